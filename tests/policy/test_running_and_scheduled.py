"""Load from the workers, jobs scheduled for later, paused queues: what the triggers count.

- the load is due pending jobs plus jobs handed to workers, the larger of the broker's unacked
  count and the workers' own running + prefetched report (each misses some: early acks hide
  running jobs from the broker, a silent worker hides its own);
- jobs whose ETA has not come are not demand: no_workers and latency ignore them, and a machine
  is asked for one boot time before the first falls due (and the last one is kept for them);
- a queue paused at its source rents nothing for its pending jobs.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.policy import triggers as t
from autoscaler.policy.decide import decide
from autoscaler.policy.snapshot import QueueMetrics, QueueSnapshot, Snapshot

from .helpers import NOW, booting, config, ready, snap
from .invariants import checked_decide
from .test_properties import worlds

TARGET = [{"trigger": "queue_depth", "target_per_worker": 1}]


def m(pending=0, in_flight=0, **kw) -> QueueMetrics:
    return QueueMetrics("q", pending, 5.0 if pending else None, in_flight, NOW, **kw)


def launches(metrics: QueueMetrics, machines=(), scale_up=TARGET, **kw):
    cfg = config(scale_up, max_workers=20, **kw)
    return decide(snap(metrics, machines), cfg, NOW).queues[0]


def test_running_jobs_reported_by_workers_count_when_early_acks_hide_them():
    # early acks: 2 running (acked), 2 prefetched (unacked), 4 waiting
    assert len(launches(m(4, 2, running=2, reserved=2)).launches) == 8
    # the queue drained, 2 still running: the broker says 0/0, the workers say 2
    assert len(launches(m(0, 0, running=2, reserved=0)).launches) == 2
    # late acks: the broker's 4 unacked are the same jobs as the workers' 2 + 2: not added
    assert len(launches(m(4, 4, running=2, reserved=2)).launches) == 8
    # no worker report: the broker's count alone (the documented fallback)
    assert len(launches(m(4, 2)).launches) == 6
    # a worker that did not answer: the broker's count is the larger, it wins
    assert len(launches(m(4, 3, running=1, reserved=0)).launches) == 7


def test_jobs_running_on_leaving_machines_need_no_new_machine():
    leaving = dataclasses.replace(ready("a", running=2), drain_requested=True)
    plan = launches(m(0, 0, running=2, reserved=0), (leaving,))
    assert plan.launches == () and plan.reclaims == ()


def test_jobs_delivered_during_the_read_keep_an_idle_looking_machine_and_rent_nothing():
    """A worker that just started takes its jobs while the read runs: they are in no count
    (taken from the list before it was counted, delivered after the first view of unacked),
    only in `delivered_during_read`. Its machine, idle past the timeout by its last report, is
    kept; and nothing is rented for them."""
    idle = [{"trigger": "idle", "timeout": "3s"}]
    machine = (ready("a", idle_for=30),)

    def plan(metrics: QueueMetrics):
        return decide(snap(metrics, machine), config(TARGET, idle, max_workers=3), NOW).queues[0]

    assert [d.launch_id for d in plan(m(0, 0)).drains] == ["a"]
    held = plan(m(0, 0, delivered_during_read=3))
    assert held.drains == () and held.launches == ()
    assert plan(m(0, 0, delivered_during_read=3, running=0)).launches == ()


def test_scheduled_jobs_are_not_demand_until_a_boot_time_before_they_fall_due():
    due = NOW.timestamp() + 3600
    later = m(0, 0, scheduled=5, next_due_at=due)
    up = [{"trigger": "no_workers"}, {"trigger": "latency", "max_latency": 1}]
    assert launches(later, scale_up=up).launches == ()
    # the default boot estimate (300 s) before they fall due: one machine, ready in time
    soon = dataclasses.replace(later, next_due_at=NOW.timestamp() + 290)
    plan = launches(soon, scale_up=up)
    assert [a.trigger for a in plan.launches] == ["no_workers"]
    assert "ready when they fall due" in plan.launches[0].reason
    # due already (the reader counts it pending then), or a machine on its way: nothing more
    assert launches(soon, (booting("b"),), scale_up=up).launches == ()
    # the queue's own recent boot time, and never more than its boot timeout
    cfg = config(up, max_workers=4)
    for estimate, fires in ((280.0, False), (295.0, True)):
        qs = QueueSnapshot("q", soon, boot_estimate=estimate)
        plan = decide(Snapshot((qs,)), cfg, NOW).queues[0]
        assert bool(plan.launches) == fires, estimate
    short = config(up, max_workers=4, queues={"q": {"boot_timeout": 60}})
    qs = QueueSnapshot("q", soon, boot_estimate=600.0)
    assert decide(Snapshot((qs,)), short, NOW).queues[0].launches == ()


def test_latency_and_thresholds_see_only_due_jobs():
    only_later = m(0, 0, scheduled=3, next_due_at=NOW.timestamp() + 60)
    view = t.make_view(only_later, (), 0, NOW)
    assert not t.latency(
        config([{"trigger": "latency", "max_latency": 1}]).queues["q"].autoscale.scale_up[0], view
    ).fired
    assert view.load == 0


def test_the_last_machine_is_kept_for_jobs_about_to_fall_due():
    idle = ready("a", idle_for=3600)
    down = [{"trigger": "idle", "timeout": 60}]
    soon = m(0, 0, scheduled=1, next_due_at=NOW.timestamp() + 120)
    cfg = config([{"trigger": "no_workers"}], down, max_workers=4)
    plan = decide(snap(soon, (idle,)), cfg, NOW).queues[0]
    assert plan.drains == ()
    assert any("kept for them" in n for n in plan.notes)
    far = dataclasses.replace(soon, next_due_at=NOW.timestamp() + 7200)
    assert [d.launch_id for d in decide(snap(far, (idle,)), cfg, NOW).queues[0].drains] == ["a"]
    two = (idle, ready("b", idle_for=3000))
    assert len(decide(snap(soon, two), cfg, NOW).queues[0].drains) == 1


def test_a_paused_queue_rents_nothing_for_its_pending_jobs():
    paused = m(7, 0, paused=True)
    up = [
        {"trigger": "no_workers"},
        {"trigger": "queue_depth", "threshold": 1},
        {"trigger": "latency", "max_latency": 1},
        *TARGET,
    ]
    plan = launches(paused, scale_up=up)
    assert plan.launches == ()
    assert any("paused" in n for n in plan.notes)
    # jobs still running on it are load (they finish even while paused)
    assert len(launches(m(7, 0, paused=True, running=2, reserved=0), scale_up=up).launches) == 2


@st.composite
def richer_worlds(draw):
    """The random worlds of test_properties, their readings with worker reports, scheduled
    jobs (due within or beyond the boot time) and paused queues."""
    snapshot, cfg, now = draw(worlds())
    queues = []
    for qs in snapshot.queues:
        metrics = qs.metrics
        if metrics is not None:
            metrics = dataclasses.replace(
                metrics,
                running=draw(st.none() | st.integers(0, 12)),
                reserved=draw(st.none() | st.integers(0, 6)),
                scheduled=draw(st.integers(0, 5)),
                next_due_at=now.timestamp() + draw(st.integers(-60, 4000)),
                paused=draw(st.integers(0, 5)) == 0,
            )
        queues.append(
            dataclasses.replace(
                qs, metrics=metrics, boot_estimate=draw(st.none() | st.floats(0, 1200))
            )
        )
    return Snapshot(tuple(queues)), cfg, now


def _as_broker_only(snapshot: Snapshot) -> Snapshot:
    """The same world as the invariants know it: the load folded into `in_flight` (no worker
    report), paused queues without pending or scheduled jobs (a paused queue serves neither)."""
    out = []
    for qs in snapshot.queues:
        met = qs.metrics
        if met is not None:
            met = dataclasses.replace(
                met,
                in_flight=met.started_or_held,
                running=None,
                reserved=None,
                pending=0 if met.paused else met.pending,
                scheduled=0 if met.paused else met.scheduled,
                paused=False,
            )
        out.append(dataclasses.replace(qs, metrics=met))
    return Snapshot(tuple(out))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(richer_worlds())
def test_worker_reports_scheduled_and_paused_queues_keep_every_invariant(world):
    """Launches and scale-ups are those of the same world with the load folded into in flight
    (which `tests/policy/invariants.py` checks); scheduled jobs only ever add a pre-warm machine
    to an empty queue and keep a last machine, never more."""
    snapshot, cfg, now = world
    plan = decide(snapshot, cfg, now)
    folded = _as_broker_only(snapshot)
    checked_decide(folded, cfg, now)
    same = decide(folded, cfg, now)
    for a, b in zip(plan.queues, same.queues, strict=True):
        assert len(a.launches) >= len(b.launches)
        extra = len(a.launches) - len(b.launches)
        if extra:  # a pre-warm: one machine for an empty queue with jobs about to fall due
            assert extra == 1 and a.capacity == 0 and not b.launches
            assert [x.trigger for x in a.launches] == ["no_workers"]
        assert len(a.drains) <= len(b.drains)
        if len(a.drains) < len(b.drains):  # the last machine kept for jobs about to fall due
            assert a.capacity - len(a.drains) >= 1
    # and the checked invariants hold for the world as it is, scheduled jobs and all
    report_free = Snapshot(
        tuple(
            dataclasses.replace(
                qs,
                metrics=dataclasses.replace(qs.metrics, running=None, reserved=None, paused=False)
                if qs.metrics
                else None,
            )
            for qs in snapshot.queues
        )
    )
    checked_decide(report_free, cfg, now + timedelta(0))
