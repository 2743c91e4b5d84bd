"""Cron schedule maths in the trigger's time zone: the latest firing at or before `now`.

Cron times are wall-clock times in `timezone`; durations are real elapsed seconds. Around DST:
- a wall time skipped by spring-forward fires at the first instant after the gap (croniter's
  behaviour, e.g. 02:30 Europe/Paris on the last Sunday of March fires at 03:00 CEST), as
  Vixie cron runs jobs of the skipped hour right after the change;
- a fixed-hour wall time repeated by fall-back fires once, at its first occurrence (the second
  is skipped), so a 02:30 pre-warm window does not restart an hour later; a wildcard-hour
  expression ("0 * * * *") fires in the repeated hour too, as in Vixie cron.

Pure: `now` is always passed in. Results are memoised per (expression, zone, minute) since a
five-field cron cannot fire between minutes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from croniter import croniter

_MAX_REPEATS_SKIPPED = 8


def _is_repeat(local: datetime, tz: ZoneInfo) -> bool:
    """True if `local` is the second occurrence of an ambiguous wall time (DST fall-back)."""
    wall = local.replace(tzinfo=None)
    first = wall.replace(tzinfo=tz, fold=0).utcoffset()
    second = wall.replace(tzinfo=tz, fold=1).utcoffset()
    return first != second and local.utcoffset() == second


def _fixed_hour(expr: str) -> bool:
    """Vixie cron's rule: only jobs at fixed hours skip the repeated hour; wildcard-hour jobs
    ("0 * * * *", "*/15 */2 * * *") run through it as on any other hour."""
    return not expr.split()[1].startswith("*")


@lru_cache(maxsize=4096)
def _latest_firing_at_minute(expr: str, timezone: str, minute_utc: datetime) -> datetime:
    tz = ZoneInfo(timezone)
    local_now = minute_utc.astimezone(tz)
    if not _fixed_hour(expr) and _is_repeat(local_now, tz):
        # croniter skips the repeated hour; a wildcard-hour cron fires in it on wall time.
        wall: datetime = croniter(
            expr, local_now.replace(tzinfo=None) + timedelta(seconds=1)
        ).get_prev(datetime)
        candidate = wall.replace(tzinfo=tz, fold=1)
        if _is_repeat(candidate, tz):
            return candidate.astimezone(UTC)
    # +1 s so that a firing exactly at this minute counts as "at or before now".
    it = croniter(expr, minute_utc.astimezone(tz) + timedelta(seconds=1))
    fired: datetime = it.get_prev(datetime)
    if _fixed_hour(expr):
        for _ in range(_MAX_REPEATS_SKIPPED):
            if not _is_repeat(fired, tz):
                break
            fired = it.get_prev(datetime)
    return fired.astimezone(UTC)


def latest_firing(expr: str, timezone: str, now: datetime) -> datetime:
    """The most recent firing of `expr` (in `timezone`) at or before `now`, as aware UTC."""
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    minute = now.astimezone(UTC).replace(second=0, microsecond=0)
    return _latest_firing_at_minute(expr, timezone, minute)


def window_active(expr: str, timezone: str, duration: float, now: datetime) -> datetime | None:
    """The firing whose window [firing, firing + duration) contains `now`, else None.

    Every firing of one trigger opens a window of the same length, so if any window is open the
    latest firing's is: one look-up is enough even when windows overlap.
    """
    fired = latest_firing(expr, timezone, now)
    if now < fired + timedelta(seconds=duration):
        return fired
    return None


def firing_due(expr: str, timezone: str, grace: float, now: datetime) -> datetime | None:
    """The latest firing if it happened less than `grace` seconds ago (a one-shot action that
    must survive a late or missed tick), else None."""
    fired = latest_firing(expr, timezone, now)
    if now - fired < timedelta(seconds=grace):
        return fired
    return None
