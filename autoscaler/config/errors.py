"""Refusals: what is wrong with a config, where, and how to fix it."""

from __future__ import annotations

import difflib
import reprlib
import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class Refusal:
    path: str
    cause: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: {self.cause} — fix: {self.fix}"


MAX_SHOWN_REFUSALS = 25
"""A refusal lists this many problems at most (a file of 50,000 unknown keys is one mistake)."""


class ConfigError(Exception):
    """A config that must not be used; carries every refusal found, not just the first."""

    def __init__(self, refusals: list[Refusal], source: str = "config") -> None:
        self.refusals = refusals
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.source} is refused ({len(self.refusals)} problem(s)):"]
        # A fix may carry an example block on its following lines: indent it under its refusal.
        lines += [
            "  - " + str(r).replace("\n", "\n      ") for r in self.refusals[:MAX_SHOWN_REFUSALS]
        ]
        if len(self.refusals) > MAX_SHOWN_REFUSALS:
            lines.append(
                f"  … and {len(self.refusals) - MAX_SHOWN_REFUSALS} more problem(s); fix these "
                "first"
            )
        return "\n".join(lines)


def safe_part(part: str, limit: int = 60) -> str:
    """A key as it may appear in a path: printable and short, else quoted and escaped."""
    if (
        part.isprintable()
        and part
        and part.strip() == part
        and " " not in part
        and (len(part) <= limit)
    ):
        return part
    text = repr(part)
    return text if len(text) <= limit else text[: limit - 2] + "…" + text[0]


def format_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":  # pydantic's marker for a refused dict key (a name)
            continue
        else:
            shown = safe_part(part)
            out += f".{shown}" if out else shown
    return out or "(top level)"


_REPR = reprlib.Repr()
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlevel = 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4


def shown_value(value: Any, loc: tuple[int | str, ...] = ()) -> str:
    """The offending value for a refusal: short, and masked where it may be a secret (a
    provider option longer than a word, any URL's password)."""
    from autoscaler.urls import shown_url

    last = str(loc[-1]) if loc else ""
    if isinstance(value, str) and (last.endswith("url") or "://" in value):
        return shown_url(value, 80)
    if (
        loc
        and loc[0] == "providers"
        and len(loc) >= 3
        and isinstance(value, str | bytes)
        and len(value) > 16  # API keys are longer; a short word (a typo in a choice) is shown
    ):
        return f"(a masked {type(value).__name__} of {len(value)} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return "(a number of more than 60 digits)"
    try:
        return _REPR.repr(value)
    except Exception:  # a value whose repr fails is still refused
        return f"(a {type(value).__name__})"


def _strip_union_member(loc: tuple[Any, ...]) -> tuple[int | str, ...]:
    """Drop the discriminator tags pydantic inserts into paths (e.g. 'queue_depth')."""
    from autoscaler.config.metrics_sources import METRICS_SOURCES
    from autoscaler.config.provider_options import PROVIDER_KINDS
    from autoscaler.config.triggers import SCALE_UP_TRIGGERS

    tags = set(SCALE_UP_TRIGGERS) | set(PROVIDER_KINDS) | {"idle"}
    out: list[int | str] = []
    for i, part in enumerate(loc):
        # A tag follows a list index, a providers-dict key or a queue's `metrics` key, never a
        # field name of ours.
        if (
            isinstance(part, str)
            and part in tags
            and i > 0
            and (isinstance(loc[i - 1], int) or (i >= 2 and loc[i - 2] == "providers"))
        ):
            continue
        if isinstance(part, str) and part in METRICS_SOURCES and i > 0 and loc[i - 1] == "metrics":
            continue
        out.append(part)
    return tuple(out)


def _members(tp: Any) -> list[Any]:
    """The types a field annotation may hold: Annotated and unions unwrapped."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _members(get_args(tp)[0])
    if origin is Union or origin is types.UnionType:
        return [m for arg in get_args(tp) for m in _members(arg)]
    return [tp]


def _tag(model: type[BaseModel]) -> str | None:
    """The discriminator value of a union member (its `trigger`, `kind` or `source` literal)."""
    for name in ("trigger", "kind", "source"):
        field = model.model_fields.get(name)
        if field is not None and get_origin(field.annotation) is Literal:
            return str(get_args(field.annotation)[0])
    return None


def _step(tp: Any, part: int | str) -> Any:
    members = _members(tp)
    models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    if len(models) > 1 and isinstance(part, str):  # a discriminated union: the tag picks one
        for model in models:
            if _tag(model) == part:
                return model
    for m in members:
        if isinstance(m, type) and issubclass(m, BaseModel):
            field = m.model_fields.get(str(part))
            if field is not None:
                return field.annotation
        elif get_origin(m) is dict and isinstance(part, str):
            return get_args(m)[1]
        elif get_origin(m) in (tuple, list) and isinstance(part, int):
            return get_args(m)[0]
    return None


def fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The field names of the block holding `loc` (pydantic's raw path, tags included)."""
    from autoscaler.config.models import Config

    tp: Any = Config
    for part in loc[:-1]:
        tp = _step(tp, part)
        if tp is None:
            return []
    models = [m for m in _members(tp) if isinstance(m, type) and issubclass(m, BaseModel)]
    return list(models[0].model_fields) if len(models) == 1 else []


def _did_you_mean(word: str, choices: list[str]) -> str | None:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def _split(message: str) -> tuple[str, str]:
    if "; " in message:
        cause, fix = message.split("; ", 1)
        return cause, fix
    return message, "correct the value"


def refusals_from_validation(err: ValidationError) -> list[Refusal]:
    """Every problem pydantic found; unknown keys first, since a misspelled key usually explains
    the 'required' refusal of the field it was meant to be."""
    from autoscaler.config.metrics_sources import metrics_source_tag

    unknown: list[Refusal] = []
    refusals: list[Refusal] = []
    for e in err.errors():
        raw_loc = tuple(e["loc"])
        loc = _strip_union_member(raw_loc)
        path = format_path(loc)
        kind = e["type"]
        ctx = e.get("ctx") or {}
        value = e.get("input")
        field = str(loc[-1]) if loc else "field"
        if kind == "missing":
            refusals.append(Refusal(path, f"'{field}' is required", f"add '{field}'"))
        elif kind == "extra_forbidden":
            known = fields_at(raw_loc)
            guess = _did_you_mean(field, known)
            if guess is not None:
                fix = f"did you mean '{guess}'? correct its spelling, or remove it"
            elif known:
                fix = f"remove it or correct its spelling (fields here: {', '.join(known)})"
            else:
                fix = "remove it or correct its spelling"
            shown = safe_part(field)
            what = f"'{shown}'" if shown == field else shown
            unknown.append(Refusal(path, f"unknown field {what}", fix))
        elif kind == "union_tag_invalid":
            disc = ctx.get("discriminator", "").strip("'")
            if disc == f"{metrics_source_tag.__name__}()":  # the metrics block's callable one
                disc = "source"
            expected = str(ctx.get("expected_tags", "")).replace("'", "")
            noun = {"kind": "provider kind", "source": "metrics source"}.get(disc, "trigger")
            guess = _did_you_mean(str(ctx.get("tag")), [t.strip() for t in expected.split(",")])
            hint = f"did you mean '{guess}'? " if guess else ""
            refusals.append(
                Refusal(
                    format_path((*loc, disc)),
                    f"unknown {noun} {ctx.get('tag')!r}",
                    f"{hint}use one of: {expected}",
                )
            )
        elif kind == "union_tag_not_found":
            disc = ctx.get("discriminator", "").strip("'")
            refusals.append(Refusal(path, f"'{disc}' is missing", f"add '{disc}'"))
        elif kind == "value_error":
            cause, fix = _split(str(ctx.get("error", e["msg"])))
            refusals.append(Refusal(path, cause, fix))
        elif kind == "not_ascii_number":  # raised for a block, about one of its fields
            cause, fix = _split(e["msg"])
            refusals.append(Refusal(format_path((*loc, str(ctx.get("field")))), cause, fix))
        elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            bound = next(iter(ctx.values()), "")
            word = {
                "greater_than": "more than",
                "greater_than_equal": "at least",
                "less_than": "less than",
                "less_than_equal": "at most",
            }[kind]
            refusals.append(
                Refusal(
                    path,
                    f"{shown_value(value, loc)} is out of range",
                    f"use a value {word} {bound}",
                )
            )
        elif kind == "literal_error":
            refusals.append(
                Refusal(
                    path,
                    f"{shown_value(value, loc)} is not allowed",
                    f"use one of: {ctx.get('expected')}",
                )
            )
        else:
            refusals.append(
                Refusal(path, f"{shown_value(value, loc)}: {e['msg'].lower()}", "correct the value")
            )
    return unknown + refusals
