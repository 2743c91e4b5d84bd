"""The versioned config document: every `apply` is kept, the loop runs the newest. Read as
frozen records (`ConfigRecord`), never ORM rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoscaler.store.models import ConfigVersion


@dataclass(frozen=True)
class ConfigRecord:
    """One version of the config document: who recorded it, when and why."""

    version: int
    document: dict[str, Any]
    changed_by: str
    changed_at: datetime
    comment: str | None = None


def _record(row: ConfigVersion) -> ConfigRecord:
    return ConfigRecord(row.version, row.document, row.changed_by, row.changed_at, row.comment)


def current_version(session: Session) -> int | None:
    """The newest version number (one cheap query: the loop asks it every tick)."""
    return session.scalar(select(func.max(ConfigVersion.version)))


def latest(session: Session) -> ConfigRecord | None:
    row = session.scalar(select(ConfigVersion).order_by(ConfigVersion.version.desc()).limit(1))
    return _record(row) if row is not None else None


def get(session: Session, version: int) -> ConfigRecord | None:
    row = session.get(ConfigVersion, version)
    return _record(row) if row is not None else None


def record(
    session: Session,
    document: dict[str, Any],
    changed_by: str,
    now: datetime,
    comment: str | None = None,
) -> ConfigRecord | None:
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
    return _record(row)


def history(session: Session) -> Sequence[ConfigRecord]:
    rows = session.scalars(select(ConfigVersion).order_by(ConfigVersion.version))
    return [_record(r) for r in rows]
