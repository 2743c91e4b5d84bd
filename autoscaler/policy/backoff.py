"""Exponential backoff of failed rentals per (queue, provider), with deterministic jitter.

Jitter must not make decide() impure, so it is drawn from a hash of (key, failures) instead of a
random generator: the same failure of the same (queue, provider) always waits the same time, and
two queues failing together do not retry in lockstep. Jitter only ever shortens the wait, so the
cap is a hard upper bound ("up to 10 minutes").
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from autoscaler.config.models import Backoff
from autoscaler.policy.snapshot import BackoffState


def jitter_fraction(key: str, failures: int) -> float:
    """A number in [0, 1) fixed by (key, failures): the seeded 'random' part of the wait."""
    digest = hashlib.sha256(f"{key}\x00{failures}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def next_backoff(failures: int, base: float, cap: float, jitter: float, key: str) -> float:
    """Seconds to wait after the `failures`-th consecutive failure (1 → base, doubling, ≤ cap).

    The exponential part is min(cap, base·2^(failures-1)); jitter removes up to `jitter` of it:
    wait = exp · (1 - jitter·u), u = jitter_fraction(key, failures). Never above cap, never
    below (1 - jitter)·exp.
    """
    if failures <= 0:
        return 0.0
    # 2**64 overflows nothing in Python, but keep the exponent bounded so huge counts stay cheap.
    exponent = min(failures - 1, 62)
    exp = min(cap, base * float(2**exponent))
    return exp * (1.0 - jitter * jitter_fraction(key, failures))


def backoff_key(queue: str, provider: str) -> str:
    return f"{queue}/{provider}"


def after_failure(
    previous: BackoffState | None,
    queue: str,
    provider: str,
    now: datetime,
    config: Backoff,
    error: str | None = None,
) -> BackoffState:
    """The backoff to store after a failed rental: one more failure, `until` pushed out."""
    failures = (previous.failures if previous is not None else 0) + 1
    wait = next_backoff(
        failures, config.base, config.cap, config.jitter, backoff_key(queue, provider)
    )
    return BackoffState(
        provider=provider, failures=failures, until=now + timedelta(seconds=wait), last_error=error
    )


def active_backoff(state: BackoffState | None, now: datetime) -> BackoffState | None:
    """The backoff if it still forbids a launch at `now` (until is exclusive)."""
    if state is None or state.until <= now:
        return None
    return state
