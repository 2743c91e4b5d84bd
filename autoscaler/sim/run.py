"""Run our policy and the baselines on one trace: the shared entry of the CLI and benchmark."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from autoscaler.config import load_config
from autoscaler.config.models import Config, MetricTrigger, MockProvider, ProviderConfig
from autoscaler.policy.decide import decide
from autoscaler.policy.plan import Plan
from autoscaler.policy.snapshot import Snapshot
from autoscaler.sim.baselines import KedaLike, RunqyOriginal
from autoscaler.sim.engine import Policy, Result, Simulation
from autoscaler.sim.provider import ProviderParams
from autoscaler.sim.report import Report, Saturation, saturation_warning, summarize
from autoscaler.sim.trace import Job, load_trace

POLICIES: dict[str, tuple[Callable[[], Policy], bool]] = {
    # name: (fresh policy factory, fast path on arrival at an empty queue)
    "ours": (lambda: decide, True),
    "runqy-original": (RunqyOriginal, False),
    "keda-like": (KedaLike, False),
}


def load_sim_config(path: str | Path) -> Config:
    """The normal YAML config; a provider it names but does not declare is simulated."""
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    declared = set((data.get("providers") or {}).keys()) if isinstance(data, dict) else set()
    named: dict[str, ProviderConfig] = {}
    queues = data.get("queues") if isinstance(data, dict) else None
    for q in (queues or {}).values():
        auto = q.get("autoscale") if isinstance(q, dict) else None
        prov = auto.get("provider") if isinstance(auto, dict) else None
        if isinstance(prov, str) and prov not in declared:
            named[prov] = MockProvider(kind="mock")
    return load_config(path, registered_providers=named)


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
