"""Queries on registered providers (credentials stay encrypted; decryption is the vault's job),
read as frozen records (`ProviderRecord`), never ORM rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from autoscaler.store.models import LIVE_STATES, Instance, ProviderRow


@dataclass(frozen=True, slots=True)
class ProviderRecord:
    """One registered provider: its kind, options and encrypted key (never in clear)."""

    id: int
    name: str
    kind: str
    options: dict[str, Any]
    credentials_encrypted: bytes | None = field(repr=False)
    """Never in clear, and left out of the repr all the same."""
    created_at: datetime
    updated_at: datetime


def _record(row: ProviderRow) -> ProviderRecord:
    return ProviderRecord(
        row.id,
        row.name,
        row.kind,
        row.options,
        row.credentials_encrypted,
        row.created_at,
        row.updated_at,
    )


def get_provider(session: Session, name: str) -> ProviderRecord | None:
    row = session.scalar(select(ProviderRow).where(ProviderRow.name == name))
    return _record(row) if row is not None else None


def stamp(session: Session) -> tuple[int, datetime | None]:
    """How many providers are registered and when one last changed: the loop reloads its config
    when this changes (one cheap query, asked every tick)."""
    count, changed = session.execute(
        select(func.count(), func.max(ProviderRow.updated_at)).select_from(ProviderRow)
    ).one()
    return int(count), changed


def list_providers(session: Session) -> list[ProviderRecord]:
    return [_record(r) for r in session.scalars(select(ProviderRow).order_by(ProviderRow.name))]


def add_provider(
    session: Session, name: str, kind: str, options: dict[str, Any], credentials: bytes | None
) -> ProviderRecord:
    row = ProviderRow(name=name, kind=kind, options=options, credentials_encrypted=credentials)
    session.add(row)
    session.flush()
    return _record(row)


def set_credentials(session: Session, name: str, credentials: bytes | None) -> bool:
    """Replace provider `name`'s encrypted key (the vault's rotation); its `updated_at` moves
    on, so the loop reloads it. False if no provider has that name."""
    result = session.execute(
        update(ProviderRow)
        .where(ProviderRow.name == name)
        .values(credentials_encrypted=credentials)
    )
    return bool(getattr(result, "rowcount", 0))


def live_instance_count(session: Session, provider: str) -> int:
    return int(
        session.scalar(
            select(func.count())
            .select_from(Instance)
            .where(Instance.provider == provider, Instance.state.in_(LIVE_STATES))
        )
        or 0
    )


def remove_provider(session: Session, name: str) -> None:
    session.execute(delete(ProviderRow).where(ProviderRow.name == name))
