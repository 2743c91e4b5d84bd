"""`celery -A autoscaler` finds the app; a real worker answers a real `celery call`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from autoscaler.store import migrate

CELERY = str(Path(sys.executable).with_name("celery"))


def _env(tmp_path: Path, broker: str, backend: str, db_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "AUTOSCALER_HOME": str(tmp_path / "home"),
        "AUTOSCALER_BROKER_URL": broker,
        "AUTOSCALER_RESULT_BACKEND": backend,
        "AUTOSCALER_DATABASE_URL": db_url,
    }


@pytest.mark.parametrize("transport", ["embedded", "redis"])
def test_worker_runs_a_task_sent_with_celery_call(transport, tmp_path, db_url):
    migrate.upgrade(db_url)
    # PostgreSQL here trusts loopback, so a password is accepted and must never be shown.
    db_url = db_url.replace("postgres@", "postgres:pw-SECRET-42@")
    if transport == "embedded":
        broker = f"sqla+sqlite:///{tmp_path / 'broker.db'}"
        backend = f"db+sqlite:///{tmp_path / 'results.db'}"
    else:
        broker = "redis://127.0.0.1:6379/14"
        backend = "redis://127.0.0.1:6379/14"
    env = _env(tmp_path, broker, backend, db_url)
    queue = f"autoscaler-test-{uuid.uuid4().hex[:8]}"
    worker = subprocess.Popen(
        [
            CELERY,
            "-A",
            "autoscaler",
            "worker",
            "--pool",
            "solo",
            "-Q",
            queue,
            "-l",
            "warning",
            "-n",
            f"{queue}@%h",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        if transport == "embedded":
            _wait_for_queue_row(tmp_path / "broker.db", queue, worker)
        sent = subprocess.run(
            [CELERY, "-A", "autoscaler", "call", "autoscaler.check_store", "--queue", queue],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        task_id = sent.stdout.strip().splitlines()[-1]
        code = (
            "import json,sys; from autoscaler.celery import app; "
            f"print(json.dumps(app.AsyncResult('{task_id}').get(timeout=60)))"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=90
        )
        if result.returncode != 0:
            _stop(worker)
            logs = worker.stdout.read().decode() if worker.stdout else ""
            raise AssertionError(f"{result.stderr}\n--- worker ---\n{logs}")
        answer = json.loads(result.stdout.strip().splitlines()[-1])
        assert answer["revision"] == migrate.head_revision()
        assert answer["live_instances"] == 0
        assert "pw-SECRET-42" not in result.stdout
        # the worker read the store we gave it, and names it with the password masked
        assert answer["database"] == db_url.replace("pw-SECRET-42", "***")
    finally:
        _stop(worker)


def _wait_for_queue_row(broker_db: Path, queue: str, worker: subprocess.Popen) -> None:
    """kombu's SQL transport creates a queue's row without a lock: a publisher and a consumer
    declaring the same new queue at once can collide. Publish once the worker has declared it."""
    import sqlite3
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert worker.poll() is None, worker.stdout.read() if worker.stdout else ""
        try:
            with sqlite3.connect(broker_db) as conn:
                if conn.execute("SELECT 1 FROM kombu_queue WHERE name = ?", (queue,)).fetchone():
                    return
        except sqlite3.OperationalError:
            pass  # the tables do not exist yet
        time.sleep(0.2)
    raise AssertionError(f"the worker never declared {queue}")


def test_celery_finds_the_app_and_its_config(tmp_path, sqlite_url):
    env = _env(
        tmp_path,
        f"sqla+sqlite:///{tmp_path / 'b.db'}",
        f"db+sqlite:///{tmp_path / 'r.db'}",
        sqlite_url,
    )
    out = subprocess.run(
        [CELERY, "-A", "autoscaler", "report"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "sqla+sqlite" in out.stdout
    assert "task_default_queue: 'autoscaler'" in out.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_beat_and_flower_start_from_the_app(tmp_path, sqlite_url):
    import requests

    migrate.upgrade(sqlite_url)
    env = _env(tmp_path, "redis://127.0.0.1:6379/14", "redis://127.0.0.1:6379/14", sqlite_url)
    port = _free_port()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    beat = subprocess.Popen(
        [CELERY, "-A", "autoscaler", "beat", "-l", "info"],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    flower = subprocess.Popen(
        [CELERY, "-A", "autoscaler", "flower", f"--port={port}", "--address=127.0.0.1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        answer = None
        for _ in range(120):
            try:
                answer = requests.get(f"http://127.0.0.1:{port}/healthcheck", timeout=2)
                break
            except requests.ConnectionError:
                assert flower.poll() is None, flower.stdout.read() if flower.stdout else ""
                subprocess.run(["sleep", "0.5"], check=True)
        assert answer is not None and answer.status_code == 200
        # Flower's API shows task arguments: it stays closed without authentication.
        api = requests.get(f"http://127.0.0.1:{port}/api/workers", timeout=5)
        assert api.status_code == 401
        assert beat.poll() is None  # beat is running, not crashed on the config
    finally:
        _stop(flower)
        _stop(beat)
    out = beat.stdout.read().decode() if beat.stdout else ""
    assert "beat: Starting" in out, out
    # our scheduler built the loop's entries (no config applied yet: the defaults) ...
    entries = "autoscaler-fast-path, autoscaler-reconcile, autoscaler-retention, autoscaler-tick"
    assert entries in out, out
    assert "autoscaler.control.beat.ConfigScheduler" in out, out
    # ... and wrote no schedule file into the folder it was started from
    assert list(cwd.iterdir()) == []
