"""The scale-down half of a queue's evaluation: the ordered scale-down methods
(SCALE_DOWN_METHODS), the operator's manual target, and the drain rules beside them. Pure."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from autoscaler.config.models import Config
from autoscaler.config.triggers import (
    LEARNED_MAX_FACTOR,
    IdleTrigger,
    QueueDepthTrigger,
    ScheduleDownTrigger,
)
from autoscaler.lifecycle import InstanceState
from autoscaler.policy import triggers as t
from autoscaler.policy.history import learned_idle_timeout
from autoscaler.policy.plan import Drain
from autoscaler.policy.queue_eval import QueueEval
from autoscaler.policy.snapshot import Machine, QueueSnapshot

SCHEDULE_DOWN_GRACE_POLLS = 2
"""A scale-down schedule is acted on during this many poll intervals after it fires, so one
late or lost tick does not skip a night's scale-down; acting twice is harmless (idempotent)."""

FLEET_IDLE_S = 120.0
"""Fleet-level scale-in: an idle machine above what the load wants goes after this long, not
after the idle timeout (one machine is always left to the timeout). 120 s: on the shipped and
generated traces it cut steady from $40.45 to $35.70 and long-short from $49.04 to $45.68
(p95 +30 s and +7 s), diurnal 1.40× → 1.28× the bound (`benchmarks/cost.py`)."""

_T = TypeVar("_T")


def scale_down(u: QueueEval, config: Config, now: datetime) -> list[Drain]:
    """The queue's scale-down: each method of SCALE_DOWN_METHODS in turn, within one budget
    (never below the floor; scheduled jobs about to fall due keep the last machine, which
    would be rented again at once), never a machine an earlier method chose."""
    for trig in u.auto.scale_down:
        if not any(isinstance(trig, m.kinds) for m in SCALE_DOWN_METHODS):
            raise TypeError(
                f"scale-down trigger {type(trig).__name__} has no method in SCALE_DOWN_METHODS"
            )
    budget = u.capacity - max(u.floor, 1 if u.keep_one else 0)
    if budget <= 0:
        return []
    drains: list[Drain] = []
    for method in SCALE_DOWN_METHODS:
        triggers = [tr for tr in u.auto.scale_down if isinstance(tr, method.kinds)]
        if triggers:
            chosen = frozenset(d.launch_id for d in drains)
            drains += method.drains(u, triggers, config, now, chosen, budget - len(drains))
    return drains


def _idle(
    u: QueueEval,
    idle_triggers: Sequence[Any],
    config: Config,
    now: datetime,
    chosen: frozenset[str],
    budget: int,
) -> list[Drain]:
    """Most idle first; several idle triggers act as the shortest timeout. Jobs waiting keep
    the machines they need (ceil(pending / target)): a machine that looks idle while work
    waits is about to take it (a worker still loading its models, or an agent whose last
    report predates its first job), and draining it would only rent another."""
    idle_budget = min(budget, _serving(u) - _needed_for_waiting(u))
    idle: dict[str, tuple[Machine, float, float, str]] = {}
    poll = u.settings.poll_interval
    for trig in idle_triggers:
        timeout, why = idle_timeout(trig, u.qs, config, poll)
        how = "learned " if why else ""
        for m, secs in t.idle_candidates(timeout, u.qs.machines, now):
            if m.launch_id in chosen:
                continue
            if m.launch_id not in idle or timeout < idle[m.launch_id][2]:
                idle[m.launch_id] = (m, secs, timeout, how)
    ordered = sorted(idle.values(), key=lambda x: (-x[1], x[0].launch_id))
    drains: list[Drain] = []
    for m, secs, timeout, how in within_share(u, ordered, idle_budget, lambda c: c[0], set(chosen)):
        drains.append(
            Drain(
                queue=u.name,
                launch_id=m.launch_id,
                trigger="idle",
                reason=(
                    f"idle: no task for {secs:.0f}s ≥ {how}timeout {timeout:.0f}s; capacity "
                    f"{u.capacity - len(drains)} > floor {u.floor}"
                ),
            )
        )
    return drains


def _schedule(
    u: QueueEval,
    schedules: Sequence[Any],
    config: Config,
    now: datetime,
    chosen: frozenset[str],
    budget: int,
) -> list[Drain]:
    """Back to the floor once a scale-down schedule fired: idle machines now, busy ones once
    they finish."""
    poll = u.settings.poll_interval
    taken = set(chosen)
    drains: list[Drain] = []
    for trig in schedules:
        fired = t.schedule_down_due(trig, SCHEDULE_DOWN_GRACE_POLLS * poll, now)
        if fired is None:
            continue
        eligible = [
            m
            for m in u.qs.machines
            if m.serving and m.launch_id not in taken and m.created_at <= fired
        ]
        eligible.sort(key=lambda m: (m.busy, m.running_tasks, m.idle_since(), m.launch_id))
        for m in eligible:
            if len(drains) >= budget:
                break
            drains.append(
                Drain(
                    queue=u.name,
                    launch_id=m.launch_id,
                    trigger="schedule",
                    when_idle=m.busy,
                    reason=(
                        f"schedule {trig.cron!r} ({trig.timezone}) fired {fired.isoformat()}: "
                        f"back to floor {u.floor} from capacity {u.capacity}; "
                        + (
                            f"busy with {m.running_tasks} task(s): drain once idle"
                            if m.busy
                            else "idle: drain now"
                        )
                    ),
                )
            )
            taken.add(m.launch_id)
    return drains


def outlived(u: QueueEval, chosen: set[str], now: datetime) -> list[Drain]:
    """Machines that served the queue's `max_lifetime`: drained now, busy or not (an honest
    worker finishes its job and leaves; reconcile destroys one still busy `drain_timeout`
    later), whatever the queue wants; it rents their replacements as it would any capacity."""
    limit = u.auto.max_lifetime
    if limit is None:
        return []
    out = []
    for m in u.qs.machines:
        if not m.serving or m.ready_at is None or m.launch_id in chosen:
            continue
        lived = (now - m.ready_at).total_seconds()
        if lived >= limit:
            out.append(
                Drain(
                    queue=u.name,
                    launch_id=m.launch_id,
                    trigger="max_lifetime",
                    reason=(
                        f"served {lived:.0f}s ≥ max_lifetime {limit:.0f}s: drained whatever it "
                        "says" + (f" (busy with {m.running_tasks} task(s))" if m.busy else "")
                    ),
                )
            )
    return out


def idle_timeout(
    trig: IdleTrigger, qs: QueueSnapshot, config: Config, poll: float
) -> tuple[float, str | None]:
    """The idle timeout in force: the configured one, or — while no job waits, once the queue
    has shown enough quiet gaps and `learn` is on — the one learned from them, plus a poll when
    it keeps the machine for a gap (a gap is seen to a poll), never above the configured ×
    LEARNED_MAX_FACTOR. A machine that jobs wait for (just ready, or between two jobs of a
    burst) is never judged by a learned timeout: a timeout of 0 would drain it and rent again.
    Returns (seconds, why it was learned or None for the configured one)."""
    if not trig.learn or not _nothing_waits(qs):
        return trig.timeout, None
    boot = qs.boot_estimate if qs.boot_estimate is not None else t.DEFAULT_BOOT_ESTIMATE
    learned = learned_idle_timeout(qs.history.quiet_gaps, boot, trig.timeout)
    if learned is None or learned[0] == trig.timeout:
        return trig.timeout, None
    margin = poll if learned[0] > 0 else 0.0
    timeout = min(learned[0] + margin, trig.timeout * LEARNED_MAX_FACTOR)
    return timeout, learned[1]


def _nothing_waits(qs: QueueSnapshot) -> bool:
    """Fresh numbers say no job waits: a learned timeout may judge the queue's idle machines."""
    m = qs.metrics
    return m is not None and not m.stale and m.pending == 0


def learned_notes(u: QueueEval, config: Config) -> list[str]:
    """What the status shows of a learned idle timeout in force (why, from how many gaps)."""
    poll = u.settings.poll_interval
    out = []
    for trig in u.auto.scale_down:
        if isinstance(trig, IdleTrigger):
            timeout, why = idle_timeout(trig, u.qs, config, poll)
            if why:
                out.append(f"idle timeout {timeout:.0f}s instead of {trig.timeout:.0f}s: {why}")
    return out


def _target_per_worker(u: QueueEval) -> int:
    """Jobs one machine is meant to carry: the largest `queue_depth.target_per_worker`, else 1."""
    target = 1
    for trig in u.auto.scale_up:
        if isinstance(trig, QueueDepthTrigger) and trig.target_per_worker:
            target = max(target, trig.target_per_worker)
    return target


def _serving(u: QueueEval) -> int:
    return sum(1 for m in u.qs.machines if m.serving)


def _needed_for_waiting(u: QueueEval) -> int:
    """Machines the jobs waiting now need, ceil(pending / target); 0 when none waits. Jobs
    handed to a worker while the read ran count too (`delivered_during_read`: possibly in no
    other number): the machine that just took them still looks idle until its worker reports
    them, and draining it sent them back for another machine (the worker image's e2e)."""
    m = u.qs.metrics
    waiting = (m.pending + m.delivered_during_read) if m is not None else 0
    return -(-max(0, waiting) // _target_per_worker(u))


def _fleet(
    u: QueueEval,
    idle_triggers: Sequence[Any],
    config: Config,
    now: datetime,
    chosen: frozenset[str],
    budget: int,
) -> list[Drain]:
    """Fleet-level scale-in: the load wants ceil((pending + running) / target) machines (at
    least one, kept for the idle timeout); serving machines above that which ran nothing for
    FLEET_IDLE_S go now, most idle first. Never a busy one, never below the floor (budget)."""
    if budget <= 0 or u.qs.metrics is None:
        return []
    shortest = min(tr.timeout for tr in idle_triggers)
    if shortest <= FLEET_IDLE_S:
        return []  # the idle timeout already acts sooner
    read = u.qs.metrics
    load = read.pending + read.started_or_held + read.delivered_during_read
    target = _target_per_worker(u)
    need = max(1, -(-load // target))
    serving = [m for m in u.qs.machines if m.serving and m.launch_id not in chosen]
    spare = sorted(
        (
            m
            for m in serving
            if not m.busy and (now - m.idle_since()).total_seconds() >= FLEET_IDLE_S
        ),
        key=lambda m: (m.idle_since(), m.launch_id),
    )
    out = []
    room = max(0, min(budget, len(serving) - need))
    for m in within_share(u, spare, room, lambda c: c, chosen):
        secs = (now - m.idle_since()).total_seconds()
        out.append(
            Drain(
                queue=u.name,
                launch_id=m.launch_id,
                trigger="idle",
                reason=(
                    f"fleet: no task for {secs:.0f}s ≥ {FLEET_IDLE_S:.0f}s and {len(serving)} "
                    f"serving > {need} the load of {load} wants (target {target}/worker)"
                ),
            )
        )
    return out


def manual_down(u: QueueEval) -> list[Drain]:
    """Down to the operator's target: idle machines now (most idle first), busy ones once idle.

    Metrics are not needed: the operator asked. Busy machines are still never drained now."""
    budget = u.capacity - u.floor
    serving = sorted(
        (m for m in u.qs.machines if m.serving),
        key=lambda m: (m.busy, m.running_tasks, m.idle_since(), m.launch_id),
    )
    return [
        Drain(
            queue=u.name,
            launch_id=m.launch_id,
            trigger="manual",
            when_idle=m.busy,
            reason=(
                f"manual target {u.floor}: capacity {u.capacity}; "
                + (
                    f"busy with {m.running_tasks} task(s): drain once idle"
                    if m.busy
                    else "idle: drain now"
                )
            ),
        )
        for m in serving[: max(0, budget)]
    ]


def complete_requested(u: QueueEval, already: set[str]) -> list[Drain]:
    return [
        Drain(
            queue=u.name,
            launch_id=m.launch_id,
            trigger="drain_requested",
            reason="drain was requested while busy; the worker is idle now",
        )
        for m in u.qs.machines
        if m.state == InstanceState.READY
        and m.drain_requested
        and not m.busy
        and m.launch_id not in already
    ]


def within_share(
    u: QueueEval,
    ordered: list[_T],
    budget: int,
    machine: Callable[[_T], Machine],
    gone: Collection[str],
) -> list[_T]:
    """Of the drain candidates (in the order they would go), those to drain so that a shrinking
    fleet stays within the queue's `max_share` of interruptible machines: whenever draining a
    machine on demand next would leave too many interruptible ones, the next interruptible
    candidate goes instead, and with none the machines on demand are kept (the share is a
    promise: an idle machine costs less than work lost to preemptions the user did not
    accept). `gone`: machines this plan drains already. Without `interruptible`: unchanged."""
    spec = u.auto.instance.interruptible
    if spec is None:
        return ordered[: max(0, budget)]
    fleet = [m for m in u.qs.machines if (m.serving or m.booting) and m.launch_id not in gone]
    n, k = len(fleet), sum(1 for m in fleet if m.interruptible)
    left = list(ordered)
    out: list[_T] = []
    while left and len(out) < budget:
        over = k > math.floor(spec.max_share * (n - 1) + 1e-9)
        pick = next((c for c in left if machine(c).interruptible), None) if over else left[0]
        if pick is None:
            break
        left.remove(pick)
        out.append(pick)
        n, k = n - 1, k - (1 if machine(pick).interruptible else 0)
    return out


class DownMethod(NamedTuple):
    """One way a queue scales down: the config trigger kinds that switch it on, and the drains
    it chooses given the machines earlier methods chose and the budget they left."""

    name: str
    kinds: tuple[type, ...]
    drains: Callable[[QueueEval, Sequence[Any], Config, datetime, frozenset[str], int], list[Drain]]


SCALE_DOWN_METHODS: tuple[DownMethod, ...] = (
    DownMethod("idle", (IdleTrigger,), _idle),
    DownMethod("fleet", (IdleTrigger,), _fleet),
    DownMethod("schedule", (ScheduleDownTrigger,), _schedule),
)
"""The scale-down methods in the order they choose, as Karpenter orders its disruption
methods: idle machines past their timeout (most idle first), then the fleet's idle machines
above what the load wants, then a due schedule back to the floor. An operator's manual target
replaces them all (`manual_down`); finishing a requested drain and `max_lifetime` are drain
rules beside them, not scale-down. Every member of `config.models.ScaleDownTrigger` switches
on a method here, or `tests/policy/test_scale_down.py` fails, and a trigger of a kind no
method takes is refused loudly, never skipped."""
