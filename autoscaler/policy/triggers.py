"""Each trigger as a small pure function over one queue's view.

Scale-up triggers return an `UpVote`: the capacity they want (absolute) and why. Two styles:
- "+1" triggers (no_workers, queue_depth.threshold, latency, metric.threshold) ask for one more
  machine than the queue has; while any machine of the queue is still booting they are *held*
  (no stacking: the booting machine is the answer to this load);
- "target" triggers (queue_depth.target_per_worker, metric.target_per_worker) ask for
  ceil(load / target) machines; booting machines already count as capacity, so a launch only
  happens when the load grew past what is already on its way.
Scale-down triggers pick machines; `decide()` applies the floor and the other guards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from autoscaler.config.durations import format_duration
from autoscaler.config.models import (
    IdleTrigger,
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


@dataclass(frozen=True)
class QueueView:
    """Derived numbers of one queue at `now`, shared by every trigger."""

    metrics: QueueMetrics
    machines: tuple[Machine, ...]
    serving: int
    booting: int
    manual: int
    leaving_running: int

    @property
    def capacity(self) -> int:
        return self.serving + self.booting + self.manual

    @property
    def load(self) -> int:
        """Jobs that need a worker: pending plus those running on capacity that stays.

        Jobs finishing on machines already asked to leave are not counted: they need no new
        machine (otherwise a night-time drain of busy workers would launch replacements)."""
        return self.metrics.pending + max(0, self.metrics.in_flight - self.leaving_running)

    def have(self) -> str:
        return (
            f"have {self.capacity} ({self.serving} ready, {self.booting} booting, "
            f"{self.manual} hand-made)"
        )


def make_view(metrics: QueueMetrics, machines: tuple[Machine, ...], manual: int) -> QueueView:
    return QueueView(
        metrics=metrics,
        machines=machines,
        serving=sum(1 for m in machines if m.serving),
        booting=sum(1 for m in machines if m.booting),
        manual=max(0, manual),
        leaving_running=sum(
            m.running_tasks for m in machines if m.billing and not m.serving and not m.booting
        ),
    )


@dataclass(frozen=True)
class UpVote:
    trigger: str
    fired: bool
    wants: int
    reason: str
    held: bool = False


def _plus_one(trigger: str, view: QueueView, why: str) -> UpVote:
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


def no_workers(_: NoWorkersTrigger, view: QueueView) -> UpVote:
    pending = view.metrics.pending
    if pending > 0 and view.capacity == 0:
        return UpVote(
            "no_workers",
            True,
            1,
            f"no_workers: {pending} pending and no live, booting or hand-made worker → one machine",
        )
    return _quiet("no_workers", f"{pending} pending, capacity {view.capacity}")


def queue_depth(trig: QueueDepthTrigger, view: QueueView) -> UpVote:
    pending = view.metrics.pending
    if trig.target_per_worker is not None:
        target = trig.target_per_worker
        wants = math.ceil(view.load / target)
        text = (
            f"{pending} pending + {view.load - pending} running = {view.load} jobs at "
            f"{target}/worker → want {wants}"
        )
        if wants > view.capacity:
            return UpVote("queue_depth", True, wants, f"queue_depth: {text}, {view.have()}")
        return _quiet("queue_depth", f"{text}, {view.have()}")
    assert trig.threshold is not None
    if pending > trig.threshold:
        return _plus_one("queue_depth", view, f"{pending} pending > threshold {trig.threshold}")
    return _quiet("queue_depth", f"{pending} pending ≤ threshold {trig.threshold}")


def latency(trig: LatencyTrigger, view: QueueView) -> UpVote:
    age = view.metrics.oldest_pending_age
    limit = format_duration(trig.max_latency)
    if age is not None and view.metrics.pending > 0 and age > trig.max_latency:
        return _plus_one("latency", view, f"oldest pending job waited {age:.0f}s > {limit}")
    shown = "none pending" if age is None else f"oldest pending {age:.0f}s"
    return _quiet("latency", f"{shown} ≤ {limit}")


def metric(trig: MetricTrigger, view: QueueView) -> UpVote:
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
    trig: IdleTrigger, machines: tuple[Machine, ...], now: datetime
) -> list[tuple[Machine, float]]:
    """Ready, not busy, not already leaving, idle for at least `timeout`: (machine, idle s)."""
    out = []
    for m in machines:
        if m.state != InstanceState.READY or m.drain_requested or m.busy:
            continue
        idle = (now - m.idle_since()).total_seconds()
        if idle >= trig.timeout:
            out.append((m, idle))
    return out


def schedule_down_due(trig: ScheduleDownTrigger, grace: float, now: datetime) -> datetime | None:
    """The firing of a scale-down schedule still to be acted on at `now`, if any."""
    return firing_due(trig.cron, trig.timezone, grace, now)
