"""A held provider holds no worker: its hold is recorded once, honoured everywhere.

Two causes, one record (`store.rate_limits`: "no call to this provider before T", read by every
Celery worker process and the next tick):

- **a rate limit.** The HTTP client sleeps a 429 out only for short hints
  (`RetryPolicy.rate_limit_budget`, 2 s per call); a longer reset raises `RateLimitedError` at
  once and the step that got it records the reset;
- **no answer.** Every provider call of a lifecycle step ends within `STEP_CALL_MAX` (4 s, or a
  third of a shorter poll; reconcile's lists, which hold no lifecycle slot, get `call_deadline`,
  a third of the poll, 3-20 s): a provider that takes connections and never answers costs that
  one step its deadline and is held for `UNANSWERED_HOLD`, so the steps after it return at once
  instead of each waiting out 4 × 30 s reads in a lifecycle slot; reconcile keeps listing it
  (in the background, under its own deadline) and its first answered list lifts the hold.

While held, launches wait (`Wait(kind="rate_limit" | "unanswered")`, in `status` and the
events) and rent from the queue's other providers, reconcile decides nothing that needs the
provider's list, and terminate, stop, resume and orphan destroys wait for the hold's end.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from autoscaler.control.runtime import Loaded, Runtime, log, utc_now
from autoscaler.policy.snapshot import HoldCause, RateLimit
from autoscaler.providers import http
from autoscaler.providers.base import RateLimitedError, UnansweredError
from autoscaler.store import events, rate_limits

DEFAULT_RESET = 60.0
"""Seconds a provider is left alone after a 429 that gave no reset (Vast sends none)."""

MAX_RESET = 3600.0
"""The longest reset honoured: a provider's hint beyond an hour (or not a number) is a bug,
and an hour without a list or a destroy is already long."""

STEP_CALL_MAX = 4.0
"""The longest one provider call of a lifecycle step may take, retries included (a third of
the poll when that is shorter): a provider answers a destroy, a stop or a start in well under
a second; a silent one costs each step already running this once, and the lifecycle slots
are free again within it (measured: the 4 slots held 10 s with a third of a 30 s poll, and a
Vast-only queue's launch waited 8.9 s; `benchmarks/silent_provider.py`)."""

DEFAULT_POLL = 30.0
"""The poll a step whose config is gone is bounded by (the schema's default)."""

DEADLINE_MIN = 3.0
DEADLINE_MAX = 20.0

UNANSWERED_HOLD = 60.0
"""Seconds a provider that did not answer is left alone, unless an answered list lifts the
hold sooner (reconcile lists it every poll)."""


def call_deadline(poll_interval: float) -> float:
    """How long one provider may take to answer a step or a list: a third of the poll
    interval, between 3 and 20 s (10 s at the default 30 s poll), retries included."""
    return min(DEADLINE_MAX, max(DEADLINE_MIN, poll_interval / 3))


class Held(Exception):
    """The provider takes no call now; `waiting` says until when, for the step's result."""

    def __init__(self, limit: RateLimit) -> None:
        what = "rate-limited" if limit.cause == "rate_limit" else "not answering"
        self.limit = limit
        self.waiting = f"waiting: {limit.provider} is {what} until {limit.until.isoformat()}"
        super().__init__(self.waiting)


@contextmanager
def answering(
    rt: Runtime, provider: str, loaded: Loaded | None, queue: str | None = None
) -> Iterator[None]:
    """The frame of a lifecycle step's provider calls: `Held` at once while the provider is
    held; the block's calls bounded by `call_deadline` of the poll of `loaded` (the step's
    config, else the default poll); a 429's reset or a missed deadline recorded for every
    process and raised as `Held`."""
    limit = current(rt, provider)
    if limit is not None:
        raise Held(limit)
    poll = loaded.config.poll_interval if loaded is not None else DEFAULT_POLL
    try:
        with http.each_call_within(min(STEP_CALL_MAX, call_deadline(poll))):
            yield
    except RateLimitedError as exc:
        raise Held(note(rt, provider, exc, queue)) from None
    except UnansweredError as exc:
        raise Held(note_unanswered(rt, provider, str(exc), queue)) from None


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
    """Record the provider's reset for every process; one event per stretch of holds."""
    reason = str(exc)[:500] or "rate limited (HTTP 429)"
    return _hold(rt, provider, reset_seconds(exc), reason, "rate_limit", queue)


def note_unanswered(rt: Runtime, provider: str, why: str, queue: str | None = None) -> RateLimit:
    """Record that the provider gave no answer in time: held `UNANSWERED_HOLD` for every
    process (an answered list lifts it sooner); one event per stretch of holds."""
    return _hold(rt, provider, UNANSWERED_HOLD, why[:500] or "no answer", "unanswered", queue)


def answered(rt: Runtime, provider: str) -> None:
    """The provider answered (reconcile listed it): lift its no-answer hold, with an event."""
    now = utc_now()
    with rt.transaction() as session:
        if rate_limits.lift(session, provider, "unanswered", now):
            events.record(
                session,
                [
                    events.event(
                        "provider",
                        "answering",
                        f"{provider} answers again: calls to it resume",
                        details={"provider": provider},
                    )
                ],
                now,
            )
            log.warning("%s answers again", provider)


_SAID = {
    "rate_limit": ("rate_limited", "rate-limited the account"),
    "unanswered": ("unanswered", "gave no answer in time"),
}


def _hold(
    rt: Runtime, provider: str, seconds: float, reason: str, cause: HoldCause, queue: str | None
) -> RateLimit:
    now = utc_now()
    until = now + timedelta(seconds=seconds)
    action, said = _SAID[cause]
    with rt.transaction() as session:
        if rate_limits.record(session, provider, until, reason, now, cause):
            events.record(
                session,
                [
                    events.event(
                        "provider",
                        action,
                        f"{provider} {said}: no call to it before "
                        f"{until.isoformat(timespec='seconds')} ({reason})",
                        queue=queue,
                        details={"provider": provider, "until": until.isoformat()},
                    )
                ],
                now,
            )
        limit = rate_limits.of(session, provider, now)
    log.warning("%s %s: no call before %s", provider, said, until.isoformat())
    return limit or RateLimit(provider, until, reason, cause)
