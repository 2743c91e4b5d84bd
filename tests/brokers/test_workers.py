"""Live workers: a real Celery worker process seen through the broker; the silence window;
the merge with agent-reported machines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from autoscaler.brokers.workers import (
    BrokerWorkers,
    CeleryWorkerProbe,
    WorkerTracker,
    hand_made,
    host_of,
    merge_live_workers,
    with_broker_workers,
)
from autoscaler.policy.snapshot import QueueMetrics
from tests.conftest import REDIS_URL

ROOT = Path(__file__).resolve().parents[2]


def test_a_real_worker_is_seen_on_its_queues_and_not_live_after_it_dies(prefix):
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
    now = [datetime.now(UTC)]
    probe = CeleryWorkerProbe(
        f"{REDIS_URL}/0", transport_options={"global_keyprefix": prefix}, timeout=1.0
    )
    workers = BrokerWorkers(probe, window=60, clock=lambda: now[0])
    try:
        deadline = time.monotonic() + 30
        live: dict[str, tuple[str, ...]] = {}
        while time.monotonic() < deadline and "gpu-a" not in live:
            live = workers.read()
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
    assert workers.read() == {"gpu-a": ("w1@hand-made-box",), "gpu-b": ("w1@hand-made-box",)}
    # ... past its window it is not live
    now[0] += timedelta(seconds=31)
    assert workers.read() == {}
    probe.close()


def test_tracker_window_per_worker_and_queues_kept_on_bare_heartbeats():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    tr = WorkerTracker(window=10)
    tr.observe("celery@a", ["q1"], t0)
    tr.observe("celery@b", ["q1", "q2"], t0, window=4)  # event heartbeats: 2 x 2 s
    tr.observe("celery@a", None, t0 + timedelta(seconds=8))  # heartbeat without queue list
    assert tr.live(t0 + timedelta(seconds=4)) == {
        "q1": ("celery@a", "celery@b"),
        "q2": ("celery@b",),
    }
    assert tr.live(t0 + timedelta(seconds=5)) == {"q1": ("celery@a",)}
    assert tr.live(t0 + timedelta(seconds=18.5)) == {}


names = st.from_regex(r"[a-z]{1,6}(@[a-z0-9]{1,6})?", fullmatch=True)


@given(st.lists(names, max_size=6), st.lists(names, max_size=6))
def test_merge_counts_each_host_once_and_keeps_agent_names(agent, broker):
    merged = merge_live_workers(agent, broker)
    hosts = {host_of(n) for n in [*agent, *broker]}
    assert len(merged) == len(hosts) and {host_of(n) for n in merged} == hosts
    for n in agent:  # the agent-reported machine is never replaced by a broker name
        assert any(host_of(m) == host_of(n) and m in agent for m in merged)
    manual = hand_made(agent, broker)  # merged = ours + hand-made, nothing counted twice
    assert len(merged) == len({host_of(n) for n in agent}) + len(manual)
    assert not {host_of(n) for n in manual} & {host_of(n) for n in agent}


def test_with_broker_workers_fills_only_the_named_queues():
    m = QueueMetrics("q1", 1, None, 0, datetime.now(UTC))
    out = with_broker_workers({"q1": m, "q2": m}, {"q1": ("celery@x",)})
    assert out["q1"].broker_workers == ("celery@x",) and out["q2"].broker_workers == ()


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
