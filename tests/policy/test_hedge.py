"""Hedged launch: one more machine when every booting machine is late and nothing serves."""

from __future__ import annotations

from dataclasses import replace

from autoscaler.policy import decide
from autoscaler.policy.hedge import HEDGE_LATE_FACTOR
from autoscaler.policy.triggers import DEFAULT_BOOT_ESTIMATE

from .helpers import NOW, booting, config, metrics, ready, snap
from .invariants import check_plan

UP = [{"trigger": "no_workers"}, {"trigger": "queue_depth", "threshold": 0}]
LATE = HEDGE_LATE_FACTOR * DEFAULT_BOOT_ESTIMATE  # 450 s with no boot seen


def launches(s, cfg=None):
    cfg = cfg or config(UP, [])
    plan = decide(s, cfg, NOW)
    check_plan(s, cfg, plan)
    return plan.for_queue("q").launches


def test_every_booting_machine_late_one_more():
    got = launches(snap(metrics(pending=3), (booting("a", ago=LATE + 1),)))
    assert len(got) == 1 and got[0].trigger == "hedge" and "past 450s" in got[0].reason


def test_not_late_no_hedge_no_stacking():
    assert launches(snap(metrics(pending=3), (booting("a", ago=LATE - 1),))) == ()
    # one late, one young (the hedge of the last period): nothing more
    machines = (booting("a", ago=LATE * 2), booting("b", ago=30))
    assert launches(snap(metrics(pending=3), machines)) == ()


def test_no_hedge_when_a_machine_serves_or_nothing_waits():
    machines = (booting("a", ago=LATE + 1), ready("b", running=1))
    assert launches(snap(metrics(pending=3, in_flight=1), machines)) == ()
    assert launches(snap(metrics(pending=0), (booting("a", ago=LATE + 1),))) == ()


def test_the_late_point_follows_the_slowest_boot_seen_on_the_queue():
    slow = replace(ready("b", running=1, created_ago=1000), ready_at=NOW)  # booted in 1000 s
    drained = replace(slow, drain_requested=True, running_tasks=1)
    # a 1000 s boot seen: 600 s of booting is not late (1.5 × 1000 = 1500 > the 900 s boot
    # timeout: the timeout comes first, no hedge at all)
    s = snap(metrics(pending=3, in_flight=1), (booting("a", ago=600), drained))
    assert all(x.trigger != "hedge" for x in launches(s))


def test_no_hedge_at_max_workers():
    cfg = config(UP, [], max_workers=1)
    assert launches(snap(metrics(pending=3), (booting("a", ago=LATE + 1),)), cfg) == ()


def test_a_quick_boot_is_never_judged_late_before_a_minute_or_two_polls():
    """Readiness is seen at a reconcile: with 1 s boots, machines 10 s into booting are not late
    (the loop's chaos test rented a fourth machine 3 s after three, before this floor)."""
    from autoscaler.policy.hedge import HEDGE_MIN_LATE_S
    from autoscaler.policy.snapshot import QueueSnapshot, Snapshot

    quick = snap(metrics(pending=6), (booting("a", ago=10), booting("b", ago=10)))
    qs = QueueSnapshot("q", quick.queues[0].metrics, quick.queues[0].machines, boot_estimate=1.0)
    assert launches(Snapshot((qs,))) == ()
    late = replace(qs, machines=(booting("a", ago=HEDGE_MIN_LATE_S + 10),))
    assert [x.trigger for x in launches(Snapshot((late,)))] == ["hedge"]
