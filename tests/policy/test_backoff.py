"""Backoff maths and how the plan reports a backoff."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from autoscaler.config.models import Backoff
from autoscaler.policy import decide
from autoscaler.policy.backoff import after_failure, next_backoff
from autoscaler.policy.snapshot import BackoffState

from .helpers import NOW, config, metrics, snap


def test_doubles_from_base_without_jitter():
    assert [next_backoff(n, 30, 600, 0.0, "k") for n in range(1, 7)] == [30, 60, 120, 240, 480, 600]


def test_cap_reached_and_held_for_huge_failure_counts():
    assert next_backoff(5, 30, 600, 0.0, "k") == 480
    assert next_backoff(6, 30, 600, 0.0, "k") == 600
    assert next_backoff(10_000, 30, 600, 0.0, "k") == 600


def test_zero_failures_no_wait():
    assert next_backoff(0, 30, 600, 0.2, "k") == 0


@given(st.integers(1, 200), st.floats(0.1, 1000), st.floats(0, 1), st.text(max_size=20))
def test_jitter_stays_within_bounds_and_is_deterministic(failures, base, jitter, key):
    cap = base * 7
    wait = next_backoff(failures, base, cap, jitter, key)
    exp = min(cap, base * 2 ** (failures - 1))
    assert wait <= cap + 1e-9
    assert wait >= exp * (1 - jitter) - 1e-9
    assert wait == next_backoff(failures, base, cap, jitter, key)


def test_jitter_differs_between_queues():
    waits = {next_backoff(3, 30, 600, 0.5, f"q{i}/gpu") for i in range(20)}
    assert len(waits) > 10


def test_after_failure_counts_up_and_default_cap_is_ten_minutes():
    cfg = Backoff()
    assert cfg.cap == 600
    state = None
    for _ in range(12):
        state = after_failure(state, "q", "gpu", NOW, cfg, "no offer")
    assert state.failures == 12
    assert timedelta(seconds=600 * (1 - cfg.jitter)) <= state.until - NOW <= timedelta(seconds=600)


def test_plan_says_backoff_and_launches_nothing():
    b = BackoffState("gpu", 3, NOW + timedelta(seconds=90), "capacity error")
    p = decide(
        snap(metrics(pending=4), backoffs=(b,)),
        config([{"trigger": "no_workers"}], min_workers=1),
        NOW,
    ).for_queue("q")
    assert p.launches == ()
    (w,) = p.waits
    assert w.kind == "backoff" and w.until == b.until and w.machines == 1
    assert "failed 3 time(s)" in w.reason and "capacity error" in w.reason


def test_backoff_expired_exactly_now_allows_launch():
    b = BackoffState("gpu", 3, NOW)
    p = decide(snap(metrics(pending=4), backoffs=(b,)), config([{"trigger": "no_workers"}]), NOW)
    assert len(p.launches) == 1


def test_backoff_of_another_provider_does_not_block():
    b = BackoffState("other", 3, NOW + timedelta(minutes=5))
    p = decide(snap(metrics(pending=4), backoffs=(b,)), config([{"trigger": "no_workers"}]), NOW)
    assert len(p.launches) == 1
