"""Never a machine without the credentials it needs.

A launch during an outage of the watched Redis rented a machine with no broker user and no
error: it billed and could never reach its queue. Now such a launch fails into backoff and
rents nothing; once the broker answers, the next launch makes the user and rents.
Real Redis (a throwaway server the test stops and starts), the mock provider's machines table.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import redis
from sqlalchemy import select

from autoscaler.config import load_config_text
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps import launch
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.settings import Settings
from autoscaler.store import backoffs, config_versions, instances, intents, migrate
from autoscaler.store.models import Instance, MockMachine


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis(port: int, folder: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis(port=port, socket_timeout=1).ping()
            return proc
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)


def test_a_launch_while_the_watched_redis_is_down_rents_nothing(tmp_path, db_url):
    port = _port()
    migrate.upgrade(db_url)
    env = {
        "AUTOSCALER_HOME": str(tmp_path),
        "AUTOSCALER_DATABASE_URL": db_url,
        "AUTOSCALER_API_URL": "http://127.0.0.1:8480",  # machines get their users through it
    }
    rt = Runtime(Settings.from_env(env), env=env)
    server = None
    try:
        config = load_config_text(f"""
providers:
  sandbox: {{kind: mock, boot_delay: 1}}
queues:
  q:
    metrics: {{source: celery, url: "redis://127.0.0.1:{port}/0"}}
    autoscale:
      provider: sandbox
      max_workers: 2
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.8}}
""")
        with rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())
            intents.add_intents(session, [("down1", "q", "sandbox", "t")], utc_now())
        result = run_step(launch.STEP, rt, "down1")  # nothing listens on the broker's port
        assert result.kind is Kind.FAILED and "no broker user" in str(result), result
        with rt.transaction() as session:
            assert session.scalars(select(MockMachine)).all() == []  # nothing rented
            row = instances.get(session, "down1")
            assert row is not None and row.state.value == "failed" and row.broker_user is None
            assert backoffs.by_queue(session)["q"][0].failures == 1  # it backs off

        server = _redis(port, tmp_path)  # the broker is back
        with rt.transaction() as session:
            backoffs.clear(session, "q", "sandbox")
            intents.add_intents(session, [("up1", "q", "sandbox", "t")], utc_now())
        assert run_step(launch.STEP, rt, "up1").kind is Kind.DONE
        with rt.transaction() as session:
            user = session.scalar(select(Instance.broker_user).where(Instance.launch_id == "up1"))
            assert len(session.scalars(select(MockMachine)).all()) == 1
        assert user and user.encode() in redis.Redis(port=port).execute_command("ACL", "USERS")
    finally:
        rt.close()
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
