"""Run our policy and the baselines on one trace: the shared entry of the CLI and benchmark."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from autoscaler.config import load_config_text
from autoscaler.config.durations import format_duration
from autoscaler.config.loader import parse_yaml_document, read_config_text
from autoscaler.config.machine_specs import WarmPool
from autoscaler.config.models import Config
from autoscaler.config.provider_options import MockOptions, ProviderConfig
from autoscaler.config.triggers import MetricTrigger
from autoscaler.policy.decide import decide
from autoscaler.policy.plan import Plan
from autoscaler.policy.snapshot import Snapshot
from autoscaler.sim.baselines import Keda, KedaLike, Runqy, RunqyOriginal
from autoscaler.sim.engine import DAY_S, TAIL_S, Policy, Result, Simulation, World
from autoscaler.sim.provider import ProviderParams
from autoscaler.sim.report import PolicyReport, Saturation, saturation_warning, summarize
from autoscaler.sim.trace import Job


def decide_factory() -> Policy:
    return decide


SCALE_IN_DELAY_S = 600.0
"""The cluster autoscaler's default scale-down-unneeded-time: a node stays 10 min after its pod."""

POLICIES: dict[str, tuple[Callable[[], Policy], float]] = {
    # name: (fresh policy factory, seconds a machine keeps billing after its worker left).
    # Every policy gets the same scale-from-zero fast path (an evaluation on arrival at a
    # queue with no machine).
    "ours": (decide_factory, 0.0),
    "runqy": (Runqy, 0.0),
    "keda": (Keda, 0.0),
    "keda+delay": (Keda, SCALE_IN_DELAY_S),
}

STRAWMEN: dict[str, tuple[Callable[[], Policy], float]] = {
    # the baselines the table used to print: runqy stacking launches and judging idle per
    # queue, KEDA on pending only killing busy pods. Run without the fast path, as they were.
    "runqy-original": (RunqyOriginal, 0.0),
    "keda-like": (KedaLike, 0.0),
}

BASELINE_NOTES = {
    "runqy": "runqy as documented: +1 per poll, no stacking, threshold triggers, per-worker idle",
    "keda": "KEDA counting pending + running jobs, 300 s stabilization, graceful pod removal",
    "keda+delay": "the same, with the cluster's 10 min scale-in delay (node bills after its pod)",
}


POOLED = "ours+pool"
UNPOOLED = "ours-no-pool"
"""Our policy beside itself: with the queue's warm pool (DEFAULT_POOL when the config has none),
or without the pool the config has."""

DEFAULT_POOL_SIZE = 8
DEFAULT_POOL_KEEP_FOR = 4 * 3600.0
"""The pool `ours+pool` runs with when the config has none: at most 8 stopped machines (never
above max_workers), each kept 4 h (see docs/decisions/018-warm-pools.md for the sweep behind
these; `autoscaler tune` finds a queue's own)."""


def with_pool(config: Config, queue: str, pool: WarmPool) -> Config:
    """`config` with `queue`'s warm pool replaced by `pool`."""
    q = config.queues[queue]
    assert q.autoscale is not None
    auto = q.autoscale.model_copy(update={"warm_pool": pool})
    queues = {**config.queues, queue: q.model_copy(update={"autoscale": auto})}
    return config.model_copy(update={"queues": queues})


def pool_variant(config: Config, queue: str) -> tuple[str, Config, str]:
    """The run of ours the table shows beside ours: with a warm pool when the config has none,
    without the config's pool when it has one. (name, its config, what it is)."""
    auto = config.queues[queue].autoscale
    assert auto is not None
    if auto.warm_pool.size > 0:
        return UNPOOLED, with_pool(config, queue, WarmPool()), "ours without the warm pool"
    pool = auto.warm_pool.model_copy(
        update={
            "size": min(DEFAULT_POOL_SIZE, auto.max_workers),
            "keep_for": DEFAULT_POOL_KEEP_FOR,
        }
    )
    return POOLED, with_pool(config, queue, pool), f"ours with {pool_words(pool)}"


def pool_words(pool: WarmPool) -> str:
    """A pool as the table says it: "a warm pool of 8 kept 4h (resume timeout 2m)"."""
    return (
        f"a warm pool of {pool.size} stopped machine(s) kept {format_duration(pool.keep_for)} "
        f"(resume timeout {format_duration(pool.resume_timeout)})"
    )


def warm_assumptions(config: Config, queue: str) -> str:
    """The simulated provider's warm-pool numbers, one line (`sim/provider.py` says why)."""
    auto = config.queues[queue].autoscale
    assert auto is not None
    p = ProviderParams.for_queue(config, auto)
    seen = "at resume_timeout" if p.miss_seen_at_timeout else "when the start answers"
    return (
        f"warm pool model: cold boot {p.boot_s:.0f} s, resume {p.resume_s:.0f} s, stop "
        f"{p.stop_s:.0f} s at full price, {p.resume_failure_rate:.0%} of resumes fail (seen "
        f"{seen}; a fresh machine is rented), stopped ${p.storage_price_per_hour:.4f}/h"
        + ("" if p.can_stop else "; this provider cannot stop: every drain destroys")
    )


ON_DEMAND = "ours-on-demand"
"""Our policy beside itself on a queue with `instance.interruptible`: every machine on demand."""


def without_interruptible(config: Config, queue: str) -> Config:
    """`config` with `queue` renting every machine on demand."""
    q = config.queues[queue]
    assert q.autoscale is not None
    instance = q.autoscale.instance.model_copy(update={"interruptible": None})
    auto = q.autoscale.model_copy(update={"instance": instance})
    queues = {**config.queues, queue: q.model_copy(update={"autoscale": auto})}
    return config.model_copy(update={"queues": queues})


def bound_price(config: Config, queue: str) -> float:
    """The lower bound's price: the cheapest listed provider's, or the queue's bid on it when
    that is lower (interruptible machines bill the bid)."""
    auto = config.queues[queue].autoscale
    assert auto is not None
    price = cheapest(config, queue).price_per_hour
    bid = auto.instance.interruptible
    return min(price, bid.price(price)) if bid is not None else price


def interruptible_assumptions(config: Config, queue: str, world: World) -> str | None:
    """The simulated interruptible machines, one line (None when the queue rents none)."""
    auto = config.queues[queue].autoscale
    assert auto is not None
    bid = auto.instance.interruptible
    if bid is None:
        return None
    on_demand = cheapest(config, queue).price_per_hour
    back = (
        f"seen at reconcile's next round, their jobs handed back {world.handback_s:g} s after it "
        "and run again (acks late)"
        if world.acks == "late"
        else "their running jobs lost (early acks)"
    )
    return (
        f"interruptible model: bid {bid.bid if isinstance(bid.bid, str) else f'${bid.bid:g}/h'}"
        f" (${bid.price(on_demand):.2f}/h of ${on_demand:.2f}/h on demand) on at most "
        f"{bid.max_share:.0%} of the machines; {world.preemption_rate:.1%} preempted per "
        f"machine-hour, billing and capacity ending at once, {back}; the queue evaluated at "
        "once (sim/provider.py)"
    )


MAX_SIM_TICKS = 200_000
"""Evaluations per policy a simulation may take (span of the trace / poll interval): about
20 s for the three policies. A trace spanning a year polled every second would take hours."""


class SimulationTooLong(ValueError):
    """The trace spans too many polls to replay in reasonable time; the message has the fix."""


def load_sim_config(path: str | Path) -> Config:
    """The normal YAML config; a provider it names but does not declare is simulated (a
    mock provider's defaults; a queue may list several, `provider: [a, b]`).

    Read and parsed with the same limits and refusals as `autoscaler validate`; the peek at
    which providers are named tolerates any shape (the schema then refuses it)."""
    text = read_config_text(path)
    data = parse_yaml_document(text, str(path))
    named: dict[str, ProviderConfig] = {}
    if isinstance(data, dict):
        providers = data.get("providers")
        declared = set(providers) if isinstance(providers, dict) else set()
        queues = data.get("queues")
        for q in queues.values() if isinstance(queues, dict) else ():
            auto = q.get("autoscale") if isinstance(q, dict) else None
            prov = auto.get("provider") if isinstance(auto, dict) else None
            names = [prov] if isinstance(prov, str) else prov if isinstance(prov, list) else []
            for one in names:
                if isinstance(one, str) and one not in declared:
                    named[one] = MockOptions(kind="mock")
    return load_config_text(text, str(path), registered_providers=named, runnable=True)


def check_span(config: Config, queue: str, jobs: list[Job]) -> None:
    """SimulationTooLong when replaying `jobs` would take more than MAX_SIM_TICKS polls."""
    poll = config.queue_settings(queue).poll_interval
    last = max((j.arrival_s for j in jobs), default=0.0)
    ticks = (max(DAY_S, last) + TAIL_S) / poll
    if ticks > MAX_SIM_TICKS:
        raise SimulationTooLong(
            f"the trace spans {last:.0f} s (last arrival_s), which at one poll every "
            f"{poll:g} s is {ticks:,.0f} evaluations per policy, above the limit of "
            f"{MAX_SIM_TICKS:,}; shorten the trace or simulate with a longer poll_interval "
            f"(at least {(max(DAY_S, last) + TAIL_S) / MAX_SIM_TICKS:.0f} s)"
        )


def pick_queue(config: Config, queue: str | None) -> str:
    if queue is not None:
        return queue
    for name, q in sorted(config.queues.items()):
        if q.autoscale is not None and q.autoscale.enabled:
            return name
    raise ValueError("the config has no queue with an enabled autoscale block")


def jobs_for(jobs: list[Job], queue: str, default_queue: str) -> list[Job]:
    return [j for j in jobs if (j.queue or default_queue) == queue]


def watched(policy: Policy, queue: str, saturation: Saturation) -> Policy:
    """`policy`, counting what it was shown: was the queue at max_workers with jobs pending?"""

    def call(snapshot: Snapshot, config: Config, now: datetime) -> Plan:
        qs = snapshot.queue(queue)
        if qs is not None and qs.metrics is not None and qs.metrics.pending > 0:
            saturation.pending_evaluations += 1
            if sum(1 for m in qs.machines if m.billing and not m.warm) >= saturation.max_workers:
                saturation.at_max += 1
        return policy(snapshot, config, now)

    return call


def run_watched(
    config: Config,
    queue: str,
    jobs: list[Job],
    policy: str,
    seed: int = 0,
    keep_log: bool = False,
    world: World | None = None,
    factory: Callable[[], Policy] | None = None,
) -> tuple[Result, Saturation]:
    """One run, and how often the queue was held at its max_workers with jobs pending."""
    strawman = policy in STRAWMEN
    default_factory, release_delay_s = (STRAWMEN if strawman else POLICIES).get(
        policy, (decide_factory, 0.0)
    )
    world = world or World()
    if release_delay_s:
        world = replace(world, release_delay_s=release_delay_s)
    auto = config.queues[queue].autoscale if queue in config.queues else None
    saturation = Saturation(auto.max_workers if auto is not None else 0)
    sim = Simulation(
        config,
        queue,
        jobs,
        watched((factory or default_factory)(), queue, saturation),
        name=policy,
        seed=seed,
        fast_path=not strawman,
        keep_log=keep_log,
        world=world,
    )
    return sim.run(), saturation


def compare(
    config: Config,
    queue: str,
    jobs: list[Job],
    seed: int = 0,
    world: World | None = None,
    extra: dict[str, Callable[[], Policy]] | None = None,
) -> tuple[list[PolicyReport], float]:
    """Reports for every policy, ours with and without a warm pool (`pool_variant`), and any
    `extra` ones on the same trace, seed and world, and the price used."""
    check_span(config, queue, jobs)
    reports = [summarize(*run_watched(config, queue, jobs, p, seed, world=world)) for p in POLICIES]
    variant, variant_config, _ = pool_variant(config, queue)
    pooled = summarize(*run_watched(variant_config, queue, jobs, variant, seed, world=world))
    reports.insert(1, pooled)  # beside ours
    auto = config.queues[queue].autoscale
    if auto is not None and auto.instance.interruptible is not None:
        plain = without_interruptible(config, queue)
        reports.insert(2, summarize(*run_watched(plain, queue, jobs, ON_DEMAND, seed, world=world)))
    for name, factory in (extra or {}).items():
        reports.append(
            summarize(*run_watched(config, queue, jobs, name, seed, world=world, factory=factory))
        )
    return reports, bound_price(config, queue)


def cheapest(config: Config, queue: str) -> ProviderParams:
    """The numbers of the queue's cheapest listed provider (the first of equal prices): the
    lower bound's and the references' price and boot. One provider: its own."""
    auto = config.queues[queue].autoscale
    assert auto is not None
    listed = [ProviderParams.for_provider(config, auto, p) for p in auto.providers]
    return min(listed, key=lambda p: p.price_per_hour)


def unfed_metric_queries(config: Config, queue: str) -> list[str]:
    """The Prometheus queries of `queue`'s metric triggers: a trace carries no such values."""
    auto = config.queues[queue].autoscale
    if auto is None:
        return []
    return [t.query for t in auto.scale_up if isinstance(t, MetricTrigger)]


def warnings_for(config: Config, queue: str, reports: list[PolicyReport]) -> list[str]:
    """What makes these figures say less than they seem to, one line each."""
    auto = config.queues[queue].autoscale
    assert auto is not None
    out = []
    held = saturation_warning(reports, auto.max_workers)
    if held:
        out.append(held)
    queries = unfed_metric_queries(config, queue)
    if queries:
        out.append(
            f"warning: queue {queue} scales on Prometheus ("
            + ", ".join(repr(q) for q in queries)
            + "), which a trace has no values for: those triggers never fire, and for our "
            "policy a missing metric value blocks scale-down (as when Prometheus fails), so "
            "its machines are never released and its cost is overstated"
        )
    return out


def reference_rows(
    config: Config, queue: str, jobs: list[Job], world: World | None = None
) -> list[str]:
    """The zero-wait oracle and the wait floor of `queue` on `jobs`, as table rows."""
    from autoscaler.sim.reference import wait_floor, zero_wait_oracle
    from autoscaler.sim.report import fmt_floor, fmt_oracle

    auto = config.queues[queue].autoscale
    assert auto is not None
    w = world or World()
    params = cheapest(config, queue)
    oracle = zero_wait_oracle(
        jobs, params.boot_s, params.price_per_hour, w.per_rental_dollars, w.worker_concurrency
    )
    bound = sum(j.runtime_s for j in jobs) / 3600.0 * params.price_per_hour
    floor = wait_floor(jobs, auto.max_workers, w.worker_concurrency)
    return [
        fmt_oracle(oracle.machine_hours, oracle.dollars, bound, oracle.rentals),
        fmt_floor(floor.p50, floor.p95, floor.p99, floor.max),
    ]


def table(
    config: Config,
    queue: str,
    jobs: list[Job],
    reports: list[PolicyReport],
    price: float,
    world: World | None = None,
) -> list[str]:
    """The cost table: every policy, then the references, then what each baseline is."""
    from autoscaler.sim.report import HEADER, fmt_bound, fmt_interruptible, fmt_row, fmt_warm

    lines = [HEADER, *(fmt_row(r) for r in reports)]
    lines += reference_rows(config, queue, jobs, world)
    lines.append(fmt_bound(reports[0], price))
    lines.append(front_line(reports))
    lines += [f"  {name}: {note}" for name, note in BASELINE_NOTES.items()]
    variant, _, note = pool_variant(config, queue)
    lines.append(f"  {variant}: {note}")
    if any(r.policy == ON_DEMAND for r in reports):
        lines.append(f"  {ON_DEMAND}: ours with every machine on demand (no interruptible)")
    lines += [line for r in reports if (line := fmt_warm(r)) is not None]
    lines.append(f"  {warm_assumptions(config, queue)}")
    lines += [line for r in reports if (line := fmt_interruptible(r)) is not None]
    bids = interruptible_assumptions(config, queue, world or World())
    if bids is not None:
        lines.append(f"  {bids}")
    return lines


def dominated_by(reports: list[PolicyReport]) -> list[str]:
    """The fair baselines both cheaper and faster (p95 wait) than ours, with nothing killed or
    unserved: what the goal "ours on or beyond their cost/wait front" rules out."""
    ours = next((r for r in reports if r.policy == "ours"), None)
    if ours is None:
        return []
    return [
        r.policy
        for r in reports
        if r.policy in BASELINE_NOTES
        and r.killed == 0
        and r.never_served == 0
        and r.dollars < ours.dollars
        and r.wait_p95 < ours.wait_p95
    ]


def front_line(reports: list[PolicyReport]) -> str:
    beaten = dominated_by(reports)
    return (
        "  front: no fair baseline is both cheaper and faster (p95) than ours"
        if not beaten
        else f"  front: cheaper AND faster than ours: {', '.join(beaten)}"
    )


def run_account(
    config: Config, jobs: list[Job], seed: int = 0, world: World | None = None
) -> tuple[list[PolicyReport], int]:
    """decide() on every enabled autoscaled queue of `config` in one run (one account: limits
    and priorities act across the queues); a job without a queue goes to the first one.
    Returns a report per queue and the peak of machines billing at once across them."""
    from autoscaler.sim.engine import Account

    sims = [
        Simulation(config, name, queue_jobs, decide_factory(), name=name, seed=seed, world=world)
        for name, queue_jobs in _account_queues(config, jobs)
    ]
    account = Account(sims)
    results = account.run()
    return [summarize(r) for r in results], peak_machines(results)


def baseline_accounts(
    config: Config, jobs: list[Job], seed: int = 0, world: World | None = None
) -> dict[str, tuple[list[PolicyReport], int]]:
    """Every fair baseline on every queue of the account, each queue scaled on its own (KEDA
    scalers and runqy have no account-wide cap or priority: `limits` do not hold them back).
    Per baseline: a report per queue and the peak of machines billing at once across them."""
    out = {}
    for policy, (factory, release_delay_s) in POLICIES.items():
        if policy == "ours":
            continue
        w = replace(world or World(), release_delay_s=release_delay_s)
        results = [
            Simulation(config, name, queue_jobs, factory(), name=name, seed=seed, world=w).run()
            for name, queue_jobs in _account_queues(config, jobs)
        ]
        out[policy] = ([summarize(r) for r in results], peak_machines(results))
    return out


def autoscaled_queues(config: Config) -> list[str]:
    """The queues with an enabled autoscale block, by name."""
    return [
        n
        for n, q in sorted(config.queues.items())
        if q.autoscale is not None and q.autoscale.enabled
    ]


def _account_queues(config: Config, jobs: list[Job]) -> list[tuple[str, list[Job]]]:
    names = autoscaled_queues(config)
    if not names:
        raise ValueError("the config has no queue with an enabled autoscale block")
    out = []
    for name in names:
        queue_jobs = jobs_for(jobs, name, names[0])
        check_span(config, name, queue_jobs)
        out.append((name, queue_jobs))
    return out


def peak_machines(results: list[Result]) -> int:
    """The most machines billing at the same moment across `results` (one account); a warm
    pool's machine counts only while not stopped."""
    edges = sorted(
        (t, step)
        for r in results
        for m in r.machines
        for a, b in m.running_spans(r.end_s)
        for t, step in ((a, 1), (b, -1))
    )
    peak = live = 0
    for _, step in edges:  # at equal times an end (-1) sorts first: touching is not overlap
        live += step
        peak = max(peak, live)
    return peak
