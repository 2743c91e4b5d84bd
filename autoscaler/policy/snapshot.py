"""What the decision core sees: plain frozen data, built by the shell, read by `decide()`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class QueueMetrics:
    """One queue's numbers as read by a metrics source at `read_at`.

    `oldest_pending_age` is seconds (None when nothing is pending or the age is unknown).
    `broker_workers` are worker names seen serving the queue through the broker (heartbeats or
    ping) — this is how hand-made machines count as capacity. `stale` is True when the source
    failed and these are the last known numbers; `error` says why (redacted, no secrets).
    `external` holds values of `metric` triggers, keyed by their query string.
    """

    queue: str
    pending: int
    oldest_pending_age: float | None
    in_flight: int
    read_at: datetime
    broker_workers: tuple[str, ...] = ()
    external: tuple[tuple[str, float], ...] = ()
    stale: bool = False
    error: str | None = None
