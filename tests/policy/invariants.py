"""The invariants every plan must keep, checked from the outside (shared by property tests)."""

from __future__ import annotations

import math

from autoscaler.config.models import Config, Limits
from autoscaler.config.triggers import MetricTrigger, QueueDepthTrigger
from autoscaler.lifecycle import LIVE_STATES, InstanceState
from autoscaler.policy.backoff import active_backoff
from autoscaler.policy.decide import decide
from autoscaler.policy.hedge import late_boot_s
from autoscaler.policy.plan import Plan
from autoscaler.policy.snapshot import QueueSnapshot, Snapshot
from autoscaler.policy.warm import spec_key

BOOTING = (
    InstanceState.PENDING,
    InstanceState.CREATING,
    InstanceState.BOOTING,
    InstanceState.RESUMING,  # a warm pool's machine starting again: booting capacity
)
WARM = (InstanceState.STOPPING, InstanceState.STOPPED)  # not capacity, not under max_workers


def capacity_of(qs: QueueSnapshot) -> int:
    return (
        sum(1 for m in qs.machines if m.state == InstanceState.READY and not m.drain_requested)
        + sum(1 for m in qs.machines if m.state in BOOTING)
        + max(0, qs.manual_workers)
    )


def target_wants(qs: QueueSnapshot, cfg_triggers) -> int:
    """What target-style queue_depth triggers may ask for (they may launch while booting)."""
    if qs.metrics is None or qs.metrics.stale:
        return 0
    leaving = sum(
        m.running_tasks
        for m in qs.machines
        if m.state in LIVE_STATES
        and m.state not in BOOTING
        and not (m.state == InstanceState.READY and not m.drain_requested)
    )
    load = qs.metrics.pending + max(0, qs.metrics.in_flight - leaving)
    wants = 0
    for t in cfg_triggers:
        if isinstance(t, QueueDepthTrigger) and t.target_per_worker is not None:
            wants = max(wants, math.ceil(load / t.target_per_worker))
        if getattr(t, "trigger", None) == "metric" and t.target_per_worker is not None:
            value = dict(qs.metrics.external).get(t.query)
            if value is not None and value > 0:
                wants = max(wants, math.ceil(value / t.target_per_worker))
    return wants


def check_plan(snapshot: Snapshot, config: Config, plan: Plan) -> None:
    now = plan.at
    total_launches = 0
    for qp in plan.queues:
        auto = config.queues[qp.queue].autoscale
        assert auto is not None and auto.enabled
        qs = snapshot.queue(qp.queue) or QueueSnapshot(qp.queue, None)
        cap = capacity_of(qs)
        fresh_n = len(qp.launches)
        n = fresh_n + len(qp.resumes)  # a resume adds a machine as a launch does
        total_launches += n
        kinds = {w.kind for w in qp.waits}
        assert qp.capacity == cap
        manual = qs.manual_target if qs.manual_target and qs.manual_target.active(now) else None
        if manual is not None:  # the operator's target is the floor, within max_workers
            assert qp.floor == min(manual.workers, auto.max_workers)
        else:
            assert auto.min_workers <= qp.floor <= auto.max_workers

        by_id = {m.launch_id: m for m in qs.machines}
        reclaimed = {r.launch_id for r in qp.reclaims}
        r = len(reclaimed)
        assert r == len(qp.reclaims)
        for lid in reclaimed:  # only machines asked to leave, and before any launch
            assert by_id[lid].state == InstanceState.READY and by_id[lid].drain_requested
        assert not reclaimed & {d.launch_id for d in qp.drains}
        if n:
            assert r == sum(
                1 for m in qs.machines if m.state == InstanceState.READY and m.drain_requested
            )
        # never above max: booting included, and every machine that may bill counts, but not a
        # warm pool's stopped machines
        billing = sum(1 for m in qs.machines if m.state in LIVE_STATES and m.state not in WARM)
        if n:
            assert cap + r + n <= auto.max_workers, (cap, r, n, auto.max_workers)
            assert billing + n <= auto.max_workers, (billing, n, auto.max_workers)
        # never below the floor unless in backoff, rate-limited, held by a spend cap or by
        # billing machines
        if not kinds & {"backoff", "rate_limit", "unanswered", "spend_cap", "max_workers"}:
            assert cap + r + n >= qp.floor
        # a provider in backoff or rate-limited is never called to rent; every provider
        # waiting: nothing rented (a resume rents nothing); a rate limit: no call, not even a
        # resume's start
        limited = {p for p in auto.providers if snapshot.rate_limit_for(p, now) is not None}
        held = limited | {
            p for p in auto.providers if active_backoff(qs.backoff_for(p), now) is not None
        }
        open_ = [p for p in auto.providers if p not in held]
        for a in qp.launches:
            assert set(a.providers) <= set(auto.providers) and not set(a.providers) & held
            assert list(a.providers) == open_, (a.providers, open_)
        if not open_:
            assert fresh_n == 0
        # interruptible machines never above the queue's max_share (counted on serving and
        # booting machines plus this plan's launches); none at all without `interruptible`
        bids = sum(1 for a in qp.launches if a.interruptible)
        spec = auto.instance.interruptible
        if spec is None:
            assert bids == 0
        elif bids:
            fleet = [m for m in qs.machines if m.serving or m.booting]
            share = sum(1 for m in fleet if m.interruptible) + bids
            assert share <= spec.max_share * (len(fleet) + fresh_n) + 1e-9, (share, len(fleet))
        for res in qp.resumes:
            assert by_id[res.launch_id].provider not in limited
        # no stacking: while a machine boots, only the floor or a grown target load launches
        booting = sum(1 for m in qs.machines if m.state in BOOTING)
        bound = max(qp.floor, target_wants(qs, auto.scale_up))
        fresh_now = qs.metrics is not None and not qs.metrics.stale
        grown = cap + r + n
        if booting:
            # the one exception: a hedge when every booting machine is late and none serves
            late = late_boot_s(config.queue_settings(qp.queue), qs)
            hedged = (
                fresh_now
                and manual is None
                and qs.metrics is not None
                and qs.metrics.pending > 0
                and not any(m.serving for m in qs.machines)
                and all(
                    (now - m.created_at).total_seconds() > late
                    for m in qs.machines
                    if m.state in BOOTING
                )
            )
            limit = max(bound, cap + 1) if hedged else bound
            assert n + r == 0 or grown <= limit, (cap, r, n, bound, hedged)
        else:
            assert n + r == 0 or grown <= max(bound, cap + 1, 1)
        fresh = qs.metrics is not None and not qs.metrics.stale
        if not fresh or manual is not None:
            assert n + r == 0 or grown <= qp.floor

        # drains: only our machines, each once; busy ones only "when idle"
        ids = [d.launch_id for d in qp.drains]
        assert len(ids) == len(set(ids))
        for d in qp.drains:
            m = by_id[d.launch_id]
            assert m.state == InstanceState.READY
            if m.running_tasks > 0:
                assert d.when_idle, f"busy worker {d.launch_id} drained now"
            if d.trigger == "drain_requested":
                assert m.drain_requested and m.running_tasks == 0
                assert not qp.up_fired and n == 0 and r == 0  # it may be wanted back
            else:
                assert not m.drain_requested
        down = qp.scale_down_drains
        if down and manual is not None:
            # down to the operator's target only, metrics or not; never with a launch
            assert n == 0 and r == 0 and not qp.up_fired
            assert cap - len(down) >= qp.floor
            assert all(d.trigger == "manual" for d in down)
        elif down:
            # no up and down together; never on stale data; never below the floor
            assert n == 0 and r == 0 and not qp.up_fired
            assert fresh
            assert qs.metrics is not None
            have = {q for q, _ in qs.metrics.external}
            for trig in auto.scale_up:  # never on a missing or last-known metric value
                if isinstance(trig, MetricTrigger):
                    assert trig.query in have
                    assert trig.query not in qs.metrics.external_degraded
            assert cap - len(down) >= qp.floor
            assert all(d.trigger in ("idle", "schedule") for d in down)
            # jobs waiting keep the serving machines they need from every idle drain
            idle_down = [d for d in down if d.trigger == "idle"]
            if idle_down and qs.metrics.pending > 0:
                per = max(
                    [
                        t.target_per_worker
                        for t in auto.scale_up
                        if isinstance(t, QueueDepthTrigger) and t.target_per_worker
                    ]
                    or [1]
                )
                serving = sum(1 for m in qs.machines if m.serving)
                assert serving - len(idle_down) >= math.ceil(qs.metrics.pending / per), (
                    serving,
                    len(idle_down),
                    qs.metrics.pending,
                    per,
                )
        check_warm_pool(qs, config, qp)
        for a in qp.launches:
            assert a.reason and a.provider in auto.providers
        for d in qp.drains:
            assert d.reason
        for w in qp.waits:
            assert w.reason

    # spend caps across queues
    limits = config.limits
    if total_launches:
        used, dollars = billing_usage(snapshot, config)
        if limits.max_machines is not None:
            assert used + total_launches <= limits.max_machines
        if limits.max_price_per_hour is not None:
            for a in plan.launches:
                auto = config.queues[a.queue].autoscale
                dollars += auto.instance.max_price_per_hour
            assert dollars <= limits.max_price_per_hour + 1e-6


def billing_usage(snapshot: Snapshot, config: Config) -> tuple[int, float]:
    """(machines, $/hour) billing account-wide, computed independently of the policy.

    A machine of unknown price costs at most its queue's cap; for a queue that is not configured
    (or has no autoscale block), at most the dearest cap any queue may rent at. Never $0: that
    would let spend pass limits.max_price_per_hour.
    """
    dearest = max(
        (q.autoscale.instance.max_price_per_hour for q in config.queues.values() if q.autoscale),
        default=0.0,
    )
    used = 0
    dollars = 0.0
    for qs in snapshot.queues:
        q_cfg = config.queues.get(qs.name)
        fallback = (
            q_cfg.autoscale.instance.max_price_per_hour if (q_cfg and q_cfg.autoscale) else dearest
        )
        for m in qs.machines:
            if m.state == InstanceState.STOPPED:  # its disk only
                dollars += m.storage_price_per_hour or 0.0
            elif m.state in LIVE_STATES:
                used += 1
                dollars += m.price_per_hour if m.price_per_hour is not None else fallback
    return used, dollars


def check_warm_pool(qs: QueueSnapshot, config: Config, qp) -> None:
    """Resumes come from the queue's own fitting stopped machines, the newest first, before
    anything new is rented; the pool never grows past its size; a busy worker is never sent
    to it (it is drained first, like any)."""
    auto = config.queues[qp.queue].autoscale
    size = auto.warm_pool.size
    key = spec_key(auto)
    by_id = {m.launch_id: m for m in qs.machines}

    def fits(m) -> bool:
        return m.provider in auto.providers and m.spec_key == key

    stopped = [m for m in qs.machines if m.state == InstanceState.STOPPED and fits(m)]
    resumed = [by_id[r.launch_id] for r in qp.resumes]
    assert len({m.launch_id for m in resumed}) == len(resumed)
    for m in resumed:
        assert size > 0 and m.state == InstanceState.STOPPED and fits(m), m
    if qp.launches and size > 0:  # nothing new while a fitting stopped machine waits
        assert len(resumed) == len(stopped), (len(resumed), len(stopped))
    newest = sorted(stopped, key=lambda m: (m.stopped_at or m.created_at, m.launch_id))[::-1]
    assert [m.launch_id for m in resumed] == [m.launch_id for m in newest[: len(resumed)]]

    warm = [d for d in qp.drains if d.keep_warm]
    for d in warm:
        m = by_id[d.launch_id]
        assert fits(m) and d.trigger != "drain_requested" and not m.keep_warm
        assert d.when_idle or m.running_tasks == 0  # a busy worker is never stopped
    held = sum(
        1
        for m in qs.machines
        if fits(m)
        and (
            m.state in WARM
            or (
                m.keep_warm
                and m.state in (InstanceState.READY, InstanceState.DRAINING, InstanceState.DRAINED)
            )
        )
    )
    if warm:
        assert held + len(warm) <= size, (held, len(warm), size)


def checked_decide(snapshot: Snapshot, config: Config, now) -> Plan:
    plan = decide(snapshot, config, now)
    check_plan(snapshot, config, plan)
    assert decide(snapshot, config, now) == plan  # pure: same inputs, same plan
    check_unknown_prices_at_a_full_dollar_cap(snapshot, config, now)
    return plan


def check_unknown_prices_at_a_full_dollar_cap(snapshot: Snapshot, config: Config, now) -> None:
    """With machines of unknown price billing, the same world under a dollar cap that those
    machines fill exactly (each counted at the most it may cost) must launch nothing.

    A policy that counted them at less (say $0, for a queue no longer configured) would see room
    for at least one more machine and launch it whenever a queue wants one: the random worlds of
    the property tests rarely sit right at a dollar cap, this puts every such world there.
    """
    unknown = any(
        m.state in LIVE_STATES and m.price_per_hour is None
        for qs in snapshot.queues
        for m in qs.machines
    )
    if not unknown:
        return
    _, dollars = billing_usage(snapshot, config)
    full = config.model_copy(
        update={"limits": Limits(max_machines=None, max_price_per_hour=dollars)}
    )
    plan = decide(snapshot, full, now)
    assert not plan.launches, (
        f"launched {[(a.queue, a.provider) for a in plan.launches]} with "
        f"limits.max_price_per_hour = {dollars} already billing (unknown prices at their cap)"
    )
    check_plan(snapshot, full, plan)
