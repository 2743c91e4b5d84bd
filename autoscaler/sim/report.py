"""Figures of a run: machine-hours, dollars, the lower bound, job waits, and saturation.

The figures are built so that no policy can look better than it is by not doing the work:

- Waits count every job. A job served waited from its arrival to its (last) start: a job
  killed with its machine and run again waited until it started for good. A job never served
  "waited" from its arrival to the end of the run — a lower bound of its real wait.
- `lower_bound_dollars` is Σ(runtime) × price over the whole trace: what the work costs on
  machines that are never idle and boot instantly. It is the same for every policy.
- `ratio` = (dollars + undone work × price) / lower bound. Work a policy did not do — jobs
  never started, and the unfinished part of jobs still running when the run ended — is
  charged at its lower-bound price, so dropping a job never costs less than running it.
  Every hour of work done was billed on a machine at that price, so the ratio is ≥ 1 for any
  policy on any trace (1 only when nothing was paid beyond the work itself).
- A warm pool's stopped machine bills its storage price, not the machine's: `machine_hours`
  are the hours billed at the full price, `stopped_hours` / `storage_dollars` the rest (in
  `dollars` too). A resume pays no rental fee; `launches` counts fresh rentals only.
- Interruptible machines (`instance.interruptible`): they bill the bid, so the lower bound's
  price is the cheapest hour on offer, the bid (the ratio stays ≥ 1). A job handed back after
  a preemption and run again (acks late) waited until its last start, and its lost run was
  paid (`rerun_hours`). A job lost with its machine (early acks) is never served: it waits to
  the end of the run like an unserved job, and its whole runtime is undone work; it is counted
  in `lost`, not in `never_served`.
- Saturation: at each evaluation with jobs pending, was every machine slot under max_workers
  taken (machines that may still bill count)? When that holds for a large share of those
  evaluations, waits measure the cap rather than the policy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from autoscaler.sim.engine import Result

SATURATED_SHARE = 0.10
"""A policy is flagged saturated when, in at least this share of the evaluations with jobs
pending, the queue already had max_workers machines."""


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass
class Saturation:
    """Counted while a policy runs: evaluations with jobs pending, and those of them at which
    the queue already had max_workers machines (see `run.run_watched`)."""

    max_workers: int
    pending_evaluations: int = 0
    at_max: int = 0

    @property
    def share(self) -> float:
        return self.at_max / self.pending_evaluations if self.pending_evaluations else 0.0


@dataclass(frozen=True)
class PolicyReport:
    policy: str
    jobs: int
    machine_hours: float
    dollars: float
    lower_bound_dollars: float
    ratio: float
    wait_p50: float
    wait_p95: float
    wait_p99: float
    wait_max: float
    never_served: int
    killed: int
    launches: int
    failed_rentals: int
    peak_machines: int
    over_max: int
    undone_hours: float = 0.0
    saturated_share: float = 0.0
    saturated: bool = False
    resumes: int = 0
    warm_misses: int = 0
    stopped_hours: float = 0.0
    storage_dollars: float = 0.0
    interruptible: bool = False
    """The queue rents part of its machines interruptible: the fields below are its figures."""
    preemptions: int = 0
    reruns: int = 0
    rerun_hours: float = 0.0
    lost: int = 0
    interruptible_hours: float = 0.0
    interruptible_dollars: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.interruptible:  # the report as it was before interruptible machines
            for key in INTERRUPTIBLE_FIELDS:
                del out[key]
        return out


INTERRUPTIBLE_FIELDS = (
    "interruptible",
    "preemptions",
    "reruns",
    "rerun_hours",
    "lost",
    "interruptible_hours",
    "interruptible_dollars",
)


def undone_seconds(result: Result) -> float:
    """Work the run did not do: whole jobs never started, the unfinished part of jobs running
    at the end. A killed job's lost run is not counted: it was paid and done again."""
    undone = 0.0
    for i, job in enumerate(result.jobs):
        start = result.starts.get(i)
        if start is None:
            undone += job.runtime_s
        else:
            undone += max(0.0, start + job.runtime_s - result.end_s)
    return undone


def summarize(result: Result, saturation: Saturation | None = None) -> PolicyReport:
    price = result.price_per_hour
    end_s = result.end_s
    hours = sum(b - a for m in result.machines for a, b in m.running_spans(end_s)) / 3600.0
    stopped = sum(m.stopped_seconds(end_s) for m in result.machines) / 3600.0
    storage = sum(m.stopped_seconds(end_s) / 3600.0 * m.storage_price for m in result.machines)
    running = sum(
        sum(b - a for a, b in m.running_spans(end_s)) / 3600.0 * m.price for m in result.machines
    )
    bids = [m for m in result.machines if m.interruptible]
    bid_hours = sum(b - a for m in bids for a, b in m.running_spans(end_s)) / 3600.0
    bid_dollars = sum(
        sum(b - a for a, b in m.running_spans(end_s)) / 3600.0 * m.price
        + m.stopped_seconds(end_s) / 3600.0 * m.storage_price
        + result.per_rental_dollars
        for m in bids
    )
    dollars = running + storage + len(result.machines) * result.per_rental_dollars
    bound = sum(j.runtime_s for j in result.jobs) / 3600.0 * price
    undone = undone_seconds(result) / 3600.0
    charged = dollars + undone * price
    ratio = charged / bound if bound > 0 else (math.inf if charged > 0 else 1.0)
    end = max(result.end_s, max((j.arrival_s for j in result.jobs), default=0.0))
    waits = sorted(result.starts.get(i, end) - job.arrival_s for i, job in enumerate(result.jobs))
    share = saturation.share if saturation is not None else 0.0
    return PolicyReport(
        policy=result.policy,
        jobs=len(result.jobs),
        machine_hours=hours,
        dollars=dollars,
        lower_bound_dollars=bound,
        ratio=ratio,
        wait_p50=percentile(waits, 50),
        wait_p95=percentile(waits, 95),
        wait_p99=percentile(waits, 99),
        wait_max=waits[-1] if waits else 0.0,
        never_served=len(result.jobs) - len(result.starts) - len(result.lost),
        killed=result.killed,
        launches=len(result.machines),
        failed_rentals=result.failed_rentals,
        peak_machines=result.peak_machines,
        over_max=max(0, result.max_over_limit),
        undone_hours=undone,
        saturated_share=share,
        saturated=share >= SATURATED_SHARE,
        resumes=result.resumes,
        warm_misses=result.warm_misses,
        stopped_hours=stopped,
        storage_dollars=storage,
        interruptible=result.interruptible,
        preemptions=result.preemptions,
        reruns=result.reruns,
        rerun_hours=result.rerun_work_s / 3600.0,
        lost=len(result.lost),
        interruptible_hours=bid_hours,
        interruptible_dollars=bid_dollars,
    )


HEADER = (
    f"{'policy':<16}{'mach-h':>8}{'$':>9}{'ratio':>7}{'p50 s':>8}{'p95 s':>8}{'p99 s':>8}"
    f"{'max s':>8}{'unserved':>9}{'killed':>7}{'rentals':>8}{'undone h':>9}"
)

LEGEND = (
    "ratio = ($ + undone h × price) / lower bound: work left undone (jobs never served, the\n"
    "unfinished part of jobs running at the end) is charged at its lower-bound cost, so no\n"
    "policy scores below 1.00 by dropping work. Waits count every job: a job never served\n"
    "counts from its arrival to the end of the run (a lower bound of its wait); a killed job\n"
    "until its last start. Lower bound = Σ(runtime) × price: always-busy machines, no boots.\n"
    "Zero-wait oracle: clairvoyant rentals a boot ahead, every job starts on arrival (boots,\n"
    "kept gaps and rental fees paid; ignores max_workers). Wait floor: FIFO on max_workers\n"
    "machines always warm: the waits no policy under the cap can beat (its cost is no\n"
    "reference). Every policy gets the same scale-from-zero fast path."
)


def fmt_row(r: PolicyReport) -> str:
    return (
        f"{r.policy:<16}{r.machine_hours:>8.1f}{r.dollars:>9.2f}{r.ratio:>7.2f}"
        f"{r.wait_p50:>8.0f}{r.wait_p95:>8.0f}{r.wait_p99:>8.0f}{r.wait_max:>8.0f}"
        f"{r.never_served:>9}{r.killed:>7}{r.launches:>8}{r.undone_hours:>9.1f}"
    )


def fmt_warm(r: PolicyReport) -> str | None:
    """What a warm pool did in a run, one line (None when it resumed and stopped nothing)."""
    if not r.resumes and not r.stopped_hours:
        return None
    return (
        f"  {r.policy}: {r.resumes} resumes ({r.warm_misses} warm misses), "
        f"{r.stopped_hours:.1f} machine-h stopped for ${r.storage_dollars:.2f} of storage"
    )


def fmt_interruptible(r: PolicyReport) -> str | None:
    """What interruptible machines did in a run, one line (None when it rented none)."""
    if not r.interruptible or (not r.interruptible_hours and not r.preemptions):
        return None
    return (
        f"  {r.policy}: {r.interruptible_hours:.1f} of {r.machine_hours:.1f} machine-h "
        f"interruptible for ${r.interruptible_dollars:.2f}; {r.preemptions} preemptions, "
        f"{r.reruns} jobs run again ({r.rerun_hours:.2f} h of work lost and redone), "
        f"{r.lost} jobs lost"
    )


def fmt_bound(r: PolicyReport, price: float) -> str:
    hours = r.lower_bound_dollars / price if price > 0 else 0.0
    return (
        f"{'lower bound':<16}{hours:>8.1f}{r.lower_bound_dollars:>9.2f}{1.0:>7.2f}"
        f"{0:>8}{0:>8}{0:>8}{0:>8}{0:>9}{0:>7}{'-':>8}{0:>9.1f}"
    )


def fmt_oracle(machine_hours: float, dollars: float, bound: float, rentals: int) -> str:
    ratio = dollars / bound if bound > 0 else 1.0
    return (
        f"{'zero-wait oracle':<16}{machine_hours:>8.1f}{dollars:>9.2f}{ratio:>7.2f}"
        f"{0:>8}{0:>8}{0:>8}{0:>8}{0:>9}{0:>7}{rentals:>8}{0:>9.1f}"
    )


def fmt_floor(p50: float, p95: float, p99: float, wait_max: float) -> str:
    return (
        f"{'wait floor':<16}{'-':>8}{'-':>9}{'-':>7}"
        f"{p50:>8.0f}{p95:>8.0f}{p99:>8.0f}{wait_max:>8.0f}{0:>9}{0:>7}{'-':>8}{0:>9.1f}"
    )


def saturation_warning(reports: list[PolicyReport], max_workers: int) -> str | None:
    """One warning line when a policy spent much of its pending time at max_workers."""
    held = [r for r in reports if r.saturated]
    if not held:
        return None
    shares = ", ".join(f"{r.saturated_share:.0%} ({r.policy})" for r in held)
    return (
        f"warning: jobs waited while the queue was already at max_workers ({max_workers}) in "
        f"{shares} of the evaluations with jobs pending: waits and unserved jobs measure the "
        "cap, not the policy; raise max_workers to compare the policies"
    )


PLACEMENT_COLUMNS = (
    f"{'jobs':>6}{'p50 s':>8}{'p95 s':>8}{'p99 s':>8}{'max s':>8}{'$':>9}{'mach-h':>8}"
    f"{'rentals':>8}{'failed':>7}{'unserved':>9}"
)
"""The columns of a provider list beside each provider alone (`sim.placement`)."""


def fmt_placement_row(r: PolicyReport, width: int) -> str:
    """Our policy on one provider list (`r.policy` names it), in PLACEMENT_COLUMNS."""
    return (
        f"{r.policy:<{width}}{r.jobs:>6}{r.wait_p50:>8.0f}{r.wait_p95:>8.0f}{r.wait_p99:>8.0f}"
        f"{r.wait_max:>8.0f}{r.dollars:>9.2f}{r.machine_hours:>8.1f}{r.launches:>8}"
        f"{r.failed_rentals:>7}{r.never_served:>9}"
    )
