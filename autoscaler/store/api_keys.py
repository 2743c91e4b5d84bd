"""Queries of the API's keys (`api_keys`) and of the worker-token column of `instances`: rows
only; hashing and comparing are `access.keys`'."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.store.instances import InstanceDetails, details
from autoscaler.store.models import ApiKey, Instance
from autoscaler.store.moves import update_rows


def add(
    session: Session, kind: str, name: str, key_hash: str, now: datetime, queues: list[str] | None
) -> ApiKey:
    row = ApiKey(kind=kind, name=name, key_hash=key_hash, created_at=now, queues=queues)
    session.add(row)
    session.flush()
    return row


def all_keys(session: Session) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).order_by(ApiKey.id)))


def revoke(session: Session, ident: int | str, now: datetime) -> list[ApiKey]:
    """Revoke the live key with this id (an int), or every live key with this name."""
    where = ApiKey.id == ident if isinstance(ident, int) else ApiKey.name == ident
    rows = list(session.scalars(select(ApiKey).where(where, ApiKey.revoked_at.is_(None))))
    for row in rows:
        row.revoked_at = now
    session.flush()
    return rows


def by_hash(session: Session, key_hash: str, kind: str) -> ApiKey | None:
    return session.scalar(select(ApiKey).where(ApiKey.key_hash == key_hash, ApiKey.kind == kind))


def instance_by_token_hash(session: Session, token_hash: str) -> InstanceDetails | None:
    row = session.scalar(select(Instance).where(Instance.worker_token_hash == token_hash))
    return details(row) if row is not None else None


def forget_token(session: Session, launch_id: str) -> None:
    update_rows(session, [Instance.launch_id == launch_id], {"worker_token_hash": None})
