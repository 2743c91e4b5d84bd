"""Account-wide spend caps: machines and $/hour, served by priority, waits named."""

from __future__ import annotations

from autoscaler.policy import decide
from autoscaler.policy.snapshot import QueueSnapshot, Snapshot

from .helpers import NOW, booting, config, metrics, ready

TARGET = [{"trigger": "queue_depth", "target_per_worker": 1}]


def two_queues(limits, a_prio=10, b_prio=0, price=0.60):
    return config(
        TARGET,
        max_workers=10,
        price=price,
        limits=limits,
        queues={"a": {"priority": a_prio}, "b": {"priority": b_prio}},
    )


def both(pa, pb, machines_a=(), machines_b=()):
    return Snapshot(
        (
            QueueSnapshot("a", metrics(pending=pa, queue="a"), machines_a),
            QueueSnapshot("b", metrics(pending=pb, queue="b"), machines_b),
        )
    )


def test_machine_cap_serves_higher_priority_first_and_names_the_waiters():
    plan = decide(both(4, 4), two_queues({"max_machines": 5}), NOW)
    a, b = plan.for_queue("a"), plan.for_queue("b")
    assert len(a.launches) == 4 and len(b.launches) == 1
    (w,) = b.waits
    assert w.kind == "spend_cap" and w.machines == 3
    assert "max_machines = 5" in w.reason and "a (priority 10) +4" in w.reason


def test_equal_priorities_take_turns():
    plan = decide(both(4, 4), two_queues({"max_machines": 4}, a_prio=0), NOW)
    assert len(plan.for_queue("a").launches) == 2 and len(plan.for_queue("b").launches) == 2


def test_existing_machines_of_every_state_count():
    running = (ready("a1", running=1), booting("a2"))
    plan = decide(both(4, 4, machines_a=running), two_queues({"max_machines": 3}), NOW)
    assert len(plan.launches) == 1


def test_dollar_cap():
    plan = decide(both(4, 4), two_queues({"max_price_per_hour": 2.0}), NOW)
    assert len(plan.launches) == 3  # 3 × 0.60 = 1.80 ≤ 2.00 < 2.40


def test_over_cap_already_launches_nothing_and_drains_nothing():
    machines = tuple(ready(f"m{i}", running=1) for i in range(6))
    plan = decide(both(10, 10, machines_a=machines), two_queues({"max_machines": 4}), NOW)
    assert plan.launches == () and plan.drains == ()
    assert {w.kind for w in plan.waits} == {"spend_cap"}


def test_unknown_price_counts_at_the_queue_cap():
    m = ready("a1", running=1, price=None)
    plan = decide(
        both(0, 5, machines_a=(m,)), two_queues({"max_price_per_hour": 1.0}, price=0.5), NOW
    )
    assert len(plan.launches) == 1  # 0.5 (unknown → cap) + 0.5 ≤ 1.0


def test_max_workers_zero_watches_and_counts_but_never_rents():
    """`max_workers: 0`: a queue served by hand-made capacity alone. However many jobs wait,
    nothing is rented, with or without hand-made workers beside it."""
    cfg = config([{"trigger": "queue_depth", "target_per_worker": 1}], max_workers=0)
    for manual in (0, 2):
        snap = Snapshot((QueueSnapshot("q", metrics(pending=200), (), manual_workers=manual),))
        plan = decide(snap, cfg, NOW).for_queue("q")
        assert plan.launches == ()
