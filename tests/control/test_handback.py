"""A lost machine's jobs on Redis (`control.steps.handback`), on real parts: Redis, real Celery
worker processes, the store on SQLite and PostgreSQL.

kombu's `unacked` hash on Redis records no consumer (the publisher's delivery tag, the message,
the consumer's clock), and every machine of a trust domain can write it: the broker cannot tell
which machine held a job, so the hand-back restores nothing there and says so; the job comes
back by kombu's own visibility timeout and runs once more. (RabbitMQ, where the broker can
tell: tests/control/test_handback_rabbitmq.py; the attacks: tests/security/test_handback_claims.py.)

- `acks_late`: a worker killed mid-job leaves its job in `unacked`; the step leaves it there;
  a worker whose visibility timeout is short brings it back and runs it exactly once more.
- Early acks: one `lost` event per machine, naming what its worker said.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from celery import Celery
from sqlalchemy import select

from autoscaler.config import load_config_text
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps import handback
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.lifecycle import InstanceState as S
from autoscaler.settings import Settings
from autoscaler.store import config_versions, event_views, migrate
from autoscaler.store.models import Instance, ScaleEvent
from tests.conftest import REDIS_URL

ROOT = Path(__file__).resolve().parents[2]
BROKER = f"{REDIS_URL}/0"
QUEUE = "hb-jobs"


class Broker:
    """Workers of tests/control/handback_app.py on a key prefix of their own."""

    def __init__(self, tmp_path: Path, acks: str) -> None:
        self.prefix = f"hb-{uuid.uuid4().hex[:8]}:"
        self.acks = acks
        self.marks = tmp_path / "marks.jsonl"
        self.marks.touch()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.app = Celery("hb-producer", broker=BROKER, set_as_current=False)
        self.app.conf.broker_transport_options = {"global_keyprefix": self.prefix}
        self.redis = redis.Redis.from_url(BROKER)

    def worker(
        self, name: str, pool: str = "solo", visibility: float | None = None
    ) -> subprocess.Popen[bytes]:
        env = os.environ | {"HB_BROKER": BROKER, "HB_PREFIX": self.prefix, "HB_ACKS": self.acks}
        if visibility is not None:
            env["HB_VISIBILITY"] = str(visibility)
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.control.handback_app", "worker",
             "-Q", QUEUE, "--pool", pool, "-c", "1", "-n", f"{name}@hb", "--without-gossip",
             "--without-mingle", "--without-heartbeat", "-l", "WARNING"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def publish(self, task_id: str, seconds: float) -> None:
        self.app.send_task("hb.work", args=[str(self.marks), seconds], task_id=task_id, queue=QUEUE)

    def marks_of(self) -> list[tuple[str, str, str]]:
        lines = self.marks.read_text(encoding="utf-8").splitlines()
        return [(m["what"], m["worker"].split("@")[0], m["id"]) for m in map(json.loads, lines)]

    def wait_for(self, what: tuple[str, str, str], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while what not in self.marks_of():
            assert time.monotonic() < deadline, f"no {what}; marks: {self.marks_of()}"
            time.sleep(0.1)

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        os.killpg(proc.pid, signal.SIGKILL)  # no goodbye: the job stays in unacked
        proc.wait(10)

    def unacked(self) -> int:
        return int(self.redis.hlen(self.prefix + "unacked"))

    def waiting(self) -> int:
        return int(self.redis.llen(self.prefix + QUEUE))

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)
        for key in self.redis.scan_iter(match=self.prefix + "*"):
            self.redis.delete(key)
        self.redis.close()


def _runtime(tmp_path: Path, db_url: str, broker: Broker) -> Runtime:
    migrate.upgrade(db_url)
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url}
    rt = Runtime(Settings.from_env(env), env=env)
    config = load_config_text(
        f"""
providers:
  gpu: {{kind: mock}}
queues:
  {QUEUE}:
    metrics: {{source: celery, url: "{BROKER}", global_keyprefix: "{broker.prefix}"}}
    autoscale:
      provider: gpu
      max_workers: 2
      instance: {{gpu: "RTX 4090", max_price_per_hour: 1}}
"""
    )
    with rt.transaction() as session:
        config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())
    return rt


def _lost_machine(rt: Runtime, launch_id: str, tasks: list[str], acks_late: bool) -> None:
    """A machine reconcile found gone at its provider: its jobs due to be handed back."""
    now = utc_now()
    with rt.transaction() as session:
        session.add(
            Instance(
                launch_id=launch_id,
                queue=QUEUE,
                provider="gpu",
                state=S.LOST,
                created_at=now - timedelta(minutes=10),
                tasks=tasks,
                acks_late=acks_late,
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


@pytest.fixture
def late(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path, "late")
    try:
        yield b
    finally:
        b.close()


@pytest.mark.timeout(120)
def test_a_killed_machines_job_is_left_to_kombus_own_redelivery_and_runs_once_more(
    tmp_path, db_url, late
):
    rt = _runtime(tmp_path, db_url, late)
    first = late.worker("a")
    late.publish("job-1", 3.0)
    late.wait_for(("start", "a", "job-1"))
    late.kill(first)
    assert late.unacked() == 1 and late.waiting() == 0
    _lost_machine(rt, "m1", ["job-1"], acks_late=True)
    what = run_step(handback.STEP, rt, "m1")
    assert what.kind is Kind.DONE, what
    assert "visibility_timeout" in str(what) and "said it held 1 job(s)" in str(what), what
    assert late.unacked() == 1 and late.waiting() == 0  # nothing restored on its word
    assert run_step(handback.STEP, rt, "m1").kind is Kind.SKIPPED  # done once
    (event,) = _events(rt, "left")
    assert event.details == {"said_held": 1, "left_to_the_visibility_timeout": True}
    assert _events(rt, "lost") == [] and _events(rt, "requeued") == []
    late.worker("b", visibility=2)  # kombu's own restore, on a short visibility timeout
    late.wait_for(("end", "b", "job-1"))
    time.sleep(0.5)  # nothing else may run it
    assert late.marks_of() == [("start", "a", "job-1"), ("start", "b", "job-1"),
                               ("end", "b", "job-1")]  # fmt: skip


@pytest.mark.timeout(120)
def test_with_early_acks_the_machine_is_counted_lost_once_whatever_it_named(tmp_path, db_url):
    early = Broker(tmp_path, "early")
    try:
        rt = _runtime(tmp_path, db_url, early)
        # prefork: the main process acks as its child accepts the job (a solo pool runs it
        # inline and acks only after: kombu's visibility timeout would bring it back too)
        worker = early.worker("a", pool="prefork")
        early.publish("job-e", 30.0)
        early.wait_for(("start", "a", "job-e"))
        deadline = time.monotonic() + 20  # the main process acks once it hears the child took it
        while early.unacked() and time.monotonic() < deadline:
            time.sleep(0.05)
        early.kill(worker)
        assert early.unacked() == 0  # acknowledged when it started
        named = ["job-e", *(f"never-{i}" for i in range(299))]  # 299 ids that never existed
        _lost_machine(rt, "m1", named, acks_late=False)
        run_step(handback.STEP, rt, "m1")
        (lost,) = _events(rt, "lost")
        assert lost.details["said_count"] == 300 and len(lost.details["said"]) == 20
        assert "task_acks_late" in lost.reason
        with rt.transaction() as session:
            counts = event_views.lost_work(session, utc_now() - timedelta(hours=1))
        assert counts[QUEUE] == (0, 1, 0)  # one machine lost, not 300 jobs
    finally:
        early.close()
