"""`autoscaler keys create-admin|create-enrolment|list|revoke` and `autoscaler serve` (a real
uvicorn process answering /healthz, the OpenAPI document and an admin call)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from autoscaler.cli import main
from autoscaler.store import migrate


def run(args: list[str], env: dict[str, str]):
    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


def test_keys_cli_creates_lists_and_revokes_without_storing_keys(sqlite_url, tmp_path):
    env = {"AUTOSCALER_DATABASE_URL": sqlite_url, "AUTOSCALER_HOME": str(tmp_path)}
    migrate.upgrade(sqlite_url)
    r = run(["keys", "create-admin", "--name", "alice"], env)
    assert r.exit_code == 0, r.output
    key = r.output.strip().splitlines()[-1]
    assert key.startswith("asga_") and len(key) > 40
    r = run(["keys", "create-enrolment", "--name", "desk"], env)
    assert r.exit_code == 2 and "--queue" in r.output  # bound to its queues, or refused
    r = run(["keys", "create-enrolment", "--name", "desk", "--queue", "inference"], env)
    assert r.exit_code == 0 and "for inference" in r.output
    r = run(["keys", "list"], env)
    assert "alice" in r.output and "desk" in r.output and key not in r.output
    assert r.output.count("live") == 2
    r = run(["keys", "revoke", "alice"], env)
    assert r.exit_code == 0 and "revoked" in r.output
    r = run(["keys", "revoke", "alice"], env)
    assert r.exit_code == 2
    r = run(["keys", "create-admin", "--name", " "], env)
    assert r.exit_code == 2 and "name" in r.output
    assert key.encode() not in Path(sqlite_url.removeprefix("sqlite:///")).read_bytes()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(60)
def test_serve_runs_the_api(sqlite_url, tmp_path):
    env = {
        **os.environ,
        "AUTOSCALER_DATABASE_URL": sqlite_url,
        "AUTOSCALER_HOME": str(tmp_path),
    }
    migrate.upgrade(sqlite_url)
    key = run(["keys", "create-admin", "--name", "ops"], env).output.strip().splitlines()[-1]
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "autoscaler.cli", "serve", "--bind", f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        doc = requests.get(f"{base}/openapi.json", timeout=5).json()
        assert "/v1/worker/{launch_id}/heartbeat" in doc["paths"]
        assert requests.get(f"{base}/v1/admin/queues", timeout=5).status_code == 401
        r = requests.get(
            f"{base}/v1/admin/queues", headers={"Authorization": f"Bearer {key}"}, timeout=5
        )
        assert r.status_code == 200 and r.json() == []
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_validate_says_what_each_queues_machines_will_hold(sqlite_url, tmp_path):
    import yaml

    from tests.api.apikit import CONFIG

    doc = json.loads(json.dumps(CONFIG))
    other = json.loads(json.dumps(doc["queues"]["q1"]))
    other["metrics"] = {"source": "celery", "url": "amqp://guest:secretpw@127.0.0.1:1//"}
    doc["queues"]["q2"] = other
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {"AUTOSCALER_DATABASE_URL": sqlite_url, "AUTOSCALER_HOME": str(tmp_path)}
    migrate.upgrade(sqlite_url)
    r = run(["validate", str(path)], env)
    assert r.exit_code == 0, r.output
    assert "machines of q1 will hold: their own Redis user" in r.output
    # a RabbitMQ broker whose management API refuses these credentials: said, not guessed
    assert "machines of q2 will hold: the watched broker cannot be asked" in r.output
    assert "secretpw" not in r.output
