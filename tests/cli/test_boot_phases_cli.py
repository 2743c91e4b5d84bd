"""`autoscaler instances LAUNCH_ID` shows a machine's boots phase by phase; `autoscaler status`
shows median and p90 boot per (provider, GPU) with how many boots (PostgreSQL and SQLite)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from autoscaler.cli import common, main
from autoscaler.lifecycle import InstanceState as S
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import BootPhase, Instance

NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
SEC = timedelta(seconds=1)


def _fill(url: str) -> None:
    engine = make_engine(url)
    try:
        with transaction(session_factory(engine)) as s:
            # abcd…: launched at 11:00:00, its cold boot's phases, then resumed at 11:55:00 and
            # ready again at 11:55:30 (the row keeps the latest ready)
            created = NOW - timedelta(hours=1)
            s.add(
                Instance(
                    launch_id="abcd1234efgh5678",
                    queue="inference",
                    provider="gpu-vast",
                    state=S.READY,
                    gpu="RTX 4090",
                    host_id="4242",
                    created_at=created,
                    booting_at=created + 30 * SEC,
                    ready_at=NOW - 5 * timedelta(minutes=1) + 30 * SEC,
                    resuming_at=NOW - 5 * timedelta(minutes=1),
                    resumes=1,
                )
            )
            cold = [
                ("started", 40),
                ("registered", 42),
                ("code_fetched", 60),
                ("requirements_installed", 170),
                ("worker_up", 175),
                ("first_job", 200),
            ]
            for phase, at in cold:
                s.add(_phase("abcd1234efgh5678", 0, phase, created + at * SEC))
            resume_start = NOW - 5 * timedelta(minutes=1)
            for phase, at in [("started", 20), ("registered", 21), ("worker_up", 28)]:
                s.add(_phase("abcd1234efgh5678", 1, phase, resume_start + at * SEC))
            # boot statistics: gpu-vast / RTX 4090 boots of 100, 200, 300 s (+ the one above
            # is a resumed machine: left out), runpod / A100 one of 60 s
            for i, secs in enumerate((100, 200, 300)):
                ready = NOW - timedelta(hours=2 + i)
                s.add(
                    Instance(
                        launch_id=f"abcd0000old{i}",
                        queue="inference",
                        provider="gpu-vast",
                        state=S.TERMINATED,
                        gpu="RTX 4090",
                        created_at=ready - secs * SEC,
                        ready_at=ready,
                    )
                )
            s.add(
                Instance(
                    launch_id="zzzz00000001",
                    queue="batch",
                    provider="gpu-runpod",
                    state=S.TERMINATED,
                    gpu="A100",
                    created_at=NOW - timedelta(hours=3),
                    ready_at=NOW - timedelta(hours=3) + 60 * SEC,
                )
            )
    finally:
        engine.dispose()


def _phase(launch_id: str, boot: int, phase: str, at: datetime) -> BootPhase:
    return BootPhase(
        launch_id=launch_id,
        boot=boot,
        phase=phase,
        at=at,
        received_at=at + SEC,
        queue="inference",
        provider="gpu-vast",
        gpu="RTX 4090",
        host_id="4242",
    )


@pytest.fixture
def cli(db_url, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "now", lambda: NOW)
    env = {
        "AUTOSCALER_HOME": str(tmp_path / "home"),
        "AUTOSCALER_DATABASE_URL": db_url,
        "AUTOSCALER_BROKER_URL": "redis://127.0.0.1:6379/15",
    }
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(main, list(args), env=env)

    upgraded = run("db", "upgrade")
    assert upgraded.exit_code == 0, upgraded.output
    _fill(db_url)
    return run


def test_instances_launch_id_shows_each_boot_phase_by_phase(cli):
    out = cli("instances", "abcd1234")  # a prefix, as the tables show 12 characters
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0] == (
        "machine abcd1234efgh5678 (queue inference; gpu-vast, RTX 4090, host 4242): ready"
    )
    # its cold boot's control-plane time went with its resume (the row keeps the latest ready)
    assert lines[1] == (
        "launched 11:00:00; resumed ×1 from the warm pool, the latest at 11:55:00; ready 11:55:30"
    )
    rows = [line.split() for line in lines if line.startswith(("cold", "resume"))]
    # BOOT PHASE AT SINCE-START STEP, in the order they happened
    assert rows == [
        ["cold", "agent", "started", "11:00:40", "40s", "40s"],
        ["cold", "registered", "11:00:42", "42s", "2s"],
        ["cold", "code", "fetched", "11:01:00", "1m00s", "18s"],
        ["cold", "requirements", "installed", "11:02:50", "2m50s", "1m50s"],
        ["cold", "worker", "up", "11:02:55", "2m55s", "5s"],
        ["cold", "first", "job", "11:03:20", "3m20s", "25s"],
        ["resume", "1", "agent", "started", "11:55:20", "20s", "20s"],
        ["resume", "1", "registered", "11:55:21", "21s", "1s"],
        ["resume", "1", "worker", "up", "11:55:28", "28s", "7s"],
    ]


def test_instances_launch_id_json_and_refusals(cli):
    out = cli("instances", "abcd1234efgh5678", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert (doc["provider"], doc["gpu"], doc["host_id"]) == ("gpu-vast", "RTX 4090", "4242")
    assert [b["boot"] for b in doc["boots"]] == [0, 1]
    assert doc["boots"][0]["ready_seconds"] is None  # resumed since: not a cold boot's row now
    assert doc["boots"][0]["phases"][0]["phase"] == "started"
    assert doc["boots"][1]["resume"] is True
    assert [p["phase"] for p in doc["boots"][1]["phases"]] == ["started", "registered", "worker_up"]

    several = cli("instances", "abcd")
    assert several.exit_code == 2 and "several launch ids" in several.output
    missing = cli("instances", "nope")
    assert missing.exit_code == 2 and "no machine 'nope'" in missing.output
    both = cli("instances", "abcd1234", "--queue", "inference")
    assert both.exit_code == 2 and "not both" in both.output


def test_a_machine_without_phases_says_so(cli):
    out = cli("instances", "zzzz00000001")
    assert out.exit_code == 0, out.output
    assert "boot 1m00s (launch → ready" in out.output
    assert "no boot phase reported" in out.output


def test_status_shows_median_and_p90_boot_per_provider_and_gpu(cli):
    out = cli("status")
    assert out.exit_code == 0, out.output
    text = out.output
    assert "boot times (launch → ready, cold boots of the last 7 days):" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith("gpu-")}
    # PROVIDER GPU MEDIAN P90 BOOTS
    assert rows["gpu-vast"] == ["gpu-vast", "RTX", "4090", "3m20s", "5m00s", "3"]
    assert rows["gpu-runpod"] == ["gpu-runpod", "A100", "1m00s", "1m00s", "1"]
    assert text.index("boot times") < text.index("spend:")

    doc = json.loads(cli("status", "--json").output)
    assert doc["boots"] == [
        {
            "provider": "gpu-runpod",
            "gpu": "A100",
            "median_seconds": 60.0,
            "p90_seconds": 60.0,
            "samples": 1,
        },
        {
            "provider": "gpu-vast",
            "gpu": "RTX 4090",
            "median_seconds": 200.0,
            "p90_seconds": 300.0,
            "samples": 3,
        },
    ]
    one = json.loads(cli("status", "--queue", "batch", "--json").output)
    assert one["boots"] == [
        {
            "queue": "batch",
            "provider": "gpu-runpod",
            "gpu": "A100",
            "median_seconds": 60.0,
            "p90_seconds": 60.0,
            "samples": 1,
        }
    ]
    text = cli("status", "--queue", "batch").output
    assert "boot times of batch's machines" in text and "gpu-vast" not in text
