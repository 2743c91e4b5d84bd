"""A rate-limited provider holds no worker, and its reset is honoured by every process.

The loop's steps in this process (launch, tick, reconcile, terminate) against the project's
RunPod and Vast fakes answering every call 429 — RunPod with its own `RateLimit: limit=60,
remaining=0, reset=30`, Vast with no hint — on SQLite and PostgreSQL: the first call that meets
the limit records it in the store; from then on no step calls that provider before the reset
(the fakes count every request), launches wait with a `rate_limit` wait naming its end (in the
status and the events), reconcile decides nothing that needs the list, and nothing is created.
A rate limit is no failure of a rental: the backoff does not grow.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from autoscaler.config import load_config_text
from autoscaler.control import reconciler
from autoscaler.control.rate_limits import DEFAULT_RESET
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps import launch, terminate
from autoscaler.control.steps.frame import Kind, Outcome, run_step
from autoscaler.control.tick.evaluate import evaluate
from autoscaler.lifecycle import InstanceState as S
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.settings import Settings
from autoscaler.store import backoffs, config_versions, intents, migrate, rate_limits
from autoscaler.store.models import Instance, ScaleEvent
from autoscaler.store.queue_views import queues as queue_views
from tests.control.outbox import RecordingOutbox
from tests.fakes.runpod_server import FakeRunPod
from tests.fakes.vast_server import FakeVast

RUNPOD_KEY = "rpa_RATELIMIT_4f9c2e7b1d_not_a_real_key"
VAST_KEY = "vast_RATELIMIT_8e1a5c0f3b_not_a_real_key"


def _config(runpod: FakeRunPod, vast: FakeVast) -> str:
    def queue(provider: str) -> str:
        return f"""
    metrics: {{source: celery, url: "redis://127.0.0.1:6379/10", queue: "never-read"}}
    autoscale:
      provider: {provider}
      max_workers: 3
      scale_up: [{{trigger: queue_depth, target_per_worker: 1}}]
      scale_down: [{{trigger: idle, timeout: 5m}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.8}}"""

    return f"""
backoff: {{base: 30, cap: 600}}
providers:
  pods: {{kind: runpod, base_url: "{runpod.url}", api_key_env: RL_RUNPOD,
          gpu_types: ["NVIDIA GeForce RTX 4090"]}}
  vast: {{kind: vast, base_url: "{vast.url}", api_key_env: RL_VAST}}
queues:
  on-pods:{queue("pods")}
  on-vast:{queue("vast")}
"""


@pytest.mark.timeout(120)
def test_a_rate_limit_is_recorded_once_and_no_step_calls_the_provider_before_its_reset(
    tmp_path, db_url
):
    runpod, vast = FakeRunPod(RUNPOD_KEY), FakeVast(VAST_KEY)
    migrate.upgrade(db_url)
    env = {
        "AUTOSCALER_HOME": str(tmp_path),
        "AUTOSCALER_DATABASE_URL": db_url,
        "RL_RUNPOD": RUNPOD_KEY,
        "RL_VAST": VAST_KEY,
    }
    rt = Runtime(Settings.from_env(env), env=env)
    outbox = RecordingOutbox()
    try:
        config = load_config_text(_config(runpod, vast))
        t0 = utc_now()
        with rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", t0)
            intents.add_intents(
                session,
                [
                    ("p1", "on-pods", "pods", "t"),
                    ("p2", "on-pods", "pods", "t"),
                    ("v1", "on-vast", "vast", "t"),
                ],
                t0,
            )
            session.add(  # a machine being destroyed when the limit comes
                Instance(
                    launch_id="old",
                    queue="on-pods",
                    provider="pods",
                    state=S.TERMINATING,
                    provider_instance_id="podold",
                    created_at=t0 - timedelta(minutes=5),
                    terminating_at=t0 - timedelta(minutes=2),
                )
            )
        runpod.rate_limit_header = "limit=60, remaining=0, reset=30"
        runpod.rate_limit_next = vast.rate_limit_next = 10**6  # every call answered 429

        # 1. the first launch meets the limit: failed, nothing rented, the reset recorded
        assert _failed(run_step(launch.STEP, rt, "p1"), "rate limited")
        assert _failed(run_step(launch.STEP, rt, "v1"), "rate limited")
        with rt.transaction() as session:
            limits = {r.provider: r for r in rate_limits.active(session, utc_now())}
            assert backoffs.by_queue(session) == {}  # no failure of a rental was counted
        assert set(limits) == {"pods", "vast"}
        assert 29 <= (limits["pods"].until - t0).total_seconds() <= 31 + _slack(t0)
        assert (limits["vast"].until - t0).total_seconds() >= DEFAULT_RESET - 1
        calls = (len(runpod.requests), len(vast.requests))

        # 2. from now on no step calls a limited provider: a launch, a destroy, a reconcile
        assert _failed(run_step(launch.STEP, rt, "p2"), "takes no calls before")
        waited = run_step(terminate.STEP, rt, "old")
        assert waited.kind is Kind.WAITING and "rate-limited until" in str(waited), waited
        result = reconciler.run_reconcile(rt, outbox)
        assert result["providers_unreadable"] == ["pods", "vast"]
        assert (len(runpod.requests), len(vast.requests)) == calls
        with rt.transaction() as session:
            states = {r.launch_id: r.state for r in session.scalars(select(Instance))}
        assert states == {"p1": S.FAILED, "p2": S.FAILED, "v1": S.FAILED, "old": S.TERMINATING}
        assert ("terminate", "old") in outbox.sent  # retried, and it will wait again without a call

        # 3. the tick: jobs wait, each queue is told why and until when, no launch is made
        now = utc_now()
        readings = {q: QueueMetrics(q, 5, 10.0, 0, now) for q in ("on-pods", "on-vast")}
        launched = RecordingOutbox()
        evaluate(rt, launched, trigger="t", readings=readings, now=now)
        assert launched.sent == []
        with rt.transaction() as session:
            views = {v.queue: v for v in queue_views(session, now)}
            waits = session.scalars(
                select(ScaleEvent).where(
                    ScaleEvent.kind == "wait", ScaleEvent.action == "rate_limit"
                )
            ).all()
            noted = session.scalars(
                select(ScaleEvent).where(
                    ScaleEvent.action == "rate_limited", ScaleEvent.kind == "provider"
                )
            ).all()
        for q, provider in (("on-pods", "pods"), ("on-vast", "vast")):
            (wait,) = [w for w in views[q].waits if w["kind"] == "rate_limit"]
            assert wait["until"] == limits[provider].until.isoformat(), wait
            assert any(f"{provider} takes no calls before" in why for why in views[q].why)
        assert sorted(e.queue for e in waits) == ["on-pods", "on-vast"]
        assert all(e.details["until"] for e in waits)
        assert sorted(e.details["provider"] for e in noted) == ["pods", "vast"]  # once each
        assert (len(runpod.requests), len(vast.requests)) == calls
        assert runpod.pods == {} and vast.instances == {}

        # 4. after the reset the provider is called again (and here it answers 429 again)
        later = utc_now() + timedelta(seconds=DEFAULT_RESET + 5)
        with rt.transaction() as session:
            assert rate_limits.active(session, later) == ()
    finally:
        rt.close()
        runpod.close()
        vast.close()
    assert runpod.spec_violations == [] and vast.spec_violations == []


def _slack(t0: Any) -> float:
    """Seconds this test has run: the reset is counted from when the 429 came."""
    return (utc_now() - t0).total_seconds()


def _failed(outcome: Outcome, why: str) -> bool:
    """The launch failed (nothing rented), saying `why`."""
    return outcome.kind is Kind.FAILED and why in str(outcome)
