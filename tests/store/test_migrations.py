"""Migrations apply from empty on PostgreSQL and SQLite, and agree with the models."""

from __future__ import annotations

from sqlalchemy import inspect

from autoscaler.store import migrate
from autoscaler.store.db import make_engine
from autoscaler.store.models import Base


def test_upgrade_from_empty_then_models_and_migrations_agree(db_url):
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert set(Base.metadata.tables) <= tables
        assert "alembic_version" in tables
        assert migrate.differences(engine) == []
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
        assert migrate.differences(engine) != []
    finally:
        engine.dispose()
