"""Durations as users write them ("30s", "5m", "1h30m", or plain seconds).

A duration is parsed into seconds (float) at load time so the policy never sees strings.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator

ACCEPTED_FORMS = 'a number of seconds (90), or a string like "30s", "5m", "2h", "1d" or "1h30m"'

_NUM = r"[0-9]+(?:\.[0-9]+)?"
# Units largest first, each at most once: "1h30m" yes, "30m1h" and "1h1h" no.
_DURATION = re.compile(rf"^(?:({_NUM})d)?(?:({_NUM})h)?(?:({_NUM})m)?(?:({_NUM})s)?$")


MAX_DURATION = 366 * 86400.0
"""The longest duration any field takes: a year (366d). Longer is a typo (or an overflow)."""
MIN_DURATION = 0.001
"""Durations have millisecond resolution: 0, or at least 1ms."""


def _shown(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 200:
        return "a number of more than 60 digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:58] + "…"


def parse_duration(value: Any) -> float:
    """Seconds for a user-written duration; ValueError naming the accepted forms otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; use {ACCEPTED_FORMS}")
    if isinstance(value, str) and not value.isascii():
        raise ValueError(
            f"{_shown(value)} is not a duration: it has characters outside ASCII (another "
            "script's digits, a superscript, a no-break or zero-width space?); use "
            f"{ACCEPTED_FORMS}, in ASCII"
        )
    if isinstance(value, str) and len(value) > 40:
        raise ValueError(
            f"a duration of {len(value)} characters is not a duration; use {ACCEPTED_FORMS}, "
            "at most 366d"
        )
    match = _DURATION.match(value.strip().lower()) if isinstance(value, str) else None
    if isinstance(value, int) and abs(value) > MAX_DURATION:
        seconds = math.inf if value > 0 else -math.inf
    elif isinstance(value, int | float):
        seconds = float(value)
        if math.isnan(seconds):
            raise ValueError(f"{_shown(value)} is not a finite duration; use {ACCEPTED_FORMS}")
    elif match and any(match.groups()):
        seconds = sum(
            float(n) * size
            for n, size in zip(match.groups(), (86400, 3600, 60, 1), strict=True)
            if n is not None
        )
    elif isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        seconds = float(value.strip())
    else:
        raise ValueError(f"{_shown(value)} is not a duration; use {ACCEPTED_FORMS}")
    if seconds < 0:
        raise ValueError(f"{_shown(value)} is negative; a duration must be zero or more")
    if seconds > MAX_DURATION:
        raise ValueError(
            f"{_shown(value)} is longer than a year; use at most 366d ({MAX_DURATION:.0f} seconds)"
        )
    if 0 < seconds < MIN_DURATION:
        raise ValueError(
            f"{_shown(value)} is shorter than a millisecond; use 0 or at least 0.001 seconds"
        )
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest of the accepted forms for a number of seconds, for summaries."""
    whole = int(seconds)
    if whole != seconds:
        return f"{seconds:g}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts) or "0s"


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""A config field holding a duration, stored as seconds."""
