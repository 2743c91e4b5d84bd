"""A lost machine's jobs go back to the broker at once (`control.handback`), on real parts:
Redis, real Celery worker processes, the store on SQLite and PostgreSQL.

- `acks_late`: a worker killed mid-job (its process group, no goodbye: what a destroyed
  machine is to the broker) leaves its job in kombu's `unacked` for the visibility timeout
  (an hour); handed back, it runs again on another worker at once — exactly once more.
- Two hand-backs racing for the same machine restore each job once and write one event.
- Early acks: the running job was acknowledged when it started; nothing comes back, and the
  event names it lost.
- A job another live machine says it holds is never handed back for the lost one.
"""

from __future__ import annotations

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

import pytest
import redis
from celery import Celery
from sqlalchemy import select

from autoscaler.config import load_config_text
from autoscaler.control.handback import run_handback
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.lifecycle import InstanceState as S
from autoscaler.settings import Settings
from autoscaler.store import config_versions, migrate
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

    def worker(self, name: str, pool: str = "solo") -> subprocess.Popen[bytes]:
        env = os.environ | {"HB_BROKER": BROKER, "HB_PREFIX": self.prefix, "HB_ACKS": self.acks}
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
        self.app.send_task(
            "hb.work", args=[str(self.marks), seconds], task_id=task_id, queue=QUEUE
        )

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
def test_a_killed_machines_job_runs_again_elsewhere_at_once_and_once(tmp_path, db_url, late):
    rt = _runtime(tmp_path, db_url, late)
    first = late.worker("a")
    late.publish("job-1", 3.0)
    late.wait_for(("start", "a", "job-1"))
    late.kill(first)
    assert late.unacked() == 1 and late.waiting() == 0  # kombu would wait an hour
    _lost_machine(rt, "m1", ["job-1"], acks_late=True)
    assert run_handback(rt, "m1") == "restored 1 of 1 job(s) to their queues"
    assert late.unacked() == 0 and late.waiting() == 1
    late.worker("b")
    late.wait_for(("end", "b", "job-1"))
    time.sleep(0.5)  # nothing else may run it
    assert late.marks_of() == [("start", "a", "job-1"), ("start", "b", "job-1"),
                               ("end", "b", "job-1")]  # fmt: skip
    assert run_handback(rt, "m1") == "nothing to hand back"  # done once
    (event,) = _events(rt, "restored")
    assert event.details["restored"] == ["job-1"] and _events(rt, "lost") == []


@pytest.mark.timeout(120)
def test_two_hand_backs_racing_restore_each_job_once(tmp_path, db_url, late):
    rt = _runtime(tmp_path, db_url, late)
    worker = late.worker("a")
    ids = [f"race-{i}" for i in range(2)]
    for tid in ids:
        late.publish(tid, 30.0)
    late.wait_for(("start", "a", ids[0]))
    late.kill(worker)  # one running, one prefetched or waiting
    held = late.unacked()
    assert held >= 1
    _lost_machine(rt, "m1", ids, acks_late=True)
    results: list[str] = []
    racers = [
        threading.Thread(target=lambda: results.append(run_handback(rt, "m1"))) for _ in range(4)
    ]
    for t in racers:
        t.start()
    for t in racers:
        t.join(60)
    assert late.unacked() == 0
    assert late.waiting() == 2  # each job once on its queue: none twice, none lost
    assert len(_events(rt, "restored")) == 1


@pytest.mark.timeout(120)
def test_with_early_acks_a_running_job_is_named_lost(tmp_path, db_url):
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
        _lost_machine(rt, "m1", ["job-e"], acks_late=False)
        assert run_handback(rt, "m1") == "restored 0 of 1 job(s) to their queues"
        (lost,) = _events(rt, "lost")
        assert lost.details == {"tasks": ["job-e"]} and "task_acks_late" in lost.reason
    finally:
        early.close()


@pytest.mark.timeout(120)
def test_a_job_another_live_machine_holds_is_never_handed_back_for_the_lost_one(
    tmp_path, db_url, late
):
    rt = _runtime(tmp_path, db_url, late)
    worker = late.worker("a")
    late.publish("job-x", 30.0)
    late.wait_for(("start", "a", "job-x"))
    late.kill(worker)
    now = utc_now()
    with rt.transaction() as session:  # a live machine's heartbeat names the same job
        session.add(
            Instance(
                launch_id="honest",
                queue=QUEUE,
                provider="gpu",
                state=S.READY,
                created_at=now,
                tasks=["job-x"],
            )
        )
    _lost_machine(rt, "liar", ["job-x"], acks_late=True)
    assert run_handback(rt, "liar") == "its worker held no job"
    assert late.unacked() == 1 and late.waiting() == 0
    (event,) = _events(rt, "restored")
    assert event.details["held_elsewhere"] == ["job-x"]

