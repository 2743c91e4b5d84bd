"""Engines and sessions: the one place that knows how to open the state store."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


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
