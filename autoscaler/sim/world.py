"""The simulator's world and records: how hard the world is (`World`), one simulated machine
(`SimMachine`), a run's raw outcome (`Result`), the virtual calendar and the event kinds."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from autoscaler.lifecycle import InstanceState
from autoscaler.policy import billing
from autoscaler.policy.billing import Charge
from autoscaler.sim.provider import HANDBACK_S, Outage
from autoscaler.sim.trace import Job

EPOCH = datetime(2025, 3, 3, tzinfo=UTC)
"""Virtual time zero: a Monday, midnight UTC (schedules in the config see this calendar)."""

DAY_S = 86400.0
TAIL_S = 4 * 3600.0
"""After the last arrival (or the day's end), the run continues this long at most so that idle
tails are billed and late jobs may still be served; then it stops."""


(
    _ARRIVE,
    _BOOTED,
    _FINISH,
    _TICK,
    _DRAINED,
    _STOPPED,
    _RESUMED,
    _MISSED,
    _PREEMPTED,
    _HANDED_BACK,
) = range(10)

Acks = Literal["late", "early"]


@dataclass(frozen=True)
class World:
    """How hard the simulated world is; the defaults are the exact, instant world."""

    metric_lag_s: float = 0.0
    blind_in_flight: bool = False
    blind_age: bool = False
    drain_race_s: float = 0.0
    worker_concurrency: int = 1
    per_rental_dollars: float = 0.0
    failure_seen_at_boot: bool = False
    release_delay_s: float = 0.0
    destroy_billing_s: float = 0.0
    """A destroyed machine bills this much longer (the provider's terminate takes time)."""
    outages: tuple[Outage, ...] = ()
    """Capacity windows: a provider with no capacity for an interval (`sim.provider.Outage`)."""
    preemption_rate: float = 0.0
    """Interruptible machines preempted per machine-hour (0.05: 5 % per hour), exponential."""
    acks: Acks = "late"
    """The workers' Celery acks: "late" (`task_acks_late`: a preempted machine's job runs again)
    or "early" (Celery's default: it is lost)."""
    handback_s: float = HANDBACK_S
    """From reconcile destroying a preempted machine to its jobs back in the broker (the
    hand-back step's grace and the requeue)."""

    @classmethod
    def realistic(cls) -> World:
        """A 5 s metric lag, a 2 s drain race, $0.02 per rental, failed boots reported dead by
        the provider after about a boot time, 30 s of billing after a destroy (what
        `benchmarks/cost.py --realistic` runs)."""
        return cls(
            metric_lag_s=5.0,
            drain_race_s=2.0,
            per_rental_dollars=0.02,
            failure_seen_at_boot=True,
            destroy_billing_s=30.0,
        )


@dataclass
class SimMachine:
    launch_id: str
    created_s: float
    price: float
    state: InstanceState = InstanceState.BOOTING
    ready_s: float | None = None
    ended_s: float | None = None
    jobs: dict[int, float] = field(default_factory=dict)
    """Jobs running now and when each started."""
    last_task_s: float | None = None
    drain_requested: bool = False
    launched_for: str = ""
    spec_key: str | None = None
    storage_price: float = 0.0
    """$/h while stopped (its kept disk)."""
    keep_warm: bool = False
    stopped_s: float | None = None
    """When it was last stopped (a warm pool's machine)."""
    stopped: list[tuple[float, float | None]] = field(default_factory=list)
    """(from, to) spans it was stopped, billed at `storage_price` (to None: still stopped)."""
    resumes: int = 0
    epoch: int = 0
    """Counts its stops and resumes: an event of an earlier one is stale."""
    provider: str = ""
    """The provider it was rented from."""
    interruptible: bool = False
    """Rented at the queue's bid: the provider may preempt it."""
    preempted_s: float | None = None
    """When its provider preempted it (stopped it: outbid); reconcile destroys it at its next
    round."""
    held_back: list[int] = field(default_factory=list)
    """The jobs its worker ran when it was preempted, handed back when it is destroyed."""
    stopping_s: float | None = None
    """When its latest stop began."""
    dead_s: float | None = None
    """From when its provider lists it dead (a failed boot the provider reports)."""

    def life(self) -> list[billing.Interval[float]]:
        """Its life as the money rule reads it (`policy.billing`): rented at `created_s` (booting:
        its price from then on), each stop (`stopped`: its storage price) and resume, its end
        at `ended_s`. The simulator's end is past a destroy's billing tail
        (`World.destroy_billing_s`, and a released node's `release_delay_s`), which bills as the
        machine was when destroyed: its price, or its storage price if it was stopped."""
        moves = [(InstanceState.BOOTING, self.created_s)]
        for a, b in self.stopped:
            moves.append((InstanceState.STOPPED, a))
            if b is not None:
                moves.append((InstanceState.RESUMING, b))
        if self.ended_s is not None:
            moves.append((InstanceState.TERMINATED, self.ended_s))
        return billing.intervals(moves)

    def _spans(self, end: float) -> list[billing.Span[float]]:
        return billing.spans(self.life(), self.ended_s if self.ended_s is not None else end)

    def stopped_seconds(self, end: float) -> float:
        """Seconds it was stopped up to its end (or `end` while it lives)."""
        return sum(s.end - s.start for s in self._spans(end) if s.charge is Charge.STORAGE)

    def running_spans(self, end: float) -> list[tuple[float, float]]:
        """The spans it billed at its full price (rented, not stopped)."""
        return [(s.start, s.end) for s in self._spans(end) if s.charge is Charge.FULL]


@dataclass
class Result:
    """Raw outcome of one run; `report.summarize` turns it into figures."""

    policy: str
    jobs: list[Job]
    starts: dict[int, float]
    machines: list[SimMachine]
    end_s: float
    price_per_hour: float
    """The cheapest listed provider's price: the lower bound's (and undone work's) price."""
    killed: int = 0
    failed_rentals: int = 0
    waits_by_cap: int = 0
    peak_machines: int = 0
    max_over_limit: int = 0
    evaluations: int = 0
    per_rental_dollars: float = 0.0
    log: list[str] = field(default_factory=list)
    resumes: int = 0
    warm_hits: int = 0
    warm_misses: int = 0
    stops: int = 0
    retired: int = 0
    interruptible: bool = False
    """The queue rents part of its machines interruptible (`instance.interruptible`)."""
    preemptions: int = 0
    reruns: int = 0
    """Jobs handed back after a preemption and run again from the start (`acks: late`)."""
    rerun_work_s: float = 0.0
    """The work those reruns threw away: seconds each had run when its machine was preempted."""
    lost: list[int] = field(default_factory=list)
    """Jobs lost with a preempted machine (`acks: early`): never run again."""
