"""Samples of each queue's numbers over time: the dashboard's chart of pending jobs and workers.

Every evaluation tick writes one per queue it evaluated (`tick.actions.StoreActions`), and the
API writes one whenever it shows the numbers (the dashboard, a /metrics scrape), from the rows
every reader shares. A sample is keyed by (queue, the reading's own time): a reading recorded
twice, by the tick and the API or by two API processes, is one row.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from autoscaler.store.db import upsert
from autoscaler.store.models import QueueSample

KEEP = timedelta(days=7)


class Sample(NamedTuple):
    """One point of a queue's chart: pending jobs at a reading and the machines that served."""

    queue: str
    at: datetime
    pending: int
    running: int | None
    workers: int
    booting: int
    desired: int | None


def record(
    session: Session, samples: Sequence[dict[str, Any]], now: datetime, prune: bool = True
) -> None:
    """Insert what is new (one statement; an existing (queue, at) is left alone) and, with
    `prune`, forget samples older than KEEP (one shard of a sharded tick prunes: two deleting
    the same thousands of rows at once would wait on each other's row locks)."""
    if samples:
        upsert(session, QueueSample, samples, key=("queue", "at"))
    if prune:
        session.execute(delete(QueueSample).where(QueueSample.at < now - KEEP))


def since(session: Session, start: datetime) -> list[Sample]:
    """Every queue's samples since `start`, by queue then time (one query)."""
    rows = session.execute(
        select(
            QueueSample.queue,
            QueueSample.at,
            QueueSample.pending,
            QueueSample.running,
            QueueSample.workers,
            QueueSample.booting,
            QueueSample.desired,
        )
        .where(QueueSample.at >= start)
        .order_by(QueueSample.queue, QueueSample.at)
    )
    return [Sample(*row) for row in rows]
