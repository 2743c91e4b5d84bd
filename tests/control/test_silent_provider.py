"""A provider that takes connections and never answers costs one step its deadline, once.

The RunPod fake holds every request without answering (`silent_for`); the project's real HTTP
client, steps and reconcile run against it (SQLite and PostgreSQL). Without the deadline a
terminate waited out its client's 4 × 30 s reads inside a lifecycle slot, and every other
terminate of that provider did the same in the next slot, until the loop's slots were all
held by one silent provider.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from autoscaler.config import load_config_text
from autoscaler.control import rate_limits, reconciler
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps import launch, terminate
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.lifecycle import InstanceState as S
from autoscaler.providers import http
from autoscaler.providers.base import UnansweredError
from autoscaler.providers.http import HttpClient
from autoscaler.settings import Settings
from autoscaler.store import config_versions, migrate, moves
from autoscaler.store.models import ScaleEvent
from tests.control.test_warm_pool_loop import RUNPOD_KEY, Q, World
from tests.fakes.runpod_server import FakeRunPod

CONFIG = """
poll_interval: 3
providers:
  silent: {{kind: runpod, base_url: "{runpod}", api_key_env: RP_KEY, volume_gb: 20,
            gpu_types: ["NVIDIA GeForce RTX 4090"]}}
queues:
  {queue}:
    metrics: {{source: redis-list, url: "redis://127.0.0.1:6379/10", queue: "never-read"}}
    autoscale:
      provider: silent
      max_workers: 4
      scale_up: [{{trigger: queue_depth, target_per_worker: 4}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.8}}
"""


def _events(rt: Runtime, kind: str, action: str) -> list[str]:
    with rt.transaction() as session:
        return list(
            session.scalars(
                select(ScaleEvent.reason).where(
                    ScaleEvent.kind == kind, ScaleEvent.action == action
                )
            )
        )


def test_a_deadline_bounds_a_call_and_its_retries() -> None:
    with FakeRunPod(RUNPOD_KEY) as fake:
        fake.silent_for = 30.0
        client = HttpClient("silent", fake.url, RUNPOD_KEY)
        try:
            # an inner, longer deadline never extends the outer one
            with http.deadline(1.0), http.deadline(60.0), pytest.raises(UnansweredError):
                client.request("GET", "/v2/pods")
            # one attempt: a retry's wait would have passed the deadline
            assert len(fake.calls("GET", "/v2/pods")) == 1
            fake.silent_for = 0.0
            fake.fail_next = 1  # an answer (a 503) is retried while time is left
            with http.deadline(20.0):
                assert client.request("GET", "/v2/pods").status_code == 200
            assert len(fake.calls("GET", "/v2/pods")) == 3
        finally:
            fake.silent_for = 0.0
            client.close()


def test_a_step_of_several_calls_to_a_slow_provider_still_completes() -> None:
    """The bound is per call: three calls of 0.6 s each pass a 1 s bound (1.8 s in all),
    where one bound over the whole block would have cut the third."""
    with FakeRunPod(RUNPOD_KEY) as fake:
        fake.silent_for = 0.6
        client = HttpClient("slow", fake.url, RUNPOD_KEY)
        try:
            with http.each_call_within(1.0):
                for _ in range(3):
                    assert client.request("GET", "/v2/pods").status_code == 200
            fake.silent_for = 30.0
            with http.each_call_within(1.0), pytest.raises(UnansweredError):
                client.request("GET", "/v2/pods")
            assert len(fake.calls("GET", "/v2/pods")) == 4
        finally:
            fake.silent_for = 0.0
            client.close()


@pytest.mark.timeout(120)
def test_a_silent_provider_holds_its_steps_not_the_loop(tmp_path, db_url) -> None:
    runpod = FakeRunPod(RUNPOD_KEY)
    migrate.upgrade(db_url)
    env = {
        "AUTOSCALER_HOME": str(tmp_path),
        "AUTOSCALER_DATABASE_URL": db_url,
        "RP_KEY": RUNPOD_KEY,
    }
    rt = Runtime(Settings.from_env(env), env=env)
    try:
        config = load_config_text(CONFIG.format(runpod=runpod.url, queue=Q))
        with rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())
        w = World(rt, runpod, "runpod")
        now = utc_now()
        launched = w.tick(8, now).launched
        assert len(launched) == 2
        for launch_id in launched:
            assert run_step(launch.STEP, rt, launch_id).kind is Kind.DONE
            with rt.transaction() as session:
                assert moves.move(session, launch_id, S.BOOTING, S.TERMINATING, now, "test")
        first, second = launched

        runpod.silent_for = 60.0  # takes the connection, never answers within the test
        asked = len(runpod.requests)
        said = run_step(terminate.STEP, rt, first)  # waits its deadline (3 s at a 3 s poll)
        assert said.kind is Kind.WAITING and "silent is not answering until" in str(said), said
        assert len(runpod.requests) == asked + 1  # one call, cut short; no retry
        hold = rate_limits.current(rt, "silent")
        assert hold is not None and hold.cause == "unanswered"
        assert len(_events(rt, "provider", "unanswered")) == 1

        # the next step of that provider returns at once, without a call
        said = run_step(terminate.STEP, rt, second)
        assert said.kind is Kind.WAITING and "silent is not answering" in str(said), said
        assert len(runpod.requests) == asked + 1
        assert w.row(first).state == w.row(second).state == S.TERMINATING  # nothing lost

        # launches for it wait, saying why (no backoff: not a failed rental)
        assert w.tick(16, now + timedelta(seconds=1)).launched == []
        assert _events(rt, "wait", "unanswered")

        # it answers again: reconcile's list lifts the hold, and the destroys go through
        runpod.silent_for = 0.0
        rounds = reconciler.run_reconcile(rt, w.outbox)
        assert rounds["providers_unreadable"] == []
        assert rate_limits.current(rt, "silent") is None
        assert len(_events(rt, "provider", "answering")) == 1
        assert run_step(terminate.STEP, rt, first).kind is Kind.DONE
        assert run_step(terminate.STEP, rt, second).kind is Kind.DONE
        assert runpod.pods == {}
    finally:
        runpod.silent_for = 0.0
        rt.close()
        runpod.close()
