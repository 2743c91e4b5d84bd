"""Machines asked to leave are taken back before renting; every billing machine counts."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from autoscaler.policy import decide
from autoscaler.policy.snapshot import QueueSnapshot, Snapshot

from .helpers import NOW, config, metrics, ready, snap

DEPTH0 = {"trigger": "queue_depth", "threshold": 0}


def test_an_idle_machine_asked_to_leave_is_reclaimed_not_drained_while_jobs_wait():
    s = snap(metrics(pending=5), (ready("a", drain_requested=True),))
    p = decide(s, config([DEPTH0], max_workers=4), NOW).for_queue("q")
    assert [r.launch_id for r in p.reclaims] == ["a"]
    assert p.launches == () and p.drains == ()


def test_leaving_busy_machines_count_against_max_workers():
    cfg = config([{"trigger": "queue_depth", "target_per_worker": 1}], max_workers=2)
    leaving = (
        ready("a", drain_requested=True, running=1),
        ready("b", drain_requested=True, running=1),
    )
    p = decide(snap(metrics(pending=5, in_flight=2), leaving), cfg, NOW).for_queue("q")
    assert p.launches == ()  # both taken back; nothing new above max_workers = 2
    assert sorted(r.launch_id for r in p.reclaims) == ["a", "b"]


def test_draining_and_terminating_machines_hold_their_slot_under_max_workers():
    from autoscaler.lifecycle import InstanceState

    gone_soon = (
        replace(ready("d", running=1), state=InstanceState.DRAINING),
        replace(ready("t"), state=InstanceState.TERMINATING),
    )
    cfg = config([{"trigger": "queue_depth", "target_per_worker": 1}], max_workers=3)
    p = decide(snap(metrics(pending=9), gone_soon), cfg, NOW).for_queue("q")
    assert len(p.launches) == 1  # 3 - 2 machines that may still bill
    assert any(w.kind == "max_workers" and "may still be billing" in w.reason for w in p.waits)


def test_machines_of_an_unconfigured_queue_count_at_the_dearest_price_under_a_dollar_cap():
    cfg = config([DEPTH0], max_workers=4, price=1.0, limits={"max_price_per_hour": 2.0})
    orphan = QueueSnapshot("old", None, (ready("o1", price=None), ready("o2", price=None)))
    p = decide(Snapshot((QueueSnapshot("q", metrics(pending=10)), orphan)), cfg, NOW)
    assert p.for_queue("q").launches == ()  # 2 × $1.00 already billing: the cap is reached
    assert any(w.kind == "spend_cap" for w in p.for_queue("q").waits)


def test_a_non_finite_metric_value_is_no_value_and_does_not_crash_the_tick():
    trig = {"trigger": "metric", "query": "w", "url": "http://p", "target_per_worker": 2}
    for bad in (math.inf, -math.inf, math.nan):
        m = replace(metrics(pending=0), external=(("w", bad),))
        p = decide(snap(m), config([trig]), NOW).for_queue("q")
        assert p.launches == ()


def test_an_hourly_prewarm_holds_through_the_repeated_autumn_hour():
    """Wildcard-hour crons fire in the repeated hour too (Vixie cron), so the floor holds."""
    cfg = config(
        [
            {
                "trigger": "schedule",
                "cron": "0 * * * *",
                "timezone": "Europe/Paris",
                "workers": 2,
                "duration": "1h",
            }
        ],
        [{"trigger": "idle", "timeout": "5m"}],
    )
    paris = ZoneInfo("Europe/Paris")
    for fold in (0, 1):  # 02:05 CEST, then 02:05 CET an hour later
        now = datetime(2024, 10, 27, 2, 5, tzinfo=paris, fold=fold).astimezone(UTC)
        machines = (ready("a", idle_for=600, now=now), ready("b", idle_for=600, now=now))
        p = decide(snap(replace(metrics(), read_at=now), machines), cfg, now).for_queue("q")
        assert p.floor == 2 and p.drains == (), fold
