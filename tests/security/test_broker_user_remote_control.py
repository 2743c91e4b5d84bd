"""A machine's broker user can neither command other workers, nor hang the server, nor read
what other queues run.

Reproduced before with the user made for queue A beside a plain Celery worker serving queue B on
the same Redis database: it shut that worker down with `control.broadcast("shutdown")` (the grant
on the remote-control channel allowed PUBLISH), hung Redis for everyone with a long `EVAL`, and
read every queue's task arguments by subscribing to the events channel. On Redis 7 its user now
subscribes to remote control and publishes events, and nothing else on those channels; it runs
only the scripts the control plane loaded; remote-control replies are write-only.
Real Redis 7 (the suite's), a real Celery worker of queue B (tests/control/e2eapp).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from autoscaler.brokers.users import BrokerPlan, create_user, delete_user
from tests.conftest import REDIS_URL

DB = 6
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def a_user() -> Iterator[tuple[str, str]]:
    name = f"asg-test{uuid.uuid4().hex[:8]}-qa"
    plan = BrokerPlan(
        url=f"{REDIS_URL}/{DB}", queue=f"qa-{name}", db=DB, keyprefix="", sep="\x06\x16"
    )
    create_user(plan, name, "pw-" + name)
    try:
        yield name, f"redis://{name}:pw-{name}@{REDIS_URL.split('://', 1)[1]}/{DB}"
    finally:
        delete_user(f"{REDIS_URL}/0", name)


@pytest.fixture
def worker_b(tmp_path) -> Iterator[str]:
    """A plain, hand-made Celery worker of queue B, with the broker's own credentials."""
    queue = f"qb-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "E2E_BROKER_URL": f"{REDIS_URL}/{DB}",
        "PYTHONPATH": str(REPO / "tests" / "control"),
    }
    log = open(tmp_path / "worker-b.log", "ab")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "e2eapp",
            "worker",
            "-Q",
            queue,
            "-n",
            f"{queue}@h",
            "--pool",
            "solo",
            "-l",
            "info",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        deadline = time.monotonic() + 60
        while " ready." not in (tmp_path / "worker-b.log").read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, "worker B did not start"
            time.sleep(0.2)
        yield f"{queue}@h"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _app(url: str) -> Celery:
    return Celery("probe", broker=url, set_as_current=False)


def test_a_machine_cannot_broadcast_to_the_other_workers(a_user, worker_b):
    _, url = a_user
    machine = _app(url)
    admin = _app(f"{REDIS_URL}/{DB}")
    try:
        with pytest.raises(Exception, match=r"(?i)permission"):
            machine.control.broadcast("shutdown", destination=[worker_b])
        time.sleep(1.0)
        assert admin.control.ping([worker_b], timeout=2.0), "worker B was shut down"
    finally:
        machine.close()
        admin.close()


def test_a_machine_runs_no_script_of_its_own_and_reads_no_task_events(a_user):
    _, url = a_user
    r = redis.Redis.from_url(url)
    other_sha = redis.Redis.from_url(f"{REDIS_URL}/{DB}").script_load("return 'not ours'")
    reply = f"{uuid.uuid4()}.reply.celery.pidbox"  # a loop's reply list: its mailbox's oid
    try:
        for call in (
            lambda: r.eval("while true do end", 0),  # would hang the server for everyone
            lambda: r.script_load("return 1"),
            lambda: r.execute_command("SUBSCRIBE", f"/{DB}.celeryev/task.received"),
            lambda: r.execute_command("PSUBSCRIBE", f"/{DB}.celeryev/*"),
            lambda: r.execute_command("PUBLISH", f"/{DB}.celery.pidbox", "x"),
            lambda: r.lrange(reply, 0, -1),  # others' answers
            lambda: r.delete(reply),  # nor their queues: deleted,
            lambda: r.set(reply, "x"),  # retyped (inspect fails)
            lambda: r.expire(reply, 1),
            # the reply lists of another prefix (another trust domain), and any other key
            # that merely ends like one
            lambda: r.lpush(f"b:{reply}", "answer"),
            lambda: r.lpush(f"x{reply}", "answer"),
            lambda: r.lpush("someone.reply.celery.pidbox", "answer"),
            lambda: r.evalsha(other_sha, 0),  # a script someone else loaded (a long loop)
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                call()
        # what a worker needs still works: the loaded scripts, events out, answers out
        from redis.lock import Lock

        sha = redis.Redis.from_url(f"{REDIS_URL}/{DB}").script_load(Lock.LUA_RELEASE_SCRIPT)
        assert r.evalsha(sha, 1, "unacked_mutex", "not-ours") == 0
        assert r.publish(f"/{DB}.celeryev/worker.heartbeat", "{}") >= 0
        assert r.lpush(reply, "answer") == 1
    finally:
        redis.Redis.from_url(f"{REDIS_URL}/{DB}").delete(reply)
        r.close()
