"""Live workers: a real Celery worker process seen through the broker the way the loop sees it
(probe answers recorded as sightings, read back within their window); which queue a task is
counted for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from autoscaler.brokers.base import SourceError
from autoscaler.brokers.workers import CeleryWorkerProbe
from autoscaler.control.observe import read_sightings, record_sightings
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import Base
from tests.conftest import REDIS_URL

ROOT = Path(__file__).resolve().parents[2]


def test_a_real_worker_is_seen_on_its_queues_and_not_live_after_it_dies(prefix, tmp_path):
    env = os.environ | {"TEST_WORKER_BROKER": f"{REDIS_URL}/0", "TEST_WORKER_PREFIX": prefix}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.brokers.worker_app",
            "worker",
            "-Q",
            "gpu-a,gpu-b",
            "--pool",
            "solo",
            "-n",
            "w1@hand-made-box",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    Base.metadata.create_all(engine)
    sessions = session_factory(engine)
    now = [datetime.now(UTC)]
    probe = CeleryWorkerProbe(
        f"{REDIS_URL}/0", transport_options={"global_keyprefix": prefix}, timeout=1.0
    )

    def read() -> dict[str, tuple[str, ...]]:
        """One observation as `control.observe` makes it: what answered is recorded (a failed
        probe records nothing and keeps the old sightings), then the live workers per queue."""
        try:
            answers = probe.status()
        except SourceError:
            answers = {}
        with transaction(sessions) as s:
            record_sightings(s, answers, "inst", now[0], f"{REDIS_URL}/0 {prefix}")
        with transaction(sessions) as s:
            return read_sightings(s, "inst", set(), now[0], 60)[0]

    try:
        deadline = time.monotonic() + 30
        live: dict[str, tuple[str, ...]] = {}
        while time.monotonic() < deadline and "gpu-a" not in live:
            live = read()
        assert live == {"gpu-a": ("w1@hand-made-box",), "gpu-b": ("w1@hand-made-box",)}
        # a probe on another prefix (another app) must not see it
        other = CeleryWorkerProbe(
            f"{REDIS_URL}/0", transport_options={"global_keyprefix": prefix + "x:"}, timeout=0.5
        )
        assert other.poll() == {}
        other.close()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # dies without a goodbye
        proc.wait(10)
    # no reply now; within the window it still counts (a busy solo pool cannot answer) ...
    now[0] += timedelta(seconds=30)
    assert read() == {"gpu-a": ("w1@hand-made-box",), "gpu-b": ("w1@hand-made-box",)}
    # ... past its window it is not live
    now[0] += timedelta(seconds=31)
    assert read() == {}
    probe.close()
    engine.dispose()


def test_a_task_is_attributed_to_the_consumed_queue_its_exchange_and_key_route_to():
    from autoscaler.brokers.workers import _consumed, queue_of_task

    consumed = _consumed(
        [
            {
                "name": "jobs",
                "exchange": {"name": "celery", "type": "direct"},
                "routing_key": "celery",
            },
            {
                "name": "gpu-work",
                "exchange": {"name": "jobsx", "type": "direct"},
                "routing_key": "work.gpu",
            },
            {
                "name": "gpu-topic",
                "exchange": {"name": "tasks", "type": "topic"},
                "routing_key": "gpu.#",
            },
        ]
    )

    def task(exchange: str, key: str) -> dict:
        return {"delivery_info": {"exchange": exchange, "routing_key": key}}

    assert queue_of_task(task("", "jobs"), consumed) == "jobs"  # the anonymous exchange
    assert queue_of_task(task("jobsx", "work.gpu"), consumed) == "gpu-work"
    assert queue_of_task(task("tasks", "gpu.fast.big"), consumed) == "gpu-topic"
    assert queue_of_task(task("tasks", "cpu.fast"), consumed) is None
    assert queue_of_task(task("", "elsewhere"), consumed) is None
    assert queue_of_task({"no": "info"}, consumed[:1]) == "jobs"  # one queue: from there


def test_worker_loads_fill_running_and_move_held_eta_jobs_out_of_in_flight():
    from autoscaler.brokers.workers import QueueLoad, with_worker_loads

    now = datetime.now(UTC)
    rabbit = QueueMetrics("q", 4, 10.0, 5, now)  # RabbitMQ: 3 of the 5 unacked are ETA-held
    got = with_worker_loads(rabbit, QueueLoad(running=1, reserved=1, scheduled=3, next_due=9.0))
    assert (got.in_flight, got.scheduled, got.scheduled_held, got.next_due_at) == (2, 3, 3, 9.0)
    assert (got.running, got.reserved, got.started_or_held) == (1, 1, 2)
    redis_seen = QueueMetrics("q", 4, 10.0, 2, now, scheduled=3, scheduled_held=3, next_due_at=5.0)
    got = with_worker_loads(redis_seen, QueueLoad(running=2, reserved=2, scheduled=3))
    assert (got.in_flight, got.scheduled, got.next_due_at, got.started_or_held) == (2, 3, 5.0, 4)
    assert with_worker_loads(rabbit, None) is rabbit
    assert QueueLoad.from_json(QueueLoad(1, 2, 3, 4.5).as_json()) == QueueLoad(1, 2, 3, 4.5)
    assert QueueLoad.from_json([1, -2, 3, None]) is None and QueueLoad.from_json("x") is None
