"""Named leases and tick slots: one holder at a time, one evaluation per (queue, slot).

Both are single atomic statements (INSERT … ON CONFLICT), so they hold across processes and
machines on PostgreSQL, and across processes on SQLite, without a separate lock service.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, delete, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from autoscaler.store.db import upsert
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


EVALUATION = "evaluate"
"""The one evaluation lease of an unsharded control plane; shard i of n holds `evaluate:i/n`."""

_EVALUATION_KEY = 0x6175_7431
"""pg_advisory_xact_lock key that makes taking an evaluation lease one step across processes."""

_ACCOUNT_KEY = 0x6175_7432
"""pg_advisory_xact_lock key held by a sharded evaluation from its account-wide check to its
commit: the shards' launches are checked against the caps one shard at a time."""


def evaluation_lease(shard: int, shards: int) -> str:
    return EVALUATION if shards <= 1 else f"{EVALUATION}:{shard}/{shards}"


def _shards_of(name: str) -> int | None:
    """How many shards a live evaluation lease's holder splits the queues into (None: not one)."""
    if name == EVALUATION:
        return 1
    head, _, tail = name.partition(":")
    if head != EVALUATION or "/" not in tail:
        return None
    try:
        return int(tail.split("/", 1)[1])
    except ValueError:
        return None


def acquire_evaluation(
    session: Session,
    shard: int,
    shards: int,
    holder: str,
    ttl: float,
    now: datetime,
    renew: bool = False,
) -> bool:
    """Take (or, with `renew`, renew) the lease of shard `shard` of `shards`; False while
    another holder has it, or while any evaluation splitting the queues another way is live (a
    control plane moving from 1 to 4 shards, half its workers on the old config): two such
    evaluations would share queues, and each would launch without seeing the other's intents.

    On PostgreSQL the check and the take are one step under an advisory lock: exclusive to
    take (a short transaction of its own), shared to renew. A renewal is made in the decision's
    transaction and holds its lock to the commit, so the shards' decisions run side by side
    while no lease of another split can be taken under one of them (it waits for the commit,
    then sees the renewed lease). SQLite runs one shard only."""
    if session.get_bind().dialect.name == "postgresql":
        lock = "pg_advisory_xact_lock_shared" if renew else "pg_advisory_xact_lock"
        session.execute(text(f"SELECT {lock}(:k)"), {"k": _EVALUATION_KEY})
    name = evaluation_lease(shard, shards)
    live = session.execute(
        select(Lease.name, Lease.holder).where(
            (Lease.name == EVALUATION) | Lease.name.like(f"{EVALUATION}:%"),
            Lease.expires_at > now,
        )
    ).all()
    for other, other_holder in live:
        if other_holder != holder and (other == name or _shards_of(other) != shards):
            return False
    return acquire(session, name, holder, ttl, now)


def evaluation_shards(session: Session, configured: int) -> int:
    """The shards this store can run: the configured number on PostgreSQL, one on SQLite (its
    single writer would only queue them, and its leases are not one step with their check)."""
    return configured if session.get_bind().dialect.name == "postgresql" else 1


def lock_account(session: Session) -> None:
    """Hold the account-wide check until this transaction ends (PostgreSQL; SQLite's single
    writer serializes the one shard it runs)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ACCOUNT_KEY})


def release(session: Session, name: str, holder: str) -> None:
    """Give the lease up early; a lease held by someone else is left alone."""
    session.execute(delete(Lease).where(Lease.name == name, Lease.holder == holder))


def claim_ticks(
    session: Session, slots: list[tuple[str, int]], claimant: str, now: datetime
) -> set[str]:
    """Claim many (queue, slot) pairs in one statement; returns the queues this call claimed."""
    rows = [{"queue": q, "slot": n, "claimed_by": claimant, "claimed_at": now} for q, n in slots]
    claimed = upsert(session, TickSlot, rows, key=("queue", "slot"), returning=("queue",))
    return {row[0] for row in claimed}


ROUND_KEYS = {"reconcile": 0x6175_7433}
"""pg_advisory_lock keys of the rounds that must never overlap."""


@contextlib.contextmanager
def exclusive_round(engine: Engine, name: str, lock_dir: Path) -> Iterator[bool]:
    """Whether this process runs round `name` now (True) or another holds it (False). Held
    by something the holder's death releases at once, never by a row with a time to live (a
    worker killed mid-round would stop every round until it lapsed): on PostgreSQL a session
    advisory lock on a connection of its own; on SQLite, whose store is one host's file, an
    exclusive `flock` on `lock_dir/<name>.lock`."""
    if engine.dialect.name == "postgresql":
        with _advisory(engine, ROUND_KEYS[name]) as held:
            yield held
        return
    lock_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases its lock


@contextlib.contextmanager
def _advisory(engine: Engine, key: int) -> Iterator[bool]:
    conn = engine.connect()
    try:
        held = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())
        conn.commit()  # a session lock outlives the transaction; none is left open meanwhile
        yield held
        if held:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.commit()
    except BaseException:
        # a connection in doubt (killed, or its unlock not sent) never goes back to the pool
        # holding the lock: closing it for good releases it on the server
        conn.invalidate()
        raise
    finally:
        conn.close()
