"""Hosts to avoid: a host that failed us is left out of searches until its entry expires.

Persisted so the avoidance survives restarts (ARCHITECTURE.md, invariants). Keyed by the provider's
configured name and the host id (for Vast, the `machine_id` the search filters on).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.store.models import AvoidedHost


def avoid(session: Session, provider: str, host_id: str, reason: str, until: datetime) -> None:
    """Avoid `host_id` until `until`; a later call for the same host extends (never shortens)."""
    row = session.get(AvoidedHost, (provider, host_id))
    if row is None:
        try:
            with session.begin_nested():
                session.add(
                    AvoidedHost(provider=provider, host_id=host_id, reason=reason, until=until)
                )
            return
        except IntegrityError:  # another process inserted it first
            row = session.get(AvoidedHost, (provider, host_id), populate_existing=True)
            if row is None:  # pragma: no cover - deleted in between
                return
    row.reason = reason
    if row.until < until:
        row.until = until
    session.flush()


def active_host_ids(session: Session, provider: str, now: datetime) -> list[str]:
    """Hosts of `provider` still to be avoided at `now`, oldest first."""
    rows = session.scalars(
        select(AvoidedHost.host_id)
        .where(AvoidedHost.provider == provider, AvoidedHost.until > now)
        .order_by(AvoidedHost.created_at, AvoidedHost.host_id)
    )
    return list(rows)


class StoredHostsToAvoid:
    """`providers.base.HostsToAvoid` backed by the state store: survives restarts."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self._factory = factory

    def active(self, provider: str, now: datetime) -> list[str]:
        with self._factory() as session, session.begin():
            return active_host_ids(session, provider, now)

    def avoid(self, provider: str, host_id: str, reason: str, until: datetime) -> None:
        with self._factory() as session, session.begin():
            avoid(session, provider, host_id, reason, until)
