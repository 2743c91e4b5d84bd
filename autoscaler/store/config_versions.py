"""The versioned config document: every `apply` is kept, the loop runs the newest."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoscaler.store.models import ConfigVersion


def current_version(session: Session) -> int | None:
    """The newest version number (one cheap query: the loop asks it every tick)."""
    return session.scalar(select(func.max(ConfigVersion.version)))


def latest(session: Session) -> ConfigVersion | None:
    return session.scalar(select(ConfigVersion).order_by(ConfigVersion.version.desc()).limit(1))


def get(session: Session, version: int) -> ConfigVersion | None:
    return session.get(ConfigVersion, version)


def record(
    session: Session,
    document: dict[str, Any],
    changed_by: str,
    now: datetime,
    comment: str | None = None,
) -> ConfigVersion | None:
    """A new version when `document` differs from the newest one; None when nothing changed.

    Two writers racing for the same version number collide on the primary key, so one of them
    fails instead of both silently "winning".
    """
    current = latest(session)
    if current is not None and current.document == document:
        return None
    row = ConfigVersion(
        version=(current.version + 1) if current else 1,
        document=document,
        changed_by=changed_by,
        changed_at=now,
        comment=comment,
    )
    session.add(row)
    session.flush()
    return row


def history(session: Session) -> Sequence[ConfigVersion]:
    return session.scalars(select(ConfigVersion).order_by(ConfigVersion.version)).all()
