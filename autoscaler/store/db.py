"""Engines and sessions: the one place that knows how to open the state store."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    Engine,
    Text,
    bindparam,
    case,
    cast,
    column,
    create_engine,
    event,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import QueryableAttribute, Session, sessionmaker
from sqlalchemy.pool import QueuePool

__all__ = [
    "POOL_SIZE",
    "Session",
    "StoreError",
    "batchable",
    "make_engine",
    "pool_capacity",
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


POOL_SIZE = 15
"""Connections a PostgreSQL engine keeps and lends at once (no overflow). SQLAlchemy's own 5 +
10 overflow closed each overflow connection as it came back: under 200 heartbeats a second on
two API workers that was 350 new server processes in 20 s (a fork, a login and a ping each),
and the API admits as many requests as its pool lends (`pool_capacity`), so it kept 15 busy."""


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
    if "poolclass" not in kwargs:  # another pool takes other options
        kwargs = {"pool_size": POOL_SIZE, "max_overflow": 0} | kwargs
    return create_engine(url, pool_pre_ping=True, **kwargs)


def pool_capacity(engine: Engine) -> int | None:
    """How many connections `engine`'s pool lends at once before a checkout waits (its
    `pool_size` + `max_overflow`: POOL_SIZE on PostgreSQL, SQLAlchemy's 5 + 10 on SQLite);
    None for a pool that never makes a checkout wait. The API admits no more requests than
    this at once (`api/admission.py`)."""
    pool = engine.pool
    if not isinstance(pool, QueuePool):
        return None
    overflow = int(getattr(pool, "_max_overflow", 0))
    return None if overflow < 0 else pool.size() + overflow


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
    returning: Sequence[str] = (),
) -> list[Any]:
    """INSERT `rows` into `table`, and on a row whose `key` columns exist already set its
    `update` columns to the new values (none: keep the old row; a mapping gives each column's
    value from the rejected row, `excluded`) — where `where(excluded)` holds, if given. One
    statement for all rows, in PostgreSQL's or SQLite's own dialect (both say ON CONFLICT).
    With `returning`, those columns of each row written (inserted or updated)."""
    if not rows:
        return []
    dialect = session.get_bind().dialect
    payload = _json_rows(rows) if dialect.name == "postgresql" else None
    if payload is None:
        stmt = (pg_insert if dialect.name == "postgresql" else sqlite_insert)(table)
    else:
        names = list(dict.fromkeys(k for r in rows for k in r))
        stmt = pg_insert(table).from_select(names, _from_json(table, names, payload, dialect))
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
    final: Any = done.returning(*(getattr(table, c) for c in returning)) if returning else done
    result = session.execute(final) if payload else session.execute(final, batchable(rows))
    return list(result.all()) if returning else []


JSON_ROWS_FROM = 100
"""Upserts of at least this many rows go to PostgreSQL as one JSON document. Bound row by row
(an INSERT … VALUES batch of five parameters per row, each converted by SQLAlchemy and the
driver), the tick's 10,000 readings, statuses and samples took 1.9 s of its 4 s at 10,000
queues; as one document PostgreSQL parses them itself (`benchmarks/tick.py`)."""


def _json_rows(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The rows as one JSON array, or None where they are too few to be worth it or hold a
    value the document cannot carry exactly: NaN, infinities, bytes, or a NUL character (a
    json column takes `\\u0000`, `json_populate_recordset` does not). Those are bound one by one."""
    if len(rows) < JSON_ROWS_FROM:
        return None
    try:
        payload = json.dumps(list(rows), default=_json_value, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return None if "\\u0000" in payload else payload


def keyed_values(
    session: Session, values: Mapping[str, str], key: QueryableAttribute[Any]
) -> tuple[ColumnElement[Any], ColumnElement[bool] | None]:
    """A value per key for one UPDATE: (the value expression, the join condition to add).

    On PostgreSQL, from `JSON_ROWS_FROM` keys on, the pairs come as one JSON document joined to
    the table (UPDATE … FROM); otherwise as `CASE key WHEN … THEN …`, which PostgreSQL walks
    branch by branch for every row: 4,425 drains in one tick spent 0.5 s there."""
    if session.get_bind().dialect.name != "postgresql" or len(values) < JSON_ROWS_FROM:
        return case(dict(values), value=key), None
    doc = json.dumps([{"k": k, "v": v} for k, v in values.items()])
    pairs = (
        func.json_to_recordset(cast(bindparam("pairs", doc, type_=Text), JSON))
        .table_valued(column("k", Text), column("v", Text))
        .render_derived(with_types=True)
    )
    return pairs.c.v, key == pairs.c.k


def _json_value(value: object) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:  # as the store's UTC column type refuses it
            raise ValueError("naive datetime given to the store; use an aware UTC datetime")
        return value.astimezone(UTC).isoformat()
    raise TypeError(type(value).__name__)


def _from_json(table: type[Any], names: list[str], payload: str, dialect: Any) -> Any:
    """SELECT the columns `names` from the rows of `payload`, typed by the table's own row type
    (`json_populate_recordset`: a key the JSON lacks is NULL, a JSON column keeps its value)."""
    t = table.__table__
    row_type: Any = literal_column(f"NULL::{dialect.identifier_preparer.format_table(t)}")
    src = func.json_populate_recordset(
        row_type, cast(bindparam("rows", payload, type_=Text), JSON)
    ).table_valued(*(t.c[n].name for n in names))
    return select(*(src.c[t.c[n].name] for n in names))
