"""Reconcile never judges a machine against a listing older than its row, and a silent provider
never holds the lifecycle (#34), with the loop's own steps against the RunPod and Vast fakes,
on SQLite and PostgreSQL.

The fakes' `hold_list` answers a listing with what existed when it was asked and holds it back
until the test lets go: the step under test commits in between, as it did in the issue's runs.

- a machine stopped for the warm pool while the list was taken was destroyed ("running at the
  provider though we stopped it"); now it stays stopped;
- a machine created while the list was taken was marked lost ("gone at the provider while
  booting"), the rental counted as failed and the queue backed off; now it boots;
- rounds never overlap: a round while one runs returns at once;
- a provider that takes connections and never answers is unread for the round, which goes on
  with the others within its deadline, and its list is not asked again while one is held.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import pytest

from autoscaler.config import load_config_text
from autoscaler.control import rate_limits, reconciler
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps import launch, stop
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.lifecycle import InstanceState as S
from autoscaler.settings import Settings
from autoscaler.store import backoffs, config_versions, migrate
from tests.control.test_warm_pool_loop import RUNPOD_KEY, VAST_KEY, World, _config
from tests.fakes.runpod_server import FakeRunPod
from tests.fakes.vast_server import FakeVast


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
        # a 60 s poll: a list is waited for 20 s, time for the step under test to commit while
        # it is held (past its deadline a list is unread, and judges nothing)
        text = _config(kind, fake.url).replace("poll_interval: 1\n", "poll_interval: 60\n")
        config = load_config_text(text)
        assert reconciler.list_deadline(config.poll_interval) == 20
        with rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())
        yield World(rt, fake, kind)
    finally:
        rt.close()
        fake.close()


class HeldRound:
    """A reconcile round whose provider list has been taken and is held back."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.result: dict[str, Any] = {}
        w.fake.list_taken.clear()
        self.hold = w.fake.hold_list = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert w.fake.list_taken.wait(30), "the round never listed the provider"

    def _run(self) -> None:
        self.result = reconciler.run_reconcile(self.w.rt, self.w.outbox)

    def finish(self) -> dict[str, Any]:
        self.hold.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.result


def _stop_until_stopped(w: World, launch_id: str) -> None:
    """The stop step alone (no reconcile round to confirm it) until its own read of the
    provider moves the row to stopped."""
    deadline = time.monotonic() + 20
    while w.row(launch_id).state != S.STOPPED:
        assert time.monotonic() < deadline, w.row(launch_id).state_reason
        run_step(stop.STEP, w.rt, launch_id, w.outbox)
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_a_machine_stopped_while_the_list_was_taken_is_not_destroyed(world: World):
    w = world
    now = utc_now()
    launch_id = w.boot(now)
    w.stop_idle(launch_id, now)
    held = HeldRound(w)  # the list says the machine runs
    _stop_until_stopped(w, launch_id)  # the stop commits meanwhile
    result = held.finish()
    assert result["providers_unreadable"] == [] and result["unsettled"] == 1
    row = w.row(launch_id)
    assert row.state == S.STOPPED, row.state_reason
    assert ("terminate", launch_id) not in w.outbox.sent
    # the next round, whose list comes after the stop, agrees
    reconciler.run_reconcile(w.rt, w.outbox)
    assert w.row(launch_id).state == S.STOPPED


@pytest.mark.timeout(120)
def test_a_machine_created_while_the_list_was_taken_is_not_lost(world: World):
    w = world
    result = w.tick(3, utc_now())
    (launch_id,) = result.launched
    held = HeldRound(w)  # the list has no machine yet
    assert run_step(launch.STEP, w.rt, launch_id).kind is Kind.DONE  # created meanwhile
    result = held.finish()
    assert result["providers_unreadable"] == [] and result["unsettled"] == 1
    row = w.row(launch_id)
    assert row.state == S.BOOTING, row.state_reason
    with w.rt.transaction() as session:
        assert backoffs.by_queue(session) == {}
    reconciler.run_reconcile(w.rt, w.outbox)  # listed now: still booting, nothing failed
    assert w.row(launch_id).state == S.BOOTING
    with w.rt.transaction() as session:
        assert backoffs.by_queue(session) == {}


@pytest.mark.timeout(120)
def test_rounds_never_overlap(world: World):
    w = world
    held = HeldRound(w)
    assert reconciler.run_reconcile(w.rt, w.outbox) == {"skipped": "a reconcile round is running"}
    assert "transitions" in held.finish()
    assert "transitions" in reconciler.run_reconcile(w.rt, w.outbox)  # free again


TWO_PROVIDERS = """
poll_interval: 3
providers:
  silent: {{kind: runpod, base_url: "{runpod}", api_key_env: RP_KEY, volume_gb: 20,
            gpu_types: ["NVIDIA GeForce RTX 4090"]}}
  vast: {{kind: vast, base_url: "{vast}", api_key_env: VAST_KEY}}
queues:
  infer:
    metrics: {{source: redis-list, url: "redis://127.0.0.1:6379/10", queue: "never-read"}}
    autoscale:
      provider: vast
      max_workers: 2
      scale_up: [{{trigger: queue_depth, target_per_worker: 4}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.8}}
"""


@pytest.mark.timeout(180)
def test_a_silent_provider_is_unread_and_holds_no_other(tmp_path, db_url):
    runpod, vast = FakeRunPod(RUNPOD_KEY), FakeVast(VAST_KEY)
    migrate.upgrade(db_url)
    env = {
        "AUTOSCALER_HOME": str(tmp_path),
        "AUTOSCALER_DATABASE_URL": db_url,
        "RP_KEY": RUNPOD_KEY,
        "VAST_KEY": VAST_KEY,
    }
    rt = Runtime(Settings.from_env(env), env=env)
    try:
        config = load_config_text(TWO_PROVIDERS.format(runpod=runpod.url, vast=vast.url))
        with rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())
        w = World(rt, vast, "vast")
        runpod.silent_for = 170.0  # takes the connection, never answers within the test
        rounds: list[dict[str, Any]] = []

        def two_rounds() -> None:
            for _ in range(2):
                rounds.append(reconciler.run_reconcile(rt, w.outbox))
                # the round's list of the silent provider is cut at the round's deadline: its
                # thread ends within seconds, not the 170 s of silence (a round that starts
                # while it is still ending would rightly not ask again; wait it out)
                lists = list(reconciler._IN_FLIGHT.values())
                _, running = futures.wait(lists, timeout=15)
                assert not running, "a list thread outlived its deadline"

        thread = threading.Thread(target=two_rounds, daemon=True)
        thread.start()
        thread.join(90)  # each round waits a deadline of 3 s for it, never its 170 s
        assert not thread.is_alive(), "a round waited for the silent provider"
        assert [r["providers_unreadable"] for r in rounds] == [["silent"], ["silent"]]
        # each round asked once and gave up at its deadline (the client's 30 s reads cut
        # short: no thread left waiting); the provider is held for the lifecycle steps
        assert len(runpod.calls("GET", "/v2/pods")) == 2
        assert len(vast.calls("GET", "/api/v1/instances")) == 2  # listed every round
        hold = rate_limits.current(rt, "silent")
        assert hold is not None and hold.cause == "unanswered"
        assert rate_limits.current(rt, "vast") is None

        # the other provider's queue rents and boots as ever meanwhile
        result = w.tick(3, utc_now())
        (launch_id,) = result.launched
        assert run_step(launch.STEP, rt, launch_id).kind is Kind.DONE
        reconciler.run_reconcile(rt, w.outbox)
        assert w.row(launch_id).state == S.BOOTING
    finally:
        runpod.silent_for = 0.0
        rt.close()
        vast.close()
        runpod.close()
