"""A lost machine's hand-back marks on its row: due once its provider says it no longer runs,
done once by the one caller that finishes it (`control.steps.handback`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.store.models import Instance
from autoscaler.store.moves import update_rows


def set_due(session: Session, launch_id: str, due: datetime) -> None:
    """The provider says the machine no longer runs: its jobs are handed back from `due` (once:
    an earlier mark is kept)."""
    where = [Instance.launch_id == launch_id, Instance.handback_due_at.is_(None)]
    update_rows(session, where, {"handback_due_at": due})


def pending(session: Session, limit: int = 500) -> list[tuple[str, str]]:
    """(launch id, queue) of machines whose jobs are due to be handed back and are not yet."""
    return [
        (r.launch_id, r.queue)
        for r in session.execute(
            select(Instance.launch_id, Instance.queue)
            .where(Instance.handback_due_at.is_not(None), Instance.handback_done_at.is_(None))
            .order_by(Instance.handback_due_at)
            .limit(limit)
        )
    ]


def finish(session: Session, launch_id: str, now: datetime) -> bool:
    """Mark the hand-back done; True for the one caller that marks it (its events are written
    once, whoever raced it)."""
    where = [Instance.launch_id == launch_id, Instance.handback_done_at.is_(None)]
    return bool(update_rows(session, where, {"handback_done_at": now}))


__all__ = ["finish", "pending", "set_due"]
