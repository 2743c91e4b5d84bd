"""Each trigger as a small pure function over one queue's view.

Scale-up triggers return an `UpVote`: the capacity they want (absolute) and why. Two styles:
- "+1" triggers (no_workers, queue_depth.threshold, latency, metric.threshold) ask for one more
  machine than the queue has; while any machine of the queue is still booting they are *held*
  (no stacking: the booting machine is the answer to this load);
- "target" triggers (queue_depth.target_per_worker, metric.target_per_worker) ask for
  ceil(load / target) machines; booting machines already count as capacity, so a launch only
  happens when the load grew past what is already on its way.
Scale-down triggers pick machines; `decide()` applies the floor and the other guards.

The load is due pending jobs plus the jobs handed to workers (`QueueMetrics.started_or_held`:
the workers' running + prefetched report, or the broker's unacked count where that is larger
or no worker reported). Jobs scheduled for later are not load; `no_workers` pre-warms one
machine for them a boot time (`TriggerInputs.lead`) before the first falls due. A queue its source
paused (asynq) has no pending load: nobody would serve it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from autoscaler.config.durations import format_duration
from autoscaler.config.triggers import (
    LatencyTrigger,
    MetricTrigger,
    NoWorkersTrigger,
    QueueDepthTrigger,
    ScheduleDownTrigger,
    ScheduleUpTrigger,
)
from autoscaler.lifecycle import InstanceState
from autoscaler.policy.schedule import firing_due, window_active
from autoscaler.policy.snapshot import Machine, QueueMetrics

DEFAULT_BOOT_ESTIMATE = 300.0
"""Seconds a machine is assumed to take from decision to ready when none of its queue has booted
yet (capped by the queue's boot timeout): how early scheduled jobs are pre-warmed."""


@dataclass(frozen=True)
class TriggerInputs:
    """Derived numbers of one queue at `now`, shared by every trigger.

    `lead` is how long before a scheduled job falls due a machine must be asked for so that it
    is ready in time (the queue's recent boot time)."""

    metrics: QueueMetrics
    machines: tuple[Machine, ...]
    serving: int
    booting: int
    manual: int
    leaving_running: int
    now: float = 0.0
    lead: float = DEFAULT_BOOT_ESTIMATE

    @property
    def capacity(self) -> int:
        return self.serving + self.booting + self.manual

    @property
    def pending(self) -> int:
        """Due jobs waiting for a worker; none on a queue its source has paused (nobody would
        serve them, so no machine is rented for them)."""
        return 0 if self.metrics.paused else self.metrics.pending

    @property
    def load(self) -> int:
        """Jobs that need a worker: due pending jobs plus those handed to workers (running or
        prefetched, `QueueMetrics.started_or_held`) on capacity that stays.

        Jobs finishing on machines already asked to leave are not counted: they need no new
        machine (otherwise a night-time drain of busy workers would launch replacements).
        Jobs scheduled for later are not load until they fall due."""
        return self.pending + max(0, self.metrics.started_or_held - self.leaving_running)

    @property
    def due_soon(self) -> float | None:
        """The earliest due time (epoch s) of scheduled jobs if it falls within `lead` of now."""
        m = self.metrics
        if m.paused or m.scheduled <= 0 or m.next_due_at is None:
            return None
        return m.next_due_at if m.next_due_at - self.lead <= self.now else None

    def have(self) -> str:
        return (
            f"have {self.capacity} ({self.serving} ready, {self.booting} booting, "
            f"{self.manual} hand-made)"
        )


def make_view(
    metrics: QueueMetrics,
    machines: tuple[Machine, ...],
    manual: int,
    now: datetime | None = None,
    lead: float = DEFAULT_BOOT_ESTIMATE,
) -> TriggerInputs:
    return TriggerInputs(
        metrics=metrics,
        machines=machines,
        serving=sum(1 for m in machines if m.serving),
        booting=sum(1 for m in machines if m.booting),
        manual=max(0, manual),
        leaving_running=sum(
            m.running_tasks for m in machines if m.billing and not m.serving and not m.booting
        ),
        now=now.timestamp() if now is not None else metrics.read_at.timestamp(),
        lead=max(0.0, lead),
    )


@dataclass(frozen=True)
class UpVote:
    trigger: str
    fired: bool
    wants: int
    reason: str
    held: bool = False


def _plus_one(trigger: str, view: TriggerInputs, why: str) -> UpVote:
    if view.booting > 0:
        return UpVote(
            trigger,
            True,
            view.capacity,
            f"{trigger}: {why}, but {view.booting} machine(s) still booting: "
            "adding nothing more for the same load (no stacking)",
            held=True,
        )
    return UpVote(
        trigger, True, view.capacity + 1, f"{trigger}: {why} → one more machine, {view.have()}"
    )


def _quiet(trigger: str, why: str) -> UpVote:
    return UpVote(trigger, False, 0, f"{trigger}: {why}")


def no_workers(_: NoWorkersTrigger, view: TriggerInputs) -> UpVote:
    pending = view.pending
    if pending > 0 and view.capacity == 0:
        return UpVote(
            "no_workers",
            True,
            1,
            f"no_workers: {pending} pending and no live, booting or hand-made worker → one machine",
        )
    due = view.due_soon
    if due is not None and view.capacity == 0:
        left = due - view.now
        when = f"in {left:.0f}s" if left > 0 else f"{-left:.0f}s ago"
        return UpVote(
            "no_workers",
            True,
            1,
            f"no_workers: {view.metrics.scheduled} scheduled job(s), the first due {when}, "
            f"within the {view.lead:.0f}s a machine takes to boot, and no live, booting or "
            "hand-made worker → one machine now so that it is ready when they fall due",
        )
    paused = " (queue paused at its source: not served)" if view.metrics.paused else ""
    later = f", {view.metrics.scheduled} scheduled for later" if view.metrics.scheduled else ""
    return _quiet("no_workers", f"{pending} pending{later}{paused}, capacity {view.capacity}")


def queue_depth(trig: QueueDepthTrigger, view: TriggerInputs) -> UpVote:
    pending = view.pending
    if trig.target_per_worker is not None:
        target = trig.target_per_worker
        wants = math.ceil(view.load / target)
        text = (
            f"{pending} pending + {view.load - pending} running or prefetched = {view.load} "
            f"jobs at {target}/worker → want {wants}"
        )
        if wants > view.capacity:
            return UpVote("queue_depth", True, wants, f"queue_depth: {text}, {view.have()}")
        return _quiet("queue_depth", f"{text}, {view.have()}")
    assert trig.threshold is not None
    if pending > trig.threshold:
        return _plus_one("queue_depth", view, f"{pending} pending > threshold {trig.threshold}")
    return _quiet("queue_depth", f"{pending} pending ≤ threshold {trig.threshold}")


def latency(trig: LatencyTrigger, view: TriggerInputs) -> UpVote:
    age = view.metrics.oldest_pending_age if view.pending > 0 else None
    limit = format_duration(trig.max_latency)
    if age is not None and age > trig.max_latency:
        return _plus_one("latency", view, f"oldest pending job waited {age:.0f}s > {limit}")
    shown = "none pending" if age is None else f"oldest pending {age:.0f}s"
    return _quiet("latency", f"{shown} ≤ {limit}")


def metric(trig: MetricTrigger, view: TriggerInputs) -> UpVote:
    values = dict(view.metrics.external)
    value = values.get(trig.query)
    if value is None or not math.isfinite(value):
        return _quiet("metric", f"no value for {trig.query!r}: no opinion")
    if trig.target_per_worker is not None:
        wants = math.ceil(value / trig.target_per_worker) if value > 0 else 0
        text = f"{trig.query!r} = {value:g} at {trig.target_per_worker:g}/worker → want {wants}"
        if wants > view.capacity:
            return UpVote("metric", True, wants, f"metric: {text}, {view.have()}")
        return _quiet("metric", f"{text}, {view.have()}")
    assert trig.threshold is not None
    if value > trig.threshold:
        return _plus_one("metric", view, f"{trig.query!r} = {value:g} > {trig.threshold:g}")
    return _quiet("metric", f"{trig.query!r} = {value:g} ≤ {trig.threshold:g}")


def schedule_floor(trig: ScheduleUpTrigger, now: datetime) -> tuple[int, str | None]:
    """(workers, reason) while a firing's window is open, else (0, None)."""
    fired = window_active(trig.cron, trig.timezone, trig.duration, now)
    if fired is None:
        return 0, None
    ends = fired.timestamp() + trig.duration
    left = ends - now.timestamp()
    return trig.workers, (
        f"schedule {trig.cron!r} ({trig.timezone}) fired {fired.isoformat()}: floor of "
        f"{trig.workers} for {format_duration(trig.duration)} ({left:.0f}s left)"
    )


def idle_candidates(
    timeout: float, machines: tuple[Machine, ...], now: datetime
) -> list[tuple[Machine, float]]:
    """Ready, not busy, not already leaving, idle for at least `timeout`: (machine, idle s)."""
    out = []
    for m in machines:
        if m.state != InstanceState.READY or m.drain_requested or m.busy:
            continue
        idle = (now - m.idle_since()).total_seconds()
        if idle >= timeout:
            out.append((m, idle))
    return out


def schedule_down_due(trig: ScheduleDownTrigger, grace: float, now: datetime) -> datetime | None:
    """The firing of a scale-down schedule still to be acted on at `now`, if any."""
    return firing_due(trig.cron, trig.timezone, grace, now)
