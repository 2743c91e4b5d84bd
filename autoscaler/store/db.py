"""Engines and sessions: the one place that knows how to open the state store."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, Engine, create_engine, event, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

__all__ = [
    "Session",
    "StoreError",
    "batchable",
    "make_engine",
    "session_factory",
    "sessionmaker",
    "store_now",
    "transaction",
    "upsert",
]
"""`Session` and `sessionmaker` are SQLAlchemy's, named here so that the layers above the store
can type a session without importing SQLAlchemy (an import-linter contract)."""

StoreError = SQLAlchemyError
"""Any failure of the store (unreachable, a lost connection, a constraint): what the layers above
catch without importing SQLAlchemy."""


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine tuned for the control plane: SQLite waits for locks instead of failing."""
    parsed = make_url(url)
    if parsed.drivername == "postgresql":  # psycopg 3 is the driver we ship
        url = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


def batchable(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows for one multi-row INSERT, ordered so that those with the same NULL columns are
    together: SQLAlchemy cuts its INSERT … VALUES batches where that changes, so 100 rows
    alternating NULL and values were 41 statements on PostgreSQL, and are 2 in this order."""
    return sorted(
        (dict(r) for r in rows), key=lambda r: tuple(sorted(k for k, v in r.items() if v is None))
    )


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on any error."""
    with factory() as session, session.begin():
        yield session


def store_now(session: Session) -> datetime:
    """The state store's clock: what heartbeats are stamped with and silence is judged by.

    Every process that stamps a sign of life (the API, reconcile's sightings) and every process
    that judges silence asks this one clock, so a reconciler whose own clock runs five minutes
    ahead no longer destroys a machine seen five seconds ago. PostgreSQL's `clock_timestamp()`
    (the time now, not the transaction's start); the embedded SQLite store is a file on this
    machine, whose clock it shares."""
    if session.get_bind().dialect.name == "postgresql":
        value = session.execute(text("SELECT clock_timestamp()")).scalar_one()
        if isinstance(value, datetime):
            return value.astimezone(UTC)
    return datetime.now(UTC)


def upsert(
    session: Session,
    table: type[Any],
    rows: Sequence[Mapping[str, Any]],
    key: Sequence[str],
    update: Sequence[str] | Mapping[str, Callable[[Any], Any]] = (),
    where: Callable[[Any], ColumnElement[bool]] | None = None,
) -> None:
    """INSERT `rows` into `table`, and on a row whose `key` columns exist already set its
    `update` columns to the new values (none: keep the old row; a mapping gives each column's
    value from the rejected row, `excluded`) — where `where(excluded)` holds, if given. One
    statement for all rows, in PostgreSQL's or SQLite's own dialect (both say ON CONFLICT)."""
    if not rows:
        return
    ins = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    stmt = ins(table)
    columns = [getattr(table, k) for k in key]
    if update:
        done = stmt.on_conflict_do_update(
            index_elements=columns,
            set_={
                c: update[c](stmt.excluded) if isinstance(update, Mapping) else stmt.excluded[c]
                for c in update
            },
            where=where(stmt.excluded) if where is not None else None,
        )
    else:
        done = stmt.on_conflict_do_nothing(index_elements=columns)
    session.execute(done, batchable(rows))
