"""Agent-reported live workers: fresh heartbeats in serving states only, per queue."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from autoscaler.brokers.workers import hand_made, merge_live_workers
from autoscaler.lifecycle import InstanceState
from autoscaler.store.db import transaction
from autoscaler.store.instances import live_agent_workers
from autoscaler.store.models import Instance

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def row(
    lid: str, queue: str, state: InstanceState, beat_ago: float | None, worker: str | None = None
) -> Instance:
    return Instance(
        launch_id=lid,
        queue=queue,
        provider="gpu",
        state=state,
        worker_name=worker,
        last_heartbeat_at=None if beat_ago is None else NOW - timedelta(seconds=beat_ago),
    )


def test_only_fresh_heartbeats_in_serving_states_are_live(sessions):
    with transaction(sessions) as s:
        s.add_all(
            [
                row("a", "q", InstanceState.READY, 5, "celery@gpu-a"),
                row("b", "q", InstanceState.DRAINING, 299, "celery@gpu-b"),
                row("c", "q", InstanceState.READY, 301, "celery@gpu-c"),  # silent too long
                row("d", "q", InstanceState.BOOTING, 1, "celery@gpu-d"),  # not serving yet
                row("e", "q", InstanceState.TERMINATED, 1, "celery@gpu-e"),
                row("f", "q", InstanceState.READY, None),  # never reported
                row("g", "r", InstanceState.READY, 10),  # no worker name yet: its launch id
            ]
        )
    with transaction(sessions) as s:
        live = live_agent_workers(s, NOW, heartbeat_window=300)
    assert live == {"q": ("celery@gpu-a", "celery@gpu-b"), "r": ("g",)}
    # merged with what the broker sees: the rented machine counts once, the desk GPU counts too
    broker = ("celery@gpu-a", "celery@desk")
    assert merge_live_workers(live["q"], broker) == ("celery@desk", "celery@gpu-a", "celery@gpu-b")
    assert hand_made(live["q"], broker) == ("celery@desk",)
