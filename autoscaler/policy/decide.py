"""decide(snapshot, config, now) -> Plan: the whole scaling decision as one pure function.

Per queue, in this order:
1. capacity = ready machines not asked to leave + machines still booting + hand-made workers;
   floor = max(min_workers, every open schedule window), never above max_workers.
2. Metrics fresh: every scale-up trigger votes (see triggers.py); desired = max(floor, votes),
   clamped to max_workers; machines asked to drain once idle are reclaimed first (already paid
   for), then launches = desired - capacity - reclaims, never more than max_workers minus every
   machine of the queue that may still bill (draining ones included). Metrics stale or missing:
   only the floor may launch, and nothing is scaled down (missing data never scales to zero).
3. A (queue, provider) in backoff, or a provider that rate-limited the account (a 429 whose
   reset is still ahead, `Snapshot.rate_limits`), launches nothing and the plan says until when.
4. Spend caps (config.limits) grant the remaining launches across queues by priority.
5. Scale-down only when no scale-up trigger fired, nothing is launched for the queue and every
   `metric` trigger has a current value (a failing Prometheus blocks scale-down, not scale-up):
   the methods of `scale_down.SCALE_DOWN_METHODS` in order (idle, fleet, schedule), never below
   the floor, never a machine with a running task (busy ones only get `when_idle=True`, and
   only from the schedule), never the last one while jobs scheduled for later fall due within
   a boot time. Machines already asked to drain that are now idle are
   drained (completing an earlier decision, not a new scale-down).

Jobs scheduled for later (`QueueMetrics.scheduled`) are no load; `no_workers` asks for one
machine for an empty queue one boot time (`QueueSnapshot.boot_estimate`, else
`triggers.DEFAULT_BOOT_ESTIMATE`, never above the boot timeout) before the first falls due.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from autoscaler.config.models import Autoscale, Config, QueueSettings
from autoscaler.config.triggers import (
    LatencyTrigger,
    MetricTrigger,
    NoWorkersTrigger,
    QueueDepthTrigger,
    ScheduleUpTrigger,
)
from autoscaler.lifecycle import InstanceState
from autoscaler.policy import triggers as t
from autoscaler.policy import warm
from autoscaler.policy.caps import LaunchGrant, Request, allocate, usage
from autoscaler.policy.hedge import hedge_reason, lead
from autoscaler.policy.history import burst_limit
from autoscaler.policy.plan import (
    Drain,
    Launch,
    Plan,
    QueuePlan,
    Reclaim,
    Resume,
    Wait,
    WaitKind,
)
from autoscaler.policy.queue_eval import QueueEval, provider_holds
from autoscaler.policy.scale_down import (
    complete_requested,
    learned_notes,
    manual_down,
    outlived,
    scale_down,
)
from autoscaler.policy.snapshot import Machine, ManualTarget, QueueSnapshot, Snapshot

FLOOR_TRIGGERS = ("hedge", "schedule", "min_workers")
"""Launches the burst rule leaves alone: a hedge and the floor are not asked by the load."""


def decide(
    snapshot: Snapshot, config: Config, now: datetime, only: Collection[str] | None = None
) -> Plan:
    """The plan for every autoscaled queue of `config` at `now` (aware), or for the queues in
    `only` (one shard's: the others' machines still count toward the caps through the
    snapshot). Pure: no I/O, no clock."""
    if now.tzinfo is None:
        raise ValueError("decide() needs an aware datetime for now (UTC)")
    ups: list[QueueEval] = []
    plan_notes: list[str] = []
    names = sorted(config.queues) if only is None else sorted(set(only) & set(config.queues))
    for name in names:
        auto = config.queues[name].autoscale
        if auto is None or not auto.enabled:
            plan_notes.append(f"{name}: autoscaling disabled, nothing decided")
            continue
        qs = snapshot.queue(name) or QueueSnapshot(name=name, metrics=None)
        up = _scale_up(name, auto, qs, config, now)
        holds = provider_holds(auto, qs, snapshot, now)
        if holds:
            limited = {h.provider for h in holds if h.kind != "backoff"}
            resumable = tuple(m for m in up.resumable if m.provider not in limited)
            up = replace(up, holds=holds, resumable=resumable)
        ups.append(up)

    grants = _grants(ups, snapshot, config)
    queues = tuple(_finish(u, grants.get(u.name), config, now) for u in ups)
    return Plan(at=now, queues=queues, notes=tuple(plan_notes))


# --------------------------------------------------------------------------- scale up


def _floor(auto: Autoscale, now: datetime) -> tuple[int, str]:
    floor, why = auto.min_workers, f"min_workers {auto.min_workers}"
    for trig in auto.scale_up:
        if isinstance(trig, ScheduleUpTrigger):
            workers, reason = t.schedule_floor(trig, now)
            if reason is not None and workers > floor:
                floor, why = workers, reason
    return min(floor, auto.max_workers), why


UP_VOTES: dict[type, Callable[[Any, t.TriggerInputs], t.UpVote | None]] = {
    NoWorkersTrigger: t.no_workers,
    QueueDepthTrigger: t.queue_depth,
    LatencyTrigger: t.latency,
    MetricTrigger: t.metric,
}
"""Each scale-up trigger kind's vote, by its options model: the one registration of a kind.
Every member of `config.triggers.ScaleUpTrigger` is here or in FLOOR_ONLY, or
`tests/policy/test_triggers.py` fails (before, a kind missing from an `isinstance` chain
silently never voted)."""

FLOOR_ONLY: frozenset[type] = frozenset({ScheduleUpTrigger})
"""Scale-up triggers that set a floor (`_floor`) and cast no vote."""


def _vote(trig: object, view: t.TriggerInputs) -> t.UpVote | None:
    vote = UP_VOTES.get(type(trig))
    if vote is None:
        if type(trig) not in FLOOR_ONLY:
            raise TypeError(f"scale-up trigger {type(trig).__name__} has no vote in UP_VOTES")
        return None
    return vote(trig, view)


@dataclass(frozen=True)
class _Floor:
    """The fewest machines the queue keeps now, why, and the manual target that set it."""

    workers: int
    why: str
    manual: ManualTarget | None


@dataclass(frozen=True)
class _Ask:
    """What the floor and the strongest fired trigger ask for, before reclaims and limits."""

    trigger: str
    reason: str
    raw: int
    """Machines asked for, before max_workers."""
    desired: int
    wanted: int
    """Machines more than the capacity."""


def _scale_up(
    name: str, auto: Autoscale, qs: QueueSnapshot, config: Config, now: datetime
) -> QueueEval:
    """One queue's scale-up half: the floor, the triggers' votes, a hedge, then what may be
    rented (machines leaving taken back first, the burst rule, max_workers)."""
    settings = config.queue_settings(name)
    capacity = _capacity(qs)
    floor = _effective_floor(auto, qs, now)
    fresh = qs.metrics is not None and not qs.metrics.stale
    votes, vote_notes, keep_one = _evaluate(auto, qs, settings, floor.manual, now)
    fired = [v for v in votes if v.fired]
    asked = _ask(auto, floor, fired, capacity)
    hedge = None if floor.manual is not None or not fresh else hedge_reason(settings, qs, now)
    hedged = _hedged(asked, hedge, capacity, auto.max_workers)
    ask = hedged or asked
    waits = _over_ceiling(name, ask, capacity, auto.max_workers)
    reclaims = _reclaims(qs.machines, ask.wanted)
    wanted, burst_note = _burst_cap(ask, qs, fresh, floor, capacity, len(reclaims))
    wanted, full = _headroom_cap(name, ask.trigger, wanted, qs.machines, auto.max_workers)
    notes = [f"floor {floor.workers} ({floor.why})", *vote_notes]
    notes += [hedged.reason] if hedged is not None else []
    notes += [burst_note] if burst_note is not None else []
    return QueueEval(
        name=name,
        auto=auto,
        settings=settings,
        qs=qs,
        capacity=capacity,
        floor=floor.workers,
        # nothing asks for more: capacity, and scale-down may lower it below
        desired=capacity if not fired and floor.workers <= capacity else ask.desired,
        reclaims=reclaims,
        wanted=wanted,
        trigger=ask.trigger,
        reason=ask.reason,
        up_fired=bool(fired) or (hedge is not None and ask.trigger == "hedge"),
        fresh=fresh,
        degraded=_degraded(auto, qs),
        notes=tuple(notes),
        waits=(*waits, *full),
        manual=floor.manual,
        keep_one=keep_one,
        resumable=tuple(warm.resumable(qs.machines, auto, config)) if wanted > 0 else (),
    )


def _capacity(qs: QueueSnapshot) -> int:
    """Ready machines not asked to leave, booting ones and hand-made workers."""
    serving = sum(1 for m in qs.machines if m.serving)
    booting = sum(1 for m in qs.machines if m.booting)
    return serving + booting + max(0, qs.manual_workers)


def _effective_floor(auto: Autoscale, qs: QueueSnapshot, now: datetime) -> _Floor:
    """The schedule's floor, unless an active manual target sets it (within max_workers)."""
    manual = qs.manual_target if qs.manual_target and qs.manual_target.active(now) else None
    if manual is None:
        return _Floor(*_floor(auto, now), manual=None)
    return _Floor(
        min(max(0, manual.workers), auto.max_workers),
        f"manual target {manual.workers} set by {manual.set_by or 'an operator'} until "
        f"{manual.until.isoformat()}",
        manual,
    )


def _degraded(auto: Autoscale, qs: QueueSnapshot) -> tuple[str, ...]:
    """The `metric` triggers' queries that failed or went unread (they block scale-down)."""
    if qs.metrics is None:
        return ()
    have = {query for query, _ in qs.metrics.external}
    return tuple(
        trig.query
        for trig in auto.scale_up
        if isinstance(trig, MetricTrigger)
        and (trig.query in qs.metrics.external_degraded or trig.query not in have)
    )


def _evaluate(
    auto: Autoscale,
    qs: QueueSnapshot,
    settings: QueueSettings,
    manual: ManualTarget | None,
    now: datetime,
) -> tuple[list[t.UpVote], list[str], bool]:
    """The load triggers' votes and the notes saying why (none without fresh numbers or under
    a manual target); keep_one when scheduled jobs fall due within a boot."""
    if manual is not None:
        return [], ["manual target: load triggers and idle timeouts are not evaluated"], False
    if qs.metrics is None:
        return [], ["no metrics read yet: load triggers not evaluated, no scale-down"], False
    if qs.metrics.stale:
        return (
            [],
            [
                f"metrics stale ({qs.metrics.error or 'source failing'}): load triggers not "
                "evaluated, no scale-down"
            ],
            False,
        )
    view = t.make_view(qs.metrics, qs.machines, qs.manual_workers, now, lead(settings, qs))
    votes = [vote for vote in (_vote(trig, view) for trig in auto.scale_up) if vote is not None]
    notes = [vote.reason for vote in votes]
    if view.due_soon is None:
        return votes, notes, False
    notes.append(
        f"{qs.metrics.scheduled} scheduled job(s) fall due within the {view.lead:.0f}s a "
        "machine takes to boot: the last machine is kept for them"
    )
    return votes, notes, True


def _ask(auto: Autoscale, floor: _Floor, fired: list[t.UpVote], capacity: int) -> _Ask:
    """The strongest fired trigger against the floor: how many machines, and who asks."""
    best = max(fired, key=lambda v: v.wants, default=None)
    raw = max(floor.workers, best.wants if best is not None else 0)
    desired = min(raw, auto.max_workers)
    wanted = max(0, desired - capacity)
    if best is not None and best.wants >= floor.workers:
        return _Ask(best.trigger, best.reason, raw, desired, wanted)
    if floor.manual is not None:
        return _Ask("manual", f"{floor.why}, {capacity} serving or booting", raw, desired, wanted)
    trigger = "schedule" if floor.workers > auto.min_workers else "min_workers"
    return _Ask(trigger, f"floor: {floor.why}, {capacity} serving or booting", raw, desired, wanted)


def _hedged(ask: _Ask, hedge: str | None, capacity: int, ceiling: int) -> _Ask | None:
    """One machine more for late boots when nothing else is asked (see HEDGE_LATE_FACTOR);
    None when no hedge applies."""
    if hedge is None or ask.wanted != 0 or capacity >= ceiling:
        return None
    desired = max(ask.desired, min(capacity + 1, ceiling))
    return replace(ask, trigger="hedge", reason=hedge, wanted=1, desired=desired)


def _over_ceiling(name: str, ask: _Ask, capacity: int, ceiling: int) -> list[Wait]:
    """The machines asked for above max_workers, as a wait the plan reports."""
    if not (ask.raw > ceiling and ask.raw > capacity):
        return []
    return [
        Wait(
            queue=name,
            kind="max_workers",
            machines=ask.raw - max(capacity, ceiling),
            reason=f"{ask.trigger} asks for {ask.raw} but max_workers is {ceiling} "
            "(booting included)",
        )
    ]


def _reclaims(machines: tuple[Machine, ...], wanted: int) -> tuple[Machine, ...]:
    """Machines asked to drain once idle, taken back before anything new is rented: they are
    booted and paid for already. Idle ones first: they can take a job at once."""
    leaving = sorted(
        (m for m in machines if m.state == InstanceState.READY and m.drain_requested),
        key=lambda m: (m.busy, m.launch_id),
    )
    return tuple(leaving[:wanted])


def _burst_cap(
    ask: _Ask, qs: QueueSnapshot, fresh: bool, floor: _Floor, capacity: int, reclaimed: int
) -> tuple[int, str | None]:
    """The launches still wanted after the reclaims, held to the burst rule when the load asks
    them (never below the floor); the note saying so, if it held them."""
    wanted = ask.wanted - reclaimed
    if wanted <= 0 or not fresh or floor.manual is not None or ask.trigger in FLOOR_TRIGGERS:
        return wanted, None
    limit = _burst(qs, qs.machines)
    if limit is None or limit[0] >= wanted:
        return wanted, None
    return max(limit[0], floor.workers - capacity - reclaimed), limit[1]


def _headroom_cap(
    name: str, trigger: str, wanted: int, machines: tuple[Machine, ...], ceiling: int
) -> tuple[int, list[Wait]]:
    """Launches within max_workers, counting every machine of the queue that may bill (leaving
    ones too; a warm pool's stopped ones are not machines it runs); the wait for the rest."""
    billing = sum(1 for m in machines if m.billing and not m.warm)
    headroom = max(0, ceiling - billing)
    if wanted <= headroom:
        return wanted, []
    return headroom, [
        Wait(
            queue=name,
            kind="max_workers",
            machines=wanted - headroom,
            reason=(
                f"{trigger} wants {wanted} more but {billing} machine(s) of this queue may "
                f"still be billing (draining and terminating ones included); max_workers is "
                f"{ceiling}"
            ),
        )
    ]


def _burst(qs: QueueSnapshot, machines: tuple[Machine, ...]) -> tuple[int, str] | None:
    """The burst rule (`policy.history.burst_limit`) for the queue's numbers now."""
    m = qs.metrics
    if m is None or qs.history.job_seconds is None:
        return None
    boot = qs.boot_estimate if qs.boot_estimate is not None else t.DEFAULT_BOOT_ESTIMATE
    booting = [(m.read_at - x.created_at).total_seconds() for x in machines if x.booting]
    return burst_limit(
        0 if m.paused else m.pending,
        m.oldest_pending_age,
        sum(1 for x in machines if x.serving) + max(0, qs.manual_workers),
        booting,
        qs.history.job_seconds,
        qs.history.jobs_seen,
        boot,
    )


def _grants(ups: list[QueueEval], snapshot: Snapshot, config: Config) -> dict[str, LaunchGrant]:
    limits = config.limits
    if limits.max_machines is None and limits.max_price_per_hour is None:
        return {}
    requests = [
        Request(u.name, u.auto.priority, asked, u.auto.instance.max_price_per_hour)
        for u in ups
        if (asked := _unheld(u)) > 0
    ]
    used_machines, used_dollars = usage(snapshot, config)
    return allocate(requests, limits, used_machines, used_dollars)


def _interruptible_launches(u: QueueEval, fresh: int) -> int:
    """How many of `fresh` new machines are rented at the bid: the queue's machines (serving
    and booting) plus these stay at most `max_share` interruptible, counted down; the rest on
    demand. A preempted machine is no capacity (it leaves at once), so its replacement may be
    interruptible again only while the share allows."""
    spec = u.auto.instance.interruptible
    if spec is None or fresh <= 0:
        return 0
    fleet = [m for m in u.qs.machines if m.serving or m.booting]
    already = sum(1 for m in fleet if m.interruptible)
    allowed = math.floor(spec.max_share * (len(fleet) + fresh) + 1e-9)
    return max(0, min(fresh, allowed - already))


def _unheld(u: QueueEval) -> int:
    """Machines the queue may get now before the caps: all while one of its providers may be
    called; when every one waits, only its resumes (a resume rents nothing; `resumable` holds
    none on a provider under a rate limit)."""
    if u.open_providers:
        return u.wanted
    return min(u.wanted, len(u.resumable))


# --------------------------------------------------------------------------- finish


def _provider_hold(u: QueueEval) -> tuple[WaitKind, datetime, str] | None:
    """Why the queue rents nothing now, if so: every provider it lists waits. The wait ends
    when the first of them may be called again; a hold (a rate limit, no answer) is named as
    the kind only when every provider is held for that one cause, else it is a backoff."""
    if u.open_providers or not u.holds:
        return None
    kinds = {h.kind for h in u.holds}
    kind: WaitKind = kinds.pop() if len(kinds) == 1 else "backoff"
    until = min(h.until for h in u.holds)
    if len(u.holds) == 1:
        return kind, until, u.holds[0].why
    return kind, until, "every provider waits: " + "; ".join(h.why for h in u.holds)


def _finish(u: QueueEval, grant: LaunchGrant | None, config: Config, now: datetime) -> QueuePlan:
    waits = list(u.waits)
    notes = list(u.notes)
    count = u.wanted
    hold = _provider_hold(u)
    open_providers = u.open_providers
    if count > 0 and open_providers and u.holds:
        notes.append(
            "; ".join(h.why for h in u.holds) + f"; renting from {', '.join(open_providers)}"
        )
    if count > 0 and hold is not None:
        kind, until, why = hold
        held = count - _unheld(u)
        if held > 0:
            waits.append(
                Wait(
                    queue=u.name,
                    kind=kind,
                    machines=held,
                    until=until,
                    reason=f"{why}; {held} machine(s) wait",
                )
            )
        count -= held
    if count > 0 and grant is not None:
        if grant.reason is not None:
            waits.append(
                Wait(queue=u.name, kind="spend_cap", machines=grant.waiting, reason=grant.reason)
            )
        count = grant.granted

    resumes = tuple(
        Resume(
            queue=u.name,
            launch_id=m.launch_id,
            reason=f"{u.reason}: resume {m.launch_id} from the warm pool (stopped "
            + (f"since {m.stopped_at.isoformat()}" if m.stopped_at else "")
            + ") instead of renting a new machine",
        )
        for m in u.resumable[:count]
    )
    fresh = count - len(resumes)
    bids = _interruptible_launches(u, fresh)
    launches = tuple(
        Launch(
            queue=u.name,
            provider=open_providers[0],
            fallbacks=open_providers[1:],
            trigger=u.trigger,
            index=i + 1,
            reason=(u.reason if fresh == 1 else f"{u.reason} (machine {i + 1} of {fresh})")
            + (" at the queue's bid (interruptible)" if i < bids else ""),
            interruptible=i < bids,
        )
        for i in range(fresh)
    )

    reclaims = tuple(
        Reclaim(
            queue=u.name,
            launch_id=m.launch_id,
            reason=f"{u.reason}: take back {m.launch_id} (asked to drain once idle, "
            + ("busy" if m.busy else "idle")
            + ") instead of renting a new machine",
        )
        for m in u.reclaims
    )
    drains: list[Drain] = []
    desired = u.desired
    if u.manual is not None:
        if not (launches or reclaims or resumes):
            drains = manual_down(u)
            desired = u.capacity - len(drains)
    elif launches or reclaims or resumes:
        notes.append("scaled up: no scale-down in the same evaluation")
    elif u.up_fired:
        notes.append("a scale-up trigger fired: no scale-down in this evaluation")
    elif not u.fresh:
        pass  # already noted: stale or missing metrics never scale down
    elif u.degraded:
        notes.append(
            f"no scale-down: metric value(s) {', '.join(map(repr, u.degraded))} missing or only "
            "last-known"
        )
    else:
        drains = scale_down(u, config, now)
        notes.extend(learned_notes(u, config))
        desired = u.capacity - len(drains)
    # While the queue asks for more, keep machines asked to leave: it may take them back.
    if not (u.up_fired or launches or reclaims or resumes):
        drains.extend(complete_requested(u, {d.launch_id for d in drains}))
    drains.extend(outlived(u, {d.launch_id for d in drains}, now))
    drains = warm.keep_warm(drains, u.qs.machines, u.auto, config)

    return QueuePlan(
        queue=u.name,
        capacity=u.capacity,
        floor=u.floor,
        ceiling=u.auto.max_workers,
        desired=desired,
        up_fired=u.up_fired,
        launches=launches,
        reclaims=reclaims,
        drains=tuple(drains),
        waits=tuple(waits),
        notes=tuple(notes),
        resumes=resumes,
    )
