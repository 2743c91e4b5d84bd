"""`autoscaler tune --trace FILE --config FILE --p95-wait 2m`: settings picked from your traffic.

Sweeps the autoscale settings of one queue — the idle timeout (fixed, or learned from the
trace's gaps as decide() does by default), the queue_depth target per worker, the latency
trigger's max_latency, min_workers — replays the trace through decide()
for each setting (in parallel, one process per core); then the warm pool: every setting on
that sweep's cost/wait front again with each `warm_pool` size (1, 2, 4, 8, 16, never above
max_workers) and `keep_for` (1h, 4h, 1d), where the provider can stop machines. Prints:

- the cheapest setting whose p95 job wait holds the target, with no job killed or unserved;
- the Pareto front of cost against p95 wait (no other setting is both cheaper and faster);
- the cheapest without a warm pool beside it, so what the pool is worth is seen;
- the YAML block of the chosen setting, to paste under the queue's `autoscale:`.

Everything else of the queue (provider, max_workers, instance, schedule and metric triggers)
is kept as the config has it: max_workers is the user's budget, not a knob to tune.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import click
import yaml

from autoscaler.boundary import Refused
from autoscaler.config import ConfigError
from autoscaler.config.durations import parse_duration
from autoscaler.config.machine_specs import WarmPool
from autoscaler.config.models import Autoscale, Config
from autoscaler.config.triggers import (
    IdleTrigger,
    LatencyTrigger,
    NoWorkersTrigger,
    QueueDepthTrigger,
    ScaleDownTrigger,
    ScaleUpTrigger,
)
from autoscaler.sim.cli import CONFIG_OPTION, TRACE_OPTION
from autoscaler.sim.engine import World
from autoscaler.sim.provider import ProviderParams
from autoscaler.sim.report import PolicyReport, summarize
from autoscaler.sim.run import check_span, jobs_for, load_sim_config, pick_queue, run_watched
from autoscaler.sim.trace import Job, TraceError, load_trace

IDLE_TIMEOUTS = (60.0, 120.0, 300.0, 600.0, 1800.0)
TARGETS = (1, 2, 4)
MAX_LATENCIES: tuple[float | None, ...] = (None, 60.0, 120.0, 300.0)
MIN_WORKERS = (0, 1)
LEARN = (True, False)
POOL_SIZES = (1, 2, 4, 8, 16)
KEEP_FORS = (3600.0, 4 * 3600.0, 86400.0)
"""The warm pools swept on the front of the settings without one (`pool_grid`)."""


@dataclass(frozen=True)
class Setting:
    idle_timeout: float
    target_per_worker: int
    max_latency: float | None
    min_workers: int
    learn: bool = True
    pool_size: int = 0
    keep_for: float = 86400.0

    def warm_pool(self, base: Autoscale) -> WarmPool:
        """`base`'s warm pool with this setting's size and keep_for (size 0: no pool)."""
        return base.warm_pool.model_copy(
            update={"size": min(self.pool_size, base.max_workers), "keep_for": self.keep_for}
        )

    def autoscale(self, base: Autoscale) -> Autoscale:
        """`base` with this setting's triggers and warm pool; its other triggers are kept."""
        up: list[ScaleUpTrigger] = [NoWorkersTrigger(trigger="no_workers")]
        up.append(
            QueueDepthTrigger(trigger="queue_depth", target_per_worker=self.target_per_worker)
        )
        if self.max_latency is not None:
            up.append(LatencyTrigger(trigger="latency", max_latency=self.max_latency))
        up += [
            t
            for t in base.scale_up
            if not isinstance(t, NoWorkersTrigger | QueueDepthTrigger | LatencyTrigger)
        ]
        down: list[ScaleDownTrigger] = [
            IdleTrigger(trigger="idle", timeout=self.idle_timeout, learn=self.learn)
        ]
        down += [t for t in base.scale_down if not isinstance(t, IdleTrigger)]
        return base.model_copy(
            update={
                "scale_up": tuple(up),
                "scale_down": tuple(down),
                "min_workers": min(self.min_workers, base.max_workers),
                "warm_pool": self.warm_pool(base),
            }
        )

    def yaml_block(self, base: Autoscale) -> str:
        up: list[dict[str, object]] = [{"trigger": "no_workers"}]
        up.append({"trigger": "queue_depth", "target_per_worker": self.target_per_worker})
        if self.max_latency is not None:
            up.append({"trigger": "latency", "max_latency": _dur(self.max_latency)})
        kept = [
            t.model_dump(mode="json", exclude_none=True)
            for t in base.scale_up
            if not isinstance(t, NoWorkersTrigger | QueueDepthTrigger | LatencyTrigger)
        ]
        idle: dict[str, object] = {"trigger": "idle", "timeout": _dur(self.idle_timeout)}
        if not self.learn:
            idle["learn"] = False
        down: list[dict[str, object]] = [idle]
        down += [
            t.model_dump(mode="json", exclude_none=True)
            for t in base.scale_down
            if not isinstance(t, IdleTrigger)
        ]
        block: dict[str, object] = {
            "min_workers": min(self.min_workers, base.max_workers),
            "max_workers": base.max_workers,
            "scale_up": up + kept,
            "scale_down": down,
        }
        if self.pool_size > 0 or base.warm_pool.size > 0:
            pool = self.warm_pool(base)
            shown: dict[str, object] = {"size": pool.size}
            if pool.size > 0:
                shown["keep_for"] = _dur(pool.keep_for)
                if "resume_timeout" in base.warm_pool.model_fields_set:
                    shown["resume_timeout"] = _dur(pool.resume_timeout)
            block["warm_pool"] = shown
        return yaml.safe_dump(block, sort_keys=False, default_flow_style=False)

    def describe(self) -> str:
        lat = f"latency {_dur(self.max_latency)}" if self.max_latency is not None else "no latency"
        learned = " (learned)" if self.learn else " (fixed)"
        pool = f", pool {self.pool_size} for {_dur(self.keep_for)}" if self.pool_size else ""
        return (
            f"idle {_dur(self.idle_timeout)}{learned}, target {self.target_per_worker}/worker, "
            f"{lat}, min {self.min_workers}{pool}"
        )


def _dur(seconds: float) -> str:
    s = round(seconds)
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


def grid() -> list[Setting]:
    return [
        Setting(idle, target, lat, mn, learn)
        for idle, target, lat, mn, learn in itertools.product(
            IDLE_TIMEOUTS, TARGETS, MAX_LATENCIES, MIN_WORKERS, LEARN
        )
    ]


def pool_options(max_workers: int) -> list[tuple[int, float]]:
    """(size, keep_for) of the warm pools swept: POOL_SIZES never above max_workers."""
    sizes = sorted({min(n, max_workers) for n in POOL_SIZES if max_workers > 0})
    return [(n, keep) for n in sizes for keep in KEEP_FORS]


def pool_grid(settings: Sequence[Setting], max_workers: int) -> list[Setting]:
    """Each of `settings` with each warm pool of `pool_options`."""
    return [
        replace(s, pool_size=n, keep_for=keep)
        for s in settings
        for n, keep in pool_options(max_workers)
    ]


# one per worker process: the config, queue, jobs, world and seed of the sweep
_STATE: tuple[Config, str, list[Job], World, int] | None = None


def _init(config: Config, queue: str, jobs: list[Job], world: World, seed: int) -> None:
    global _STATE
    _STATE = (config, queue, jobs, world, seed)


def _run(setting: Setting) -> tuple[Setting, PolicyReport]:
    assert _STATE is not None
    config, queue, jobs, world, seed = _STATE
    return setting, evaluate(config, queue, jobs, setting, world, seed)


def evaluate(
    config: Config, queue: str, jobs: list[Job], setting: Setting, world: World, seed: int = 0
) -> PolicyReport:
    """One setting replayed through decide()."""
    q = config.queues[queue]
    assert q.autoscale is not None
    tuned = q.model_copy(update={"autoscale": setting.autoscale(q.autoscale)})
    cfg = config.model_copy(update={"queues": {**config.queues, queue: tuned}})
    return summarize(*run_watched(cfg, queue, jobs, "ours", seed, world=world))


def sweep(
    config: Config,
    queue: str,
    jobs: list[Job],
    settings: Sequence[Setting],
    world: World | None = None,
    seed: int = 0,
    workers: int | None = None,
) -> list[tuple[Setting, PolicyReport]]:
    """Every setting's report, in the order of `settings`."""
    world = world or World()
    if not settings:
        return []
    workers = workers or max(1, min(len(settings), os.cpu_count() or 1))
    if workers == 1:
        return [(s, evaluate(config, queue, jobs, s, world, seed)) for s in settings]
    with ProcessPoolExecutor(
        max_workers=workers, initializer=_init, initargs=(config, queue, jobs, world, seed)
    ) as pool:
        return list(pool.map(_run, settings, chunksize=max(1, len(settings) // (4 * workers))))


def ok(r: PolicyReport) -> bool:
    return r.killed == 0 and r.never_served == 0


def pareto(results: list[tuple[Setting, PolicyReport]]) -> list[tuple[Setting, PolicyReport]]:
    """Settings no other one beats on both cost and p95 wait, by cost ascending."""
    front: list[tuple[Setting, PolicyReport]] = []
    done = sorted((x for x in results if ok(x[1])), key=lambda x: (x[1].dollars, x[1].wait_p95))
    for s, r in done:
        if not front or r.wait_p95 < front[-1][1].wait_p95:
            front.append((s, r))
    return front


def cheapest(
    results: list[tuple[Setting, PolicyReport]], p95: float
) -> tuple[Setting, PolicyReport] | None:
    held = [x for x in results if ok(x[1]) and x[1].wait_p95 <= p95]
    return min(held, key=lambda x: (x[1].dollars, x[1].wait_p95)) if held else None


def tune_all(
    config: Config,
    queue: str,
    jobs: list[Job],
    world: World | None = None,
    seed: int = 0,
    workers: int | None = None,
    settings: Sequence[Setting] | None = None,
) -> tuple[list[tuple[Setting, PolicyReport]], int]:
    """The whole sweep: `settings` (default `grid()`) without a warm pool, then every setting on
    their cost/wait front with each warm pool (`pool_grid`), where the queue's provider can
    stop machines. Every result, and how many were swept with a pool."""
    auto = config.queues[queue].autoscale
    assert auto is not None
    plain = sweep(config, queue, jobs, list(settings or grid()), world, seed, workers)
    if not ProviderParams.for_queue(config, auto).can_stop:
        return plain, 0
    pooled = pool_grid([s for s, _ in pareto(plain)], auto.max_workers)
    return plain + sweep(config, queue, jobs, pooled, world, seed, workers), len(pooled)


ROW = f"{'setting':<72}{'$':>8}{'ratio':>7}{'p50 s':>7}{'p95 s':>7}{'p99 s':>7}{'rentals':>8}"


def fmt(label: str, r: PolicyReport) -> str:
    return (
        f"{label:<72}{r.dollars:>8.2f}{r.ratio:>7.2f}{r.wait_p50:>7.0f}{r.wait_p95:>7.0f}"
        f"{r.wait_p99:>7.0f}{r.launches:>8}"
    )


@click.command("tune")
@TRACE_OPTION
@CONFIG_OPTION
@click.option("--queue", default=None, help="Queue to tune (default: the first autoscaled one).")
@click.option(
    "--p95-wait",
    "p95_wait",
    required=True,
    help='Target for the 95th percentile job wait, e.g. "2m" or 90.',
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--realistic",
    is_flag=True,
    help="Sweep in the harder world (metric lag, drain race, per-rental cost).",
)
@click.option(
    "--jobs",
    "workers",
    default=None,
    type=int,
    help="Processes to sweep with (default: one per core).",
)
def tune(
    trace: str,
    config_path: str,
    queue: str | None,
    p95_wait: str,
    seed: int,
    realistic: bool,
    workers: int | None,
) -> None:
    """Sweep a queue's autoscale settings on TRACE; print the cheapest that holds --p95-wait,
    the cost/wait Pareto front and the YAML block to paste."""
    try:
        target = parse_duration(p95_wait)
        config = load_sim_config(config_path)
        name = pick_queue(config, queue)
        if name not in config.queues or config.queues[name].autoscale is None:
            raise ValueError(f"queue {name!r} has no autoscale block in the config")
        jobs = jobs_for(load_trace(trace), name, name)
        check_span(config, name, jobs)
    except (ConfigError, TraceError, ValueError) as exc:
        raise Refused(str(exc)) from None
    if workers is not None and workers < 1:
        raise Refused("--jobs must be at least 1")
    world = World.realistic() if realistic else World()
    auto = config.queues[name].autoscale
    assert auto is not None
    current = summarize(*run_watched(config, name, jobs, "ours", seed, world=world))
    results, pooled = tune_all(config, name, jobs, world, seed, workers)
    click.echo(
        f"queue {name}: {len(jobs)} jobs, {len(results) - pooled} settings swept without a warm "
        f"pool, then the {pooled // max(1, len(pool_options(auto.max_workers)))} on their front "
        f"with {len(pool_options(auto.max_workers))} warm pools each (max_workers "
        f"{auto.max_workers} kept), p95 wait target {_dur(target)}"
        if pooled
        else f"queue {name}: {len(jobs)} jobs, {len(results)} settings swept (max_workers "
        f"{auto.max_workers} kept; its provider cannot stop machines: no warm pool), p95 wait "
        f"target {_dur(target)}"
    )
    click.echo(ROW)
    click.echo(fmt("your config as it is", current))
    best = cheapest(results, target)
    if best is None:
        fastest = min((x for x in results if ok(x[1])), key=lambda x: x[1].wait_p95, default=None)
        click.echo(
            f"no setting holds a p95 wait of {_dur(target)} on this trace"
            + (
                f" (the fastest reaches {fastest[1].wait_p95:.0f} s: {fastest[0].describe()})"
                if fastest
                else ""
            )
            + "; raise max_workers or the target"
        )
    else:
        click.echo(fmt("cheapest holding the target:", best[1]))
        click.echo(f"  {best[0].describe()}")
        if pooled:
            plain = cheapest([x for x in results if x[0].pool_size == 0], target)
            if plain is None:
                click.echo("without a warm pool no setting holds the target")
            elif plain[0] != best[0]:
                click.echo(fmt("without a warm pool:", plain[1]))
                click.echo(f"  {plain[0].describe()}")
            else:
                click.echo("a warm pool does not pay on this trace: the cheapest has none")
        if current.wait_p95 <= target and current.dollars <= best[1].dollars and ok(current):
            click.echo("your config already holds the target at no more cost")
    click.echo("")
    click.echo("Pareto front (cost against p95 wait; no other setting is cheaper and faster):")
    click.echo(ROW)
    for s, r in pareto(results):
        mark = " *" if best is not None and s == best[0] else ""
        click.echo(fmt(s.describe() + mark, r))
    if best is not None:
        click.echo("")
        click.echo(f"paste under queues.{name}.autoscale (provider and instance unchanged):")
        click.echo(best[0].yaml_block(auto).rstrip())
