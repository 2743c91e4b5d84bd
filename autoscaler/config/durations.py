"""Durations as users write them ("30s", "5m", "1h30m", or plain seconds).

A duration is parsed into seconds (float) at load time so the policy never sees strings.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

ACCEPTED_FORMS = 'a number of seconds (90), or a string like "30s", "5m", "2h", "1d" or "1h30m"'

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(?:([0-9]+(?:\.[0-9]+)?)([smhd]))+$")
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd])")


def parse_duration(value: Any) -> float:
    """Seconds for a user-written duration; ValueError naming the accepted forms otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; use {ACCEPTED_FORMS}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and _DURATION.match(value.strip().lower()):
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(value.strip().lower()))
    elif isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        seconds = float(value.strip())
    else:
        raise ValueError(f"{value!r} is not a duration; use {ACCEPTED_FORMS}")
    if seconds < 0:
        raise ValueError(f"{value!r} is negative; a duration must be zero or more")
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
