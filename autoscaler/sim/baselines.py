"""Baselines replayed on the same trace, through the same simulated world.

The fair ones (in the cost table, each with the same scale-from-zero fast path as ours):

runqy (as documented): +1 machine when no worker serves a queue with jobs pending, when more
than the threshold is pending (a `target_per_worker: T` reads as a threshold of T jobs per
machine, booting ones counted), or when the oldest job waited over `max_latency`; never while
a machine boots (no stacking). Idle is judged per worker: a worker that ran no task for the
idle timeout is released (most idle first, down to min_workers). Busy workers are spared.

keda (careful user): a ScaledObject over pending + running (unacked) jobs: desired =
ceil((pending + running) / target), clamped, booting replicas counted; scale-up at once;
scale-down to the highest desired of the last 300 s (HPA stabilization), to zero only 300 s
after the queue was last active (cooldownPeriod). Pods get a long termination grace period and
a warm shutdown: a removed busy pod finishes its job first (nothing is killed). `keda+delay`
is the same with the cluster autoscaler's scale-in delay: a node stays rented (billing, no
work) for `scale_down_unneeded_s` (10 min by default) after its pod left.

The strawmen the table used to print (kept for the record, not in the table):

runqy-original: every poll, +1 machine if no *ready* worker with jobs pending, if more than
`threshold` jobs are pending, or if the oldest job waited over `max_latency` — with no guard
for machines still booting (they are not counted), so it stacks a launch every poll until
the first one boots. Idle is judged per queue: only once the whole queue ran no task for the
idle timeout are its idle workers released (down to min_workers). Busy workers are spared.

keda-like (`KedaLike`: `Keda` with `count_running` and `graceful` off): a ScaledObject over
the queue length: desired = ceil(pending / target), clamped to [min, max], booting replicas
counted; scale-up at once; scale-down to the highest desired of the last 300 s (HPA
stabilization), and to zero only 300 s after the queue was last active (cooldownPeriod).
Kubernetes removes not-ready replicas first, then the newest ready ones, and nothing protects
a busy replica: its job is killed and re-queued (the simulator counts it).

Both read their numbers from the same config block; both respect the rental backoff. A queue
listing several providers rents from those not in backoff (`_launch`), placed as ours are: the
simulator ranks their offers by the queue's `placement`; a baseline waits only when every
listed provider is in backoff.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from autoscaler.config.models import Autoscale, Config
from autoscaler.config.triggers import (
    IdleTrigger,
    LatencyTrigger,
    NoWorkersTrigger,
    QueueDepthTrigger,
)
from autoscaler.lifecycle import InstanceState
from autoscaler.policy.backoff import active_backoff
from autoscaler.policy.plan import Drain, Launch, Plan, QueuePlan
from autoscaler.policy.snapshot import Machine, QueueSnapshot, Snapshot


def _depth_number(auto: Autoscale) -> int | None:
    for trig in auto.scale_up:
        if isinstance(trig, QueueDepthTrigger):
            return trig.threshold if trig.threshold is not None else trig.target_per_worker
    return None


def _queue(snapshot: Snapshot, config: Config) -> tuple[str, Autoscale, QueueSnapshot] | None:
    for name, q in sorted(config.queues.items()):
        if q.autoscale is not None and q.autoscale.enabled:
            qs = snapshot.queue(name)
            if qs is not None and qs.metrics is not None:
                return name, q.autoscale, qs
    return None


def _open(auto: Autoscale, qs: QueueSnapshot, now: datetime) -> tuple[str, ...]:
    """The listed providers not in backoff now, in the order written (none: the queue waits)."""
    return tuple(p for p in auto.providers if active_backoff(qs.backoff_for(p), now) is None)


def _launch(
    name: str, providers: tuple[str, ...], trigger: str, why: str, index: int = 1
) -> Launch:
    """One launch on the first open provider, the others its fallbacks (as decide() gives)."""
    return Launch(name, providers[0], trigger, why, index, fallbacks=providers[1:])


def _plan(
    now: datetime,
    name: str,
    auto: Autoscale,
    capacity: int,
    desired: int,
    launches: Sequence[Launch],
    drains: Sequence[Drain],
) -> Plan:
    """A baseline's decision for its one queue, in the plan shape the executor carries out."""
    return Plan(
        at=now,
        queues=(
            QueuePlan(
                name,
                capacity,
                auto.min_workers,
                auto.max_workers,
                desired,
                launches=tuple(launches),
                drains=tuple(drains),
            ),
        ),
    )


class RunqyOriginal:
    """runqy's first autoscaler: +1 per poll, no stacking guard, idle judged per queue."""

    name = "runqy-original"

    def __call__(self, snapshot: Snapshot, config: Config, now: datetime) -> Plan:
        found = _queue(snapshot, config)
        if found is None:
            return Plan(at=now)
        name, auto, qs = found
        assert qs.metrics is not None
        m = qs.metrics
        live = [x for x in qs.machines if x.billing]
        ready = [x for x in live if x.state == InstanceState.READY and not x.drain_requested]
        why = None
        threshold = _depth_number(auto)
        for trig in auto.scale_up:
            if isinstance(trig, NoWorkersTrigger) and m.pending > 0 and not ready:
                why = f"no ready worker, {m.pending} pending"
            elif (
                isinstance(trig, QueueDepthTrigger)
                and threshold is not None
                and m.pending > threshold
            ):
                why = f"{m.pending} pending > {threshold}"
            elif (
                isinstance(trig, LatencyTrigger)
                and m.oldest_pending_age is not None
                and m.oldest_pending_age > trig.max_latency
            ):
                why = f"oldest job {m.oldest_pending_age:.0f}s > {trig.max_latency:.0f}s"
            if why:
                break
        launches: tuple[Launch, ...] = ()
        open_ = _open(auto, qs, now)
        if why and len(live) < auto.max_workers and open_:
            launches = (_launch(name, open_, "runqy-original", why),)
        drains: list[Drain] = []
        timeouts = [t.timeout for t in auto.scale_down if isinstance(t, IdleTrigger)]
        if not launches and timeouts and m.pending == 0 and m.in_flight == 0 and ready:
            last = max(x.idle_since() for x in ready)
            if (now - last).total_seconds() >= min(timeouts):
                idle = [x for x in ready if not x.busy]
                for x in idle[: max(0, len(ready) - auto.min_workers)]:
                    drains.append(Drain(name, x.launch_id, "baseline", "queue idle"))
        return _plan(now, name, auto, len(ready), len(ready) + len(launches), launches, drains)


def _threshold_of(trig: QueueDepthTrigger) -> tuple[int, bool]:
    """(number, per_worker): a threshold fires on pending > n; a target on pending > n·workers."""
    if trig.threshold is not None:
        return trig.threshold, False
    return max(1, trig.target_per_worker or 1), True


class Runqy:
    """runqy as its page documents it: +1 per poll, no stacking, idle judged per worker."""

    name = "runqy"

    def __call__(self, snapshot: Snapshot, config: Config, now: datetime) -> Plan:
        found = _queue(snapshot, config)
        if found is None:
            return Plan(at=now)
        name, auto, qs = found
        assert qs.metrics is not None
        m = qs.metrics
        live = [x for x in qs.machines if x.billing]
        serving = [x for x in live if x.serving]
        booting = [x for x in live if x.booting]
        capacity = len(serving) + len(booting)
        why = None
        for trig in auto.scale_up:
            if isinstance(trig, NoWorkersTrigger) and m.pending > 0 and capacity == 0:
                why = f"no worker, {m.pending} pending"
            elif isinstance(trig, QueueDepthTrigger):
                n, per_worker = _threshold_of(trig)
                limit = n * max(1, capacity) if per_worker else n
                if m.pending > limit:
                    why = f"{m.pending} pending > {limit}"
            elif (
                isinstance(trig, LatencyTrigger)
                and m.oldest_pending_age is not None
                and m.oldest_pending_age > trig.max_latency
            ):
                why = f"oldest job {m.oldest_pending_age:.0f}s > {trig.max_latency:.0f}s"
            if why:
                break
        launches: tuple[Launch, ...] = ()
        open_ = _open(auto, qs, now)
        if why and not booting and len(live) < auto.max_workers and open_:
            launches = (_launch(name, open_, "runqy", why),)
        drains: list[Drain] = []
        timeouts = [t.timeout for t in auto.scale_down if isinstance(t, IdleTrigger)]
        if not launches and timeouts and m.pending == 0:
            idle = sorted(
                (
                    x
                    for x in serving
                    if not x.busy and (now - x.idle_since()).total_seconds() >= min(timeouts)
                ),
                key=lambda x: x.idle_since(),
            )
            for x in idle[: max(0, len(serving) - auto.min_workers)]:
                drains.append(Drain(name, x.launch_id, "baseline", "worker idle"))
        return _plan(now, name, auto, capacity, capacity + len(launches), launches, drains)


class Keda:
    """ceil((pending + running) / target), 300 s stabilization and cooldown, graceful removal.

    One class for the fair KEDA and the strawman: `count_running=False` scales on pending jobs
    alone, `graceful=False` removes busy pods at once (their jobs are killed) and lets the
    pods still leaving stand outside max_workers. Both on is the fair one.
    """

    name = "keda"

    def __init__(
        self,
        window_s: float = 300.0,
        cooldown_s: float = 300.0,
        *,
        count_running: bool = True,
        graceful: bool = True,
    ) -> None:
        self.window_s = window_s
        self.cooldown_s = cooldown_s
        self.count_running = count_running
        self.graceful = graceful
        self.history: list[tuple[datetime, int]] = []
        self.last_active: datetime | None = None

    def __call__(self, snapshot: Snapshot, config: Config, now: datetime) -> Plan:
        found = _queue(snapshot, config)
        if found is None:
            return Plan(at=now)
        name, auto, qs = found
        assert qs.metrics is not None
        load = qs.metrics.pending + (qs.metrics.started_or_held if self.count_running else 0)
        target = max(1, _depth_number(auto) or 1)
        raw = math.ceil(load / target)
        desired = min(auto.max_workers, max(auto.min_workers, raw))
        if load > 0:
            self.last_active = now
        self.history = [
            (t, d) for t, d in self.history if (now - t).total_seconds() < self.window_s
        ]
        self.history.append((now, desired))
        replicas = [x for x in qs.machines if x.booting or x.serving]
        current = len(replicas)
        if desired > current:
            why = f"ceil({load}/{target}) = {raw}" + ("" if self.graceful else f" > {current}")
            launches = self._launches(qs, auto, name, now, current, desired, why)
            return _plan(now, name, auto, current, desired, launches, [])
        drains = self._drains(replicas, name, current, now)
        return _plan(now, name, auto, current, desired, [], drains)

    def _launches(
        self,
        qs: QueueSnapshot,
        auto: Autoscale,
        name: str,
        now: datetime,
        current: int,
        desired: int,
        why: str,
    ) -> list[Launch]:
        """Scale up at once, within max_workers (graceful: counting the pods still leaving)."""
        open_ = _open(auto, qs, now)
        if not open_:
            return []
        count = desired - current
        if self.graceful:
            going = sum(1 for x in qs.machines if x.billing) - current
            count = min(count, max(0, auto.max_workers - current - going))
        return [_launch(name, open_, self.name, why, i + 1) for i in range(count)]

    def _drains(
        self, replicas: Sequence[Machine], name: str, current: int, now: datetime
    ) -> list[Drain]:
        """Scale in to the highest desired of the window (1 until the cooldown ends): not-ready
        pods first, then the newest ready ones; a graceful busy pod finishes its job first."""
        stable = max(d for _, d in self.history)
        if (
            stable == 0
            and self.last_active is not None
            and (now - self.last_active).total_seconds() < self.cooldown_s
        ):
            stable = 1
        if stable >= current:
            return []
        order = sorted(
            replicas,
            key=lambda x: (not x.booting, -(x.ready_at or x.created_at).timestamp()),
        )
        if self.graceful:
            return [
                Drain(name, x.launch_id, "baseline", f"scale in to {stable}", when_idle=x.busy)
                for x in order[: current - stable]
            ]
        return [
            Drain(name, x.launch_id, "baseline", f"scale in to {stable} (busy: {x.busy})")
            for x in order[: current - stable]
        ]


class KedaLike(Keda):
    """The strawman: ceil(pending / target) replicas, busy pods not protected."""

    name = "keda-like"

    def __init__(self, window_s: float = 300.0, cooldown_s: float = 300.0) -> None:
        super().__init__(window_s, cooldown_s, count_running=False, graceful=False)
