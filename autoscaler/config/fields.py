"""The strict base every config model extends, and the checked field types and bounds they share.

Its own module so that each block's models (`models`, `triggers`, `metrics_sources`,
`machine_specs`, `provider_options`) can import it without importing each other.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from autoscaler.digits import ASCII_FORM
from autoscaler.urls import UrlError, parse_url


class Strict(BaseModel):
    """Unknown keys are refused (typos), and so are NaN and infinity (an infinite price cap).

    A number or a duration written as text is read from ASCII only: pydantic strips a no-break
    space around "3" and Python reads "٣" as 3, so a pasted number would silently mean
    something else (see `autoscaler.digits`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_in_ascii(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            if not (isinstance(name, str) and isinstance(value, str)) or value.isascii():
                continue
            field = cls.model_fields.get(name)
            if field is not None and _numeric(field.annotation):
                raise PydanticCustomError(
                    NOT_ASCII_NUMBER,
                    "{shown} is written with characters outside ASCII (another script's "
                    "digits, a superscript, a no-break or zero-width space?); write the number "
                    "in {form}",
                    {"field": name, "shown": shown(value), "form": ASCII_FORM},
                )
        return data


NOT_ASCII_NUMBER = "not_ascii_number"
"""The pydantic error type of a number written outside ASCII (its ctx names the field)."""


def _numeric(annotation: Any) -> bool:
    """Does a field of this type hold numbers (int, float, durations; optional or in a tuple)?"""
    if annotation is bool:
        return False
    if annotation in (int, float):
        return True
    return any(_numeric(arg) for arg in get_args(annotation) if arg is not type(None))


# --------------------------------------------------------------------------- bounds and text

MAX_NAME_LENGTH = 100
"""Queue and provider names: the store's provider column holds 100 characters."""
MAX_WORKERS = 10_000
"""Machines per queue; far above any real fleet, low enough that worst-case costs stay finite."""
MAX_PRICE_PER_HOUR = 1_000.0
"""Dollars per hour for one machine."""
MAX_POLL_INTERVAL = 86_400.0
MIN_POLL_INTERVAL = 1.0


def control_chars(value: str) -> list[str]:
    return [c for c in value if unicodedata.category(c)[0] == "C"]


def shown(value: str, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 2] + "…" + text[0]


def _check_name(value: str) -> str:
    rule = (
        f"a name is 1 to {MAX_NAME_LENGTH} characters: letters, digits and punctuation such as "
        "- _ . : @ /, without spaces, tabs, newlines or control characters"
    )
    if not value:
        raise ValueError(f"the name is empty; {rule}")
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"the name is {len(value)} characters long; {rule}")
    if value.strip() != value or not value.strip():
        raise ValueError(f"the name {shown(value)} starts or ends with blanks; {rule}")
    if any(c.isspace() for c in value) or control_chars(value):
        raise ValueError(f"the name {shown(value)} holds blanks or control characters; {rule}")
    return value


def _check_line(value: str) -> str:
    """One line of text: no control characters (a newline, a tab, a NUL byte...)."""
    bad = control_chars(value)
    if bad:
        raise ValueError(
            f"{shown(value)} holds the control character {bad[0]!r}; write it on one line "
            "without control characters"
        )
    return value


def _check_text(value: str) -> str:
    """Free text (a command, a query): anything but a NUL byte, which no database can store."""
    if "\x00" in value:
        raise ValueError("the text holds a NUL byte; remove it")
    return value


def _check_env_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,199}", value):
        # the value is not shown: a key pasted here by mistake must not be printed
        raise ValueError(
            "this is not the name of an environment variable; give a name such as "
            "VAST_API_KEY (letters, digits and _, not starting with a digit) — never the key"
        )
    return value


def _check_url(value: str) -> str:
    try:
        parse_url(value)
    except UrlError as exc:
        raise ValueError(str(exc)) from None
    return value


def _check_http_url(value: str) -> str:
    try:
        parse_url(value, schemes=("http", "https"), need_host=True, example="https://host:9090")
    except UrlError as exc:
        raise ValueError(str(exc)) from None
    return value


Name = Annotated[str, AfterValidator(_check_name)]
"""A queue or provider name."""
Line = Annotated[str, Field(max_length=1000), AfterValidator(_check_line)]
Text = Annotated[str, Field(max_length=20_000), AfterValidator(_check_text)]
EnvName = Annotated[str, AfterValidator(_check_env_name)]
Url = Annotated[str, AfterValidator(_check_url)]
HttpUrl = Annotated[str, AfterValidator(_check_http_url)]


def distinct(values: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A list of names in preference order: at least one, none twice."""
    if not values:
        raise ValueError(f"the list of {what} is empty; name one at least")
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{value!r} is listed twice; keep one")
        seen.add(value)
    return values
