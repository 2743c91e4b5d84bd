"""A rate-limited provider holds no worker: its reset is recorded once, honoured everywhere.

The HTTP client sleeps a 429 out only for short hints (`RetryPolicy.rate_limit_budget`, 2 s
per call); a longer reset raises `RateLimitedError` at once. The step that got it records
"no call to this provider before T" in the store (`store.rate_limits`), so that every Celery
worker process and the next tick see it without calling again: launches wait
(`Wait(kind="rate_limit")`, in `status` and the events), reconcile skips the provider's list
(and decides nothing that needs it), terminate and orphan destroys wait for the reset.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from autoscaler.control.runtime import Runtime, log, utc_now
from autoscaler.policy.snapshot import RateLimit
from autoscaler.providers.base import RateLimitedError
from autoscaler.store import fleet, rate_limits

DEFAULT_RESET = 60.0
"""Seconds a provider is left alone after a 429 that gave no reset (Vast sends none)."""

MAX_RESET = 3600.0
"""The longest reset honoured: a provider's hint beyond an hour (or not a number) is a bug,
and an hour without a list or a destroy is already long."""


def reset_seconds(exc: RateLimitedError) -> float:
    """How long to leave the provider alone: its hint within [1 s, MAX_RESET], else the default."""
    hint = exc.retry_after
    if hint is None or not math.isfinite(hint):
        return DEFAULT_RESET
    return min(max(hint, 1.0), MAX_RESET)


def current(rt: Runtime, provider: str, now: datetime | None = None) -> RateLimit | None:
    """The rate limit in force for `provider`, if any (one primary-key read)."""
    with rt.transaction() as session:
        return rate_limits.of(session, provider, now or utc_now())


def note(rt: Runtime, provider: str, exc: RateLimitedError, queue: str | None = None) -> RateLimit:
    """Record the provider's reset for every process; one event per stretch of limits."""
    now = utc_now()
    until = now + timedelta(seconds=reset_seconds(exc))
    reason = str(exc)[:500] or "rate limited (HTTP 429)"
    with rt.transaction() as session:
        if rate_limits.record(session, provider, until, reason, now):
            fleet.record_events(
                session,
                [
                    fleet.event(
                        "provider",
                        "rate_limited",
                        f"{provider} rate-limited the account: no call to it before "
                        f"{until.isoformat(timespec='seconds')} ({reason})",
                        queue=queue,
                        details={"provider": provider, "until": until.isoformat()},
                    )
                ],
                now,
            )
        limit = rate_limits.of(session, provider, now)
    log.warning("%s rate-limited: no call before %s", provider, until.isoformat())
    return limit or RateLimit(provider, until, reason)
