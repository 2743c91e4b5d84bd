"""A lost machine's jobs go back to RabbitMQ at once (`control.steps.handback`), on real parts:
RabbitMQ with its management API, per-machine broker users (`rabbit_users.create_user`), real
Celery worker processes (tests/control/handback_app.py: `task_acks_late`, prefetch 1), the store
on SQLite and PostgreSQL.

- A machine that vanished (its worker frozen with SIGSTOP: the TCP connection stays open, so
  the broker keeps its job unacknowledged until the heartbeat gives up, a minute or more) still
  holds its job seconds later; handed back, its user's connections are closed, the broker
  requeues the job, and another machine's worker runs it at once — exactly once more, never
  two at the same time (the frozen one never resumes: it is killed afterwards).
- Two hand-backs racing for the same machine write one event, and the job runs once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
from celery import Celery
from sqlalchemy import select

from autoscaler.brokers.rabbitmq import users as rabbit_users
from autoscaler.brokers.users import create_user, plan_for
from autoscaler.config import load_config_text
from autoscaler.config.metrics_sources import CelerySource
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps import handback
from autoscaler.control.steps.frame import Kind, Outcome, run_step
from autoscaler.lifecycle import InstanceState as S
from autoscaler.settings import Settings
from autoscaler.store import config_versions, migrate
from autoscaler.store.models import Instance, ScaleEvent
from tests.conftest import AMQP_URL

ROOT = Path(__file__).resolve().parents[2]
MGMT = "http://127.0.0.1:15672"
AUTH = ("guest", "guest")


class Rabbit:
    """Workers of tests/control/handback_app.py on a RabbitMQ queue of their own, each under a
    broker user of its own (as a rented machine is given), and the management API's view."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.queue = f"hbr-{uuid.uuid4().hex[:8]}"
        self.install = f"t{uuid.uuid4().hex[:10]}"
        plan = plan_for(CelerySource(url=AMQP_URL, management_url=MGMT), self.queue)
        assert isinstance(plan, rabbit_users.RabbitPlan)
        self.plan = plan
        self.users: list[str] = []
        self.marks = tmp_path / "marks.jsonl"
        self.marks.touch()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.app = Celery("hbr-producer", broker=AMQP_URL, set_as_current=False)

    def user(self, launch_id: str) -> str:
        user = self.plan.user(self.install, launch_id)
        create_user(self.plan, user, "pw-" + user)
        self.users.append(user)
        return user

    def worker(self, user: str) -> subprocess.Popen[bytes]:
        """A machine's worker, connected as its own user; returns once it consumes."""
        url = self.plan.machine_url(user, "pw-" + user)
        env = os.environ | {"HB_BROKER": url, "HB_ACKS": "late"}
        log_path = self.tmp / f"{user}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.control.handback_app", "worker",
                 "-Q", self.queue, "--pool", "solo", "-c", "1", "-n", f"{user}@hb",
                 "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        deadline = time.monotonic() + 60
        while " ready." not in log_path.read_text(errors="replace"):
            assert proc.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.1)
        return proc

    def publish(self, task_id: str, seconds: float) -> None:
        self.app.send_task(
            "hb.work", args=[str(self.marks), seconds], task_id=task_id, queue=self.queue,
            routing_key=self.queue,
        )  # fmt: skip

    def marks_of(self) -> list[tuple[str, str, str]]:
        lines = self.marks.read_text(encoding="utf-8").splitlines()
        return [(m["what"], m["worker"].split("@")[0], m["id"]) for m in map(json.loads, lines)]

    def wait_for(self, what: tuple[str, str, str], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while what not in self.marks_of():
            assert time.monotonic() < deadline, f"no {what}; marks: {self.marks_of()}"
            time.sleep(0.05)

    def freeze(self, proc: subprocess.Popen[bytes]) -> None:
        """A host that vanished: nothing runs, nothing closes (its sockets stay open)."""
        os.killpg(proc.pid, signal.SIGSTOP)

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stats(self) -> dict[str, Any]:
        """The queue as the management API shows it (its statistics lag by up to 5 s)."""
        resp = requests.get(
            f"{MGMT}/api/queues/%2F/{quote(self.queue, safe='')}", auth=AUTH, timeout=5
        )
        resp.raise_for_status()
        return dict(resp.json())

    def held(self) -> tuple[int, int]:
        """(unacknowledged, ready) messages of the queue."""
        stats = self.stats()
        return int(stats.get("messages_unacknowledged", 0)), int(stats.get("messages_ready", 0))

    def connections_of(self, user: str) -> int:
        resp = requests.get(
            f"{MGMT}/api/connections/username/{quote(user, safe='')}", auth=AUTH, timeout=5
        )
        resp.raise_for_status()
        return len(resp.json())

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)
        self.app.close()
        for user in self.users:
            rabbit_users.delete_user(self.plan, user)
        requests.delete(f"{MGMT}/api/queues/%2F/{quote(self.queue, safe='')}", auth=AUTH, timeout=5)


@pytest.fixture
def rabbit(tmp_path: Path) -> Iterator[Rabbit]:
    r = Rabbit(tmp_path)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def runtime(tmp_path: Path, db_url: str, rabbit: Rabbit) -> Iterator[Runtime]:
    migrate.upgrade(db_url)
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url}
    rt = Runtime(Settings.from_env(env), env=env)
    config = load_config_text(
        f"""
providers:
  gpu: {{kind: mock}}
queues:
  {rabbit.queue}:
    metrics: {{source: celery, url: "{AMQP_URL}", management_url: "{MGMT}"}}
    autoscale:
      provider: gpu
      max_workers: 2
      instance: {{gpu: "RTX 4090", max_price_per_hour: 1}}
"""
    )
    with rt.transaction() as session:
        config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())
    try:
        yield rt
    finally:
        rt.close()


def _lost_machine(rt: Runtime, queue: str, launch_id: str, user: str, tasks: list[str]) -> None:
    """A machine reconcile found gone at its provider: its jobs due to be handed back."""
    now = utc_now()
    with rt.transaction() as session:
        session.add(
            Instance(
                launch_id=launch_id,
                queue=queue,
                provider="gpu",
                state=S.LOST,
                created_at=now - timedelta(minutes=10),
                tasks=tasks,
                acks_late=True,
                broker_user=user,
                handback_due_at=now - timedelta(seconds=1),
            )
        )


def _events(rt: Runtime, action: str) -> list[ScaleEvent]:
    with rt.transaction() as session:
        return list(
            session.scalars(
                select(ScaleEvent).where(ScaleEvent.kind == "handback", ScaleEvent.action == action)
            )
        )


def _frozen_mid_job(rabbit: Rabbit, job: str) -> tuple[str, subprocess.Popen[bytes], str]:
    """Machine a's worker took `job` and froze in it; machine b's worker waits on the queue.
    Returns (a's user, a's worker, b's user)."""
    a, b = rabbit.user("la"), rabbit.user("lb")
    first = rabbit.worker(a)
    rabbit.publish(job, 5.0)  # b starts after a froze: a 5 s job is still running then
    rabbit.wait_for(("start", a, job))
    frozen_at = time.monotonic()
    rabbit.freeze(first)
    rabbit.worker(b)
    # a few seconds later the broker still holds it for a: read once the statistics (emitted
    # every 5 s or so, the first ones late) show it, never before 6 s after the freeze
    time.sleep(max(0.0, frozen_at + 6.0 - time.monotonic()))
    deadline = time.monotonic() + 20
    while (held := rabbit.held()) != (1, 0):
        assert time.monotonic() < deadline, f"(unacknowledged, ready) {held}"
        time.sleep(0.5)
    assert rabbit.connections_of(a) >= 1  # its connection stays open: today it waits it out
    assert rabbit.marks_of() == [("start", a, job)]  # b never got it
    return a, first, b


@pytest.mark.timeout(150)
def test_a_frozen_machines_job_runs_again_elsewhere_at_once_and_once(rabbit, runtime):
    a, first, b = _frozen_mid_job(rabbit, "job-1")
    _lost_machine(runtime, rabbit.queue, "m1", a, ["job-1"])
    started = time.monotonic()
    what = run_step(handback.STEP, runtime, "m1")
    assert what.kind is Kind.DONE and str(what).endswith(
        f"connection(s) of {a}: RabbitMQ requeued their unacknowledged jobs"
    ), what
    rabbit.wait_for(("start", b, "job-1"), timeout=10)
    assert time.monotonic() - started < 5.0  # at once, not at the heartbeat's minute
    rabbit.wait_for(("end", b, "job-1"))
    time.sleep(0.5)  # nothing else may run it
    rabbit.kill(first)  # a vanished machine never resumes
    time.sleep(0.5)
    assert rabbit.marks_of() == [("start", a, "job-1"), ("start", b, "job-1"),
                                 ("end", b, "job-1")]  # fmt: skip
    deadline = time.monotonic() + 20  # b acknowledged it: nothing left, nothing requeued again
    while (held := rabbit.held()) != (0, 0):
        assert time.monotonic() < deadline, f"(unacknowledged, ready) {held}"
        time.sleep(0.5)
    assert run_step(handback.STEP, runtime, "m1").kind is Kind.SKIPPED  # done once
    (event,) = _events(runtime, "requeued")
    assert event.details["connections_closed"] >= 1 and event.details["said_held"] == 1
    assert _events(runtime, "lost") == []


@pytest.mark.timeout(150)
def test_two_hand_backs_racing_close_once_and_the_job_runs_once(rabbit, runtime):
    a, first, b = _frozen_mid_job(rabbit, "race-1")
    _lost_machine(runtime, rabbit.queue, "m1", a, ["race-1"])
    results: list[Outcome] = []
    gate = threading.Barrier(2)

    def hand_back() -> None:
        gate.wait(10)
        results.append(run_step(handback.STEP, runtime, "m1"))

    racers = [threading.Thread(target=hand_back) for _ in range(2)]
    for t in racers:
        t.start()
    for t in racers:
        t.join(60)
    assert len(results) == 2 and all(r.kind in (Kind.DONE, Kind.SKIPPED) for r in results), results
    assert len(_events(runtime, "requeued")) == 1
    rabbit.wait_for(("end", b, "race-1"))
    time.sleep(0.5)
    rabbit.kill(first)
    time.sleep(0.5)
    assert rabbit.marks_of() == [("start", a, "race-1"), ("start", b, "race-1"),
                                 ("end", b, "race-1")]  # fmt: skip
    assert run_step(handback.STEP, runtime, "m1").kind is Kind.SKIPPED
    assert len(_events(runtime, "requeued")) == 1
