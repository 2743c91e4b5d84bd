"""`autoscaler serve --workers N` (or $AUTOSCALER_API_WORKERS): N uvicorn processes on one port,
each with its own runtime and pool; a bad count is refused with the fix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from autoscaler.boundary import Refused
from autoscaler.cli import main
from autoscaler.cli.serve import DEFAULT_WORKERS, MAX_WORKERS, worker_count
from autoscaler.store import migrate
from tests.agent.agentkit import free_port
from tests.api.apikit import make_world

BODY = {"state": "idle", "running_tasks": 0, "tasks": []}


def test_worker_count_takes_the_option_then_the_environment_then_the_default():
    assert worker_count(None, "") == DEFAULT_WORKERS == 1
    assert worker_count(None, " 3 ") == 3
    assert worker_count("2", "5") == 2  # the option wins
    assert worker_count(str(MAX_WORKERS), "") == MAX_WORKERS
    for bad in ("0", str(MAX_WORKERS + 1), "-1", "two", "\u0663", "1.5"):
        with pytest.raises(Refused, match="--workers must be a whole number"):
            worker_count(bad, "")
    with pytest.raises(Refused, match="AUTOSCALER_API_WORKERS must be"):
        worker_count(None, "0")


def test_serve_refuses_a_bad_worker_count(sqlite_url, tmp_path):
    env = {"AUTOSCALER_DATABASE_URL": sqlite_url, "AUTOSCALER_HOME": str(tmp_path)}
    migrate.upgrade(sqlite_url)
    r = CliRunner().invoke(main, ["serve", "--workers", "0"], env=env)
    assert r.exit_code == 2 and "--workers must be a whole number" in r.output
    r = CliRunner().invoke(main, ["serve"], env={**env, "AUTOSCALER_API_WORKERS": "many"})
    assert r.exit_code == 2 and "AUTOSCALER_API_WORKERS must be" in r.output


def spawned(pgid: int) -> list[int]:
    """The uvicorn worker processes of the server whose process group is `pgid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == pgid:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid and b"spawn_main" in cmdline:
            found.append(int(entry))
    return found


@pytest.mark.timeout(90)
def test_serve_with_two_workers_answers_heartbeats(pg_url, tmp_path):
    world = make_world(pg_url, tmp_path)
    env = {
        **os.environ,
        "AUTOSCALER_DATABASE_URL": pg_url,
        "AUTOSCALER_HOME": str(tmp_path / "home"),
        "AUTOSCALER_API_WORKERS": "2",
    }
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autoscaler.cli",
            "serve",
            "--bind",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while len(spawned(proc.pid)) < 2 or not _healthy(base):
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "two workers did not come up"
            time.sleep(0.2)
        assert len(spawned(proc.pid)) == 2
        for launch in ("m1", "m2"):
            for _ in range(5):  # several connections: both processes take their share
                r = requests.post(
                    f"{base}/v1/worker/{launch}/heartbeat",
                    json=BODY,
                    timeout=10,
                    headers={"Authorization": f"Bearer {world.tokens[launch]}"},
                )
                assert r.status_code == 200 and r.json() == {"drain": False, "state": "ready"}
        r = requests.post(
            f"{base}/v1/worker/m1/heartbeat",
            json=BODY,
            timeout=10,
            headers={"Authorization": f"Bearer {world.tokens['m2']}"},
        )
        assert r.status_code == 403  # one token, one launch, whichever process answers
        assert world.row("m1").last_heartbeat_at is not None
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        world.close()
    deadline = time.monotonic() + 10
    while spawned(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not spawned(proc.pid)  # the workers stop with the server


def _healthy(base: str) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=1).status_code == 200
    except requests.RequestException:
        return False
