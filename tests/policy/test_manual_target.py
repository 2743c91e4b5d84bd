"""Manual targets in decide(): an operator pins a queue at N machines until a deadline."""

from __future__ import annotations

from datetime import timedelta

import pytest

from autoscaler.lifecycle import InstanceState
from autoscaler.policy.decide import decide
from autoscaler.policy.plan import Plan, QueuePlan
from autoscaler.policy.snapshot import (
    BackoffState,
    Machine,
    ManualTarget,
    QueueMetrics,
    QueueSnapshot,
    Snapshot,
)

from .helpers import NOW, booting, config, metrics, ready
from .invariants import check_plan

LOAD_UP = [
    {"trigger": "no_workers"},
    {"trigger": "queue_depth", "threshold": 1},
    {"trigger": "queue_depth", "target_per_worker": 1},
    {"trigger": "latency", "max_latency": 10},
]
IDLE_DOWN = [{"trigger": "idle", "timeout": 60}]


def target(workers: int, *, left: float = 3600.0) -> ManualTarget:
    return ManualTarget(workers, NOW + timedelta(seconds=left), "alice")


def world(
    manual: ManualTarget | None,
    machines: tuple[Machine, ...] = (),
    m: QueueMetrics | None = None,
    *,
    backoffs: tuple[BackoffState, ...] = (),
    hand_made: int = 0,
    others: tuple[QueueSnapshot, ...] = (),
) -> Snapshot:
    return Snapshot(
        (QueueSnapshot("q", m, machines, hand_made, backoffs, manual_target=manual), *others)
    )


def plan_for(snapshot: Snapshot, cfg, *, checked: bool = True) -> tuple[Plan, QueuePlan]:
    plan = decide(snapshot, cfg, NOW)
    assert decide(snapshot, cfg, NOW) == plan  # pure
    if checked:
        check_plan(snapshot, cfg, plan)
    qp = plan.for_queue("q")
    assert qp is not None
    return plan, qp


def drained(qp: QueuePlan) -> list[tuple[str, bool]]:
    return [(d.launch_id, d.when_idle) for d in qp.drains]


def check_manual_drains(snapshot: Snapshot, qp: QueuePlan) -> None:
    """What check_plan says of drains, for drains a manual target asks for: only ready machines
    of ours, each once, busy ones only once idle, never below the target."""
    qs = snapshot.queue("q")
    assert qs is not None
    by_id = {m.launch_id: m for m in qs.machines}
    ids = [d.launch_id for d in qp.drains]
    assert len(ids) == len(set(ids))
    for d in qp.drains:
        m = by_id[d.launch_id]
        assert m.state == InstanceState.READY
        if m.running_tasks > 0:
            assert d.when_idle, f"busy {m.launch_id} drained now"
        assert d.reason
    manual = [d for d in qp.drains if d.trigger == "manual"]
    assert qp.capacity - len(manual) >= qp.floor
    assert not qp.launches and not qp.reclaims


# --------------------------------------------------------------------------- up to N


@pytest.mark.parametrize("metrics_kind", ["none", "stale", "idle", "busy"])
def test_a_target_launches_up_to_n_whatever_the_metrics(metrics_kind):
    m = {
        "none": None,
        "stale": metrics(50, stale=True),
        "idle": metrics(0),
        "busy": metrics(50, oldest=900),
    }[metrics_kind]
    cfg = config(LOAD_UP, IDLE_DOWN, max_workers=8)
    _, qp = plan_for(world(target(3), (), m), cfg)
    assert len(qp.launches) == 3
    assert [a.index for a in qp.launches] == [1, 2, 3]
    assert all(a.trigger == "manual" and a.provider == "gpu" for a in qp.launches)
    assert qp.floor == 3 and qp.desired == 3
    assert not qp.drains


def test_a_target_counts_ready_booting_and_hand_made_machines():
    cfg = config(max_workers=8)
    machines = (ready("r1"), booting("b1"), booting("p1", state=InstanceState.PENDING))
    _, qp = plan_for(world(target(5), machines, metrics(0), hand_made=1), cfg)
    assert qp.capacity == 4
    assert len(qp.launches) == 1


@pytest.mark.parametrize(("n", "max_workers", "launched"), [(3, 2, 2), (9, 4, 4), (4, 4, 4)])
def test_a_target_never_launches_past_max_workers(n, max_workers, launched):
    cfg = config(max_workers=max_workers)
    _, qp = plan_for(world(target(n), (), metrics(0)), cfg)
    assert len(qp.launches) == launched
    assert qp.floor == min(n, max_workers)


def test_machines_that_may_still_bill_count_against_max_workers():
    cfg = config(max_workers=3)
    leaving = (
        Machine("d1", InstanceState.DRAINING, NOW - timedelta(hours=1), "gpu"),
        Machine("t1", InstanceState.TERMINATING, NOW - timedelta(hours=1), "gpu"),
    )
    _, qp = plan_for(world(target(3), leaving, metrics(0)), cfg)
    assert len(qp.launches) == 1
    assert {w.kind for w in qp.waits} == {"max_workers"}


def test_a_target_respects_the_backoff():
    cfg = config(max_workers=8)
    backoff = BackoffState("gpu", 3, NOW + timedelta(seconds=90), "no capacity")
    _, qp = plan_for(world(target(3), (), metrics(0), backoffs=(backoff,)), cfg)
    assert qp.launches == ()
    (wait,) = qp.waits
    assert (wait.kind, wait.machines, wait.until) == ("backoff", 3, backoff.until)
    # the backoff over (until is exclusive): the launches go out
    over = BackoffState("gpu", 3, NOW, "no capacity")
    _, qp = plan_for(world(target(3), (), metrics(0), backoffs=(over,)), cfg)
    assert len(qp.launches) == 3


@pytest.mark.parametrize(
    ("limits", "granted"),
    [
        ({"max_machines": 3}, 2),  # one machine of another queue already bills
        ({"max_price_per_hour": 1.9}, 2),  # 0.60 billing + 2 × 0.60 ≤ 1.9 < 3 × 0.60 + 0.60
        ({"max_machines": 1}, 0),
    ],
)
def test_a_target_respects_the_spend_caps(limits, granted):
    cfg = config(max_workers=8, limits=limits)
    elsewhere = QueueSnapshot("gone", None, (ready("x1"),))
    _, qp = plan_for(world(target(4), (), metrics(0), others=(elsewhere,)), cfg)
    assert len(qp.launches) == granted
    assert [w.kind for w in qp.waits] == ["spend_cap"]
    assert qp.waits[0].machines == 4 - granted


def test_machines_asked_to_leave_are_taken_back_before_renting():
    cfg = config(max_workers=8)
    machines = (ready("r1"), ready("keep", running=1, drain_requested=True))
    _, qp = plan_for(world(target(3), machines, metrics(0)), cfg)
    assert [r.launch_id for r in qp.reclaims] == ["keep"]
    assert len(qp.launches) == 1
    assert not qp.drains


# --------------------------------------------------------------------------- holds at N


@pytest.mark.parametrize("pending", [0, 200])
def test_a_target_holds_whatever_the_load_triggers_say(pending):
    """200 jobs waiting 15 minutes would launch up to max; idle machines would be drained."""
    cfg = config(LOAD_UP, IDLE_DOWN, max_workers=8)
    machines = (ready("r1", idle_for=7200), ready("r2", idle_for=7200))
    m = metrics(pending, oldest=900 if pending else None)
    _, qp = plan_for(world(target(2), machines, m), cfg)
    assert not qp.launches and not qp.drains and not qp.reclaims
    assert not qp.up_fired
    assert qp.desired == 2
    # without the target, the same world does change (the triggers are live)
    _, free = plan_for(world(None, machines, m), cfg)
    assert free.launches or free.drains


def test_a_target_holds_while_machines_boot():
    cfg = config(LOAD_UP, max_workers=8)
    machines = (ready("r1", running=1), booting("b1"), booting("b2"))
    _, qp = plan_for(world(target(3), machines, metrics(100, oldest=900)), cfg)
    assert not qp.launches and not qp.drains


# --------------------------------------------------------------------------- down to N


def test_idle_machines_above_n_are_drained_now_most_idle_first():
    cfg = config(LOAD_UP, max_workers=8)
    machines = (
        ready("a", idle_for=100),
        ready("b", idle_for=1000),
        ready("c", idle_for=500),
        ready("d", idle_for=5),
    )
    snapshot = world(target(2), machines, metrics(0))
    _, qp = plan_for(snapshot, cfg, checked=False)
    assert drained(qp) == [("b", False), ("c", False)]
    assert all(d.trigger == "manual" for d in qp.drains)
    assert qp.desired == 2
    check_manual_drains(snapshot, qp)


def test_a_target_drains_without_any_metrics_and_whatever_the_load():
    cfg = config(LOAD_UP, max_workers=8)
    machines = (ready("a", idle_for=100), ready("b", idle_for=1000))
    for m in (None, metrics(5, stale=True), metrics(500, oldest=3600)):
        snapshot = world(target(1), machines, m)
        _, qp = plan_for(snapshot, cfg, checked=False)
        assert drained(qp) == [("b", False)], m
        check_manual_drains(snapshot, qp)


def test_busy_machines_above_n_are_only_drained_once_idle_and_idle_ones_go_first():
    cfg = config(max_workers=8)
    machines = (
        ready("busy2", running=2, idle_for=0),
        ready("busy1", running=1, idle_for=0),
        ready("idle", idle_for=30),
    )
    snapshot = world(target(1), machines, metrics(0, in_flight=3))
    _, qp = plan_for(snapshot, cfg, checked=False)
    # two above the target: the idle one now, then the least busy one once idle
    assert drained(qp) == [("idle", False), ("busy1", True)]
    check_manual_drains(snapshot, qp)


def test_target_zero_releases_every_serving_machine():
    cfg = config(LOAD_UP, IDLE_DOWN, min_workers=1, max_workers=8)
    machines = (
        ready("a", idle_for=10),
        ready("b", running=1),
        ready("c", idle_for=4000),
        ready("left", drain_requested=True, idle_for=50),  # asked to leave earlier, idle now
        booting("boot"),
        Machine("going", InstanceState.DRAINING, NOW - timedelta(hours=1), "gpu"),
    )
    snapshot = world(target(0), machines, metrics(3, oldest=600, in_flight=1))
    _, qp = plan_for(snapshot, cfg, checked=False)
    assert qp.floor == 0  # below min_workers: the operator asked
    manual = [(d.launch_id, d.when_idle) for d in qp.drains if d.trigger == "manual"]
    assert manual == [("c", False), ("a", False), ("b", True)]
    # the one already asked to leave completes its drain; booting and leaving ones are untouched
    assert [d.launch_id for d in qp.drains if d.trigger == "drain_requested"] == ["left"]
    assert not qp.launches
    check_manual_drains(snapshot, qp)


def test_hand_made_workers_count_toward_the_target_but_are_never_drained():
    cfg = config(max_workers=8)
    machines = (ready("a", idle_for=10), ready("b", idle_for=20))
    snapshot = world(target(1), machines, metrics(0), hand_made=1)
    _, qp = plan_for(snapshot, cfg, checked=False)
    assert qp.capacity == 3
    assert drained(qp) == [("b", False), ("a", False)]
    check_manual_drains(snapshot, qp)


def test_at_the_target_nothing_is_drained():
    cfg = config(max_workers=8)
    machines = (ready("a", idle_for=7200), ready("b", idle_for=7200))
    _, qp = plan_for(world(target(2), machines, metrics(0)), cfg)
    assert not qp.drains and not qp.launches


# --------------------------------------------------------------------------- expiry


@pytest.mark.parametrize("left", [0.0, -1.0, -86400.0])
def test_an_expired_target_is_ignored(left):
    cfg = config(LOAD_UP, IDLE_DOWN, max_workers=8)
    idle = (ready("a", idle_for=7200), ready("b", idle_for=7200))
    # no load: the idle trigger drains as if no target had been set, never "manual"
    snapshot = world(target(2, left=left), idle, metrics(0))
    plan, qp = plan_for(snapshot, cfg)
    assert plan == decide(world(None, idle, metrics(0)), cfg, NOW)
    assert {d.trigger for d in qp.drains} == {"idle"}
    # load: the triggers launch, not the (expired) target of 0
    snapshot = world(target(0, left=left), (), metrics(3, oldest=60))
    plan, qp = plan_for(snapshot, cfg)
    assert plan == decide(world(None, (), metrics(3, oldest=60)), cfg, NOW)
    assert qp.launches and all(a.trigger != "manual" for a in qp.launches)


def test_a_target_one_second_from_expiry_still_holds():
    cfg = config(LOAD_UP, IDLE_DOWN, max_workers=8)
    idle = (ready("a", idle_for=7200), ready("b", idle_for=7200))
    _, qp = plan_for(world(target(2, left=1.0), idle, metrics(0)), cfg)
    assert not qp.drains and not qp.launches
