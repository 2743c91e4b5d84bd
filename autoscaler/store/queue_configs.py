"""Versioned effective config per queue: every change kept, with who made it and when."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoscaler.store.models import QueueConfigVersion


def latest(session: Session, queue: str) -> QueueConfigVersion | None:
    return session.scalar(
        select(QueueConfigVersion)
        .where(QueueConfigVersion.queue == queue)
        .order_by(QueueConfigVersion.version.desc())
        .limit(1)
    )


def latest_all(session: Session) -> dict[str, QueueConfigVersion]:
    newest = (
        select(QueueConfigVersion.queue, func.max(QueueConfigVersion.version).label("v"))
        .group_by(QueueConfigVersion.queue)
        .subquery()
    )
    rows = session.scalars(
        select(QueueConfigVersion).join(
            newest,
            (QueueConfigVersion.queue == newest.c.queue)
            & (QueueConfigVersion.version == newest.c.v),
        )
    ).all()
    return {row.queue: row for row in rows}


def record(
    session: Session,
    queue: str,
    config: dict[str, Any],
    changed_by: str,
    now: datetime,
    comment: str | None = None,
) -> QueueConfigVersion | None:
    """A new version when `config` differs from the latest one; None when nothing changed.

    Two writers racing for the same version collide on the unique (queue, version) key, so one
    of them fails instead of both silently "winning".
    """
    current = latest(session, queue)
    if current is not None and current.config == config:
        return None
    row = QueueConfigVersion(
        queue=queue,
        version=(current.version + 1) if current else 1,
        config=config,
        changed_by=changed_by,
        changed_at=now,
        comment=comment,
    )
    session.add(row)
    session.flush()
    return row


def history(session: Session, queue: str) -> Sequence[QueueConfigVersion]:
    return session.scalars(
        select(QueueConfigVersion)
        .where(QueueConfigVersion.queue == queue)
        .order_by(QueueConfigVersion.version)
    ).all()
