"""Multi-row inserts stay one statement or two whatever the mix of NULLs (the tick's statement
count must not grow with queues): `store.db.batchable` orders rows so SQLAlchemy's batches hold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import event, func, select

from autoscaler.store import migrate, queue_samples
from autoscaler.store.db import batchable, make_engine, session_factory, transaction
from autoscaler.store.models import QueueSample


@given(st.lists(st.dictionaries(st.sampled_from("abc"), st.none() | st.integers(0, 3))))
def test_batchable_keeps_every_row_and_groups_rows_by_their_null_columns(rows):
    out = batchable(rows)
    assert sorted(map(repr, out)) == sorted(map(repr, rows))
    shapes = [tuple(sorted(k for k, v in r.items() if v is None)) for r in out]
    assert shapes == sorted(shapes)


def test_a_hundred_samples_with_mixed_nulls_are_one_statement_or_two(pg_url):
    migrate.upgrade(pg_url)
    engine = make_engine(pg_url)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    now = datetime.now(UTC)
    samples = [
        {
            "queue": f"q{i}",
            "at": now,
            "pending": i,
            "running": None if i % 5 else 1,  # alternating NULLs: 41 statements unordered
            "workers": 0,
            "booting": 0,
            "desired": i,
        }
        for i in range(100)
    ]
    try:
        with transaction(session_factory(engine)) as session:
            statements.clear()
            queue_samples.record(session, samples, now - timedelta(days=1))
            inserts = [s for s in statements if s.lstrip().upper().startswith("INSERT")]
            assert len(inserts) <= 2, len(inserts)
            assert session.scalar(select(func.count()).select_from(QueueSample)) == 100
    finally:
        engine.dispose()


def test_job_records_expire_in_bounded_batches_and_only_when_writing(pg_url, monkeypatch):
    from autoscaler.store import job_records
    from autoscaler.store.models import JobRecord

    migrate.upgrade(pg_url)
    engine = make_engine(pg_url)
    now = datetime.now(UTC)
    old = now - job_records.KEEP - timedelta(hours=1)

    def job(i: int, at: datetime) -> dict[str, object]:
        return {
            "queue": "q",
            "task_id": f"t{i}",
            "worker": "w",
            "arrived_at": None,
            "started_at": at,
            "finished_at": at,
            "runtime_s": 1.0,
        }

    def count() -> int:
        with transaction(session_factory(engine)) as session:
            return session.scalar(select(func.count()).select_from(JobRecord)) or 0

    monkeypatch.setattr(job_records, "EXPIRE_BATCH", 3)
    try:
        with transaction(session_factory(engine)) as session:
            session.execute(JobRecord.__table__.insert(), [job(i, old) for i in range(5)])
        with transaction(session_factory(engine)) as session:
            job_records.record(session, [], now)  # no jobs: nothing expires
        assert count() == 5
        with transaction(session_factory(engine)) as session:
            job_records.record(session, [job(100, now)], now)
        assert count() == 1 + 5 - 3
        with transaction(session_factory(engine)) as session:
            job_records.record(session, [job(101, now)], now)
        assert count() == 2
    finally:
        engine.dispose()
