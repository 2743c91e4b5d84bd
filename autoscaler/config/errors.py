"""Refusals: what is wrong with a config, where, and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError


@dataclass(frozen=True)
class Refusal:
    path: str
    cause: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: {self.cause} — fix: {self.fix}"


class ConfigError(Exception):
    """A config that must not be used; carries every refusal found, not just the first."""

    def __init__(self, refusals: list[Refusal], source: str = "config") -> None:
        self.refusals = refusals
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.source} is refused ({len(self.refusals)} problem(s)):"]
        # A fix may carry an example block on its following lines: indent it under its refusal.
        lines += ["  - " + str(r).replace("\n", "\n      ") for r in self.refusals]
        return "\n".join(lines)


def format_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _strip_union_member(loc: tuple[Any, ...]) -> tuple[int | str, ...]:
    """Drop the discriminator tags pydantic inserts into paths (e.g. 'queue_depth')."""
    from autoscaler.config.models import PROVIDER_KINDS, SCALE_UP_TRIGGERS

    tags = set(SCALE_UP_TRIGGERS) | set(PROVIDER_KINDS) | {"idle"}
    out: list[int | str] = []
    for i, part in enumerate(loc):
        # A tag follows a list index or a providers-dict key, never a field name of ours.
        if (
            isinstance(part, str)
            and part in tags
            and i > 0
            and (isinstance(loc[i - 1], int) or (i >= 2 and loc[i - 2] == "providers"))
        ):
            continue
        out.append(part)
    return tuple(out)


def _split(message: str) -> tuple[str, str]:
    if "; " in message:
        cause, fix = message.split("; ", 1)
        return cause, fix
    return message, "correct the value"


def refusals_from_validation(err: ValidationError) -> list[Refusal]:
    refusals: list[Refusal] = []
    for e in err.errors():
        loc = _strip_union_member(tuple(e["loc"]))
        path = format_path(loc)
        kind = e["type"]
        ctx = e.get("ctx") or {}
        value = e.get("input")
        field = str(loc[-1]) if loc else "field"
        if kind == "missing":
            refusals.append(Refusal(path, f"'{field}' is required", f"add '{field}'"))
        elif kind == "extra_forbidden":
            refusals.append(
                Refusal(path, f"unknown field '{field}'", "remove it or correct its spelling")
            )
        elif kind == "union_tag_invalid":
            disc = ctx.get("discriminator", "").strip("'")
            expected = ctx.get("expected_tags", "")
            noun = "provider kind" if disc == "kind" else "trigger"
            refusals.append(
                Refusal(
                    format_path((*loc, disc)),
                    f"unknown {noun} {ctx.get('tag')!r}",
                    f"use one of: {expected.replace(chr(39), '')}",
                )
            )
        elif kind == "union_tag_not_found":
            disc = ctx.get("discriminator", "").strip("'")
            refusals.append(Refusal(path, f"'{disc}' is missing", f"add '{disc}'"))
        elif kind == "value_error":
            cause, fix = _split(str(ctx.get("error", e["msg"])))
            refusals.append(Refusal(path, cause, fix))
        elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            bound = next(iter(ctx.values()), "")
            word = {
                "greater_than": "more than",
                "greater_than_equal": "at least",
                "less_than": "less than",
                "less_than_equal": "at most",
            }[kind]
            refusals.append(
                Refusal(path, f"{value!r} is out of range", f"use a value {word} {bound}")
            )
        elif kind == "literal_error":
            refusals.append(
                Refusal(path, f"{value!r} is not allowed", f"use one of: {ctx.get('expected')}")
            )
        else:
            refusals.append(Refusal(path, f"{value!r}: {e['msg'].lower()}", "correct the value"))
    return refusals
