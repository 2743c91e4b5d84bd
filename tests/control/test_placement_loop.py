"""Placement across providers: the loop's own tick, launch and status against the project's
RunPod and Vast fakes at once (each follows its real API: paths, bodies, capacity errors, 401s,
5xx after a create), on SQLite and PostgreSQL.

- RunPod out of capacity → the same launch rents on Vast; RunPod backs off with its cause.
- Vast cheaper → Vast, under `cheapest`; `in_order` keeps the list's order.
- Vast's key refused → RunPod serves, and `status` says "key refused" for Vast.
- Both in backoff → the queue waits, the wait naming both; nothing is called.
- A create ambiguous on Vast (made, then a 500) is found there by its label and never repeated
  on RunPod.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from autoscaler.cli.render import render_status
from autoscaler.config import load_config_text
from autoscaler.config.models import Backoff
from autoscaler.control import machines
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps import launch
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.control.tick.evaluate import evaluate
from autoscaler.lifecycle import InstanceState as S
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.settings import Settings
from autoscaler.store import backoffs, config_versions, migrate, queue_views
from autoscaler.store.models import Instance, QueueStatus
from tests.control.outbox import RecordingOutbox
from tests.fakes.runpod_server import FakeRunPod
from tests.fakes.vast_server import FakeVast

RUNPOD_KEY = "rpa_PLACEMENT_3c1f9e0a7b_not_a_real_key"
VAST_KEY = "vast_PLACEMENT_7d2b4e8c1f_not_a_real_key"


def _config(runpod: FakeRunPod, vast: FakeVast, providers: str, placement: str) -> str:
    return f"""
backoff: {{base: 60, cap: 600}}
providers:
  pods: {{kind: runpod, base_url: "{runpod.url}", api_key_env: PL_RUNPOD, cloud_type: COMMUNITY}}
  vast: {{kind: vast, base_url: "{vast.url}", api_key_env: PL_VAST}}
queues:
  render:
    metrics: {{source: celery, url: "redis://127.0.0.1:6379/10", queue: "never-read"}}
    autoscale:
      provider: {providers}
      placement: {placement}
      max_workers: 3
      scale_up: [{{trigger: queue_depth, target_per_worker: 10}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.8}}
"""


class World:
    """A control plane in this process with both fakes, its config applied."""

    def __init__(self, tmp_path: Any, db_url: str, vast_key: str = VAST_KEY) -> None:
        self.runpod, self.vast = FakeRunPod(RUNPOD_KEY), FakeVast(VAST_KEY)
        migrate.upgrade(db_url)
        env = {
            "AUTOSCALER_HOME": str(tmp_path),
            "AUTOSCALER_DATABASE_URL": db_url,
            "PL_RUNPOD": RUNPOD_KEY,
            "PL_VAST": vast_key,
        }
        self.rt = Runtime(Settings.from_env(env), env=env)

    def apply(self, providers: str = "[pods, vast]", placement: str = "cheapest") -> None:
        config = load_config_text(_config(self.runpod, self.vast, providers, placement))
        with self.rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())

    def tick(self, pending: int = 5) -> list[str]:
        """One evaluation with `pending` jobs waiting; returns the launch ids it asked for."""
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

    def creates(self) -> tuple[int, int]:
        return len(self.runpod.calls("POST", "/v2/pods")), len(
            self.vast.calls("PUT", "/api/v0/asks/")
        )

    def close(self) -> None:
        self.runpod.close()
        self.vast.close()


@pytest.fixture
def world(tmp_path, db_url) -> Iterator[World]:
    w = World(tmp_path, db_url)
    try:
        yield w
    finally:
        w.close()


def test_runpod_out_of_capacity_the_same_launch_rents_on_vast(world: World) -> None:
    world.apply(placement="in_order")  # RunPod first by preference
    world.runpod.refuse_create = True  # the catalog shows stock; creates are refused
    (launch_id,) = world.tick(pending=5)
    assert run_step(launch.STEP, world.rt, launch_id).kind is Kind.DONE
    row = world.row(launch_id)
    assert row.state == S.BOOTING and row.provider == "vast"
    assert row.placement == {"providers": ["pods", "vast"], "tried": ["pods", "vast"]}
    assert world.creates() == (1, 1)  # one refused on RunPod, one made on Vast
    assert len(world.vast.instances) == 1 and world.runpod.pods == {}
    with world.rt.transaction() as session:
        held = {b.provider: b for b in backoffs.by_queue(session)["render"]}
    assert set(held) == {"pods"} and held["pods"].cause == "capacity"
    # the next tick rents on Vast alone: RunPod waits out its backoff, and says so
    (second,) = world.tick(pending=15)
    assert world.row(second).placement is None and world.row(second).provider == "vast"
    with world.rt.transaction() as session:
        status = session.get(QueueStatus, "render")
        assert status is not None
        notes = " ".join(status.status.get("notes", []))
    assert "backoff: renting from pods failed 1 time(s)" in notes and "renting from vast" in notes


def test_vast_cheaper_is_rented_under_cheapest_and_the_list_order_wins_under_in_order(
    world: World,
) -> None:
    world.apply(placement="cheapest")  # Vast's verified 4090 at $0.31/h vs RunPod's $0.34/h
    (first,) = world.tick()
    assert run_step(launch.STEP, world.rt, first).kind is Kind.DONE
    assert world.row(first).provider == "vast" and world.row(first).price_per_hour == 0.31
    assert world.creates() == (0, 1)
    world.apply(placement="in_order")
    (second,) = world.tick(pending=15)
    assert run_step(launch.STEP, world.rt, second).kind is Kind.DONE
    assert world.row(second).provider == "pods" and world.row(second).price_per_hour == 0.34
    assert world.creates() == (1, 1)


def test_vast_key_refused_runpod_serves_and_status_says_why(tmp_path, db_url) -> None:
    w = World(tmp_path, db_url, vast_key="vast_WRONG_KEY_0000000000_not_real")
    try:
        w.apply(providers="[vast, pods]", placement="in_order")
        (launch_id,) = w.tick()
        assert run_step(launch.STEP, w.rt, launch_id).kind is Kind.DONE
        assert w.row(launch_id).provider == "pods"
        assert w.vast.instances == {}
        now = utc_now()
        with w.rt.transaction() as session:
            (queue,) = queue_views.queues(session, now)
            states = {p.provider: p.state for p in queue.providers}
            text = render_status(session, w.rt.settings, now)
        assert states == {"vast": "key refused", "pods": "serving"}
        assert "providers: vast key refused until" in text
        assert "pods serving (1 machine)" in text
        assert VAST_KEY not in text and "vast_WRONG_KEY" not in text
    finally:
        w.close()


def test_both_providers_in_backoff_the_queue_waits_naming_both(world: World) -> None:
    world.apply()
    now = utc_now()
    with world.rt.transaction() as session:
        for name in ("pods", "vast"):
            machines.rental_failed(
                session, "render", name, now, Backoff(base=600, cap=600), "no stock", "capacity"
            )
    before = (len(world.runpod.requests), len(world.vast.requests))
    assert world.tick() == []
    with world.rt.transaction() as session:
        status = session.get(QueueStatus, "render")
        assert status is not None
        (wait,) = status.status["waits"]
    assert wait["kind"] == "backoff" and wait["reason"].startswith("every provider waits: ")
    assert "renting from pods failed" in wait["reason"]
    assert "renting from vast failed" in wait["reason"]
    assert (len(world.runpod.requests), len(world.vast.requests)) == before  # nothing called


def test_a_create_ambiguous_on_vast_is_found_by_label_and_never_repeated_on_runpod(
    world: World,
) -> None:
    world.apply(providers="[vast, pods]", placement="in_order")
    world.vast.fail_after_create = 1  # the instance is made, the answer is a 500
    (launch_id,) = world.tick()
    assert run_step(launch.STEP, world.rt, launch_id).kind is Kind.DONE
    row = world.row(launch_id)
    assert row.provider == "vast" and row.provider_instance_id is not None
    assert len(world.vast.instances) == 1 and world.creates() == (0, 1)
    assert world.runpod.pods == {}
    # and a second run of the same launch (a redelivered task) creates nothing anywhere
    assert run_step(launch.STEP, world.rt, launch_id).kind is Kind.SKIPPED
    assert world.creates() == (0, 1)


def test_a_provider_that_does_not_answer_in_time_is_skipped_not_waited_for(world: World) -> None:
    world.apply(placement="cheapest")  # Vast is the cheaper: waited for, it would win
    with world.rt.transaction() as session:
        latest = config_versions.latest(session)
        assert latest is not None
        doc = dict(latest.document)
    doc["queues"]["render"]["autoscale"]["offer_timeout"] = 1.0
    with world.rt.transaction() as session:
        config_versions.record(session, doc, "t", utc_now())
    world.vast.hold_search = threading.Event()  # Vast's search does not answer
    try:
        (launch_id,) = world.tick()
        assert run_step(launch.STEP, world.rt, launch_id).kind is Kind.DONE
        # the launch is done while Vast's search is still held: it was not waited for
        assert not world.vast.hold_search.is_set() and world.vast.searches == []
    finally:
        world.vast.hold_search.set()
    assert world.row(launch_id).provider == "pods"
    with world.rt.transaction() as session:
        (b,) = backoffs.by_queue(session)["render"]
    assert b.provider == "vast" and b.cause == "no_answer"
