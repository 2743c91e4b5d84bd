"""Interruptible machines in `decide()`: at most `max_share` of a queue's machines are rented at
the bid, the rest on demand; a shrinking fleet drains so it stays within the share; a
preempted machine (destroyed, so terminating) is no capacity. The random worlds of
`test_properties.py` check the launch share on every plan (`invariants.check_plan`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from autoscaler.lifecycle import InstanceState

from .helpers import NOW, config, metrics, ready, snap
from .invariants import checked_decide

IDLE = [{"trigger": "idle", "timeout": "5m"}]
DEPTH = [{"trigger": "queue_depth", "target_per_worker": 1}]


def cfg(max_share: float, max_workers: int = 10, **over: Any):
    instance = {
        "gpu": "RTX 4090",
        "max_price_per_hour": 0.6,
        "interruptible": {"bid": "50%", "max_share": max_share},
    }
    return config(
        DEPTH, IDLE, max_workers=max_workers, queues={"q": {"instance": instance, **over}}
    )


@pytest.mark.parametrize(
    ("max_share", "wanted", "bids"), [(0.5, 4, 2), (0.7, 4, 2), (0.7, 10, 7), (1.0, 3, 3)]
)
def test_launches_at_the_bid_stay_within_the_share(max_share, wanted, bids):
    plan = checked_decide(snap(metrics(pending=wanted)), cfg(max_share), NOW)
    assert len(plan.launches) == wanted
    assert sum(a.interruptible for a in plan.launches) == bids
    assert all("interruptible" in a.reason for a in plan.launches if a.interruptible)


def test_machines_already_at_the_bid_count_toward_the_share():
    fleet = tuple(replace(ready(f"i{n}", running=1), interruptible=True) for n in range(2))
    plan = checked_decide(snap(metrics(pending=4), fleet), cfg(0.5), NOW)
    assert len(plan.launches) == 2 and not any(a.interruptible for a in plan.launches)


def test_a_shrinking_fleet_drains_an_interruptible_machine_to_stay_within_the_share():
    """Three idle machines, one on demand (the most idle) and two at the bid, max_share 0.7:
    draining the on-demand one would leave 2 of 2 at the bid; an interruptible one goes."""
    fleet = (
        ready("od", idle_for=3000),
        replace(ready("i1", idle_for=1000), interruptible=True),
        replace(ready("i2", idle_for=900), interruptible=True),
    )
    plan = checked_decide(snap(metrics(pending=0), fleet), cfg(0.7, min_workers=2), NOW)
    assert [d.launch_id for d in plan.drains] == ["i1"]


def test_without_interruptible_the_most_idle_machine_drains_first():
    fleet = (
        ready("od", idle_for=3000),
        replace(ready("i1", idle_for=1000), interruptible=True),
    )
    plain = config(DEPTH, IDLE, max_workers=4, min_workers=1)
    plan = checked_decide(snap(metrics(pending=0), fleet), plain, NOW)
    assert [d.launch_id for d in plan.drains] == ["od"]


def test_a_preempted_machine_is_no_capacity_and_its_replacement_is_rented_at_once():
    """Reconcile moved it to terminating (its jobs handed back): the next evaluation rents."""
    preempted = replace(
        ready("gone", running=1), interruptible=True, state=InstanceState.TERMINATING
    )
    plan = checked_decide(snap(metrics(pending=1), (preempted,)), cfg(0.5), NOW)
    assert plan.queues[0].capacity == 0 and len(plan.launches) == 1
