"""Placement across providers in the simulator: a queue's provider list beside each provider
alone, on the same day with the same capacity windows (`simulate` prints it when a queue lists
several providers; `benchmarks/placement_sim.py` measures an outage on the shipped days).

The list runs through decide() and the simulator's launch as production places it (offers of
the providers not in backoff ranked by `policy.placement.rank`, failing over on a capacity
error, a backoff per (queue, provider)); "P alone" is the same config with `provider: P`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from autoscaler.config.models import Config
from autoscaler.sim.engine import Result, World
from autoscaler.sim.provider import Outage, ProviderParams
from autoscaler.sim.report import PolicyReport, summarize
from autoscaler.sim.trace import Job


@dataclass(frozen=True)
class ProviderUse:
    """What one provider billed in a run."""

    provider: str
    rentals: int
    machine_hours: float
    dollars: float


@dataclass(frozen=True)
class PlacementRow:
    """Our policy on one provider list: the queue's own (`alone` False) or one provider."""

    label: str
    providers: tuple[str, ...]
    alone: bool
    report: PolicyReport
    uses: tuple[ProviderUse, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "run": "alone" if self.alone else "list",
            "providers": list(self.providers),
            **self.report.as_dict(),
            "by_provider": {
                u.provider: {
                    "rentals": u.rentals,
                    "machine_hours": u.machine_hours,
                    "dollars": u.dollars,
                }
                for u in self.uses
            },
        }


def with_providers(config: Config, queue: str, providers: Sequence[str]) -> Config:
    """`config` with `queue` renting from `providers` (one name: that provider alone)."""
    q = config.queues[queue]
    assert q.autoscale is not None
    listed: str | tuple[str, ...] = providers[0] if len(providers) == 1 else tuple(providers)
    auto = q.autoscale.model_copy(update={"provider": listed})
    queues = {**config.queues, queue: q.model_copy(update={"autoscale": auto})}
    return config.model_copy(update={"queues": queues})


def check_outages(config: Config, queues: Sequence[str], outages: Sequence[Outage]) -> None:
    """ValueError when an outage names a provider none of `queues` lists (a typo would
    otherwise simulate no outage at all)."""
    if not outages:
        return
    listed: list[str] = []
    for name in queues:
        q = config.queues.get(name)
        if q is None or q.autoscale is None:
            raise ValueError(f"queue {name!r} has no autoscale block in the config")
        listed += [p for p in q.autoscale.providers if p not in listed]
    for o in outages:
        if o.provider not in listed:
            which = f"queue {queues[0]} does not list" if len(queues) == 1 else "no queue lists"
            raise ValueError(
                f"outage {o.describe()} names provider {o.provider!r}, which {which} (listed: "
                f"{', '.join(listed) or 'none'}); name one of those"
            )


def uses(result: Result) -> tuple[ProviderUse, ...]:
    """Per provider that rented a machine in `result`: rentals, full-price machine-hours and
    dollars (its price, a stopped machine's storage, the world's rental fee), first rental
    first."""
    by: dict[str, list[float]] = {}
    for m in result.machines:
        row = by.setdefault(m.provider, [0, 0.0, 0.0])
        hours = sum(b - a for a, b in m.running_spans(result.end_s)) / 3600.0
        stopped = m.stopped_seconds(result.end_s) / 3600.0
        row[0] += 1
        row[1] += hours
        row[2] += hours * m.price + stopped * m.storage_price + result.per_rental_dollars
    return tuple(ProviderUse(p, int(n), h, d) for p, (n, h, d) in by.items())


def billed_hours_between(result: Result, start_s: float, end_s: float) -> float:
    """Machine-hours billed at full price between `start_s` and `end_s` (an outage's span)."""
    return (
        sum(
            max(0.0, min(b, end_s) - max(a, start_s))
            for m in result.machines
            for a, b in m.running_spans(result.end_s)
        )
        / 3600.0
    )


def busiest_window(jobs: Sequence[Job], length_s: float, step_s: float = 900.0) -> Outage:
    """The `length_s` stretch (starting on a `step_s` boundary) into which the most work
    arrives — Σ runtime of the jobs arriving in it; of equal ones the latest —, as an outage
    of no provider yet."""
    last = max((j.arrival_s for j in jobs), default=0.0)
    best, best_work, start = 0.0, -1.0, 0.0
    while start <= last:
        work = sum(j.runtime_s for j in jobs if start <= j.arrival_s < start + length_s)
        if work >= best_work:  # of equal stretches, the latest: it starts with the work
            best, best_work = start, work
        start += step_s
    return Outage("", best, best + length_s)


def compare_placement(
    config: Config,
    queue: str,
    jobs: list[Job],
    seed: int = 0,
    world: World | None = None,
) -> list[PlacementRow]:
    """Our policy on the queue's provider list, then on each listed provider alone: the same
    trace, seed and world (its outages included). Empty for a queue listing one provider."""
    from autoscaler.sim.run import run_watched

    auto = config.queues[queue].autoscale
    assert auto is not None
    listed = auto.providers
    if len(listed) < 2:
        return []
    runs: list[tuple[str, tuple[str, ...], bool, Config]] = [
        (f"{auto.placement} over the list", listed, False, config)
    ]
    runs += [(f"{p} alone", (p,), True, with_providers(config, queue, (p,))) for p in listed]
    rows = []
    for label, providers, alone, cfg in runs:
        result, saturation = run_watched(cfg, queue, jobs, "ours", seed, world=world)
        report = replace(summarize(result, saturation), policy=label)
        rows.append(PlacementRow(label, providers, alone, report, uses(result)))
    return rows


def provider_terms(config: Config, queue: str) -> str:
    """Each listed provider's price and boot as the simulator runs them, one line."""
    auto = config.queues[queue].autoscale
    assert auto is not None
    parts = []
    for p in auto.providers:
        params = ProviderParams.for_provider(config, auto, p)
        parts.append(f"{p} ${params.price_per_hour:.2f}/h, boot {params.boot_s:.0f} s")
    return "; ".join(parts)


def placement_lines(
    config: Config, queue: str, rows: Sequence[PlacementRow], outages: Sequence[Outage] = ()
) -> list[str]:
    """The list beside each provider alone, as `simulate` prints it (nothing for one
    provider): the providers' numbers, the outages, a row per run, what the list rented
    where."""
    from autoscaler.sim.report import PLACEMENT_COLUMNS, fmt_placement_row

    if not rows:
        return []
    width = max(16, *(len(r.label) + 2 for r in rows))
    shown = ", ".join(o.describe() for o in outages) or "none"
    lines = [
        "",
        f"placement: ours on the provider list and on each provider alone (same trace, seed "
        f"and outages; outages: {shown})",
        f"  providers: {provider_terms(config, queue)}",
        f"{'run':<{width}}{PLACEMENT_COLUMNS}",
    ]
    lines += [fmt_placement_row(r.report, width) for r in rows]
    listed = next((r for r in rows if not r.alone), None)
    if listed is not None:
        split = ", ".join(
            f"{u.provider} {u.rentals} rentals, {u.machine_hours:.1f} mach-h, ${u.dollars:.2f}"
            for u in listed.uses
        )
        lines.append(f"  the list rented: {split or 'nothing'}")
    return lines


# --------------------------------------------------------------------------- the measure

P95_SLACK = 0.10
"""The list's p95 wait with the cheaper provider out may be at most this much above without."""


@dataclass(frozen=True)
class OutageRun:
    """One run of an outage day: its figures, the machine-hours billed during the outage, and
    the machine-hours on the dearer provider over the whole run."""

    label: str
    report: PolicyReport
    window_hours: float
    dear_hours: float


@dataclass(frozen=True)
class OutageDay:
    """The cheaper of two listed providers out of capacity for a stretch of a day: (a) the
    list without the outage, (b) the list with it, (c) the cheaper alone with it, (d) the
    dearer alone (`outage_day`)."""

    outage: Outage
    runs: tuple[OutageRun, OutageRun, OutageRun, OutageRun]
    price_gap: float
    """$/h between the dearer and the cheaper provider."""

    def p95_ratio(self) -> float:
        """(b)'s p95 wait over (a)'s."""
        a, b = self.runs[0].report.wait_p95, self.runs[1].report.wait_p95
        return b / a if a else 1.0

    def extra(self) -> float:
        """What the outage cost the list: (b)'s dollars − (a)'s."""
        return self.runs[1].report.dollars - self.runs[0].report.dollars

    def allowance(self) -> float:
        """The price gap on the machine-hours billed during the outage in (b)."""
        return self.price_gap * self.runs[1].window_hours

    def waits_hold(self) -> bool:
        return self.p95_ratio() <= 1 + P95_SLACK

    def cost_holds(self) -> bool:
        return self.extra() <= self.allowance() + 1e-9


def by_price(config: Config, queue: str) -> tuple[str, str, float]:
    """(cheapest, dearest, their price gap) of the queue's listed providers (the first listed
    of equal prices)."""
    auto = config.queues[queue].autoscale
    assert auto is not None
    price = {p: ProviderParams.for_provider(config, auto, p).price_per_hour for p in auto.providers}
    cheap = min(auto.providers, key=lambda p: price[p])
    dear = max(auto.providers, key=lambda p: price[p])
    return cheap, dear, price[dear] - price[cheap]


def outage_day(
    config: Config,
    queue: str,
    jobs: list[Job],
    hours: float = 2.0,
    seed: int = 0,
    world: World | None = None,
) -> OutageDay:
    """The issue's measure on one day: the cheapest listed provider with no capacity for
    `hours` at the day's busiest stretch (`busiest_window`), the list against each alone."""
    from autoscaler.sim.run import run_watched

    cheap, dear, gap = by_price(config, queue)
    w = busiest_window(jobs, hours * 3600.0)
    out = Outage(cheap, w.start_s, w.end_s)
    base = world or World()

    def run(label: str, cfg: Config, outages: tuple[Outage, ...]) -> OutageRun:
        result, saturation = run_watched(
            cfg, queue, jobs, "ours", seed, world=replace(base, outages=outages)
        )
        return OutageRun(
            label,
            replace(summarize(result, saturation), policy=label),
            billed_hours_between(result, out.start_s, out.end_s),
            sum(u.machine_hours for u in uses(result) if u.provider == dear),
        )

    span = f"{hours:g} h"
    return OutageDay(
        out,
        (
            run("(a) list, no outage", config, ()),
            run(f"(b) list, {cheap} out {span}", config, (out,)),
            run(f"(c) {cheap} alone, out {span}", with_providers(config, queue, (cheap,)), (out,)),
            run(f"(d) {dear} alone", with_providers(config, queue, (dear,)), (out,)),
        ),
        gap,
    )
