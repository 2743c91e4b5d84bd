"""This installation's id: stamped on every machine it creates, so it only touches its own."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autoscaler.store.models import Installation


def installation_id(session: Session) -> str:
    """The id, created on first use; concurrent first uses converge on one row (unique id=1)."""
    row = session.scalar(select(Installation).where(Installation.id == 1))
    if row is not None:
        return row.installation_id
    try:
        with session.begin_nested():
            session.add(Installation(id=1, installation_id=uuid.uuid4().hex[:12]))
    except IntegrityError:  # another process or thread made it first: theirs is the one
        pass
    row = session.scalar(select(Installation).where(Installation.id == 1))
    assert row is not None
    return row.installation_id
