"""Idle scale-down, busy protection, stale data, no up-and-down together."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.lifecycle import InstanceState
from autoscaler.policy import decide

from .helpers import NOW, booting, config, metrics, ready, snap

IDLE = [{"trigger": "idle", "timeout": "10m"}]


def drains(cfg, s):
    return decide(s, cfg, NOW).for_queue("q").drains


def test_idle_exactly_at_timeout_is_drained():
    got = drains(config([], IDLE), snap(metrics(), (ready("a", idle_for=600),)))
    assert [d.launch_id for d in got] == ["a"]


def test_idle_just_under_timeout_stays():
    assert drains(config([], IDLE), snap(metrics(), (ready("a", idle_for=599.9),))) == ()


def test_idle_drains_most_idle_first_down_to_min_workers():
    machines = (ready("a", idle_for=700), ready("b", idle_for=5000), ready("c", idle_for=900))
    got = drains(config([], IDLE, min_workers=1), snap(metrics(), machines))
    assert [d.launch_id for d in got] == ["b", "c"]
    assert "idle: no task for 5000s" in got[0].reason


def test_never_drains_a_busy_worker_even_if_idle_long_ago():
    busy = ready("a", idle_for=99999, running=1)
    assert drains(config([], IDLE), snap(metrics(in_flight=1), (busy,))) == ()


def test_worker_that_never_ran_a_task_is_idle_since_ready():
    m = replace(ready("a", created_ago=700), last_task_at=None)  # ready 640 s ago
    assert [d.launch_id for d in drains(config([], IDLE), snap(metrics(), (m,)))] == ["a"]
    m = replace(ready("a", created_ago=650), last_task_at=None)  # ready 590 s ago
    assert drains(config([], IDLE), snap(metrics(), (m,))) == ()


def test_jobs_waiting_keep_the_machines_they_need_however_idle_those_look():
    """An agent's last report can predate its worker's first job, and a worker loading its
    models runs nothing for minutes: while jobs wait, the machines they need stay (a drain
    would only rent another; seen in tests/images/test_worker_image.py on a loaded host)."""
    three = (ready("a", idle_for=700), ready("b", idle_for=5000), ready("c", idle_for=900))
    by_depth = [{"trigger": "queue_depth", "target_per_worker": 2}]
    # 2 waiting at 1 a worker (no queue_depth target): two stay, the most idle goes
    got = drains(config([], IDLE), snap(metrics(pending=2), three))
    assert [d.launch_id for d in got] == ["b"]
    # 3 waiting at 2 a worker need two machines: likewise
    got = drains(config(by_depth, IDLE, max_workers=3), snap(metrics(pending=3), three))
    assert [d.launch_id for d in got] == ["b"]
    # as many waiting as the fleet can take: nobody goes; once nothing waits, all go
    assert drains(config([], IDLE), snap(metrics(pending=3), three)) == ()
    assert drains(config([], IDLE, max_workers=3), snap(metrics(pending=9), three)) == ()
    got = drains(config([], IDLE), snap(metrics(), three))
    assert [d.launch_id for d in got] == ["b", "c", "a"]
    # a lone machine that never ran a task, ready long ago, stays while one job waits
    lone = replace(ready("a", created_ago=5000), last_task_at=None)
    assert drains(config(by_depth, IDLE, max_workers=1), snap(metrics(pending=1), (lone,))) == ()


@pytest.mark.parametrize(
    "state",
    [InstanceState.BOOTING, InstanceState.DRAINING, InstanceState.DRAINED, InstanceState.FAILED],
)
def test_only_ready_machines_are_drained(state):
    m = replace(ready("a", idle_for=9999), state=state)
    assert drains(config([], IDLE), snap(metrics(), (m,))) == ()


def test_hand_made_workers_count_towards_floor():
    got = drains(
        config([], IDLE, min_workers=1), snap(metrics(), (ready("a", idle_for=900),), manual=1)
    )
    assert [d.launch_id for d in got] == ["a"]


def test_stale_metrics_never_scale_down():
    s = snap(metrics(stale=True), (ready("a", idle_for=9999),))
    p = decide(s, config([], IDLE), NOW).for_queue("q")
    assert p.drains == ()
    assert any("stale" in n for n in p.notes)


def test_missing_metrics_never_scale_down_and_keep_the_floor():
    s = snap(None, (ready("a", idle_for=9999),))
    p = decide(s, config([{"trigger": "no_workers"}], IDLE, min_workers=2), NOW).for_queue("q")
    assert p.drains == ()
    assert len(p.launches) == 1  # the floor is kept without metrics


def test_stale_metrics_do_not_drive_load_launches():
    s = snap(metrics(pending=100, stale=True))
    assert decide(s, config([{"trigger": "no_workers"}]), NOW).for_queue("q").launches == ()


def test_no_scale_down_in_the_same_evaluation_as_a_scale_up():
    cfg = config([{"trigger": "queue_depth", "target_per_worker": 1}], IDLE, max_workers=5)
    s = snap(metrics(pending=3), (ready("a", idle_for=9999),))
    p = decide(s, cfg, NOW).for_queue("q")
    assert len(p.launches) == 2 and p.drains == ()


def test_no_scale_down_while_a_trigger_is_held_by_booting():
    cfg = config([{"trigger": "latency", "max_latency": "1m"}], IDLE)
    s = snap(metrics(pending=1, oldest=600), (ready("a", idle_for=9999), booting("b")))
    p = decide(s, cfg, NOW).for_queue("q")
    assert p.launches == () and p.drains == () and p.up_fired


def test_disabled_queue_decides_nothing():
    cfg = config([{"trigger": "no_workers"}], queues={"q": {"enabled": False}})
    plan = decide(snap(metrics(pending=5)), cfg, NOW)
    assert plan.queues == () and "disabled" in plan.notes[0]


def test_naive_now_is_refused():
    with pytest.raises(ValueError):
        decide(snap(metrics()), config(), NOW.replace(tzinfo=None))


PROM = {"trigger": "metric", "url": "http://prom:9090", "query": "waiting", "threshold": 10}


@pytest.mark.parametrize("degraded", ["missing", "last-known"])
def test_a_failing_prometheus_blocks_scale_down_but_not_queue_scale_up(degraded):
    external = () if degraded == "missing" else (("waiting", 3.0),)
    flagged = ("waiting",)
    m = replace(metrics(pending=0), external=external, external_degraded=flagged)
    cfg = config([PROM, {"trigger": "no_workers"}], IDLE)
    p = decide(snap(m, (ready("a", idle_for=9999),)), cfg, NOW).for_queue("q")
    assert p.drains == ()
    assert any("no scale-down" in n and "'waiting'" in n for n in p.notes)
    # the queue's own numbers still scale from zero while Prometheus is down
    busy_queue = replace(metrics(pending=5), external=external, external_degraded=flagged)
    assert len(decide(snap(busy_queue), cfg, NOW).for_queue("q").launches) == 1


def test_a_current_metric_value_allows_scale_down():
    m = replace(metrics(pending=0), external=(("waiting", 3.0),))
    cfg = config([PROM], IDLE)
    assert [d.launch_id for d in drains(cfg, snap(m, (ready("a", idle_for=9999),)))] == ["a"]


def test_every_scale_down_trigger_kind_switches_on_a_method():
    """One registration per scale-down kind: a kind added to the config's union with no method
    in SCALE_DOWN_METHODS fails here, and a trigger of such a kind is refused loudly, never
    skipped (before, `_scale_down`'s isinstance chain skipped it silently)."""
    import typing

    from autoscaler.config.triggers import ScaleDownTrigger
    from autoscaler.policy.scale_down import SCALE_DOWN_METHODS

    (union, *_) = typing.get_args(ScaleDownTrigger)
    kinds = set(typing.get_args(union))
    registered = {k for method in SCALE_DOWN_METHODS for k in method.kinds}
    assert kinds == registered
    assert [m.name for m in SCALE_DOWN_METHODS] == ["idle", "fleet", "schedule"]


def test_a_scale_down_trigger_no_method_takes_is_refused_not_skipped():
    class Unregistered:
        trigger = "throwaway"

    cfg = config([], IDLE)
    auto = cfg.queues["q"].autoscale.model_copy(update={"scale_down": (Unregistered(),)})
    cfg = cfg.model_copy(
        update={"queues": {"q": cfg.queues["q"].model_copy(update={"autoscale": auto})}}
    )
    with pytest.raises(TypeError, match="Unregistered has no method in SCALE_DOWN_METHODS"):
        decide(snap(metrics(), (ready("a", idle_for=5000),)), cfg, NOW)
    with pytest.raises(TypeError):
        scale_down_of(cfg)


def scale_down_of(cfg):
    """scale_down() on the queue's evaluation as decide() builds it, for the refusal above."""
    from autoscaler.policy.decide import _scale_up
    from autoscaler.policy.scale_down import scale_down
    from autoscaler.policy.snapshot import QueueSnapshot

    auto = cfg.queues["q"].autoscale
    u = _scale_up("q", auto, QueueSnapshot(name="q", metrics=metrics()), cfg, NOW)
    return scale_down(u, cfg, NOW)


def test_each_method_takes_only_the_machines_earlier_methods_left():
    """The fleet method never drains a machine the idle method chose, and the schedule never
    one either chose: each sees the budget the earlier ones left."""
    from autoscaler.policy.scale_down import FLEET_IDLE_S

    schedule = {"trigger": "schedule", "cron": "0 * * * *", "timezone": "UTC"}
    idle = {"trigger": "idle", "timeout": "30m"}
    machines = (
        ready("a", idle_for=4000),
        ready("b", idle_for=FLEET_IDLE_S + 30),
        ready("c", idle_for=FLEET_IDLE_S + 20),
        ready("d", idle_for=10),
    )
    got = drains(config([], [idle, schedule]), snap(metrics(), machines))
    # idle takes `a` (past 30 min); fleet the two idle past FLEET_IDLE_S of the three it sees
    # left; the due schedule the one machine nobody chose, back to the floor of 0.
    assert [(d.launch_id, d.reason.split(":")[0]) for d in got] == [
        ("a", "idle"),
        ("b", "fleet"),
        ("c", "fleet"),
        ("d", "schedule '0 * * * *' (UTC) fired 2025-06-02T12"),
    ]
    assert "3 serving" in got[1].reason
