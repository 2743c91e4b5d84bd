"""Interruptible machines in the simulator: a queue's mixed fleet (part of its machines rented
at a bid, `instance.interruptible`) beside the same queue all on demand, at a preemption rate
(`benchmarks/interruptible_sim.py` measures the shipped days; `simulate --preemption-rate`).

The engine does the modelling (`sim/engine.py`, the assumptions in `sim/provider.py`): a launch
decide() marked interruptible bills the bid and is preempted at `World.preemption_rate` per
machine-hour; its jobs run again (acks late) or are lost (early acks). Here: the issue's
measure — the mixed fleet's cost and p95 wait against all on demand's, per day and rate — and
the sweep for the rate at which interruptible machines stop paying.

The loader accepts `interruptible` only on a queue listing a Vast provider (Vast's bid
instances); `with_interruptible` puts the bid on an already loaded config, so the benchmark's
mock provider (its price, boots and failure rates) stands for the Vast offer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from autoscaler.config.machine_specs import Interruptible
from autoscaler.config.models import Config
from autoscaler.sim.engine import Acks, World
from autoscaler.sim.report import PolicyReport, summarize
from autoscaler.sim.trace import Job

COST_GOAL = 0.70
"""The mixed fleet at 5 %/h must cost at most this share of all on demand's..."""
P95_SLACK = 0.10
"""...at a p95 wait at most this much above all on demand's."""
BID = "50%"
MAX_SHARE = 0.7
RATES = (0.02, 0.05, 0.20)
"""Preemptions per machine-hour the issue reports."""
SWEEP = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0)
"""Rates swept for where interruptible machines stop paying."""


def with_interruptible(
    config: Config, queue: str, bid: float | str = BID, max_share: float = MAX_SHARE
) -> Config:
    """`config` with `queue` renting up to `max_share` of its machines at `bid`."""
    q = config.queues[queue]
    assert q.autoscale is not None
    spec = Interruptible(bid=bid, max_share=max_share)
    instance = q.autoscale.instance.model_copy(update={"interruptible": spec})
    auto = q.autoscale.model_copy(update={"instance": instance})
    queues = {**config.queues, queue: q.model_copy(update={"autoscale": auto})}
    return config.model_copy(update={"queues": queues})


@dataclass(frozen=True)
class MixedRun:
    """The mixed fleet at one preemption rate and acks mode, against all on demand."""

    rate: float
    acks: Acks
    report: PolicyReport
    on_demand: PolicyReport

    @property
    def label(self) -> str:
        return f"mixed, {self.rate:.0%}/h, acks {self.acks}"

    def cost_ratio(self) -> float:
        od = self.on_demand.dollars
        return self.report.dollars / od if od else 1.0

    def p95_ratio(self) -> float:
        od = self.on_demand.wait_p95
        return self.report.wait_p95 / od if od else 1.0

    def waits_hold(self) -> bool:
        return self.p95_ratio() <= 1 + P95_SLACK + 1e-9

    def goal_holds(self) -> bool:
        """The issue's goal (meant at 5 %/h, acks late): ≤ 0.7× the cost, p95 within 10 %,
        nothing lost."""
        return (
            self.cost_ratio() <= COST_GOAL + 1e-9
            and self.waits_hold()
            and self.report.lost == 0
            and self.report.never_served == 0
        )


def run_ours(config: Config, queue: str, jobs: list[Job], seed: int, world: World) -> PolicyReport:
    from autoscaler.sim.run import run_watched

    return summarize(*run_watched(config, queue, jobs, "ours", seed, world=world))


def on_demand(
    config: Config, queue: str, jobs: list[Job], seed: int = 0, world: World | None = None
) -> PolicyReport:
    """Our policy with every machine on demand (the queue's bid removed)."""
    from autoscaler.sim.run import without_interruptible

    return run_ours(without_interruptible(config, queue), queue, jobs, seed, world or World())


def mixed(
    config: Config,
    queue: str,
    jobs: list[Job],
    rate: float,
    acks: Acks = "late",
    seed: int = 0,
    world: World | None = None,
    base: PolicyReport | None = None,
) -> MixedRun:
    """Our policy on `config` (a queue with `instance.interruptible`) at `rate` preemptions per
    machine-hour, beside all on demand (`base`, run when not given) on the same seed and world."""
    w = world or World()
    od = base if base is not None else on_demand(config, queue, jobs, seed, w)
    report = run_ours(config, queue, jobs, seed, replace(w, preemption_rate=rate, acks=acks))
    return MixedRun(rate, acks, report, od)


@dataclass(frozen=True)
class Threshold:
    """Where interruptible machines stop paying on one day (None: not within the sweep):
    the first swept rate whose mixed fleet's p95 leaves the band, and the first whose cost
    reaches all on demand's."""

    p95_leaves: float | None
    cost_reaches: float | None

    def first(self) -> float | None:
        found = [r for r in (self.p95_leaves, self.cost_reaches) if r is not None]
        return min(found, default=None)


def stops_paying(points: Sequence[tuple[float, float, float]]) -> Threshold:
    """From one day's (rate, cost ratio, p95 ratio) points — one run each, or the mean over
    seeds —, the first rate out of the band and the first at which the cost reaches on
    demand's."""
    ordered = sorted(points)
    p95 = next((rate for rate, _, w in ordered if w > 1 + P95_SLACK + 1e-9), None)
    cost = next((rate for rate, c, _ in ordered if c >= 1.0), None)
    return Threshold(p95, cost)


def point(runs: Sequence[MixedRun]) -> tuple[float, float, float]:
    """(rate, mean cost ratio, mean p95 ratio) of runs at one rate (one per seed)."""
    n = len(runs)
    return (
        runs[0].rate,
        sum(r.cost_ratio() for r in runs) / n,
        sum(r.p95_ratio() for r in runs) / n,
    )
