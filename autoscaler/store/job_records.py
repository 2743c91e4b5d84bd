"""Jobs the workers finished, as their agents reported them: the queue's own traffic.

The API writes them from agent heartbeats (`record`); the evaluation tick reads each queue's
mean runtime from them (`runtime_stats`, for the burst rule); `autoscaler trace export` turns
them into a trace the simulator and `autoscaler tune` replay (`since`). A job reported twice by
one machine (a heartbeat retried) is one row: (queue, task id, reporter) is unique; a machine
naming another's job adds a row of its own, within its report budget
(`store.report_budgets`), and never stands in for the row of the machine that ran it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from autoscaler.store.db import upsert
from autoscaler.store.models import JobRecord

KEEP = timedelta(days=14)
"""Two weeks: `trace export --since 7d` twice over, a few MB for a busy queue."""

EXPIRE_BATCH = 5000
"""Expired jobs deleted per write at most (writes outnumber a day's expiries many times over)."""

STATS_WINDOW = timedelta(hours=24)
"""The mean runtime the policy sees is over the jobs finished in the last day."""


@dataclass(frozen=True)
class RuntimeStats:
    mean_s: float
    jobs: int


def record(session: Session, jobs: Sequence[dict[str, Any]], now: datetime) -> None:
    """Insert the reported jobs (one statement; a job already recorded is left alone) and forget
    up to EXPIRE_BATCH jobs finished longer than KEEP ago. Each dict has the columns of
    `JobRecord` but `id`."""
    if not jobs:
        return  # most heartbeats: nothing to write, nothing to expire
    upsert(session, JobRecord, jobs, key=("queue", "task_id", "reporter"))
    # expire a bounded batch per write: never one long delete that heartbeats queue behind
    expired = (
        select(JobRecord.id).where(JobRecord.finished_at < now - KEEP).limit(EXPIRE_BATCH)
    ).scalar_subquery()
    session.execute(delete(JobRecord).where(JobRecord.id.in_(expired)))


def runtime_stats(
    session: Session, queues: Collection[str], now: datetime
) -> dict[str, RuntimeStats]:
    """Per queue, the mean runtime and count of jobs finished within STATS_WINDOW (one query)."""
    if not queues:
        return {}
    rows = session.execute(
        select(JobRecord.queue, func.avg(JobRecord.runtime_s), func.count())
        .where(JobRecord.queue.in_(list(queues)), JobRecord.finished_at >= now - STATS_WINDOW)
        .group_by(JobRecord.queue)
    ).all()
    return {q: RuntimeStats(float(mean), int(n)) for q, mean, n in rows if mean is not None}


def since(
    session: Session, queue: str, start: datetime, limit: int
) -> Iterator[tuple[datetime | None, datetime, float]]:
    """(publish stamp or None, start, runtime) of the queue's jobs that started at or after
    `start`, in arrival order (the stamp, else the start), at most `limit`, streamed."""
    arrival = func.coalesce(JobRecord.arrived_at, JobRecord.started_at)
    rows = session.execute(
        select(JobRecord.arrived_at, JobRecord.started_at, JobRecord.runtime_s)
        .where(JobRecord.queue == queue, JobRecord.started_at >= start)
        .order_by(arrival, JobRecord.id)
        .limit(limit)
        .execution_options(yield_per=10_000)
    )
    for arrived, started, runtime in rows:
        yield arrived, started, float(runtime)
