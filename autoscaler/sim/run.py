"""Run our policy and the baselines on one trace: the shared entry of the CLI and benchmark."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from autoscaler.config import load_config_text
from autoscaler.config.loader import parse_yaml_document, read_config_text
from autoscaler.config.models import Config, MetricTrigger, MockProvider, ProviderConfig
from autoscaler.policy.decide import decide
from autoscaler.policy.plan import Plan
from autoscaler.policy.snapshot import Snapshot
from autoscaler.sim.baselines import KedaLike, RunqyOriginal
from autoscaler.sim.engine import DAY_S, TAIL_S, Policy, Result, Simulation
from autoscaler.sim.provider import ProviderParams
from autoscaler.sim.report import Report, Saturation, saturation_warning, summarize
from autoscaler.sim.trace import Job, load_trace

POLICIES: dict[str, tuple[Callable[[], Policy], bool]] = {
    # name: (fresh policy factory, fast path on arrival at an empty queue)
    "ours": (lambda: decide, True),
    "runqy-original": (RunqyOriginal, False),
    "keda-like": (KedaLike, False),
}


MAX_SIM_TICKS = 200_000
"""Evaluations per policy a simulation may take (span of the trace / poll interval): about
20 s for the three policies. A trace spanning a year polled every second would take hours."""


class SimulationTooLong(ValueError):
    """The trace spans too many polls to replay in reasonable time; the message has the fix."""


def load_sim_config(path: str | Path) -> Config:
    """The normal YAML config; a provider it names but does not declare is simulated.

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
            if isinstance(prov, str) and prov not in declared:
                named[prov] = MockProvider(kind="mock")
    return load_config_text(text, str(path), registered_providers=named, runnable=True)


def check_span(config: Config, queue: str, jobs: list[Job]) -> None:
    """SimulationTooLong when replaying `jobs` would take more than MAX_SIM_TICKS polls."""
    auto = config.queues[queue].autoscale if queue in config.queues else None
    poll = (auto.poll_interval if auto is not None else None) or config.poll_interval
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
            if sum(1 for m in qs.machines if m.billing) >= saturation.max_workers:
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
) -> tuple[Result, Saturation]:
    """One run, and how often the queue was held at its max_workers with jobs pending."""
    factory, fast = POLICIES[policy]
    auto = config.queues[queue].autoscale if queue in config.queues else None
    saturation = Saturation(auto.max_workers if auto is not None else 0)
    sim = Simulation(
        config,
        queue,
        jobs,
        watched(factory(), queue, saturation),
        name=policy,
        seed=seed,
        fast_path=fast,
        keep_log=keep_log,
    )
    return sim.run(), saturation


def run_one(
    config: Config,
    queue: str,
    jobs: list[Job],
    policy: str,
    seed: int = 0,
    keep_log: bool = False,
) -> Result:
    return run_watched(config, queue, jobs, policy, seed, keep_log)[0]


def compare(
    config: Config, queue: str, jobs: list[Job], seed: int = 0
) -> tuple[list[Report], float]:
    """Reports for every policy on the same trace and seed, and the price used."""
    check_span(config, queue, jobs)
    reports = [summarize(*run_watched(config, queue, jobs, p, seed)) for p in POLICIES]
    auto = config.queues[queue].autoscale
    assert auto is not None
    return reports, ProviderParams.for_queue(config, auto).price_per_hour


def unfed_metric_queries(config: Config, queue: str) -> list[str]:
    """The Prometheus queries of `queue`'s metric triggers: a trace carries no such values."""
    auto = config.queues[queue].autoscale
    if auto is None:
        return []
    return [t.query for t in auto.scale_up if isinstance(t, MetricTrigger)]


def warnings_for(config: Config, queue: str, reports: list[Report]) -> list[str]:
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


def compare_files(
    trace: str | Path, config_path: str | Path, queue: str | None = None, seed: int = 0
) -> tuple[str, list[Report], float]:
    config = load_sim_config(config_path)
    name = pick_queue(config, queue)
    jobs = jobs_for(load_trace(trace), name, name)
    reports, price = compare(config, name, jobs, seed)
    return name, reports, price
