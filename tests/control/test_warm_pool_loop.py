"""The loop's warm pool against the project's RunPod and Vast fakes, on SQLite and PostgreSQL.

The loop's own steps in this process — tick (`evaluate` with a reading), launch, drain,
stop, resume, reconcile, terminate — on real HTTP to the fakes, which serve the stop/start
endpoints as the specs say. A machine's worker is "up" when its heartbeat would say so
(`machines.mark_ready`, the one function every sign of life goes through); the queue is a plain
Redis list (the tick is handed its reading), so no remote control is asked.

- burst → idle → drained → stopped at the provider (RunPod `EXITED`, Vast `stopped`), its
  storage price recorded; a second burst resumes the same machine (no create), a warm hit;
- a stop whose answer is lost (timeout / 500) but which happened is confirmed by reconcile;
- a start that comes back without a GPU (RunPod) or refused (Vast) is a warm miss: destroyed,
  the queue evaluated at once, a fresh machine rented — never a backoff;
- a start stuck in scheduling is a warm miss at `resume_timeout` (reconcile), its host avoided.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from autoscaler.config import load_config_text
from autoscaler.control import machines, reconciler
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps import drain, launch, resume, stop, terminate
from autoscaler.control.steps.drain import DrainStep
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.control.tick.evaluate import TickResult, evaluate
from autoscaler.lifecycle import InstanceState as S
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.settings import Settings
from autoscaler.store import backoffs, config_versions, events, instances, migrate
from autoscaler.store.instances import InstanceDetails
from autoscaler.store.models import Instance, ScaleEvent
from tests.control.outbox import RecordingOutbox
from tests.fakes.runpod_server import FakeRunPod
from tests.fakes.vast_server import FakeVast

RUNPOD_KEY = "rpa_WARMPOOL_4f9c2e7b1d_not_a_real_key"
VAST_KEY = "vast_WARMPOOL_8e1a5c0f3b_not_a_real_key"
Q = "infer"


def _config(kind: str, url: str) -> str:
    provider = (
        f'{{kind: runpod, base_url: "{url}", api_key_env: WP_KEY, volume_gb: 20, '
        'gpu_types: ["NVIDIA GeForce RTX 4090"]}'
        if kind == "runpod"
        else f'{{kind: vast, base_url: "{url}", api_key_env: WP_KEY}}'
    )
    return f"""
poll_interval: 1
providers:
  gpu: {provider}
queues:
  {Q}:
    metrics: {{source: redis-list, url: "redis://127.0.0.1:6379/10", queue: "never-read"}}
    autoscale:
      provider: gpu
      max_workers: 2
      scale_up: [{{trigger: queue_depth, target_per_worker: 4}}]
      scale_down: [{{trigger: idle, timeout: 5m}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.8}}
      warm_pool: {{size: 1, keep_for: 1h, resume_timeout: 2s}}
"""


@dataclass
class World:
    """The runtime, the fake, and every step the loop asked to send (run here by hand)."""

    rt: Runtime
    fake: Any
    kind: str
    outbox: RecordingOutbox = field(default_factory=RecordingOutbox)

    def tick(self, pending: int, now: datetime) -> TickResult:
        reading = {Q: QueueMetrics(Q, pending, 10.0 if pending else None, 0, now)}
        return evaluate(self.rt, self.outbox, trigger="t", readings=reading, now=now)

    def row(self, launch_id: str) -> InstanceDetails:
        with self.rt.transaction() as session:
            row = instances.get(session, launch_id)
            assert row is not None
            return row

    def live(self) -> list[Instance]:
        with self.rt.transaction() as session:
            rows = list(session.scalars(select(Instance).where(Instance.state != S.TERMINATED)))
            for r in rows:
                session.expunge(r)
            return rows

    def ready(self, launch_id: str) -> None:
        with self.rt.transaction() as session:
            machines.mark_ready(session, launch_id, Q, "gpu", utc_now(), "its worker is up (test)")

    def warm_actions(self) -> list[str]:
        with self.rt.transaction() as session:
            return [
                e.action
                for e in session.scalars(
                    select(ScaleEvent)
                    .where(ScaleEvent.kind == events.WARM_EVENT)
                    .order_by(ScaleEvent.id)
                )
            ]

    def created(self) -> int:
        return len(self.fake.pods if self.kind == "runpod" else self.fake.instances)

    def boot(self, now: datetime) -> str:
        """A burst rents one machine; it boots and its worker comes up."""
        result = self.tick(3, now)
        (launch_id,) = result.launched
        assert run_step(launch.STEP, self.rt, launch_id).kind is Kind.DONE
        self.ready(launch_id)
        return launch_id

    def stop_idle(self, launch_id: str, now: datetime) -> None:
        """The queue goes quiet: drained (no worker to ask) and stopped for the pool."""
        later = now + timedelta(minutes=10)
        result = self.tick(0, later)
        assert result.drains == [launch_id]
        assert run_step(drain.STEP, self.rt, launch_id, self.outbox).kind is Kind.DONE
        assert ("stop", launch_id) in self.outbox.sent
        assert self.row(launch_id).state == S.STOPPING


@pytest.fixture(params=["runpod", "vast"])
def world(request, tmp_path, db_url) -> Iterator[World]:
    kind = request.param
    fake: Any = FakeRunPod(RUNPOD_KEY) if kind == "runpod" else FakeVast(VAST_KEY)
    migrate.upgrade(db_url)
    env = {
        "AUTOSCALER_HOME": str(tmp_path),
        "AUTOSCALER_DATABASE_URL": db_url,
        "WP_KEY": RUNPOD_KEY if kind == "runpod" else VAST_KEY,
    }
    rt = Runtime(Settings.from_env(env), env=env)
    try:
        config = load_config_text(_config(kind, fake.url))
        with rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())
        yield World(rt, fake, kind)
    finally:
        rt.close()
        fake.close()


def _stopped(w: World, launch_id: str) -> None:
    """The stop step until the provider lists the machine stopped (a stop is asynchronous)."""
    deadline = time.monotonic() + 20
    while w.row(launch_id).state != S.STOPPED:
        assert time.monotonic() < deadline, w.row(launch_id).state_reason
        run_step(stop.STEP, w.rt, launch_id, w.outbox)
        reconciler.run_reconcile(w.rt, w.outbox)


@pytest.mark.timeout(120)
def test_idle_machines_are_stopped_and_resumed_not_rented_again(world: World):
    w = world
    now = utc_now()
    launch_id = w.boot(now)
    w.stop_idle(launch_id, now)
    _stopped(w, launch_id)
    stopped = w.row(launch_id)
    assert stopped.broker_user is None and stopped.storage_price_per_hour is not None
    if w.kind == "runpod":  # 20 GB × $0.20 / 730 h
        assert stopped.storage_price_per_hour == pytest.approx(20 * 0.20 / 730, rel=1e-3)
    created = w.created()

    # a second burst: the same machine comes back, nothing is created
    result = w.tick(3, utc_now())
    assert result.launched == [] and result.resumed == [launch_id]
    assert w.row(launch_id).state == S.RESUMING
    assert run_step(resume.STEP, w.rt, launch_id, w.outbox).kind is Kind.DONE
    w.ready(launch_id)
    again = w.row(launch_id)
    assert again.state == S.READY and again.resumes == 1
    assert w.created() == created
    assert w.warm_actions() == ["stop", "stopped", "resume", "hit"]
    with w.rt.transaction() as session:
        assert backoffs.by_queue(session) == {}


@pytest.mark.timeout(120)
def test_a_stop_whose_answer_is_lost_but_happened_is_confirmed(world: World):
    w = world
    now = utc_now()
    launch_id = w.boot(now)
    w.fake.stop_times_out_but_happens = True
    w.fake.lost_answer = "500"
    w.stop_idle(launch_id, now)
    outcome = run_step(stop.STEP, w.rt, launch_id, w.outbox)
    assert w.row(launch_id).state in (S.STOPPING, S.STOPPED), outcome
    reconciler.run_reconcile(w.rt, w.outbox)
    assert w.row(launch_id).state == S.STOPPED
    assert w.warm_actions().count("stopped") == 1  # confirmed once, whoever confirmed it


@pytest.mark.timeout(120)
def test_a_start_refused_is_a_warm_miss_and_a_fresh_machine_is_rented_at_once(world: World):
    w = world
    now = utc_now()
    launch_id = w.boot(now)
    w.stop_idle(launch_id, now)
    _stopped(w, launch_id)
    w.fake.resume_without_gpu = True
    result = w.tick(3, utc_now())
    assert result.resumed == [launch_id]
    w.outbox.clear()
    outcome = run_step(resume.STEP, w.rt, launch_id, w.outbox)
    assert outcome.kind is Kind.ABANDONED, outcome  # a warm miss
    assert w.row(launch_id).state == S.TERMINATING
    assert ("terminate", launch_id) in w.outbox.sent and ("evaluate", Q) in w.outbox.sent
    assert run_step(terminate.STEP, w.rt, launch_id).kind is Kind.DONE
    with w.rt.transaction() as session:
        assert backoffs.by_queue(session) == {}  # a miss is not a failed rental
    fresh = w.tick(3, utc_now())  # what the "evaluate" step does
    assert len(fresh.launched) == 1 and fresh.resumed == []
    assert "miss" in w.warm_actions()


@pytest.mark.timeout(120)
def test_a_start_stuck_scheduling_is_a_warm_miss_at_the_resume_timeout(world: World):
    w = world
    now = utc_now()
    launch_id = w.boot(now)
    w.stop_idle(launch_id, now)
    _stopped(w, launch_id)
    w.fake.start_stuck_scheduling = True
    assert w.tick(3, utc_now()).resumed == [launch_id]
    assert run_step(resume.STEP, w.rt, launch_id, w.outbox).kind is Kind.DONE
    reconciler.run_reconcile(w.rt, w.outbox)
    assert w.row(launch_id).state == S.RESUMING  # within its resume_timeout (2 s)
    time.sleep(2.2)
    w.outbox.clear()
    reconciler.run_reconcile(w.rt, w.outbox)
    row = w.row(launch_id)
    assert row.state == S.TERMINATING and "warm miss" in (row.state_reason or "")
    assert ("evaluate", Q) in w.outbox.sent


@pytest.mark.timeout(120)
def test_a_stop_or_resume_lost_mid_step_is_finished_by_reconcile(world: World):
    """A worker killed mid-stop (the row stopping, the provider never asked) and mid-resume
    (the row resuming, the start never sent): reconcile sends each step again and it ends."""
    w = world
    now = utc_now()
    launch_id = w.boot(now)
    w.stop_idle(launch_id, now)  # the stop task is lost: never run
    time.sleep(1.1)  # one step-retry period (the poll interval, 1 s)
    w.outbox.clear()
    reconciler.run_reconcile(w.rt, w.outbox)
    assert ("stop", launch_id) in w.outbox.sent
    _stopped(w, launch_id)
    assert w.tick(3, utc_now()).resumed == [launch_id]  # the resume task is lost: never run
    time.sleep(1.1)
    w.outbox.clear()
    reconciler.run_reconcile(w.rt, w.outbox)
    assert ("resume", launch_id) in w.outbox.sent
    assert run_step(resume.STEP, w.rt, launch_id, w.outbox).kind is Kind.DONE
    w.ready(launch_id)
    assert w.row(launch_id).state == S.READY
    assert w.warm_actions().count("hit") == 1


@pytest.mark.timeout(120)
def test_racing_steps_stop_resume_and_destroy_each_machine_once(world: World):
    """Several workers run the same step at once (redelivered tasks, reconcile's retries): each
    move happens once, with one event, and nothing more is created."""
    w = world
    now = utc_now()
    launch_id = w.boot(now)
    w.stop_idle(launch_id, now)

    def race(step: Any) -> None:
        threads = [threading.Thread(target=step) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)

    deadline = time.monotonic() + 20
    while w.row(launch_id).state != S.STOPPED:
        assert time.monotonic() < deadline
        race(lambda: run_step(stop.STEP, w.rt, launch_id, w.outbox))
    created = w.created()
    assert w.tick(3, utc_now()).resumed == [launch_id]
    race(lambda: run_step(resume.STEP, w.rt, launch_id, w.outbox))
    w.ready(launch_id)
    w.ready(launch_id)
    actions = w.warm_actions()
    assert actions.count("stopped") == 1 and actions.count("hit") == 1, actions
    assert w.created() == created
    # the operator empties the pool later: the machine is destroyed once
    w.stop_idle(launch_id, now + timedelta(minutes=30))
    _stopped(w, launch_id)
    emptied = DrainStep("emptied by the operator")
    assert run_step(emptied, w.rt, launch_id).kind is Kind.CANCELLED
    race(lambda: run_step(terminate.STEP, w.rt, launch_id))
    with w.rt.transaction() as session:
        destroyed = session.scalars(
            select(ScaleEvent).where(
                ScaleEvent.kind == "terminate", ScaleEvent.launch_id == launch_id
            )
        ).all()
    assert w.row(launch_id).state == S.TERMINATED and len(destroyed) == 1
    assert w.created() == created - 1  # gone at the provider: nothing leaks
