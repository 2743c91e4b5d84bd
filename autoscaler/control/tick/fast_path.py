"""The fast path: every second, queues with jobs and no machine are evaluated at once rather
than at their next poll."""

from __future__ import annotations

from datetime import datetime

from autoscaler.control.outbox import Outbox
from autoscaler.control.runtime import Loaded, Runtime
from autoscaler.control.tick.evaluate import TickResult, evaluate
from autoscaler.control.tick.read import read_metrics
from autoscaler.store import (
    instances,
)
from autoscaler.store.db import Session


def fast_path(rt: Runtime, outbox: Outbox, now: datetime | None = None) -> TickResult:
    """Scale from zero without waiting a poll: queues with no capacity at all are read every
    second, and one with jobs waiting is evaluated at once. Costs one query when every queue
    has capacity."""
    with rt.transaction() as session:
        loaded = rt.load(session)
        if loaded is None:
            return TickResult("fast", skipped="no config")
        empty = _queues_without_capacity(session, loaded)
    if not empty:
        return TickResult("fast", loaded.version, skipped="every queue has capacity")
    readings = read_metrics(rt, loaded, empty)
    waiting = [
        q
        for q in empty
        if readings[q].pending > 0 and not readings[q].stale and not readings[q].paused
    ]
    if not waiting:
        return TickResult("fast", loaded.version, skipped="no job waits at an empty queue")
    return evaluate(rt, outbox, trigger="fast", queues=waiting, readings=readings, now=now)


def _queues_without_capacity(session: Session, loaded: Loaded) -> list[str]:
    """Autoscaled queues with no machine serving or on its way (hand-made workers are
    checked by the evaluation itself)."""
    busy = instances.queues_served(session)
    return [q for q in loaded.autoscaled if q not in busy]
