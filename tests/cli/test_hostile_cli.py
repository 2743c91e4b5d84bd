"""Hostile CLI invocations: each is a refusal (a message, exit 2), never a traceback or a hang;
anything unforeseen goes through one error boundary (a traceback only with --debug)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from autoscaler.cli import main
from autoscaler.sim.trace import Job, write_csv
from autoscaler.vault import generate_key

REPO = Path(__file__).resolve().parents[2]
SIM_CONFIG = REPO / "autoscaler" / "sim" / "traces" / "sim-config.yaml"


def clean_refusal(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), repr(result.exception)
    for f in fragments:
        assert f in result.output, result.output


@pytest.fixture
def cli(db_url, tmp_path):
    env = {
        "AUTOSCALER_HOME": str(tmp_path / "home"),
        "AUTOSCALER_DATABASE_URL": db_url,
        "AUTOSCALER_VAULT_KEY": generate_key(),
        "AUTOSCALER_BROKER_URL": "redis://127.0.0.1:6379/15",
    }
    runner = CliRunner()

    def run(*args: str, input: str | bytes | None = None, **extra: str):
        return runner.invoke(main, list(args), env={**env, **extra}, input=input)

    assert run("db", "upgrade").exit_code == 0
    return run


@pytest.fixture
def bare(tmp_path):
    """The CLI without a store (validate and simulate need none)."""
    runner = CliRunner()
    env = {"AUTOSCALER_HOME": str(tmp_path / "home")}

    def run(*args: str, input: str | bytes | None = None, **extra: str):
        return runner.invoke(main, list(args), env={**env, **extra}, input=input)

    return run


# --------------------------------------------------------------------------- providers add


def test_a_provider_name_over_100_characters_is_refused(cli):
    clean_refusal(cli("providers", "add", "p" * 101, "--kind", "mock"), "100")


@pytest.mark.parametrize("name", ["a\x00b", "a\nb", " a", "a\tb", ""])
def test_a_provider_name_with_control_characters_is_refused(cli, name):
    clean_refusal(cli("providers", "add", name, "--kind", "mock"), "name")
    listed = cli("providers", "list")
    assert listed.exit_code == 0 and "no provider registered" in listed.output


def test_a_key_on_stdin_that_is_not_utf8_is_refused(cli):
    result = cli(
        "providers", "add", "v", "--kind", "vast", "--api-key-stdin", input=b"\xff\xfe key \xe9\n"
    )
    clean_refusal(result, "UTF-8")


def test_deeply_nested_options_json_is_refused(cli):
    deep = '{"countries": ' + "[" * 100_000 + "]" * 100_000 + "}"
    clean_refusal(
        cli("providers", "add", "v", "--kind", "vast", "--options-json", deep), "--options-json"
    )


def test_an_option_with_thousands_of_digits_is_refused(cli):
    result = cli(
        "providers", "add", "v", "--kind", "vast", "--option", "min_bandwidth_mbps=" + "9" * 5000
    )
    clean_refusal(result, "digits")


def test_a_secret_pasted_into_an_option_is_masked_in_the_refusal(cli):
    secret = "sk-live-0123456789ABCDEF-never-print"
    result = cli("providers", "add", "v", "--kind", "vast", "--option", f"countries={secret}")
    clean_refusal(result)
    assert secret not in result.output


# ------------------------------------------------------------------------------- validate


def test_validate_a_file_that_is_not_utf8(bare, tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"queues:\n  caf\xe9: {}\n")
    clean_refusal(bare("validate", str(p)), "UTF-8")


@pytest.mark.timeout(60)
def test_validate_dev_zero(bare):
    clean_refusal(bare("validate", "/dev/zero"), "regular file")


def test_a_bad_port_in_the_control_broker_url_is_refused(bare, tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "providers": {"gpu": {"kind": "mock"}},
                "queues": {
                    "jobs": {
                        "autoscale": {
                            "provider": "gpu",
                            "max_workers": 1,
                            "instance": {"gpu": "x", "max_price_per_hour": 1},
                        }
                    }
                },
            }
        )
    )
    result = bare("validate", str(p), AUTOSCALER_BROKER_URL="redis://:s3cr3t-pw@h:abc/15")
    clean_refusal(result, "AUTOSCALER_BROKER_URL")
    assert "s3cr3t-pw" not in result.output


# ------------------------------------------------------------------------------- simulate


def _trace(tmp_path: Path) -> Path:
    p = tmp_path / "t.csv"
    write_csv([Job(0.0, 60.0), Job(30.0, 60.0)], p)
    return p


@pytest.mark.parametrize(
    "text",
    [
        "providers: [a, b]\nqueues: {}\n",
        "queues: [a]\n",
        "queues: {a: [1]}\n",
        "queues: {a: {autoscale: [1]}}\n",
        "queues: [\n",
        "\x00",
        "- 1\n- 2\n",
    ],
    ids=[
        "providers list",
        "queues list",
        "queue list",
        "autoscale list",
        "bad yaml",
        "nul",
        "top list",
    ],
)
def test_simulate_with_a_malformed_config_is_refused(bare, tmp_path, text):
    c = tmp_path / "c.yaml"
    c.write_text(text)
    clean_refusal(bare("simulate", "--trace", str(_trace(tmp_path)), "--config", str(c)))


@pytest.mark.timeout(60)
def test_simulate_a_trace_arriving_in_a_trillion_seconds_is_refused(bare, tmp_path):
    t = tmp_path / "t.csv"
    t.write_text("arrival_s,runtime_s\n0,60\n1e12,60\n")
    clean_refusal(bare("simulate", "--trace", str(t), "--config", str(SIM_CONFIG)), "arrival_s")


@pytest.mark.timeout(60)
def test_simulate_a_sparse_year_at_one_second_polls_is_refused_not_run(bare, tmp_path):
    doc = yaml.safe_load(SIM_CONFIG.read_text())
    doc["poll_interval"] = 1
    c = tmp_path / "c.yaml"
    c.write_text(yaml.safe_dump(doc))
    t = tmp_path / "t.csv"
    t.write_text("arrival_s,runtime_s\n0,60\n31000000,60\n")
    clean_refusal(bare("simulate", "--trace", str(t), "--config", str(c)), "poll")


def test_simulate_a_trace_line_nested_deep(bare, tmp_path):
    t = tmp_path / "t.jsonl"
    t.write_text(
        '{"arrival_s": 0, "runtime_s": 1, "queue": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    )
    clean_refusal(bare("simulate", "--trace", str(t), "--config", str(SIM_CONFIG)), "t.jsonl:1")


@pytest.mark.parametrize(
    "body",
    [
        b"arrival_s,runtime_s\n0,1\n\xff\xfe,1\n",
        b'{"arrival_s": 1e999, "runtime_s": 1}\n',
        b'{"arrival_s": ' + b"9" * 400 + b', "runtime_s": 1}\n',
        b'{"arrival_s": ' + b"9" * 5000 + b', "runtime_s": 1}\n',
        b'{"arrival_s": true, "runtime_s": 1}\n',
    ],
    ids=["not utf8", "inf", "400 digits", "5000 digits", "bool"],
)
def test_simulate_a_hostile_trace(bare, tmp_path, body):
    t = tmp_path / "t.jsonl"
    t.write_bytes(body)
    clean_refusal(bare("simulate", "--trace", str(t), "--config", str(SIM_CONFIG)))


def test_simulate_a_huge_csv_field(bare, tmp_path):
    t = tmp_path / "t.csv"
    t.write_text("arrival_s,runtime_s\n0," + "1" * 200_000 + "\n")
    clean_refusal(bare("simulate", "--trace", str(t), "--config", str(SIM_CONFIG)))


def test_simulate_with_a_schedule_lasting_forever(bare, tmp_path):
    doc = yaml.safe_load(SIM_CONFIG.read_text())
    q = next(iter(doc["queues"].values()))
    q["autoscale"].setdefault("scale_up", []).append(
        {
            "trigger": "schedule",
            "cron": "0 8 * * *",
            "workers": 1,
            "duration": "99999999999999999999d",
        }
    )
    c = tmp_path / "c.yaml"
    c.write_text(yaml.safe_dump(doc))
    clean_refusal(
        bare("simulate", "--trace", str(_trace(tmp_path)), "--config", str(c)), "duration"
    )


# --------------------------------------------------------------------------- vault key file


def test_a_vault_key_file_that_is_not_utf8_is_refused(cli, tmp_path):
    kf = tmp_path / "vault.key"
    kf.write_bytes(b"\xff\xfe\x00garbage")
    result = cli(
        "providers",
        "add",
        "v",
        "--kind",
        "vast",
        "--api-key-stdin",
        input="k\n",
        AUTOSCALER_VAULT_KEY="",
        AUTOSCALER_VAULT_KEY_FILE=str(kf),
    )
    clean_refusal(result, "AUTOSCALER_VAULT_KEY_FILE")


# ---------------------------------------------------------------------------- the boundary


def test_an_unforeseen_error_is_one_line_without_a_traceback_unless_debug(bare, monkeypatch):
    import autoscaler.cli.config as cli_config

    def boom(*a, **k):
        raise RuntimeError("kaboom at redis://:leaky-pw@h:1/0")

    monkeypatch.setattr(cli_config, "read_config", boom)
    result = bare("validate", str(REPO / "examples" / "seed.yaml"))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "kaboom" in result.output
    assert "leaky-pw" not in result.output
    assert "--debug" in result.output
    debug = bare("--debug", "validate", str(REPO / "examples" / "seed.yaml"))
    assert isinstance(debug.exception, RuntimeError)
    env_debug = bare("validate", str(REPO / "examples" / "seed.yaml"), AUTOSCALER_DEBUG="1")
    assert isinstance(env_debug.exception, RuntimeError)


def test_the_installed_command_prints_no_traceback(tmp_path):
    p = tmp_path / "deep.yaml"
    p.write_text("queues: " + "[" * 5000 + "]" * 5000)
    out = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "validate", str(p)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "AUTOSCALER_HOME": str(tmp_path / "home")},
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]


def test_providers_list_rows_stay_one_line_each(cli):
    assert cli("providers", "add", "a", "--kind", "mock").exit_code == 0
    out = cli("providers", "list")
    assert out.exit_code == 0 and len(out.output.strip().splitlines()) == 1
    assert json.loads(out.output.split("options: ", 1)[1]) == {}


@pytest.mark.parametrize("revision", ["", " ", "nope", "x" * 500])
def test_db_upgrade_to_a_revision_that_is_not_one_is_refused(bare, revision):
    clean_refusal(bare("db", "upgrade", "--revision", revision), "revision")


def test_a_database_url_sqlalchemy_cannot_open_is_refused(bare):
    result = bare("providers", "list", AUTOSCALER_DATABASE_URL="amqp://guest:pw-secret@h//")
    clean_refusal(result, "AUTOSCALER_DATABASE_URL")
    assert "pw-secret" not in result.output
