"""Queries of the API's keys (`api_keys`) and of the worker-token column of `instances`: frozen
records only (`KeyRecord`, `InstanceDetails`); hashing and comparing are `access.keys`'."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.store.instances import InstanceDetails, details
from autoscaler.store.models import ApiKey, Instance
from autoscaler.store.moves import update_rows


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One admin or enrolment key as stored: its SHA-256 digest, never the key."""

    id: int
    kind: str
    name: str
    key_hash: str = field(repr=False)
    created_at: datetime
    revoked_at: datetime | None
    queues: list[str] | None
    """An enrolment key's queues (None: a key made before keys were bound to queues)."""


def _record(row: ApiKey) -> KeyRecord:
    return KeyRecord(
        row.id, row.kind, row.name, row.key_hash, row.created_at, row.revoked_at, row.queues
    )


def add(
    session: Session, kind: str, name: str, key_hash: str, now: datetime, queues: list[str] | None
) -> KeyRecord:
    row = ApiKey(kind=kind, name=name, key_hash=key_hash, created_at=now, queues=queues)
    session.add(row)
    session.flush()
    return _record(row)


def all_keys(session: Session) -> list[KeyRecord]:
    return [_record(r) for r in session.scalars(select(ApiKey).order_by(ApiKey.id))]


def revoke(session: Session, ident: int | str, now: datetime) -> list[KeyRecord]:
    """Revoke the live key with this id (an int), or every live key with this name."""
    where = ApiKey.id == ident if isinstance(ident, int) else ApiKey.name == ident
    rows = list(session.scalars(select(ApiKey).where(where, ApiKey.revoked_at.is_(None))))
    for row in rows:
        row.revoked_at = now
    session.flush()
    return [_record(r) for r in rows]


def by_hash(session: Session, key_hash: str, kind: str) -> KeyRecord | None:
    row = session.scalar(select(ApiKey).where(ApiKey.key_hash == key_hash, ApiKey.kind == kind))
    return _record(row) if row is not None else None


def instance_by_token_hash(session: Session, token_hash: str) -> InstanceDetails | None:
    row = session.scalar(select(Instance).where(Instance.worker_token_hash == token_hash))
    return details(row) if row is not None else None


def forget_token(session: Session, launch_id: str) -> None:
    update_rows(session, [Instance.launch_id == launch_id], {"worker_token_hash": None})
