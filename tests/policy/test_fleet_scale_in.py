"""Fleet-level scale-in: idle machines above what the load wants go after FLEET_IDLE_S."""

from __future__ import annotations

from autoscaler.policy import decide
from autoscaler.policy.scale_down import FLEET_IDLE_S

from .helpers import NOW, config, metrics, ready, snap
from .invariants import check_plan

IDLE = [{"trigger": "idle", "timeout": "10m"}]
TARGET = [{"trigger": "queue_depth", "target_per_worker": 2}]


def drained(cfg, s):
    plan = decide(s, cfg, NOW)
    check_plan(s, cfg, plan)
    return sorted(d.launch_id for d in plan.for_queue("q").drains)


def test_spare_idle_machines_go_after_the_fleet_idle_time_one_stays_for_the_timeout():
    machines = tuple(ready(x, idle_for=FLEET_IDLE_S + i) for i, x in enumerate("abc"))
    # no load: two go (most idle first), one is left to the 10 min idle timeout
    assert drained(config(TARGET, IDLE), snap(metrics(), machines)) == ["b", "c"]


def test_the_load_keeps_what_it_wants():
    machines = (
        ready("a", idle_for=FLEET_IDLE_S + 5),
        ready("b", idle_for=FLEET_IDLE_S + 9),
        ready("c", running=1),
        ready("d", running=1),
    )
    # 2 jobs in flight at target 2 want 1 machine; 4 serve, 2 busy: the 2 idle ones go
    got = drained(config(TARGET, IDLE), snap(metrics(in_flight=2), machines))
    assert got == ["a", "b"]
    # 6 jobs in flight at target 2 want 3: one idle machine goes, the most idle
    got = drained(config(TARGET, IDLE), snap(metrics(in_flight=6), machines))
    assert got == ["b"]


def test_never_busy_never_below_the_floor_never_recently_idle():
    machines = (ready("a", idle_for=FLEET_IDLE_S - 1), ready("b", idle_for=FLEET_IDLE_S - 1))
    assert drained(config(TARGET, IDLE), snap(metrics(), machines)) == []
    # the busy machine covers the load and stays; the spare idle one goes
    machines = (ready("a", idle_for=9999, running=1), ready("b", idle_for=FLEET_IDLE_S + 1))
    assert drained(config(TARGET, IDLE), snap(metrics(in_flight=1), machines)) == ["b"]
    machines = tuple(ready(x, idle_for=FLEET_IDLE_S + 1) for x in "abc")
    assert drained(config(TARGET, IDLE, min_workers=3), snap(metrics(), machines)) == []
    assert len(drained(config(TARGET, IDLE, min_workers=2), snap(metrics(), machines))) == 1


def test_a_short_idle_timeout_is_left_alone():
    short = [{"trigger": "idle", "timeout": "1m"}]
    machines = tuple(ready(x, idle_for=30) for x in "ab")
    assert drained(config(TARGET, short), snap(metrics(), machines)) == []


def test_no_idle_trigger_no_fleet_scale_in():
    machines = tuple(ready(x, idle_for=9999) for x in "ab")
    assert drained(config(TARGET, []), snap(metrics(), machines)) == []
