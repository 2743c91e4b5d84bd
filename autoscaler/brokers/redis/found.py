"""What one read's pieces found per queue, and the `QueueMetrics` built from it."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from autoscaler.brokers.redis.heads import Item
from autoscaler.policy.snapshot import QueueMetrics


class Found:
    """What one read's pieces found, per queue (by index): due and scheduled depths, the
    earliest due time, the longest wait; the keys that failed; the windows of unstamped heads
    (priority key -> queue index, items, their ids); the queues still open (waiting for a
    continuation, a window's first sightings or an error's text) and the readings of the
    others, made while the next pieces run on the server (without the unacked hash)."""

    __slots__ = ("ages", "errors", "metrics", "next_due", "open", "pending", "scheduled", "windows")

    def __init__(self, queues: int) -> None:
        self.pending = [0] * queues
        self.scheduled = [0] * queues
        self.next_due: list[float | None] = [None] * queues
        self.ages: list[float | None] = [None] * queues
        self.errors: dict[int, str] = {}
        self.windows: dict[str, tuple[int, tuple[Item, ...], tuple[str, ...]]] = {}
        self.open: set[int] = set()
        self.metrics: dict[int, QueueMetrics] = {}

    def add(self, qi: int, depth: int, sched: int, next_due: float | None) -> None:
        self.pending[qi] += depth - sched
        if sched:
            self.scheduled[qi] += sched
        if next_due is not None:
            nd = self.next_due[qi]
            self.next_due[qi] = next_due if nd is None else min(nd, next_due)

    def aged(self, qi: int, age: float | None) -> None:
        if age is not None:
            old = self.ages[qi]
            self.ages[qi] = age if old is None else max(old, age)


_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(QueueMetrics)
    if f.default is not dataclasses.MISSING
}
_FAST = (
    not hasattr(QueueMetrics, "__slots__")
    and not hasattr(QueueMetrics, "__post_init__")
    and all(f.default_factory is dataclasses.MISSING for f in dataclasses.fields(QueueMetrics))
)


def queue_metrics(
    queue: str,
    pending: int,
    age: float | None,
    in_flight: int,
    read_at: datetime,
    scheduled: int,
    next_due: float | None,
    held: int,
) -> QueueMetrics:
    """A QueueMetrics, filled without its generated frozen __init__ (which sets each of its
    16 fields through object.__setattr__): the same instance, 3x faster for 10,000 queues."""
    if not _FAST:
        return QueueMetrics(
            queue=queue,
            pending=pending,
            oldest_pending_age=age,
            in_flight=in_flight,
            read_at=read_at,
            scheduled=scheduled,
            next_due_at=next_due,
            scheduled_held=held,
        )
    m = object.__new__(QueueMetrics)
    fields = m.__dict__
    fields.update(_DEFAULTS)
    fields["queue"], fields["pending"], fields["oldest_pending_age"] = queue, pending, age
    fields["in_flight"], fields["read_at"], fields["scheduled"] = in_flight, read_at, scheduled
    fields["next_due_at"], fields["scheduled_held"] = next_due, held
    return m
