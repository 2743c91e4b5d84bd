"""`db upgrade` is the one command that creates the store (and the embedded home); the
revision check the other commands use reads without writing."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import inspect

from autoscaler.cli import main
from autoscaler.store import migrate
from autoscaler.store.db import make_engine


def invoke(args: list[str], **env: str | None) -> Result:
    return CliRunner().invoke(main, args, env={"AUTOSCALER_VAULT_KEY_FILE": None, **env})


@pytest.fixture
def fresh(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_db_upgrade_on_a_fresh_folder_creates_the_store_then_commands_work(fresh):
    env: dict[str, str | None] = {
        "AUTOSCALER_HOME": None,
        "AUTOSCALER_DATABASE_URL": None,
        "AUTOSCALER_BROKER_URL": None,
    }
    upgraded = invoke(["db", "upgrade"], **env)
    assert upgraded.exit_code == 0, upgraded.output
    assert (fresh / ".autoscaler" / "state.db").is_file()
    assert (fresh / ".autoscaler" / "broker.db").is_file()
    listed = invoke(["providers", "list"], **env)
    assert listed.exit_code == 0, listed.output
    assert "no provider registered" in listed.output


def test_db_upgrade_on_postgresql_with_the_embedded_broker_prepares_its_home(fresh, pg_url):
    upgraded = invoke(
        ["db", "upgrade"],
        AUTOSCALER_HOME=None,
        AUTOSCALER_DATABASE_URL=pg_url,
        AUTOSCALER_BROKER_URL=None,
    )
    assert upgraded.exit_code == 0, upgraded.output
    assert (fresh / ".autoscaler" / "broker.db").is_file()
    with psycopg.connect(pg_url.replace("+psycopg", "")) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()


def test_revisions_reads_the_store_without_writing_to_it(db_url):
    engine = make_engine(db_url)
    try:
        current, head = migrate.revisions(engine)
        assert current is None and head is not None
        assert inspect(engine).get_table_names() == []  # not even alembic_version
        migrate.upgrade(db_url)
        assert migrate.revisions(engine) == (head, head)
    finally:
        engine.dispose()
