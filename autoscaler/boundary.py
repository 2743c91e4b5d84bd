"""The CLI's one error boundary: whatever goes wrong becomes a message and an exit code.

- A refusal (bad input, with its fix) exits 2: commands raise `Refused` or call `_fail`.
- Anything else that escapes a command is a bug of ours: one line naming the error, with every
  secret we know of (passwords of the URLs in the environment, vault keys, any
  `scheme://user:password@` in the text) masked, and exit 1. The traceback is printed only
  with `autoscaler --debug ...` or AUTOSCALER_DEBUG=1.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import IO, Any

import click

from autoscaler.urls import url_secrets

DEBUG_ENV = "AUTOSCALER_DEBUG"
MAX_MESSAGE = 300

_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)[^\s@/]+@")


class Refused(click.ClickException):
    """Bad input: the message (cause and fix) on stderr, exit 2."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(self.format_message(), err=True, file=file)


class InternalError(click.ClickException):
    """An error we did not foresee: one line on stderr, exit 1."""

    exit_code = 1

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(self.format_message(), err=True, file=file)


def debug_enabled(ctx: click.Context | None = None, env: Mapping[str, str] | None = None) -> bool:
    e = os.environ if env is None else env
    if e.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    while ctx is not None:
        if ctx.params.get("debug"):
            return True
        ctx = ctx.parent
    return False


def known_secrets(env: Mapping[str, str] | None = None) -> list[str]:
    """Secrets a message might carry: URL passwords of the environment and vault keys."""
    e = os.environ if env is None else env
    found: list[str] = []
    for name, value in e.items():
        if not name.startswith("AUTOSCALER_") and not name.endswith("_URL"):
            continue
        if "://" in value:
            found += url_secrets(value)
        if name == "AUTOSCALER_VAULT_KEY":
            found += [k.strip() for k in value.split(",") if k.strip()]
    # longest first, so that a secret containing another is masked whole
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


def scrub(text: str, env: Mapping[str, str] | None = None) -> str:
    for secret in known_secrets(env):
        text = text.replace(secret, "***")
    return _URL_PASSWORD.sub(r"\1***@", text)


def one_line(exc: BaseException, env: Mapping[str, str] | None = None) -> str:
    """`Type: message` on one line, secrets masked, at most MAX_MESSAGE characters."""
    try:
        text = str(exc)
    except Exception:  # a message that cannot even be built
        text = ""
    text = scrub(" ".join(text.split()), env)
    if len(text) > MAX_MESSAGE:
        text = text[: MAX_MESSAGE - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class BoundaryGroup(click.Group):
    """A click group whose commands never end in a traceback (unless asked to)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # RecursionError and MemoryError included
            if debug_enabled(ctx):
                raise
            raise InternalError(
                f"error: internal error ({one_line(exc)}); this is a bug: rerun with --debug "
                f"(or {DEBUG_ENV}=1) for the traceback and report it"
            ) from None
