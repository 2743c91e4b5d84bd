"""Named leases and tick slots: one holder at a time, one evaluation per (queue, slot).

Both are single atomic statements (INSERT … ON CONFLICT), so they hold across processes and
machines on PostgreSQL, and across processes on SQLite, without a separate lock service.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from autoscaler.store.models import Lease, TickSlot


def _insert(session: Session, table: Any) -> Any:
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"leases need PostgreSQL or SQLite, not {dialect}")


def acquire(session: Session, name: str, holder: str, ttl: float, now: datetime) -> bool:
    """Take or renew lease `name` for `ttl` seconds; False while someone else holds it."""
    expires = now + timedelta(seconds=ttl)
    stmt = _insert(session, Lease.__table__).values(
        name=name, holder=holder, expires_at=expires, acquired_at=now
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=[Lease.name],
        set_={"holder": holder, "expires_at": expires},
        where=(Lease.__table__.c.holder == holder) | (Lease.__table__.c.expires_at <= now),
    )
    session.execute(stmt)
    current = session.scalar(select(Lease.holder).where(Lease.name == name))
    return current == holder


def release(session: Session, name: str, holder: str) -> None:
    """Give the lease up early; a lease held by someone else is left alone."""
    session.execute(delete(Lease).where(Lease.name == name, Lease.holder == holder))


def holder_of(session: Session, name: str, now: datetime) -> str | None:
    lease = session.scalar(select(Lease).where(Lease.name == name))
    if lease is None or lease.expires_at <= now:
        return None
    return lease.holder


def claim_tick(session: Session, queue: str, slot: int, claimant: str, now: datetime) -> bool:
    """True for the first claim of (queue, slot); a duplicate (second beat, redelivery): False."""
    stmt = (
        _insert(session, TickSlot.__table__)
        .values(queue=queue, slot=slot, claimed_by=claimant, claimed_at=now)
        .on_conflict_do_nothing(index_elements=[TickSlot.queue, TickSlot.slot])
        .returning(TickSlot.__table__.c.slot)
    )
    return session.execute(stmt).first() is not None


def claim_ticks(
    session: Session, slots: list[tuple[str, int]], claimant: str, now: datetime
) -> set[str]:
    """Claim many (queue, slot) pairs in one statement; returns the queues this call claimed."""
    if not slots:
        return set()
    stmt = (
        _insert(session, TickSlot.__table__)
        .on_conflict_do_nothing(index_elements=[TickSlot.queue, TickSlot.slot])
        .returning(TickSlot.__table__.c.queue)
    )
    # Rows as parameters (not a VALUES list): compiled once, sent in batches by the driver.
    params = [{"queue": q, "slot": n, "claimed_by": claimant, "claimed_at": now} for q, n in slots]
    return {row[0] for row in session.execute(stmt, params).all()}


def prune_ticks(session: Session, before: datetime) -> int:
    """Old slots only guard against duplicates of *recent* ticks; drop the rest."""
    old = delete(TickSlot).where(TickSlot.claimed_at < before).returning(TickSlot.slot)
    return len(session.execute(old).all())
