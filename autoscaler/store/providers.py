"""Queries on registered providers (credentials stay encrypted; decryption is the vault's job)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoscaler.store.models import LIVE_STATES, Instance, Provider


def get_provider(session: Session, name: str) -> Provider | None:
    return session.scalar(select(Provider).where(Provider.name == name))


def stamp(session: Session) -> tuple[int, datetime | None]:
    """How many providers are registered and when one last changed: the loop reloads its config
    when this changes (one cheap query, asked every tick)."""
    count, changed = session.execute(
        select(func.count(), func.max(Provider.updated_at)).select_from(Provider)
    ).one()
    return int(count), changed


def list_providers(session: Session) -> Sequence[Provider]:
    return session.scalars(select(Provider).order_by(Provider.name)).all()


def add_provider(
    session: Session, name: str, kind: str, options: dict[str, Any], credentials: bytes | None
) -> Provider:
    row = Provider(name=name, kind=kind, options=options, credentials_encrypted=credentials)
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


def remove_provider(session: Session, row: Provider) -> None:
    session.delete(row)
    session.flush()
