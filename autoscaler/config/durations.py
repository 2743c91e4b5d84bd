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


def parse_duration(value: Any) -> float:
    """Seconds for a user-written duration; ValueError naming the accepted forms otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; use {ACCEPTED_FORMS}")
    match = _DURATION.match(value.strip().lower()) if isinstance(value, str) else None
    if isinstance(value, int | float):
        seconds = float(value)
        if not math.isfinite(seconds):
            raise ValueError(f"{value!r} is not a finite duration; use {ACCEPTED_FORMS}")
    elif match and any(match.groups()):
        seconds = sum(
            float(n) * size
            for n, size in zip(match.groups(), (86400, 3600, 60, 1), strict=True)
            if n is not None
        )
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
