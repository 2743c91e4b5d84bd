"""Interruptible machines through the loop's own tick, launch and reconcile against the
project's Vast fake (its bid search, bid creates and `outbid` switch follow Vast's spec), on
SQLite and PostgreSQL.

- The tick rents at most `max_share` of the queue's machines at the bid; the launch sends the
  bid and the row says interruptible, at the bid's price.
- Outbid: reconcile sees the machine stopped by Vast, moves it to terminating (no capacity from
  now on), records the preemption with its host, marks its jobs to be handed back, and asks
  for the hand-back, the destroy and an evaluation at once (the replacement).
- A host that preempts our machines twice within a day is avoided.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from autoscaler.api import metrics
from autoscaler.config import load_config_text
from autoscaler.control import machines, reconciler
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps import launch
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.control.tick.evaluate import evaluate
from autoscaler.lifecycle import InstanceState as S
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.settings import Settings
from autoscaler.store import (
    avoided_hosts,
    backoffs,
    config_versions,
    events,
    heartbeats,
    migrate,
    queue_views,
)
from autoscaler.store.models import Instance, ScaleEvent
from tests.control.outbox import RecordingOutbox
from tests.fakes.vast_server import FakeVast

VAST_KEY = "vast_INTERRUPTIBLE_5b1e9c2d7a_not_a_real_key"


class World:
    def __init__(self, tmp_path: Any, db_url: str) -> None:
        self.vast = FakeVast(VAST_KEY)
        migrate.upgrade(db_url)
        env = {
            "AUTOSCALER_HOME": str(tmp_path),
            "AUTOSCALER_DATABASE_URL": db_url,
            "IL_VAST": VAST_KEY,
        }
        self.rt = Runtime(Settings.from_env(env), env=env)
        config = load_config_text(
            f"""
providers:
  vast: {{kind: vast, base_url: "{self.vast.url}", api_key_env: IL_VAST}}
queues:
  render:
    metrics: {{source: celery, url: "redis://127.0.0.1:6379/10", queue: "never-read"}}
    autoscale:
      provider: vast
      max_workers: 4
      scale_up: [{{trigger: queue_depth, target_per_worker: 1}}]
      instance:
        gpu: "RTX 4090"
        max_price_per_hour: 0.8
        interruptible: {{bid: 0.25, max_share: 0.5}}
"""
        )
        with self.rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())

    def tick(self, pending: int) -> list[str]:
        now = utc_now()
        sent = RecordingOutbox()
        evaluate(
            self.rt,
            sent,
            trigger="t",
            readings={"render": QueueMetrics("render", pending, 30.0, 0, now)},
            now=now,
        )
        return [str(lid) for lid in sent.of("launch")]

    def row(self, launch_id: str) -> Instance:
        with self.rt.transaction() as session:
            row = session.scalars(select(Instance).where(Instance.launch_id == launch_id)).one()
            session.expunge(row)
            return row

    def serving(self, launch_id: str, tasks: list[str]) -> None:
        """Its worker is up and holds `tasks` (its agent's heartbeat)."""
        now = utc_now()
        with self.rt.transaction() as session:
            machines.mark_ready(session, launch_id, "render", "vast", now, "its worker is up (t)")
            said = {"last_heartbeat_at": now, "tasks": tasks}
            heartbeats.note_heartbeat(session, launch_id, said)


@pytest.fixture
def world(tmp_path, db_url) -> Iterator[World]:
    w = World(tmp_path, db_url)
    try:
        yield w
    finally:
        w.vast.close()


def test_an_outbid_machine_is_no_capacity_its_jobs_go_back_and_a_replacement_is_asked_for(
    world: World,
) -> None:
    launches = world.tick(pending=2)
    assert len(launches) == 2
    for lid in launches:
        assert run_step(launch.STEP, world.rt, lid).kind is Kind.DONE
    rows = {lid: world.row(lid) for lid in launches}
    bid = [r for r in rows.values() if r.interruptible]
    on_demand = [r for r in rows.values() if not r.interruptible]
    assert len(bid) == 1 and len(on_demand) == 1  # max_share 0.5 of 2 machines
    (machine,) = bid
    assert machine.price_per_hour == 0.25
    created = world.vast.instances[int(machine.provider_instance_id)]
    assert created["is_bid"] is True
    for r in rows.values():
        world.serving(r.launch_id, ["job-1"] if r is machine else ["job-2"])

    world.vast.outbid(int(machine.provider_instance_id))
    outbox = RecordingOutbox()
    reconciler.run_reconcile(world.rt, outbox)
    sent = outbox.sent

    after = world.row(machine.launch_id)
    assert after.state == S.TERMINATING and "outbid" in (after.state_reason or "")
    assert after.handback_due_at is not None and after.tasks == ["job-1"]
    assert world.row(on_demand[0].launch_id).state == S.READY  # the other one untouched
    assert ("handback", machine.launch_id) in sent and ("terminate", machine.launch_id) in sent
    assert ("evaluate", "render") in sent  # the replacement now, not a poll later
    with world.rt.transaction() as session:
        (event,) = session.scalars(select(ScaleEvent).where(ScaleEvent.kind == "preemption"))
        assert event.details == {"provider": "vast", "host": machine.host_id}
        (queue,) = queue_views.queues(session, utc_now())
        assert queue.preemptions_today == 1
        assert queue.preempting_hosts == {machine.host_id: 1}
        scrape = metrics.render(session)
        assert (
            f'autoscaler_preemptions_total{{host="{machine.host_id}",provider="vast",'
            f'queue="render"}} 1.0' in scrape
        )
        # no failure of the rental, and the host is not avoided for one preemption
        assert backoffs.by_queue(session) == {}
        assert avoided_hosts.active_host_ids(session, "vast", utc_now()) == []


def test_a_host_that_preempts_twice_within_a_day_is_avoided(world: World) -> None:
    (lid, *_) = world.tick(pending=2)
    launched = [lid, *_]
    for one in launched:
        run_step(launch.STEP, world.rt, one)
    machine = next(world.row(x) for x in launched if world.row(x).interruptible)
    host = machine.host_id
    assert host is not None
    earlier = utc_now() - timedelta(hours=3)
    with world.rt.transaction() as session:  # a machine of ours preempted there this morning
        session.add(
            Instance(
                launch_id="earlier",
                queue="render",
                provider="vast",
                state=S.TERMINATED,
                host_id=host,
                created_at=earlier,
                interruptible=True,
            )
        )
        events.record(
            session,
            [
                events.event(
                    "preemption", "preempted", "outbid", queue="render", launch_id="earlier"
                )
            ],
            earlier,
        )
    world.serving(machine.launch_id, [])
    world.vast.outbid(int(machine.provider_instance_id))
    reconciler.run_reconcile(world.rt, RecordingOutbox())
    with world.rt.transaction() as session:
        assert host in avoided_hosts.active_host_ids(session, "vast", utc_now())
