"""Operators' manual targets: a pinned worker count per queue, until it expires."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from autoscaler.policy.snapshot import ManualTarget
from autoscaler.store.models import ManualTargetRow


def in_force(session: Session, now: datetime) -> dict[str, ManualTarget]:
    """Targets still in force; expired ones are deleted on the way."""
    session.execute(delete(ManualTargetRow).where(ManualTargetRow.until <= now))
    return {
        t.queue: ManualTarget(t.workers, t.until, t.set_by)
        for t in session.scalars(select(ManualTargetRow))
    }


def put(
    session: Session, queue: str, workers: int, until: datetime, by: str, now: datetime
) -> None:
    row = session.get(ManualTargetRow, queue)
    if row is None:
        session.add(
            ManualTargetRow(queue=queue, workers=workers, until=until, set_by=by, set_at=now)
        )
    else:
        row.workers, row.until, row.set_by, row.set_at = workers, until, by, now
    session.flush()


def clear(session: Session, queue: str) -> bool:
    result = session.execute(delete(ManualTargetRow).where(ManualTargetRow.queue == queue))
    return bool(getattr(result, "rowcount", 0))


__all__ = ["clear", "in_force", "put"]
