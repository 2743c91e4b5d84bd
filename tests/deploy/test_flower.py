"""The control plane in Flower: its tasks have readable names and only names and ids as
arguments (Flower shows them), and the README's manual scale through Flower's task API works
with basic auth (and not without), here on the embedded broker."""

from __future__ import annotations

import base64
import inspect
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_PARAMS = {"trigger", "queue", "shard", "workers", "for_", "launch_id"}
TASKS = {
    "autoscaler.tick",
    "autoscaler.fast_path",
    "autoscaler.launch",
    "autoscaler.drain",
    "autoscaler.terminate",
    "autoscaler.reconcile",
    "autoscaler.scale",
    "autoscaler.check_store",
}


def test_tasks_are_named_and_take_only_names_and_ids():
    from autoscaler.celery import app

    ours = {name: task for name, task in app.tasks.items() if name.startswith("autoscaler.")}
    assert set(ours) >= TASKS
    for name, task in ours.items():
        params = set(inspect.signature(task.run).parameters)
        assert params <= ALLOWED_PARAMS, (name, params)


def test_argument_reprs_are_what_the_operator_typed():
    from autoscaler.celery import app

    msg = app.amqp.as_task_v2("id-1", "autoscaler.scale", args=["inference", 3, "30m"])
    assert msg.headers["task"] == "autoscaler.scale"
    assert msg.headers["argsrepr"] == "['inference', 3, '30m']"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, object], auth: str | None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.timeout(120)
def test_manual_scale_through_flowers_task_api_needs_its_login(tmp_path):
    port = _free_port()
    broker = tmp_path / "broker.db"
    env = {
        **os.environ,
        "AUTOSCALER_HOME": str(tmp_path),
        "AUTOSCALER_DATABASE_URL": f"sqlite:///{tmp_path / 'state.db'}",
        "AUTOSCALER_BROKER_URL": f"sqla+sqlite:///{broker}",
        "AUTOSCALER_RESULT_BACKEND": f"db+sqlite:///{tmp_path / 'results.db'}",
        "FLOWER_BASIC_AUTH": "operator:flower-pw",
        "PYTHONPATH": str(ROOT),
    }
    subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "db", "upgrade"], env=env, check=True, timeout=60
    )
    flower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "autoscaler",
            "flower",
            "--address=127.0.0.1",
            f"--port={port}",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}/api/task/async-apply/autoscaler.scale"
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = _post(url, {"args": ["inference", 3, "30m"]}, None)
                break
            except (urllib.error.URLError, ConnectionError):
                assert flower.poll() is None, flower.stderr.read().decode() if flower.stderr else ""
                assert time.monotonic() < deadline, "Flower did not start"
                time.sleep(0.3)
        assert status == 401  # no login, no task
        status, body = _post(url, {"args": ["inference", 3, "30m"]}, "operator:wrong")
        assert status == 401
        status, body = _post(url, {"args": ["inference", 3, "30m"]}, "operator:flower-pw")
        assert status == 200, body
        task_id = json.loads(body)["task-id"]
    finally:
        # Flower's own shutdown is not under test, and its first SIGTERM is sometimes lost (seen
        # here: a Flower still up 27 minutes after the test, gone at a second SIGTERM): as
        # systemd and compose do, a kill after the grace.
        flower.terminate()
        try:
            flower.wait(timeout=10)
        except subprocess.TimeoutExpired:
            flower.kill()
            flower.wait(timeout=10)
    with sqlite3.connect(broker) as db:
        payloads = [row[0] for row in db.execute("SELECT payload FROM kombu_message")]
    sent = [json.loads(p) for p in payloads]
    ours = [m for m in sent if m["headers"].get("id") == task_id]
    assert len(ours) == 1  # queued once, for a worker to run
    assert ours[0]["headers"]["task"] == "autoscaler.scale"
    assert ours[0]["headers"]["argsrepr"] == "['inference', 3, '30m']"
