"""Property-based tests: random configs, snapshots and instants must keep every invariant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.lifecycle import InstanceState
from autoscaler.policy.history import QueueHistory
from autoscaler.policy.snapshot import (
    BackoffState,
    Machine,
    ManualTarget,
    QueueMetrics,
    QueueSnapshot,
    RateLimit,
    Snapshot,
)
from autoscaler.policy.warm import spec_key

from .helpers import config
from .invariants import checked_decide

# instants around DST changes and ordinary days
BASES = [
    datetime(2025, 3, 30, 0, 0, tzinfo=UTC),  # Europe spring forward
    datetime(2025, 10, 26, 0, 0, tzinfo=UTC),  # Europe fall back
    datetime(2025, 3, 9, 6, 0, tzinfo=UTC),  # US spring forward
    datetime(2025, 6, 2, 8, 0, tzinfo=UTC),
]
CRONS = ["0 9 * * *", "30 2 * * *", "*/15 * * * *", "0 1 * * 1-5", "0 22 * * *"]
ZONES = ["UTC", "Europe/Paris", "America/New_York"]


@st.composite
def up_triggers(draw, max_workers):
    out = []
    if draw(st.booleans()):
        out.append({"trigger": "no_workers"})
    if draw(st.booleans()):
        if draw(st.booleans()):
            out.append({"trigger": "queue_depth", "threshold": draw(st.integers(0, 12))})
        else:
            out.append({"trigger": "queue_depth", "target_per_worker": draw(st.integers(1, 6))})
    if draw(st.booleans()):
        out.append({"trigger": "latency", "max_latency": draw(st.integers(1, 900))})
    if draw(st.booleans()):
        mode = draw(st.sampled_from(["threshold", "target_per_worker"]))
        out.append(
            {"trigger": "metric", "query": "w", "url": "http://p", mode: draw(st.integers(1, 10))}
        )
    if max_workers >= 1 and draw(st.booleans()):
        out.append(
            {
                "trigger": "schedule",
                "cron": draw(st.sampled_from(CRONS)),
                "timezone": draw(st.sampled_from(ZONES)),
                "workers": draw(st.integers(1, max_workers)),
                "duration": draw(st.integers(60, 6 * 3600)),
            }
        )
    return out


@st.composite
def down_triggers(draw):
    out = []
    if draw(st.booleans()):
        out.append({"trigger": "idle", "timeout": draw(st.integers(1, 1800))})
    if draw(st.booleans()):
        out.append(
            {
                "trigger": "schedule",
                "cron": draw(st.sampled_from(CRONS)),
                "timezone": draw(st.sampled_from(ZONES)),
            }
        )
    return out


@st.composite
def configs(draw):
    names = draw(st.sampled_from([["q"], ["q", "r"]]))
    queues = {}
    for name in names:
        mx = draw(st.integers(0, 6))
        queues[name] = {
            "min_workers": draw(st.integers(0, mx)),
            "max_workers": mx,
            "priority": draw(st.integers(0, 2)),
            "scale_up": draw(up_triggers(mx)),
            "scale_down": draw(down_triggers()),
            "instance": {"gpu": "x", "max_price_per_hour": draw(st.sampled_from([0.3, 0.6, 1.1]))},
            **(
                {
                    "instance": {
                        "gpu": "x",
                        "max_price_per_hour": 1.1,
                        "interruptible": {
                            "bid": draw(st.sampled_from([0.2, "50%"])),
                            "max_share": draw(st.sampled_from([0.1, 0.5, 0.7, 1.0])),
                        },
                    }
                }
                if draw(st.booleans())
                else {}
            ),
            # one provider, or a list (placement across providers)
            "provider": draw(st.sampled_from(["gpu", "gpu", ["gpu", "gpu2"], ["gpu2", "gpu"]])),
            "warm_pool": {"size": draw(st.integers(0, mx)), "keep_for": "1h"},
        }
    limits = {}
    if draw(st.integers(0, 2)) == 0:
        limits["max_machines"] = draw(st.integers(0, 8))
    if draw(st.integers(0, 2)) == 0:
        limits["max_price_per_hour"] = draw(st.sampled_from([0.0, 1.0, 2.5, 4.0]))
    return config(queues=queues, limits=limits or None)


@st.composite
def machines(draw, now, name):
    out = []
    for i in range(draw(st.integers(0, 8))):
        state = draw(st.sampled_from(list(InstanceState)))
        created = now - timedelta(seconds=draw(st.integers(0, 7200)))
        ready_at = (
            created + timedelta(seconds=draw(st.integers(0, 600)))
            if state not in (InstanceState.PENDING, InstanceState.CREATING, InstanceState.BOOTING)
            else None
        )
        if ready_at is not None and ready_at > now:
            ready_at = now
        last = draw(st.none() | st.integers(0, 7200))
        out.append(
            Machine(
                launch_id=f"{name}-{i}",
                state=state,
                created_at=created,
                provider=draw(st.sampled_from(["gpu", "gpu", "gpu2"])),
                ready_at=ready_at,
                running_tasks=draw(st.sampled_from([0, 0, 1, 2])),
                last_task_at=None if last is None else now - timedelta(seconds=last),
                drain_requested=draw(st.booleans()),
                price_per_hour=draw(st.sampled_from([None, 0.3, 0.6])),
                # rented as the spec the queue rents now, as another, or before specs were kept
                spec_key=draw(st.sampled_from([FIT, FIT, "another spec", None])),
                keep_warm=draw(st.booleans()),
                stopped_at=(
                    now - timedelta(seconds=draw(st.integers(0, 7200)))
                    if state in (InstanceState.STOPPING, InstanceState.STOPPED)
                    else None
                ),
                storage_price_per_hour=draw(st.sampled_from([None, 0.01])),
                interruptible=draw(st.booleans()),
            )
        )
    return tuple(out)


_RENTS = {"q": {"instance": {"gpu": "x", "max_price_per_hour": 0.3}}}
FIT = spec_key(config(queues=_RENTS).queues["q"].autoscale)  # what every generated queue rents


@st.composite
def histories(draw):
    """What the loop may have learned: any gaps (learned idle timeouts), any runtime (the
    burst rule), trusted or not."""
    return QueueHistory(
        quiet_gaps=tuple(draw(st.lists(st.floats(0, 7200), max_size=20))),
        job_seconds=draw(st.none() | st.floats(0.01, 7200)),
        jobs_seen=draw(st.integers(0, 200)),
    )


@st.composite
def worlds(draw):
    cfg = draw(configs())
    now = draw(st.sampled_from(BASES)) + timedelta(seconds=draw(st.integers(0, 3 * 86400)))
    queues = []
    for name in cfg.queues:
        kind = draw(st.sampled_from(["fresh", "fresh", "fresh", "stale", "none"]))
        metrics = None
        if kind != "none":
            pending = draw(st.integers(0, 40))
            metrics = QueueMetrics(
                name,
                pending,
                draw(st.none() | st.floats(0, 3600)) if pending else None,
                draw(st.integers(0, 10)),
                now,
                external=(("w", float(draw(st.integers(0, 30)))),) if draw(st.booleans()) else (),
                external_degraded=("w",) if draw(st.booleans()) else (),
                stale=kind == "stale",
            )
        backoffs = tuple(  # per (queue, provider): in force or expired, on either provider
            BackoffState(
                provider,
                draw(st.integers(1, 9)),
                now + timedelta(seconds=draw(st.integers(-600, 600))),
            )
            for provider in ("gpu", "gpu2")
            if draw(st.booleans())
        )
        # an operator's target, sometimes: in force, expired, or above max_workers
        target = None
        if draw(st.integers(0, 4)) == 0:
            target = ManualTarget(
                draw(st.integers(0, 8)), now + timedelta(seconds=draw(st.integers(-60, 3600)))
            )
        queues.append(
            QueueSnapshot(
                name,
                metrics,
                draw(machines(now, name)),
                draw(st.integers(0, 2)),
                backoffs,
                manual_target=target,
                boot_estimate=draw(st.none() | st.floats(1, 900)),
                history=draw(histories()),
            )
        )
    # a queue the config does not know still bills and counts toward caps
    if draw(st.booleans()):
        queues.append(QueueSnapshot("orphan", None, draw(machines(now, "orphan"))))
    # the provider rate-limited the account or did not answer, sometimes: in force or expired
    limits = tuple(
        RateLimit(
            provider,
            now + timedelta(seconds=draw(st.integers(-60, 600))),
            cause=draw(st.sampled_from(("rate_limit", "unanswered"))),
        )
        for provider in ("gpu", "gpu2")
        if draw(st.integers(0, 3)) == 0
    )
    return Snapshot(tuple(queues), rate_limits=limits), cfg, now


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_every_plan_keeps_the_invariants(world):
    snapshot, cfg, now = world
    checked_decide(snapshot, cfg, now)


PLUS_ONE = st.lists(
    st.sampled_from(
        [
            {"trigger": "no_workers"},
            {"trigger": "queue_depth", "threshold": 0},
            {"trigger": "queue_depth", "threshold": 3},
            {"trigger": "latency", "max_latency": 1},
            {"trigger": "metric", "query": "w", "url": "http://p", "threshold": 1},
        ]
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    PLUS_ONE,
    st.integers(0, 3),
    st.integers(1, 4),
    st.integers(0, 4),
    st.integers(0, 50),
    st.integers(0, 5),
    st.sampled_from(BASES),
)
def test_no_stacking_while_booting(trigs, min_workers, n_booting, n_ready, pending, busy, now):
    """Whatever the load, +1 triggers add nothing while a machine boots (only the floor may)."""
    cfg = config(trigs, min_workers=min_workers, max_workers=12)
    ms = tuple(
        Machine(f"b{i}", InstanceState.BOOTING, now - timedelta(seconds=10 * i), "gpu")
        for i in range(n_booting)
    ) + tuple(
        Machine(
            f"r{i}",
            InstanceState.READY,
            now - timedelta(hours=1),
            "gpu",
            ready_at=now - timedelta(minutes=50),
            running_tasks=1 if i < busy else 0,
            last_task_at=now,
        )
        for i in range(n_ready)
    )
    m = QueueMetrics(
        "q", pending, 600.0 if pending else None, min(busy, n_ready), now, external=(("w", 99.0),)
    )
    plan = checked_decide(Snapshot((QueueSnapshot("q", m, ms),)), cfg, now)
    qp = plan.for_queue("q")
    assert len(qp.launches) <= max(0, min_workers - (n_booting + n_ready))
    if pending:
        assert qp.drains == ()  # a fired (held) trigger blocks scale-down too


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 3),
    st.integers(1, 5),
    st.integers(0, 3),
    st.booleans(),
    st.booleans(),
    st.integers(0, 20),
    st.sampled_from(BASES),
)
def test_no_scale_down_on_a_missing_or_last_known_metric(
    min_workers, n_idle, n_busy, has_value, flagged, value, now
):
    """Idle machines galore, but a metric trigger's value is missing or only last-known."""
    if has_value and not flagged:
        flagged = True  # a current value would allow scale-down: not this property
    cfg = config(
        [{"trigger": "metric", "query": "w", "url": "http://p", "threshold": 50}],
        [{"trigger": "idle", "timeout": 60}, {"trigger": "schedule", "cron": "* * * * *"}],
        min_workers=min_workers,
        max_workers=12,
    )
    ms = tuple(
        Machine(
            f"r{i}",
            InstanceState.READY,
            now - timedelta(hours=2),
            "gpu",
            ready_at=now - timedelta(hours=1),
            running_tasks=1 if i < n_busy else 0,
            last_task_at=now - timedelta(hours=1),
        )
        for i in range(n_idle + n_busy)
    )
    m = QueueMetrics(
        "q",
        0,
        None,
        n_busy,
        now,
        external=(("w", float(value)),) if has_value else (),
        external_degraded=("w",) if flagged else (),
    )
    qp = checked_decide(Snapshot((QueueSnapshot("q", m, ms),)), cfg, now).for_queue("q")
    assert qp.scale_down_drains == ()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    busy=st.lists(st.integers(0, 3), min_size=0, max_size=8),
    target=st.integers(0, 8),
    pending=st.integers(0, 40),
    stale=st.booleans(),
    now=st.datetimes(min_value=datetime(2025, 1, 1), max_value=datetime(2030, 1, 1)).map(
        lambda d: d.replace(tzinfo=UTC)
    ),
)
def test_a_manual_target_never_drains_a_busy_worker_now(busy, target, pending, stale, now):
    """Down to the operator's target: idle machines go now, busy ones only once idle —
    with or without fresh metrics, whatever the load."""
    cfg = config([{"trigger": "no_workers"}], [{"trigger": "idle", "timeout": "1h"}], max_workers=8)
    ms = tuple(
        Machine(
            f"m{i}",
            InstanceState.READY,
            now - timedelta(hours=1),
            "gpu",
            ready_at=now - timedelta(hours=1),
            running_tasks=n,
        )
        for i, n in enumerate(busy)
    )
    m = QueueMetrics("q", pending, None, sum(busy), now, stale=stale)
    snap = Snapshot(
        (QueueSnapshot("q", m, ms, manual_target=ManualTarget(target, now + timedelta(hours=1))),)
    )
    qp = checked_decide(snap, cfg, now).for_queue("q")
    assert qp is not None
    idle = sum(1 for n in busy if n == 0)
    now_drained = [d for d in qp.drains if not d.when_idle]
    assert len(now_drained) == min(idle, max(0, len(busy) - target))
    assert len(qp.drains) == max(0, len(busy) - target)
