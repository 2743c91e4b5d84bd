"""Each scale-up trigger at and around its edges, through decide()."""

from __future__ import annotations

from autoscaler.lifecycle import InstanceState
from autoscaler.policy import decide

from .helpers import NOW, booting, config, metrics, ready, snap

NO_WORKERS = {"trigger": "no_workers"}


def qplan(cfg, s, now=NOW):
    p = decide(s, cfg, now).for_queue("q")
    assert p is not None
    return p


# ------------------------------------------------------------------ no_workers


def test_no_workers_launches_one_when_jobs_wait_and_nothing_serves():
    p = qplan(config([NO_WORKERS]), snap(metrics(pending=7)))
    assert len(p.launches) == 1
    assert p.launches[0].trigger == "no_workers"
    assert "7 pending" in p.launches[0].reason


def test_no_workers_quiet_without_pending_jobs():
    assert qplan(config([NO_WORKERS]), snap(metrics(pending=0))).launches == ()


def test_no_workers_counts_booting_machines_in_every_early_state():
    for state in (InstanceState.PENDING, InstanceState.CREATING, InstanceState.BOOTING):
        p = qplan(config([NO_WORKERS]), snap(metrics(pending=3), (booting("b", state=state),)))
        assert p.launches == (), state


def test_no_workers_counts_hand_made_workers():
    assert qplan(config([NO_WORKERS]), snap(metrics(pending=3), manual=1)).launches == ()


def test_no_workers_ignores_machines_leaving():
    leaving = ready("r", drain_requested=True, running=1)
    p = qplan(config([NO_WORKERS]), snap(metrics(pending=3, in_flight=1), (leaving,)))
    # it fires (the leaving machine is not capacity), and takes that machine back rather than
    # renting a new one: it is booted and paid for already
    assert p.up_fired and p.launches == ()
    assert [r.launch_id for r in p.reclaims] == ["r"]


# ------------------------------------------------------------------ queue_depth threshold


def depth(threshold):
    return config([{"trigger": "queue_depth", "threshold": threshold}])


def test_queue_depth_exactly_at_threshold_adds_nothing():
    p = qplan(depth(50), snap(metrics(pending=50), (ready("a", running=1),)))
    assert p.launches == ()
    assert not p.up_fired


def test_queue_depth_one_above_threshold_adds_one_machine():
    p = qplan(depth(50), snap(metrics(pending=51), (ready("a", running=1),)))
    assert len(p.launches) == 1
    assert "51 pending > threshold 50" in p.launches[0].reason
    assert p.desired == 2


def test_queue_depth_threshold_zero_fires_on_first_job():
    assert len(qplan(depth(0), snap(metrics(pending=1))).launches) == 1


def test_queue_depth_held_while_a_machine_boots_no_stacking():
    p = qplan(depth(5), snap(metrics(pending=500), (ready("a", running=1), booting("b"))))
    assert p.launches == ()
    assert p.up_fired
    assert any("no stacking" in n for n in p.notes)


# ------------------------------------------------------------------ queue_depth target


def target(n, **kw):
    return config([{"trigger": "queue_depth", "target_per_worker": n}], **kw)


def test_target_per_worker_is_ceil_of_load_over_target():
    p = qplan(target(2, max_workers=10), snap(metrics(pending=5)))
    assert len(p.launches) == 3  # ceil(5/2)
    p = qplan(target(2, max_workers=10), snap(metrics(pending=4)))
    assert len(p.launches) == 2  # exactly divisible: no extra machine


def test_target_per_worker_counts_running_jobs_and_booting_capacity():
    machines = (ready("a", running=1), ready("b", running=1), booting("c"))
    p = qplan(target(1, max_workers=10), snap(metrics(pending=3, in_flight=2), machines))
    assert len(p.launches) == 2  # load 5, capacity 3 (booting counts)


def test_target_per_worker_does_not_replace_machines_asked_to_leave():
    leaving = tuple(ready(f"m{i}", running=1, drain_requested=True) for i in range(4))
    p = qplan(target(1, max_workers=10), snap(metrics(pending=0, in_flight=4), leaving))
    assert p.launches == ()


def test_target_capped_by_max_workers_with_a_wait():
    p = qplan(target(1, max_workers=4), snap(metrics(pending=9), (booting("b"),)))
    assert len(p.launches) == 3
    assert [w.kind for w in p.waits] == ["max_workers"]


# ------------------------------------------------------------------ latency


def lat():
    return config([{"trigger": "latency", "max_latency": "5m"}])


def test_latency_exactly_at_max_adds_nothing():
    assert qplan(lat(), snap(metrics(pending=1, oldest=300.0))).launches == ()


def test_latency_over_max_adds_one():
    p = qplan(lat(), snap(metrics(pending=1, oldest=300.5), (ready("a", running=1),)))
    assert len(p.launches) == 1
    assert p.launches[0].trigger == "latency"


def test_latency_held_while_booting():
    p = qplan(lat(), snap(metrics(pending=1, oldest=900.0), (booting("b"),)))
    assert p.launches == () and p.up_fired


def test_latency_ignores_unknown_age():
    assert qplan(lat(), snap(metrics(pending=0, oldest=None))).launches == ()


# ------------------------------------------------------------------ metric


def metric_cfg(**mode):
    return config(
        [{"trigger": "metric", "query": "waiting", "url": "http://p:9090", **mode}], max_workers=8
    )


def test_metric_threshold_edges():
    at = snap(metrics(external=(("waiting", 10.0),)), (ready("a", running=1),))
    over = snap(metrics(external=(("waiting", 10.5),)), (ready("a", running=1),))
    assert qplan(metric_cfg(threshold=10), at).launches == ()
    assert len(qplan(metric_cfg(threshold=10), over).launches) == 1


def test_metric_target_per_worker():
    s = snap(metrics(external=(("waiting", 7.0),)))
    assert len(qplan(metric_cfg(target_per_worker=2), s).launches) == 4


def test_metric_missing_value_has_no_opinion():
    s = snap(metrics(pending=0, external=(("other", 99.0),)))
    p = qplan(metric_cfg(threshold=1), s)
    assert p.launches == () and not p.up_fired
    assert any("no value" in n for n in p.notes)


# ------------------------------------------------------------------ max over triggers


def test_max_over_triggers_single_decision():
    cfg = config([NO_WORKERS, {"trigger": "queue_depth", "target_per_worker": 2}], max_workers=10)
    p = qplan(cfg, snap(metrics(pending=9)))
    assert len(p.launches) == 5
    assert {a.trigger for a in p.launches} == {"queue_depth"}
    assert [a.index for a in p.launches] == [1, 2, 3, 4, 5]


def test_every_scale_up_trigger_kind_votes_or_sets_a_floor():
    """One registration per trigger kind: a kind added to the config's union without a vote
    fails here, and a trigger of an unregistered kind is refused loudly, never skipped."""
    import importlib
    import typing

    import pytest

    from autoscaler.config.triggers import ScaleUpTrigger

    rules = importlib.import_module("autoscaler.policy.decide")
    (union, *_) = typing.get_args(ScaleUpTrigger)
    kinds = set(typing.get_args(union))
    assert kinds == set(rules.UP_VOTES) | set(rules.FLOOR_ONLY)
    assert not set(rules.UP_VOTES) & set(rules.FLOOR_ONLY)

    class Unregistered:
        trigger = "throwaway"

    with pytest.raises(TypeError, match="Unregistered has no vote"):
        rules._vote(Unregistered(), None)
