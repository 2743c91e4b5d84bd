"""Registered providers as typed configs, and their API keys resolved from env or the vault."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from autoscaler.config.errors import ConfigError, refusals_from_validation
from autoscaler.config.models import Config
from autoscaler.config.provider_options import ProviderConfig
from autoscaler.store.providers import ProviderRecord, list_providers
from autoscaler.vault import Vault

MAX_OPTIONS_TEXT = 64 * 1024
MAX_OPTIONS_DEPTH = 8
MAX_OPTION_DIGITS = 30
MAX_KEY_BYTES = 16 * 1024


class OptionsError(ValueError):
    """Provider options given on the command line that cannot be read; the message has the fix."""


def _bounded_int(text: str) -> int:
    if sum(c.isdigit() for c in text) > MAX_OPTION_DIGITS:
        raise OptionsError(
            f"a number with {len(text)} digits (the limit is {MAX_OPTION_DIGITS} digits); "
            "write a realistic number"
        )
    return int(text)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if level > MAX_OPTIONS_DEPTH:
            break
        if isinstance(item, dict):
            stack += [(v, level + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, level + 1) for v in item]
    return deepest


def parse_options_json(text: str) -> Any:
    """JSON from the command line, bounded: size, nesting and digits; OptionsError otherwise.
    json.JSONDecodeError passes through (the caller says what JSON it expected)."""
    if len(text) > MAX_OPTIONS_TEXT:
        raise OptionsError(
            f"{len(text)} characters, above the limit of {MAX_OPTIONS_TEXT}; pass only the "
            "options you need"
        )
    try:
        value = json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        raise OptionsError(
            f"nested too deeply (the limit is {MAX_OPTIONS_DEPTH} levels); options are flat "
            "values and lists"
        ) from None
    except (OptionsError, json.JSONDecodeError):
        raise
    except ValueError as exc:  # e.g. a float Python cannot read
        raise OptionsError(f"not readable as JSON ({str(exc)[:80]})") from None
    if _depth(value) > MAX_OPTIONS_DEPTH:
        raise OptionsError(
            f"nested more than {MAX_OPTIONS_DEPTH} levels deep; options are flat values and lists"
        )
    return value


def read_key(raw: bytes) -> str:
    """An API key from standard input's bytes: UTF-8, one line, no control characters."""
    if len(raw) > MAX_KEY_BYTES:
        raise OptionsError(
            f"standard input holds more than {MAX_KEY_BYTES} bytes on its first line; pipe in "
            "only the key"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OptionsError(
            f"the key on standard input is not UTF-8 text (byte {exc.start}); pipe in the key "
            "as plain text, e.g. 'autoscaler providers add NAME --kind vast --api-key-stdin < "
            "vast.key'"
        ) from None
    key = text.strip()
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise OptionsError(
            "the key on standard input holds control characters; pipe in the key alone, on one line"
        )
    return key


class CredentialError(Exception):
    """A provider's key cannot be had; the message names the provider and the fix."""


def validate_provider(name: str, kind: str, options: Mapping[str, Any]) -> ProviderConfig:
    """The same validation a `providers:` block in the YAML gets, with the same refusals."""
    try:
        config = Config.model_validate({"providers": {name: {**options, "kind": kind}}})
    except ValidationError as exc:
        raise ConfigError(refusals_from_validation(exc), f"provider {name!r}") from None
    return config.providers[name]


def registered_provider_configs(session: Session) -> dict[str, ProviderConfig]:
    return {
        row.name: validate_provider(row.name, row.kind, row.options)
        for row in list_providers(session)
    }


def resolve_api_key(
    name: str,
    config: ProviderConfig,
    encrypted: bytes | None,
    vault: Callable[[], Vault],
    env: Mapping[str, str],
) -> str | None:
    """The provider's key: decrypted from the store, else read from the named env variable."""
    if encrypted is not None:
        return vault().decrypt(encrypted, f"the credentials of provider {name!r}")
    if config.api_key_env:
        value = env.get(config.api_key_env)
        if not value:
            raise CredentialError(
                f"provider {name!r} reads its API key from ${config.api_key_env}, which is not "
                f"set; export it, or store the key with 'autoscaler providers add {name} "
                f"--kind {config.kind} --api-key-stdin'"
            )
        return value
    if config.needs_key:
        raise CredentialError(
            f"provider {name!r} ({config.kind}) has no API key; store one with "
            f"'autoscaler providers add {name} --kind {config.kind} --api-key-stdin' or set "
            "api_key_env"
        )
    return None


def describe_credentials(row: ProviderRecord) -> str:
    """What `providers list` shows: where the key lives, never the key."""
    if row.credentials_encrypted is not None:
        return "stored encrypted"
    env = (row.options or {}).get("api_key_env")
    return f"from ${env}" if env else "none"
