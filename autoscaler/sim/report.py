"""Figures of a run: machine-hours, dollars, the lower bound, and job waits."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from autoscaler.sim.engine import Result


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass(frozen=True)
class Report:
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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(result: Result) -> Report:
    price = result.price_per_hour
    hours = sum(
        ((m.ended_s if m.ended_s is not None else result.end_s) - m.created_s) / 3600.0
        for m in result.machines
    )
    dollars = sum(
        ((m.ended_s if m.ended_s is not None else result.end_s) - m.created_s) / 3600.0 * m.price
        for m in result.machines
    )
    bound = sum(j.runtime_s for j in result.jobs) / 3600.0 * price
    waits = sorted(result.starts[i] - result.jobs[i].arrival_s for i in result.starts)
    return Report(
        policy=result.policy,
        jobs=len(result.jobs),
        machine_hours=hours,
        dollars=dollars,
        lower_bound_dollars=bound,
        ratio=dollars / bound if bound > 0 else math.inf,
        wait_p50=percentile(waits, 50),
        wait_p95=percentile(waits, 95),
        wait_p99=percentile(waits, 99),
        wait_max=waits[-1] if waits else 0.0,
        never_served=len(result.jobs) - len(result.starts),
        killed=result.killed,
        launches=len(result.machines),
        failed_rentals=result.failed_rentals,
        peak_machines=result.peak_machines,
        over_max=max(0, result.max_over_limit),
    )


def lower_bound_row(report: Report) -> dict[str, Any]:
    return {
        "policy": "lower bound",
        "machine_hours": report.lower_bound_dollars / (report.dollars / report.machine_hours)
        if report.machine_hours and report.dollars
        else 0.0,
        "dollars": report.lower_bound_dollars,
        "ratio": 1.0,
    }


HEADER = (
    f"{'policy':<16}{'mach-h':>8}{'$':>9}{'ratio':>7}{'p50 s':>8}{'p95 s':>8}{'p99 s':>8}"
    f"{'max s':>8}{'unserved':>9}{'killed':>7}{'rentals':>8}"
)


def fmt_row(r: Report) -> str:
    return (
        f"{r.policy:<16}{r.machine_hours:>8.1f}{r.dollars:>9.2f}{r.ratio:>7.2f}"
        f"{r.wait_p50:>8.0f}{r.wait_p95:>8.0f}{r.wait_p99:>8.0f}{r.wait_max:>8.0f}"
        f"{r.never_served:>9}{r.killed:>7}{r.launches:>8}"
    )


def fmt_bound(r: Report, price: float) -> str:
    hours = r.lower_bound_dollars / price if price > 0 else 0.0
    return (
        f"{'lower bound':<16}{hours:>8.1f}{r.lower_bound_dollars:>9.2f}{1.0:>7.2f}"
        f"{0:>8}{0:>8}{0:>8}{0:>8}{0:>9}{0:>7}{'-':>8}"
    )
