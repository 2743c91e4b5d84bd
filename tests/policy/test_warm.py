"""Warm pools in the pure core: which drains end stopped, which stopped machines a launch
resumes, and what reconcile does with pool machines (`policy/warm.py`, `decide`, `reconcile`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.config.loader import load_config_text
from autoscaler.config.models import Config
from autoscaler.lifecycle import InstanceState, MachineStatus
from autoscaler.policy.caps import usage
from autoscaler.policy.reconcile import Listed, ProviderView, Row, reconcile
from autoscaler.policy.snapshot import BackoffState, Machine, RateLimit
from autoscaler.policy.warm import Stopped, retirements, spec_key

from .helpers import NOW, PROVIDERS, metrics, ready, snap
from .invariants import checked_decide

S = InstanceState
IDLE = [{"trigger": "idle", "timeout": "5m"}]
UP = [{"trigger": "queue_depth", "threshold": 1}]


def cfg(size: int = 2, *, gpu: str = "RTX 4090", max_workers: int = 4, **over: Any) -> Config:
    auto: dict[str, Any] = {
        "provider": "gpu",
        "max_workers": max_workers,
        "scale_up": UP,
        "scale_down": IDLE,
        "instance": {"gpu": gpu, "max_price_per_hour": 0.6},
        "warm_pool": {"size": size, "keep_for": "1h", "resume_timeout": "2m"},
        **over,
    }
    doc = {"queues": {"q": {"autoscale": auto}}}
    return load_config_text(yaml.safe_dump(doc), registered_providers=PROVIDERS)


KEY = spec_key(cfg().queues["q"].autoscale)


def stopped(lid: str, ago: float = 60.0, *, key: str | None = KEY) -> Machine:
    return Machine(
        launch_id=lid,
        state=S.STOPPED,
        created_at=NOW - timedelta(hours=2),
        provider="gpu",
        price_per_hour=0.6,
        spec_key=key,
        stopped_at=NOW - timedelta(seconds=ago),
        storage_price_per_hour=0.01,
    )


def idle(lid: str, idle_for: float = 600.0, **kw: Any) -> Machine:
    return replace(ready(lid, idle_for=idle_for, **kw), spec_key=KEY)


# --------------------------------------------------------------------------- decide


def test_a_launch_resumes_the_most_recently_stopped_fitting_machine_before_renting():
    machines = (stopped("old", 900), stopped("new", 60), stopped("unfit", 10, key="other"))
    plan = checked_decide(snap(metrics(pending=3), machines), cfg(), NOW)
    qp = plan.queues[0]
    # +1 triggers: one machine for the load; the freshest fitting one comes back
    assert [r.launch_id for r in qp.resumes] == ["new"]
    assert qp.launches == ()


def test_more_wanted_than_the_pool_holds_resumes_all_then_rents_the_rest():
    c = cfg(scale_up=[{"trigger": "queue_depth", "target_per_worker": 1}])
    plan = checked_decide(snap(metrics(pending=3), (stopped("a", 60), stopped("b", 30))), c, NOW)
    qp = plan.queues[0]
    assert [r.launch_id for r in qp.resumes] == ["b", "a"]
    assert len(qp.launches) == 1


def test_without_a_pool_stopped_machines_are_never_resumed():
    plan = checked_decide(snap(metrics(pending=3), (stopped("a"),)), cfg(size=0), NOW)
    assert plan.queues[0].resumes == () and len(plan.queues[0].launches) == 1


def test_a_stopped_machine_is_not_capacity_and_not_under_max_workers():
    c = cfg(size=1, max_workers=1, scale_up=[{"trigger": "no_workers"}])
    plan = checked_decide(snap(metrics(pending=3), (stopped("a"),)), c, NOW)
    qp = plan.queues[0]
    assert qp.capacity == 0
    assert [r.launch_id for r in qp.resumes] == ["a"]  # not held by max_workers 1


def test_a_rental_backoff_holds_new_machines_but_not_resumes():
    until = NOW + timedelta(minutes=5)
    s = snap(metrics(pending=3), (stopped("a"),), backoffs=(BackoffState("gpu", 2, until),))
    qp = checked_decide(s, cfg(), NOW).queues[0]
    assert [r.launch_id for r in qp.resumes] == ["a"] and qp.launches == ()
    s = snap(metrics(pending=3), (), backoffs=(BackoffState("gpu", 2, until),))
    qp = checked_decide(s, cfg(), NOW).queues[0]
    assert qp.launches == () and [w.kind for w in qp.waits] == ["backoff"]


def test_a_rate_limit_holds_resumes_too():
    s = snap(metrics(pending=3), (stopped("a"),))
    s = replace(s, rate_limits=(RateLimit("gpu", NOW + timedelta(minutes=1)),))
    qp = checked_decide(s, cfg(), NOW).queues[0]
    assert qp.resumes == () and [w.kind for w in qp.waits] == ["rate_limit"]


def test_idle_drains_go_to_the_pool_while_it_has_room():
    machines = (idle("a", 900), idle("b", 800), idle("c", 700))
    qp = checked_decide(snap(metrics(), machines), cfg(size=1), NOW).queues[0]
    assert {d.launch_id: d.keep_warm for d in qp.drains} == {"a": True, "b": False, "c": False}
    # a pool already full keeps none
    full = (*machines, stopped("s"))
    qp = checked_decide(snap(metrics(), full), cfg(size=1), NOW).queues[0]
    assert qp.drains and not any(d.keep_warm for d in qp.drains)


def test_a_machine_rented_as_another_spec_is_never_kept_warm():
    machines = (replace(idle("a"), spec_key="other"),)
    qp = checked_decide(snap(metrics(), machines), cfg(), NOW).queues[0]
    assert [d.keep_warm for d in qp.drains] == [False]


def test_a_schedule_scale_down_fills_the_pool_and_busy_ones_only_once_idle():
    c = cfg(scale_down=[{"trigger": "schedule", "cron": "0 12 * * *"}])
    machines = (idle("idle"), idle("busy", running=2))
    qp = checked_decide(snap(metrics(), machines), c, NOW).queues[0]
    by_id = {d.launch_id: d for d in qp.drains}
    assert by_id["busy"].when_idle and not by_id["idle"].when_idle
    assert all(d.keep_warm for d in qp.drains)  # room for both: size 2


def test_a_stopped_machine_counts_its_storage_price_and_no_machine_toward_caps():
    c = cfg()
    assert usage(snap(metrics(), (stopped("a"),)), c) == (0, 0.01)


# --------------------------------------------------------------------------- reconcile


def row(lid: str, state: InstanceState, since: float, **kw: Any) -> Row:
    return Row(lid, "q", "gpu", state, NOW - timedelta(seconds=since), f"p-{lid}", "h1", **kw)


def listed(lid: str, status: MachineStatus) -> Listed:
    return Listed(f"p-{lid}", lid, f"asg-inst-{lid}", status, "h1")


def rec(rows: list[Row], *machines: Listed, c: Config | None = None):
    views = {"gpu": ProviderView("gpu", True, tuple(machines))}
    plan = reconcile(tuple(rows), views, {}, c or cfg(), NOW)
    return {t.launch_id: t for t in plan.transitions}, {r.launch_id: r for r in plan.retries}


def test_a_drained_machine_kept_warm_is_stopped_and_others_destroyed():
    moves, _ = rec(
        [row("w", S.DRAINED, 1, keep_warm=True), row("d", S.DRAINED, 1)],
        listed("w", MachineStatus.RUNNING),
        listed("d", MachineStatus.RUNNING),
    )
    assert moves["w"].dst == S.STOPPING and moves["d"].dst == S.TERMINATING


def test_a_stop_is_confirmed_by_the_provider_retried_and_given_up():
    moves, _ = rec([row("a", S.STOPPING, 5)], listed("a", MachineStatus.STOPPED))
    assert moves["a"].dst == S.STOPPED
    moves, retries = rec([row("a", S.STOPPING, 45)], listed("a", MachineStatus.RUNNING))
    assert not moves and retries["a"].step == "stop"
    moves, _ = rec([row("a", S.STOPPING, 700)], listed("a", MachineStatus.RUNNING))
    assert moves["a"].dst == S.TERMINATING


def test_a_machine_whose_processes_ended_after_its_drain_is_still_stopped_not_destroyed():
    # the agent exits once its worker drained: the provider may list the machine dead before
    # the stop step ran; the stop is sent again, and only a machine dead for long is destroyed
    moves, retries = rec([row("a", S.STOPPING, 1)], listed("a", MachineStatus.DEAD))
    assert not moves and retries["a"].step == "stop"
    moves, _ = rec([row("a", S.STOPPING, 61)], listed("a", MachineStatus.DEAD))
    assert moves["a"].dst == S.TERMINATING


def test_stopped_machines_past_keep_for_unfit_or_above_size_are_destroyed():
    rows = [
        row("expired", S.STOPPED, 3601, spec_key=KEY),
        row("unfit", S.STOPPED, 10, spec_key="other"),
        row("new", S.STOPPED, 10, spec_key=KEY),
        row("older", S.STOPPED, 20, spec_key=KEY),
        row("oldest", S.STOPPED, 30, spec_key=KEY),
    ]
    moves, _ = rec(rows, *(listed(r.launch_id, MachineStatus.STOPPED) for r in rows))
    assert {k for k, t in moves.items() if t.dst == S.TERMINATING} == {"expired", "unfit", "oldest"}
    assert "keep_for" in moves["expired"].reason and "size 2" in moves["oldest"].reason


def test_a_stopped_machine_running_without_our_resume_is_destroyed():
    moves, _ = rec([row("a", S.STOPPED, 10, spec_key=KEY)], listed("a", MachineStatus.RUNNING))
    assert moves["a"].dst == S.TERMINATING


def test_a_resume_is_a_warm_hit_once_its_worker_speaks_and_a_miss_past_the_timeout():
    seen = NOW - timedelta(seconds=5)
    moves, _ = rec(
        [row("a", S.RESUMING, 30, last_seen_at=seen)], listed("a", MachineStatus.RUNNING)
    )
    assert moves["a"].dst == S.READY and moves["a"].warm == "hit"
    moves, _ = rec([row("a", S.RESUMING, 121)], listed("a", MachineStatus.STARTING))
    miss = moves["a"]
    assert (miss.dst, miss.warm, miss.rental, miss.avoid_host) == (
        S.TERMINATING,
        "miss",
        None,  # a warm miss is not a failed rental: no backoff
        True,
    )
    moves, retries = rec([row("a", S.RESUMING, 40)], listed("a", MachineStatus.STOPPED))
    assert not moves and retries["a"].step == "resume"


@settings(max_examples=200, deadline=None)
@given(
    ages=st.lists(st.floats(0, 10_000, allow_nan=False), min_size=0, max_size=8),
    keys=st.lists(st.sampled_from([KEY, "other", None]), min_size=8, max_size=8),
    size=st.integers(0, 4),
)
def test_after_a_reconcile_the_pool_holds_at_most_size_fitting_machines_within_keep_for(
    ages, keys, size
):
    c = cfg(size=size)
    machines = [
        Stopped(f"m{i}", "q", "gpu", keys[i], NOW - timedelta(seconds=a))
        for i, a in enumerate(ages)
    ]
    gone = retirements(machines, c, NOW)
    kept = [m for m in machines if m.launch_id not in gone]
    assert len(kept) <= size
    for m in kept:
        assert m.spec_key == KEY and (NOW - m.since).total_seconds() < 3600
    # every machine past keep_for goes, whatever else holds
    for m in machines:
        if (NOW - m.since).total_seconds() >= 3600:
            assert m.launch_id in gone


def test_a_queue_listing_several_providers_keeps_and_resumes_stopped_machines_of_each():
    """A pool keeps machines of every provider the queue rents from (placement across
    providers): a fitting stopped machine on the second provider is neither retired nor passed
    over; one on a provider the list no longer names is retired."""
    c = cfg(size=3, provider=["gpu", "gpu2"])
    key = spec_key(c.queues["q"].autoscale)
    machines = [
        Stopped("on-first", "q", "gpu", key, NOW - timedelta(seconds=60)),
        Stopped("on-second", "q", "gpu2", key, NOW - timedelta(seconds=30)),
        Stopped("elsewhere", "q", "gpu3", key, NOW - timedelta(seconds=10)),
    ]
    assert set(retirements(machines, c, NOW)) == {"elsewhere"}
    second = replace(stopped("on-second", ago=30, key=key), provider="gpu2")
    first = stopped("on-first", ago=60, key=key)
    plan = checked_decide(snap(metrics(pending=4), (first, second)), c, NOW)
    assert [r.launch_id for r in plan.resumes][:1] == ["on-second"]  # the newest, on gpu2
