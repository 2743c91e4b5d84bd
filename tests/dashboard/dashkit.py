"""The dashboard tests' world: the API tests' world (tests/api/apikit.py: a store, one applied
config with queue q1 on a mock provider, two ready machines, admin keys) plus six hours of q1's
history, written the way production writes it: a metric reading saved by the loop's own store
code, then the API showing the numbers (which records the sample)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from autoscaler.lifecycle import InstanceState
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.store import events, metric_readings, queue_status
from tests.api.apikit import World, add_machine, make_world

SOURCE = "celery:redis://127.0.0.1:6379/11"
# (hours ago, pending, ready machines): a burst that the machines work off
HISTORY = [(5.5, 0, 2), (4.5, 12, 2), (3.5, 30, 3), (2.5, 18, 3), (1.5, 6, 2), (0.5, 4, 2)]
PENDING_NOW = 4


def save_reading(world: World, pending: int, at: datetime, running: int | None = 1) -> None:
    with world.rt.transaction() as session:
        metric_readings.save(
            session,
            SOURCE,
            {
                "q1": QueueMetrics(
                    queue="q1",
                    pending=pending,
                    oldest_pending_age=42.0 if pending else None,
                    in_flight=0,
                    read_at=at,
                    running=running,
                )
            },
        )


def set_status(world: World, desired: int, note: str = "no_workers: quiet") -> None:
    status: dict[str, Any] = {
        "queue": "q1",
        "capacity": 2,
        "floor": 0,
        "ceiling": 3,
        "desired": desired,
        "waits": [],
        "notes": [note],
    }
    with world.rt.transaction() as session:
        queue_status.record(session, [status], 1, datetime.now(UTC))


def dashboard_world(db_url: str, tmp_path: Any) -> World:
    world = make_world(db_url, tmp_path)
    now = datetime.now(UTC)
    set_status(world, 2)
    extra = "m3"
    for hours, pending, ready in HISTORY:
        if ready == 3 and extra not in world.tokens:
            world.tokens[extra] = add_machine(world.rt, extra, InstanceState.READY)
        if ready == 2 and extra in world.tokens:
            world.set_state(extra, InstanceState.TERMINATED)
        save_reading(world, pending, now - timedelta(hours=hours))
        r = world.client.get("/v1/admin/overview", headers=world.h(world.admin))
        assert r.status_code == 200, r.text
    with world.rt.transaction() as session:
        events.record(
            session,
            [
                events.event(
                    "scale_up", "launch", "no_workers: 12 pending and no live worker", queue="q1"
                ),
                events.event("drain", "drained", "idle for 5m", queue="q1", launch_id="m3"),
            ],
            now,
        )
    assert HISTORY[-1][1] == PENDING_NOW
    return world
