"""The `autoscaler` command end to end: db, providers, vault, validate — on both databases."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from autoscaler.cli import main
from autoscaler.store.db import make_engine
from autoscaler.vault import generate_key

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SECRET = "vast_SECRET_0123456789abcdef_never_print_me"


@pytest.fixture
def cli(db_url, tmp_path):
    env = {
        "AUTOSCALER_HOME": str(tmp_path / "home"),
        "AUTOSCALER_DATABASE_URL": db_url,
        "AUTOSCALER_VAULT_KEY": generate_key(),
        "AUTOSCALER_BROKER_URL": "redis://127.0.0.1:6379/15",
    }
    runner = CliRunner()

    def run(*args: str, input: str | None = None, **extra: str):
        return runner.invoke(main, list(args), env={**env, **extra}, input=input)

    assert run("db", "upgrade").exit_code == 0
    run.env = env  # type: ignore[attr-defined]
    return run


def test_validate_seed_prints_the_dry_run_once_its_provider_is_registered(cli):
    refused = cli("validate", str(EXAMPLES / "seed.yaml"))
    assert refused.exit_code != 0
    assert "unknown provider 'gpu-vast'" in refused.output
    added = cli(
        "providers",
        "add",
        "gpu-vast",
        "--kind",
        "vast",
        "--api-key-stdin",
        "--option",
        'countries=["US","CA"]',
        "--option",
        "min_cuda_version=12.1",
        input=SECRET + "\n",
    )
    assert added.exit_code == 0, added.output
    ok = cli("validate", str(EXAMPLES / "seed.yaml"))
    assert ok.exit_code == 0, ok.output
    for expected in (
        "queue inference: on gpu-vast",
        "RTX 4090",
        "at most $0.60/h",
        "0..4 machines",
        "more than 50 jobs pending",
        "older than 5m",
        "no task for 10m",
        "in US/CA",
        "CUDA ≥12.1",
        "worst case $2.40/h",
    ):
        assert expected in ok.output
    assert SECRET not in ok.output


def test_full_example_dry_run_names_schedules_and_caps(cli):
    ok = cli("validate", str(EXAMPLES / "full.yaml"))
    assert ok.exit_code == 0, ok.output
    assert "schedule '30 7 * * 1-5' (Europe/Paris) → keep at least 2 machine(s) for 2h" in ok.output
    assert "account-wide spend cap: 6 machines and $3.50/h" in ok.output
    assert "evaluation in 2 shards" in ok.output
    assert "ceil(pending / 20)" in ok.output
    assert "held to $3.50/h by limits.max_price_per_hour" in ok.output
    assert "on the broker in $WATCH_REDIS_URL" in ok.output
    assert "amqp://guest:***@127.0.0.1:5672//" in ok.output  # the password is never printed


def test_bad_config_is_refused_and_changes_nothing(cli, db_url, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((EXAMPLES / "seed.yaml").read_text().replace('"5m"', '"5 minutes"'))
    engine = make_engine(db_url)
    with engine.connect() as c:
        before = c.execute(text("SELECT count(*) FROM config_versions")).scalar()
    result = cli("validate", str(bad))
    assert result.exit_code != 0
    assert "max_latency" in result.output and "'5 minutes' is not a duration" in result.output
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM config_versions")).scalar() == before
    engine.dispose()


def test_providers_list_never_prints_a_secret_and_remove_works(cli):
    assert (
        cli(
            "providers", "add", "rp", "--kind", "runpod", "--api-key-stdin", input=SECRET + "\n"
        ).exit_code
        == 0
    )
    assert (
        cli("providers", "add", "vx", "--kind", "vast", "--api-key-env", "VAST_KEY").exit_code == 0
    )
    listed = cli("providers", "list")
    assert listed.exit_code == 0
    assert "rp\trunpod\tcredentials: stored encrypted" in listed.output
    assert "vx\tvast\tcredentials: from $VAST_KEY" in listed.output
    assert SECRET not in listed.output
    dup = cli("providers", "add", "rp", "--kind", "mock")
    assert dup.exit_code != 0 and "exists already" in dup.output
    assert cli("providers", "remove", "rp").exit_code == 0
    missing = cli("providers", "remove", "rp")
    assert missing.exit_code != 0 and "registered: vx" in missing.output


def test_bad_provider_options_are_refused_and_nothing_is_stored(cli):
    result = cli(
        "providers",
        "add",
        "v",
        "--kind",
        "vast",
        "--option",
        "min_reliability=3",
        "--option",
        "colour=red",
    )
    assert result.exit_code != 0
    assert "providers.v.min_reliability" in result.output
    assert "unknown field 'colour'" in result.output
    assert "no provider registered" in cli("providers", "list").output


def test_storing_a_key_without_a_vault_key_is_refused(cli):
    result = cli(
        "providers",
        "add",
        "rp",
        "--kind",
        "runpod",
        "--api-key-stdin",
        input=SECRET + "\n",
        AUTOSCALER_VAULT_KEY="",
    )
    assert result.exit_code != 0 and "no vault key is configured" in result.output
    assert "no provider registered" in cli("providers", "list").output


def test_vault_rotate_re_encrypts_and_wrong_key_changes_nothing(cli, db_url):
    old = cli.env["AUTOSCALER_VAULT_KEY"]
    assert (
        cli(
            "providers", "add", "rp", "--kind", "runpod", "--api-key-stdin", input=SECRET + "\n"
        ).exit_code
        == 0
    )
    engine = make_engine(db_url)

    def stored() -> bytes:
        with engine.connect() as c:
            return bytes(c.execute(text("SELECT credentials_encrypted FROM providers")).scalar())

    before = stored()
    wrong = cli("vault", "rotate", AUTOSCALER_VAULT_KEY=generate_key())
    assert wrong.exit_code != 0 and "cannot be decrypted" in wrong.output
    assert stored() == before
    new = generate_key()
    ok = cli("vault", "rotate", AUTOSCALER_VAULT_KEY=f"{new},{old}")
    assert ok.exit_code == 0 and "1 credential(s) re-encrypted" in ok.output
    after = stored()
    assert after != before and SECRET.encode() not in after
    from tests.store.helpers import vault_of

    assert vault_of(new).decrypt(after) == SECRET
    engine.dispose()


def test_validate_refuses_a_watched_queue_on_the_control_planes_redis(cli, tmp_path):
    cfg = tmp_path / "shared.yaml"
    cfg.write_text(
        "providers: {m: {kind: mock}}\n"
        "queues:\n  q:\n    metrics: {url: 'redis://127.0.0.1:6379/15', "
        "global_keyprefix: 'autoscaler-control:'}\n"
        "    autoscale: {provider: m, max_workers: 1, instance: {gpu: x, max_price_per_hour: 1}}\n"
    )
    result = cli("validate", str(cfg))
    assert result.exit_code != 0 and "requeue its unacked jobs" in result.output
    # the same when the URL comes from the environment, as in the seed's config
    by_env = tmp_path / "env.yaml"
    by_env.write_text(
        "providers: {m: {kind: mock}}\n"
        "queues:\n  q:\n    metrics: {global_keyprefix: 'autoscaler-control:'}\n"
        "    autoscale: {provider: m, max_workers: 1, instance: {gpu: x, max_price_per_hour: 1}}\n"
    )
    shared = cli(
        "validate", str(by_env), AUTOSCALER_WATCH_BROKER_URL="redis://:pw-SECRET@127.0.0.1:6379/15"
    )
    assert shared.exit_code != 0 and "requeue its unacked jobs" in shared.output
    assert "pw-SECRET" not in shared.output
    apart = cli("validate", str(by_env), AUTOSCALER_WATCH_BROKER_URL="redis://127.0.0.1:6379/3")
    assert apart.exit_code == 0, apart.output


def test_db_upgrade_prepares_the_embedded_broker(db_url, tmp_path):
    broker = tmp_path / "broker.db"
    env = {
        "AUTOSCALER_HOME": str(tmp_path),
        "AUTOSCALER_DATABASE_URL": db_url,
        "AUTOSCALER_BROKER_URL": f"sqla+sqlite:///{broker}",
    }
    result = CliRunner().invoke(main, ["db", "upgrade"], env=env)
    assert result.exit_code == 0, result.output
    assert "embedded broker" in result.output
    engine = make_engine(f"sqlite:///{broker}")
    with engine.connect() as c:
        names = {r[0] for r in c.execute(text("SELECT name FROM sqlite_master"))}
    engine.dispose()
    assert {"kombu_queue", "kombu_message"} <= names


def test_console_script_is_installed_and_runs(tmp_path):
    exe = Path(sys.executable).with_name("autoscaler")
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True)
    assert "providers" in out.stdout and "validate" in out.stdout and "vault" in out.stdout


def test_apply_records_a_version_only_when_the_effective_config_changes(cli, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text((EXAMPLES / "full.yaml").read_text())
    first = cli("apply", str(cfg), "--by", "alice", "--comment", "first")
    assert first.exit_code == 0, first.output
    assert "recorded as version 1 (3 queue(s))" in first.output
    again = cli("apply", str(cfg), "--by", "bob")
    assert "unchanged" in again.output
    cfg.write_text(cfg.read_text().replace("threshold: 50", "threshold: 80"))
    changed = cli("apply", str(cfg), "--by", "bob", "--comment", "fewer machines")
    assert "recorded as version 2" in changed.output
    lines = cli("history").output.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("v1") and "alice" in lines[0] and lines[0].endswith("— first")
    assert lines[1].startswith("v2") and "bob\tqueues.inference — fewer machines" in lines[1]
    # only the versions that changed a queue, when asked for one
    llm = cli("history", "--queue", "llm").output.strip().splitlines()
    assert [line.split("\t")[0] for line in llm] == ["v1"]


def test_apply_of_a_refused_config_records_nothing(cli, tmp_path):
    cfg = tmp_path / "c.yaml"
    text_ = (EXAMPLES / "full.yaml").read_text()
    cfg.write_text(text_.replace("max_workers: 3", "max_workers: -3"))
    result = cli("apply", str(cfg))
    assert result.exit_code != 0 and "max_workers" in result.output
    assert cli("history").exit_code != 0
