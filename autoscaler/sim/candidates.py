"""Candidate policy rules, prototyped as wrappers around decide() so they can be measured in the
simulator before any of them goes into the decision core (autoscaler/policy/).

Each wrapper keeps its own small history (what it saw in earlier snapshots), calls decide()
with a config it adjusts or adds drains to decide()'s plan; none launches on its own, and none
ever drains a busy machine. `python benchmarks/cost.py --candidates` prints them beside ours.
(The learned idle timeout, prototyped here first, now lives in `policy/history.py`; no
hedged launch while a machine resumes, in `policy/hedge.py`'s `hedge_reason`.)

- hedge: when jobs wait, no machine serves and every booting machine is late (booting longer
  than `late_factor` × the median boot seen so far, 180 s × that before any), rent one more
  (within max_workers counting every billing machine, never in backoff): a failed boot then
  costs a late boot, not the boot timeout.
- fleet-stateless: the same without history (what decide() could do today): an idle machine
  above the current desired count goes once idle for the whole window.
- fleet-scale-in: idle machines above the highest load-based desired count of the last
  `window_s` (desired = ceil((pending + running) / target)) are drained at once, most idle
  first, never a busy one and never below the floor; one machine is kept for the idle timeout.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime

from autoscaler.config.models import Config
from autoscaler.config.triggers import QueueDepthTrigger
from autoscaler.policy.decide import decide
from autoscaler.policy.plan import Drain, Launch, Plan
from autoscaler.policy.snapshot import Snapshot


def _target(config: Config, queue: str) -> int:
    auto = config.queues[queue].autoscale
    assert auto is not None
    for trig in auto.scale_up:
        if isinstance(trig, QueueDepthTrigger):
            return max(1, trig.target_per_worker or trig.threshold or 1)
    return 1


class FleetScaleIn:
    name = "fleet-scale-in"

    def __init__(
        self, window_s: float = 120.0, inner: object | None = None, stateless: bool = False
    ) -> None:
        self.window_s = window_s
        self.history: list[tuple[datetime, int]] = []
        self.inner = inner
        self.stateless = stateless

    def __call__(self, snapshot: Snapshot, config: Config, now: datetime) -> Plan:
        inner = self.inner if callable(self.inner) else decide
        plan: Plan = inner(snapshot, config, now)
        out = []
        for qp in plan.queues:
            qs = snapshot.queue(qp.queue)
            if qs is None or qs.metrics is None or qs.metrics.stale:
                out.append(qp)
                continue
            load = qs.metrics.pending + qs.metrics.started_or_held
            desired = math.ceil(load / _target(config, qp.queue))
            self.history = [
                (t, d) for t, d in self.history if (now - t).total_seconds() < self.window_s
            ]
            if self.stateless:
                self.history = []
            self.history.append((now, desired))
            if qp.up_fired or qp.launches or qp.reclaims:
                out.append(qp)
                continue
            keep = max(qp.floor, max(d for _, d in self.history), 1)
            draining = {d.launch_id for d in qp.drains}
            serving = [m for m in qs.machines if m.serving and m.launch_id not in draining]
            idle = sorted((m for m in serving if not m.busy), key=lambda m: m.idle_since())
            if self.stateless:
                # no history: a machine idle for the whole window stands for "not needed in it"
                idle = [m for m in idle if (now - m.idle_since()).total_seconds() >= self.window_s]
            extra = []
            for m in idle[: max(0, len(serving) - keep)]:
                extra.append(
                    Drain(qp.queue, m.launch_id, "idle", f"fleet above recent desired {keep}")
                )
            out.append(replace(qp, drains=qp.drains + tuple(extra)) if extra else qp)
        return replace(plan, queues=tuple(out))


class Hedge:
    name = "hedge"

    def __init__(self, late_factor: float = 1.5, inner: object | None = None) -> None:
        self.late_factor = late_factor
        self.inner = inner
        self.boots: list[float] = []
        self.seen_ready: set[str] = set()

    def __call__(self, snapshot: Snapshot, config: Config, now: datetime) -> Plan:
        inner = self.inner if callable(self.inner) else decide
        plan: Plan = inner(snapshot, config, now)
        out = []
        for qp in plan.queues:
            qs = snapshot.queue(qp.queue)
            auto = config.queues[qp.queue].autoscale if qp.queue in config.queues else None
            if qs is None or qs.metrics is None or auto is None:
                out.append(qp)
                continue
            for m in qs.machines:
                if m.ready_at is not None and m.launch_id not in self.seen_ready:
                    self.seen_ready.add(m.launch_id)
                    self.boots.append((m.ready_at - m.created_at).total_seconds())
            median = sorted(self.boots)[len(self.boots) // 2] if self.boots else 180.0
            late = self.late_factor * median
            booting = [m for m in qs.machines if m.booting]
            billing = sum(1 for m in qs.machines if m.billing)
            if (
                qs.metrics.pending > 0
                and not qp.launches
                and not any(m.serving for m in qs.machines)
                and booting
                and all((now - m.created_at).total_seconds() > late for m in booting)
                and billing < auto.max_workers
                and not any(w.kind in ("backoff", "spend_cap") for w in qp.waits)
            ):
                first, *others = auto.providers
                hedge = Launch(
                    qp.queue,
                    first,
                    "hedge",
                    f"every booting machine is past {late:.0f}s",
                    1,
                    fallbacks=tuple(others),
                )
                qp = replace(qp, launches=(hedge,))
            out.append(qp)
        return replace(plan, queues=tuple(out))


class StatelessFleet(FleetScaleIn):
    """fleet-scale-in with no history: only machines idle for the whole window go."""

    name = "fleet-stateless"

    def __init__(self) -> None:
        super().__init__(stateless=True)


CANDIDATES = {
    "fleet-scale-in": FleetScaleIn,
    "fleet-stateless": StatelessFleet,
    "hedge": Hedge,
}
