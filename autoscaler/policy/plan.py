"""What decide() returns: actions with their reasons, and the numbers behind them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Literal

WaitKind = Literal["backoff", "rate_limit", "unanswered", "spend_cap", "max_workers", "stale"]
DrainTrigger = Literal["idle", "schedule", "manual", "drain_requested", "baseline", "max_lifetime"]


@dataclass(frozen=True)
class Launch:
    """Rent one machine for `queue` from `provider`. `index` is 1..n within this plan's queue,
    so (queue, evaluation, index) can key an idempotent launch intent. `fallbacks`: for a queue
    listing several providers, the others not waiting now, in the order written; the launch
    ranks the offers of all of them (`policy.placement`), `provider` being the first listed."""

    queue: str
    provider: str
    trigger: str
    reason: str
    index: int = 1
    fallbacks: tuple[str, ...] = ()
    interruptible: bool = False
    """Rent it at the queue's bid (`instance.interruptible`), within its `max_share`."""

    @property
    def providers(self) -> tuple[str, ...]:
        """Every provider this launch may rent from."""
        return (self.provider, *self.fallbacks)


@dataclass(frozen=True)
class Drain:
    """Drain machine `launch_id`. `when_idle=False`: it is idle now, drain it now.
    `when_idle=True`: it is busy; mark it drain-requested, take no new job, drain once idle."""

    queue: str
    launch_id: str
    trigger: DrainTrigger
    reason: str
    when_idle: bool = False
    keep_warm: bool = False
    """Once drained, stop it for the queue's warm pool instead of destroying it."""


@dataclass(frozen=True)
class Resume:
    """Start a stopped machine of the queue's warm pool again instead of renting a new one: the
    provider's start plus the worker's start, not a cold boot."""

    queue: str
    launch_id: str
    reason: str


@dataclass(frozen=True)
class Reclaim:
    """Take machine `launch_id` back: it was asked to drain once idle, but the queue needs it
    again. Cheaper than renting: it is already booted and already paid for."""

    queue: str
    launch_id: str
    reason: str


@dataclass(frozen=True)
class Wait:
    """Machines a queue wants but does not get this evaluation, and why."""

    queue: str
    kind: WaitKind
    machines: int
    reason: str
    until: datetime | None = None


@dataclass(frozen=True)
class QueuePlan:
    """One queue's decision and its audit numbers.

    capacity: serving + booting + hand-made workers now; floor: max(min_workers, active
    schedule windows); ceiling: max_workers; desired: what the triggers and floor ask for,
    clamped to [0, ceiling] (equal to capacity when nothing asks for a change).
    `up_fired` is True when a scale-up trigger asked for more (even if held by no-stacking,
    backoff or caps): scale-down is then off for this evaluation.
    """

    queue: str
    capacity: int
    floor: int
    ceiling: int
    desired: int
    up_fired: bool = False
    launches: tuple[Launch, ...] = ()
    reclaims: tuple[Reclaim, ...] = ()
    drains: tuple[Drain, ...] = ()
    waits: tuple[Wait, ...] = ()
    notes: tuple[str, ...] = ()
    resumes: tuple[Resume, ...] = ()

    @property
    def scale_down_drains(self) -> tuple[Drain, ...]:
        """Drains that reduce capacity (not the completion of an earlier drain request)."""
        return tuple(d for d in self.drains if d.trigger != "drain_requested")


@dataclass(frozen=True)
class Plan:
    at: datetime
    queues: tuple[QueuePlan, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def launches(self) -> tuple[Launch, ...]:
        return tuple(a for q in self.queues for a in q.launches)

    @property
    def reclaims(self) -> tuple[Reclaim, ...]:
        return tuple(a for q in self.queues for a in q.reclaims)

    @property
    def resumes(self) -> tuple[Resume, ...]:
        return tuple(a for q in self.queues for a in q.resumes)

    @property
    def drains(self) -> tuple[Drain, ...]:
        return tuple(a for q in self.queues for a in q.drains)

    @property
    def waits(self) -> tuple[Wait, ...]:
        return tuple(a for q in self.queues for a in q.waits)

    @cached_property
    def _by_queue(self) -> dict[str, QueuePlan]:
        return {q.queue: q for q in self.queues}

    def for_queue(self, name: str) -> QueuePlan | None:
        return self._by_queue.get(name)

    def describe(self) -> str:
        """Every action and wait, one line each, for logs and the CLI."""
        lines = []
        for q in self.queues:
            lines.append(
                f"[{q.queue}] capacity {q.capacity}, floor {q.floor}, max {q.ceiling}, "
                f"desired {q.desired}"
            )
            lines.extend(f"  resume {r.launch_id}: {r.reason}" for r in q.resumes)
            lines.extend(f"  launch #{a.index}: {a.reason}" for a in q.launches)
            lines.extend(f"  reclaim {r.launch_id}: {r.reason}" for r in q.reclaims)
            lines.extend(
                f"  drain {d.launch_id}{' when idle' if d.when_idle else ''}: {d.reason}"
                for d in q.drains
            )
            lines.extend(f"  wait ({w.kind}, {w.machines}): {w.reason}" for w in q.waits)
        return "\n".join(lines)
