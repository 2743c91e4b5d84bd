"""Each queue's last evaluation: its status (what `autoscaler status` and the dashboard show) and
its history (`policy.history`: quiet gaps, kept between ticks as JSON).

One row per queue, written by every evaluation tick (`control.tick.actions.StoreActions.flush`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoscaler.store.db import upsert
from autoscaler.store.models import QueueStatus


@dataclass(frozen=True, slots=True)
class QueueEvaluation:
    """A queue's latest evaluation as `status`, the admin API and /metrics read it."""

    queue: str
    evaluated_at: datetime
    config_version: int
    status: dict[str, Any]
    """The status document the tick wrote (`StoreActions.flush`): desired, capacity, waits…"""


def evaluations(session: Session) -> dict[str, QueueEvaluation]:
    """Each queue's latest evaluation, by queue (one query)."""
    rows = session.execute(
        select(
            QueueStatus.queue,
            QueueStatus.evaluated_at,
            QueueStatus.config_version,
            QueueStatus.status,
        )
    )
    return {
        queue: QueueEvaluation(queue, at, version, status) for queue, at, version, status in rows
    }


def histories(session: Session, queues: Collection[str]) -> dict[str, Any]:
    """The stored history document of each of these queues that has one row (one query)."""
    return dict(
        session.execute(
            select(QueueStatus.queue, QueueStatus.history).where(
                QueueStatus.queue.in_(list(queues))
            )
        ).all()
    )


def statuses(session: Session, queues: Collection[str]) -> dict[str, Any]:
    """The stored status document of each of these queues (one query)."""
    return dict(
        session.execute(
            select(QueueStatus.queue, QueueStatus.status).where(QueueStatus.queue.in_(list(queues)))
        ).all()
    )


def record(
    session: Session,
    statuses: list[dict[str, Any]],
    version: int,
    now: datetime,
    histories: Mapping[str, dict[str, Any]] | None = None,
) -> None:
    """Upsert each evaluated queue's status and, where given, its history (one statement; a
    queue given no history keeps its stored one)."""
    if not statuses:
        return
    histories = histories or {}
    upsert(
        session,
        QueueStatus,
        [
            {
                "queue": s["queue"],
                "evaluated_at": now,
                "config_version": version,
                "status": s,
                "history": histories.get(s["queue"]),
            }
            for s in statuses
        ],
        key=("queue",),
        update={
            "evaluated_at": lambda new: new.evaluated_at,
            "config_version": lambda new: new.config_version,
            "status": lambda new: new.status,
            "history": lambda new: func.coalesce(new.history, QueueStatus.history),
        },
    )
