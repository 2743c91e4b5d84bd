"""A newcomer's first hour: commands on a store that was never set up fail with the fix, not a
traceback, and only `db upgrade` creates anything."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from click.testing import CliRunner, Result
from sqlalchemy import text

from autoscaler.cli import main
from autoscaler.store import migrate
from autoscaler.store.db import make_engine
from autoscaler.vault import generate_key

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOT_SET_UP = "is not set up: run `autoscaler db upgrade` first"

# Every command that needs the store, with what it needs to get that far.
STORE_COMMANDS = {
    "providers list": ["providers", "list"],
    "providers add": ["providers", "add", "m", "--kind", "mock"],
    "providers remove": ["providers", "remove", "m"],
    "history": ["history"],
    "apply": ["apply", str(EXAMPLES / "full.yaml")],
    "vault rotate": ["vault", "rotate"],
}


def invoke(args: list[str], **env: str | None) -> Result:
    base: dict[str, str | None] = {
        "AUTOSCALER_VAULT_KEY": generate_key(),
        "AUTOSCALER_BROKER_URL": "redis://127.0.0.1:6379/15",
        "AUTOSCALER_RESULT_BACKEND": None,
        "AUTOSCALER_VAULT_KEY_FILE": None,
    }
    return CliRunner().invoke(main, args, env={**base, **env})


def assert_clean_refusal(result: Result, expected: str) -> None:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), "".join(
        traceback.format_exception(result.exception)
    )
    assert expected in result.output
    assert "Traceback" not in result.output and "sqlalchemy" not in result.output.lower()


@pytest.fixture
def fresh(tmp_path, monkeypatch) -> Path:
    """An empty folder with the embedded defaults: nothing set, nothing created yet."""
    monkeypatch.chdir(tmp_path)
    for name in ("AUTOSCALER_HOME", "AUTOSCALER_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def fresh_env() -> dict[str, str | None]:
    return {"AUTOSCALER_HOME": None, "AUTOSCALER_DATABASE_URL": None}


# ------------------------------------------------------------------ a store never set up


@pytest.mark.parametrize("args", STORE_COMMANDS.values(), ids=STORE_COMMANDS.keys())
def test_a_command_on_a_fresh_folder_says_to_run_db_upgrade_and_creates_nothing(fresh, args):
    result = invoke(args, **fresh_env())
    assert_clean_refusal(result, NOT_SET_UP)
    assert "sqlite:///" in result.output and "state.db" in result.output  # which store
    assert list(fresh.iterdir()) == [], "nothing may be created but by `db upgrade`"


@pytest.mark.parametrize("args", STORE_COMMANDS.values(), ids=STORE_COMMANDS.keys())
def test_a_command_on_a_postgresql_database_never_migrated_says_so_and_creates_nothing(
    pg_url, args
):
    result = invoke(args, AUTOSCALER_DATABASE_URL=pg_url)
    assert_clean_refusal(result, NOT_SET_UP)
    engine = make_engine(pg_url)
    with engine.connect() as c:
        tables = c.execute(
            text("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")
        ).scalar()
    engine.dispose()
    assert tables == 0


def test_an_empty_sqlite_file_is_not_a_store(tmp_path):
    state = tmp_path / "state.db"
    state.touch()  # what an earlier `validate` used to leave behind
    result = invoke(["providers", "list"], AUTOSCALER_DATABASE_URL=f"sqlite:///{state}")
    assert_clean_refusal(result, NOT_SET_UP)


def test_an_unreachable_postgresql_is_named_redacted_without_a_traceback(fresh):
    url = "postgresql://autoscaler:pw-SECRET-42@127.0.0.1:1/autoscaler"
    result = invoke(["providers", "list"], AUTOSCALER_DATABASE_URL=url)
    assert_clean_refusal(result, "cannot be reached")
    assert "postgresql://autoscaler:***@127.0.0.1:1/autoscaler" in result.output
    assert "pw-SECRET-42" not in result.output


def test_a_store_behind_the_migrations_says_to_upgrade(tmp_path):
    script = ScriptDirectory.from_config(migrate.alembic_config(""))
    base = script.get_base()
    if base == script.get_current_head():
        pytest.skip("a single migration: no older revision to be at")
    url = f"sqlite:///{tmp_path / 'state.db'}"
    migrate.upgrade(url, str(base))
    result = invoke(["providers", "list"], AUTOSCALER_DATABASE_URL=url)
    assert_clean_refusal(result, "run `autoscaler db upgrade`")
    assert str(base) in result.output


# ------------------------------------------------------------------ validate without a store


def test_validate_on_a_fresh_folder_checks_the_file_and_creates_nothing(fresh):
    result = invoke(["validate", str(EXAMPLES / "full.yaml")], **fresh_env())
    assert result.exit_code == 0, result.output
    assert "Dry run" in result.output and "queue inference: on gpu-vast" in result.output
    notes = [line for line in result.output.splitlines() if "registered providers" in line]
    assert len(notes) == 1 and "autoscaler db upgrade" in notes[0]
    assert list(fresh.iterdir()) == []


def test_validate_refuses_a_bad_file_before_it_needs_a_store(fresh, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((EXAMPLES / "seed.yaml").read_text().replace('"5m"', '"5 minutes"'))
    result = invoke(["validate", str(bad)], **fresh_env())
    assert_clean_refusal(result, "'5 minutes' is not a duration")
    assert NOT_SET_UP not in result.output
    assert sorted(p.name for p in fresh.iterdir()) == ["bad.yaml"]


def test_validate_of_an_empty_file_is_refused_with_a_minimal_config(fresh):
    empty = fresh / "empty.yaml"
    empty.write_text("# my autoscaler config\n")
    result = invoke(["validate", str(empty)], **fresh_env())
    assert_clean_refusal(result, "no queue is configured")
    assert "queues:" in result.output and "worst case" not in result.output


def test_validate_without_a_store_refuses_a_provider_it_cannot_find_with_the_fix(fresh):
    result = invoke(["validate", str(EXAMPLES / "seed.yaml")], **fresh_env())
    assert_clean_refusal(result, "unknown provider 'gpu-vast'")
    assert "autoscaler db upgrade" in result.output  # the registered ones could not be read
    assert "providers:" in result.output  # or declare it in the file
    assert list(fresh.iterdir()) == []


def test_validate_without_postgresql_still_checks_the_file(fresh):
    url = "postgresql://autoscaler:pw-SECRET-42@127.0.0.1:1/autoscaler"
    result = invoke(["validate", str(EXAMPLES / "full.yaml")], AUTOSCALER_DATABASE_URL=url)
    assert result.exit_code == 0, result.output
    assert "cannot be reached" in result.output and "pw-SECRET-42" not in result.output


# ------------------------------------------------------------------ validate with a store


@pytest.fixture
def store(db_url, tmp_path) -> dict[str, str]:
    env = {"AUTOSCALER_HOME": str(tmp_path / "home"), "AUTOSCALER_DATABASE_URL": db_url}
    assert invoke(["db", "upgrade"], **env).exit_code == 0
    return env


def test_validate_says_the_files_provider_overrides_the_registered_one(store):
    added = invoke(
        ["providers", "add", "gpu-vast", "--kind", "vast", "--api-key-env", "VAST_API_KEY"],
        **store,
    )
    assert added.exit_code == 0, added.output
    result = invoke(["validate", str(EXAMPLES / "full.yaml")], **store)
    assert result.exit_code == 0, result.output
    assert (
        "provider gpu-vast: declared in this file (overrides the registered one of the same name)"
        in result.output
    )
    assert "registered providers could not be read" not in result.output


@pytest.mark.parametrize("url", ["redis://h:abc/0", "postgresql://u@h:port/db"])
def test_a_database_url_whose_port_is_no_number_is_refused_not_a_crash(tmp_path, url):
    """Found by the CLI fuzz: SQLAlchemy's URL parser raises ValueError on such a port."""
    result = CliRunner().invoke(
        main,
        ["providers", "list"],
        env={"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": url},
    )
    assert result.exit_code == 2, result.output
    assert "is not a database URL" in result.output and "internal error" not in result.output
