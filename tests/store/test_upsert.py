"""`store.db.upsert` writes the same rows whichever way it sends them: bound row by row, or, on
PostgreSQL from `JSON_ROWS_FROM` rows on, as one JSON document (`json_populate_recordset`)."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, func, select

from autoscaler.store import migrate
from autoscaler.store.db import JSON_ROWS_FROM, make_engine, session_factory, transaction, upsert
from autoscaler.store.models import JobRecord, MetricReading, QueueStatus, TickSlot
from tests.conftest import PG_ADMIN_DSN, PG_URL_TEMPLATE

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
_row = st.tuples(st.integers(0, 400), st.integers(0, 10**6), _json | st.just({"gaps": [1.5]}))
_batch = st.lists(_row, max_size=20, unique_by=lambda r: r[0]) | st.lists(
    _row, min_size=JSON_ROWS_FROM + 10, max_size=JSON_ROWS_FROM + 60, unique_by=lambda r: r[0]
)


@pytest.fixture(scope="module")
def pg_sessions():
    """One database for the module: hypothesis runs many examples in it."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = PG_URL_TEMPLATE.format(db=name)
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        yield session_factory(engine)
    finally:
        engine.dispose()
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(_batch, min_size=1, max_size=3))
def test_an_upsert_writes_the_same_rows_bound_or_as_one_document(pg_sessions, batches):
    """Batches of queue statuses (a key seen again updates its row; a None history keeps the
    stored one, as `coalesce` says), big and small, against a model of what ON CONFLICT does."""
    with transaction(pg_sessions) as s:
        s.execute(delete(QueueStatus))
    model: dict[str, dict[str, Any]] = {}
    for batch in batches:
        rows = {}
        for q, version, doc in batch:  # one row per key (ON CONFLICT cannot update one twice)
            rows[f"q{q}"] = {
                "queue": f"q{q}",
                "evaluated_at": T0 + timedelta(seconds=version),
                "config_version": version,
                "status": {"doc": doc},
                "history": doc if isinstance(doc, dict) and doc else None,
            }
        with transaction(pg_sessions) as s:
            upsert(
                s,
                QueueStatus,
                list(rows.values()),
                key=("queue",),
                update={
                    "evaluated_at": lambda new: new.evaluated_at,
                    "config_version": lambda new: new.config_version,
                    "status": lambda new: new.status,
                    "history": lambda new: func.coalesce(new.history, QueueStatus.history),
                },
            )
        for q, row in rows.items():
            kept = model.get(q, {}).get("history")
            model[q] = dict(row, history=row["history"] if row["history"] is not None else kept)
    with transaction(pg_sessions) as s:
        got = {
            r.queue: {
                "queue": r.queue,
                "evaluated_at": r.evaluated_at,
                "config_version": r.config_version,
                "status": r.status,
                "history": r.history,
            }
            for r in s.scalars(select(QueueStatus))
        }
    assert got == model


def test_a_big_claim_returns_the_rows_it_inserted_only(pg_sessions):
    """`returning` gives the rows written, not the ones ON CONFLICT DO NOTHING skipped, through
    the document as through bound rows (the tick's slot claim relies on it)."""
    with transaction(pg_sessions) as s:
        s.execute(delete(TickSlot))
        first = [
            {"queue": f"q{i}", "slot": 1, "claimed_by": "a", "claimed_at": T0}
            for i in range(0, 400, 2)
        ]
        assert len(upsert(s, TickSlot, first, key=("queue", "slot"), returning=("queue",))) == 200
    with transaction(pg_sessions) as s:
        every = [
            {"queue": f"q{i}", "slot": 1, "claimed_by": "b", "claimed_at": T0} for i in range(400)
        ]
        got = upsert(s, TickSlot, every, key=("queue", "slot"), returning=("queue",))
        assert sorted(r[0] for r in got) == sorted(f"q{i}" for i in range(1, 400, 2))
        few = upsert(s, TickSlot, every[:3], key=("queue", "slot"), returning=("queue",))
        assert few == []


def test_values_json_cannot_carry_are_bound_row_by_row(pg_sessions):
    """A NaN runtime is refused by a JSON document; those rows go bound and still land whole; a
    naive timestamp is refused either way, with nothing written."""
    jobs = [
        {
            "queue": "q",
            "task_id": f"t{i}",
            "worker": "w",
            "started_at": T0,
            "finished_at": T0,
            "runtime_s": float("nan") if i == 7 else float(i),
        }
        for i in range(JSON_ROWS_FROM + 5)
    ]
    with transaction(pg_sessions) as s:
        s.execute(delete(JobRecord))
        upsert(s, JobRecord, jobs, key=("queue", "task_id", "reporter"))
    with transaction(pg_sessions) as s:
        got = dict(s.execute(select(JobRecord.task_id, JobRecord.runtime_s)).all())
    assert len(got) == JSON_ROWS_FROM + 5 and math.isnan(got["t7"]) and got["t8"] == 8.0
    naive = [
        dict(r, source="s", queue=f"n{i}", read_at=T0.replace(tzinfo=None), reading={})
        for i, r in enumerate({} for _ in range(JSON_ROWS_FROM))
    ]
    with pytest.raises(Exception, match="naive datetime"), transaction(pg_sessions) as s:
        upsert(s, MetricReading, naive, key=("source", "queue"), update=("reading", "read_at"))
    with transaction(pg_sessions) as s:
        assert s.scalar(select(func.count()).select_from(MetricReading)) == 0
