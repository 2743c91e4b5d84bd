"""Queries on registered providers (credentials stay encrypted; decryption is the vault's job)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoscaler.store.models import LIVE_STATES, Instance, ProviderRow


def get_provider(session: Session, name: str) -> ProviderRow | None:
    return session.scalar(select(ProviderRow).where(ProviderRow.name == name))


def stamp(session: Session) -> tuple[int, datetime | None]:
    """How many providers are registered and when one last changed: the loop reloads its config
    when this changes (one cheap query, asked every tick)."""
    count, changed = session.execute(
        select(func.count(), func.max(ProviderRow.updated_at)).select_from(ProviderRow)
    ).one()
    return int(count), changed


def list_providers(session: Session) -> Sequence[ProviderRow]:
    return session.scalars(select(ProviderRow).order_by(ProviderRow.name)).all()


def add_provider(
    session: Session, name: str, kind: str, options: dict[str, Any], credentials: bytes | None
) -> ProviderRow:
    row = ProviderRow(name=name, kind=kind, options=options, credentials_encrypted=credentials)
    session.add(row)
    session.flush()
    return row


def live_instance_count(session: Session, provider: str) -> int:
    return int(
        session.scalar(
            select(func.count())
            .select_from(Instance)
            .where(Instance.provider == provider, Instance.state.in_(LIVE_STATES))
        )
        or 0
    )


def remove_provider(session: Session, row: ProviderRow) -> None:
    session.delete(row)
    session.flush()
