"""Migrations apply from empty on PostgreSQL and SQLite, and agree with the models; 0020
backfills the machines' state histories from their columns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import inspect, select

from autoscaler.lifecycle import InstanceState as S
from autoscaler.store import migrate, spend, transitions
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import Base, Instance
from tests.store.helpers import differences


def test_upgrade_from_empty_then_models_and_migrations_agree(db_url):
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert set(Base.metadata.tables) <= tables
        assert "alembic_version" in tables
        assert differences(engine) == []
    finally:
        engine.dispose()


def test_upgrade_is_idempotent_and_downgrade_returns_to_empty(db_url):
    migrate.upgrade(db_url)
    migrate.upgrade(db_url)
    migrate.downgrade(db_url, "base")
    engine = make_engine(db_url)
    try:
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()
    migrate.upgrade(db_url)


def test_a_model_change_without_migration_is_detected(db_url):
    """The agreement check itself must be able to fail."""
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE leases")
        assert differences(engine) != []
    finally:
        engine.dispose()


def test_instance_transitions_are_backfilled_from_the_columns(db_url):
    """0020 writes a history for every existing machine from its columns, as well as they can
    say: each state at its latest visit, in time order, the current state last, a first row
    with no `src`. A machine stopped and resumed twice shows its latest stop only (its columns
    know no more), so its bill is what the columns billed; machines moved from then on are
    exact (`tests/store/test_transitions.py`)."""
    t0 = datetime(2026, 6, 1, tzinfo=UTC)

    def at(minutes: float) -> datetime:
        return t0 + timedelta(minutes=minutes)

    def row(launch_id: str, state: S, **times: float) -> Instance:
        return Instance(
            launch_id=launch_id,
            queue="q",
            provider="pods",
            state=state,
            price_per_hour=2.0,
            storage_price_per_hour=0.01,
            created_at=at(-3),
            running_tasks=0,
            updated_at=at(times.pop("updated", 0)),
            **{f"{name}_at": at(m) for name, m in times.items()},
        )

    migrate.upgrade(db_url, "0019")
    engine = make_engine(db_url)
    try:
        with transaction(session_factory(engine)) as s:
            s.add_all(
                [
                    row(  # stopped 01:00-04:00 and 05:00-08:00: the columns keep the second
                        "warm", S.READY, pending=-3, creating=-2, booting=0, ready=490,
                        draining=290, drained=295, stopping=298, stopped=300, resuming=480,
                        updated=490,
                    ),
                    row(
                        "gone", S.TERMINATED, pending=-3, creating=-2, booting=0, ready=10,
                        terminating=100, terminated=102, updated=102,
                    ),
                    row("failed", S.FAILED, pending=-3, creating=-2, updated=5),  # no failed_at
                    row("intent", S.PENDING, pending=-3, updated=-3),
                ]
            )  # fmt: skip
        migrate.upgrade(db_url)
        now = at(600)
        with transaction(session_factory(engine)) as s:
            rows = {r.launch_id: r for r in s.scalars(select(Instance))}
            histories = transitions.history(s, list(rows))
            for launch_id, r in rows.items():
                # as the columns billed: nothing better can be known of the past
                assert spend.billed(r, now, histories=histories) == pytest.approx(
                    spend.billed(r, now, histories={})
                ), launch_id
        for history in histories.values():
            assert history[0].src is None
            assert [t.src for t in history[1:]] == [t.dst for t in history[:-1]]
        assert [(t.dst, t.at) for t in histories["warm"]] == [
            (S.PENDING, at(-3)), (S.CREATING, at(-2)), (S.BOOTING, at(0)),
            (S.DRAINING, at(290)), (S.DRAINED, at(295)), (S.STOPPING, at(298)),
            (S.STOPPED, at(300)), (S.RESUMING, at(480)), (S.READY, at(490)),
        ]  # fmt: skip
        assert [t.dst for t in histories["gone"]][-2:] == [S.TERMINATING, S.TERMINATED]
        assert [(t.dst, t.at) for t in histories["failed"]][-1] == (S.FAILED, at(5))
        assert [t.dst for t in histories["intent"]] == [S.PENDING]
        assert spend.billed(rows["warm"], now, histories=histories)[1] == pytest.approx(
            7 * 2.0 + 3 * 0.01
        )
        migrate.downgrade(db_url, "0019")
        assert "instance_transitions" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()
