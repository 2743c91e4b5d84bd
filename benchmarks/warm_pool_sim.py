"""Warm pools in the simulator: every trace without a pool and with the tuned pool.

    python benchmarks/warm_pool_sim.py [--seed N] [--default-world] [--traces spiky,sparse]

Issue 21's measure: with a cold boot of 3 min and a resume of 40 s (`autoscaler/sim/provider.py`
says where these and the other assumptions come from), in the realistic world, the tuned pool
must cut the p95 wait by at least 30 % at no more than +5 % cost, or cut cost by at least 10 % at
an equal (no worse) p95, versus no pool.

Per trace (the shipped days and the generated unseen ones), the benchmark's queue as
`autoscaler/sim/traces/sim-config.yaml` sets it, run through decide() without a pool and with
each pool `autoscaler tune` sweeps (`tune.pool_options`: size × keep_for); the pool is tuned per
route: the one with the lowest p95 at no more than +5 % cost (route "wait"), the cheapest at a p95
no worse than without (route "cost"). Prints both, whether either route holds, and what the
pools did (resumes, warm misses, machine-hours stopped, storage).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from autoscaler.config.machine_specs import WarmPool
from autoscaler.config.models import Config
from autoscaler.sim.engine import World
from autoscaler.sim.report import PolicyReport, summarize
from autoscaler.sim.run import (
    load_sim_config,
    pick_queue,
    run_watched,
    warm_assumptions,
    with_pool,
)
from autoscaler.sim.trace import Job, load_trace
from autoscaler.sim.tracegen import GENERATORS, TRACES_DIR, UNSEEN
from autoscaler.sim.tune import _dur, pool_options

WAIT_CUT = 0.30
WAIT_COST_SLACK = 0.05
COST_CUT = 0.10


def run(
    config: Config,
    queue: str,
    jobs: list[Job],
    pool: tuple[int, float] | None,
    seed: int,
    world: World,
) -> PolicyReport:
    cfg = config
    if pool is not None:
        base = config.queues[queue].autoscale
        assert base is not None
        cfg = with_pool(
            config, queue, base.warm_pool.model_copy(update={"size": pool[0], "keep_for": pool[1]})
        )
    else:
        cfg = with_pool(config, queue, WarmPool())
    return summarize(*run_watched(cfg, queue, jobs, "ours", seed, world=world))


def row(label: str, r: PolicyReport, base: PolicyReport | None = None) -> str:
    delta = ""
    if base is not None:
        dc = (r.dollars / base.dollars - 1) * 100 if base.dollars else 0.0
        dw = (r.wait_p95 / base.wait_p95 - 1) * 100 if base.wait_p95 else 0.0
        delta = f"{dc:+7.1f}% {dw:+7.1f}%"
    else:
        delta = f"{'':>8} {'':>8}"
    return (
        f"  {label:<34}{r.dollars:>8.2f}{r.wait_p50:>7.0f}{r.wait_p95:>7.0f}{r.wait_p99:>7.0f}"
        f" {delta}{r.launches:>8}{r.resumes:>8}{r.warm_misses:>6}{r.stopped_hours:>8.1f}"
        f"{r.storage_dollars:>8.2f}"
    )


HEADER = (
    f"  {'':<34}{'$':>8}{'p50 s':>7}{'p95 s':>7}{'p99 s':>7} {'Δ$':>8} {'Δp95':>8}"
    f"{'rentals':>8}{'resumes':>8}{'miss':>6}{'stop h':>8}{'store $':>8}"
)


def tuned(
    base: PolicyReport, pooled: dict[tuple[int, float], PolicyReport]
) -> tuple[
    tuple[tuple[int, float], PolicyReport] | None, tuple[tuple[int, float], PolicyReport] | None
]:
    """The pool of each route: lowest p95 within +5 % cost; cheapest at no worse a p95."""
    ok = {k: r for k, r in pooled.items() if r.killed == 0 and r.never_served == 0}
    wait = [x for x in ok.items() if x[1].dollars <= base.dollars * (1 + WAIT_COST_SLACK)]
    cost = [x for x in ok.items() if x[1].wait_p95 <= base.wait_p95]
    by_wait = min(wait, key=lambda x: (x[1].wait_p95, x[1].dollars), default=None)
    by_cost = min(cost, key=lambda x: (x[1].dollars, x[1].wait_p95), default=None)
    return by_wait, by_cost


def verdict(base: PolicyReport, by_wait: PolicyReport | None, by_cost: PolicyReport | None) -> str:
    wait_ok = by_wait is not None and by_wait.wait_p95 <= base.wait_p95 * (1 - WAIT_CUT)
    cost_ok = by_cost is not None and by_cost.dollars <= base.dollars * (1 - COST_CUT)
    routes = [
        n
        for n, ok in (
            ("p95 −30 % at ≤ +5 % cost", wait_ok),
            ("cost −10 % at no worse p95", cost_ok),
        )
        if ok
    ]
    return "HOLDS (" + "; ".join(routes) + ")" if routes else "does not hold"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default=str(TRACES_DIR / "sim-config.yaml"))
    parser.add_argument(
        "--default-world", action="store_true", help="the exact world instead of the realistic one"
    )
    parser.add_argument("--traces", default=None, help="comma-separated names (default: all)")
    args = parser.parse_args()
    world = World() if args.default_world else World.realistic()
    config = load_sim_config(args.config)
    queue = pick_queue(config, None)
    auto = config.queues[queue].autoscale
    assert auto is not None
    traces: dict[str, Callable[[], list[Job]]] = {
        name: (lambda n=name: load_trace(TRACES_DIR / f"{n}.csv")) for name in GENERATORS
    }
    traces.update({f"{n} (unseen)": gen for n, gen in UNSEEN.items()})
    if args.traces:
        wanted = set(args.traces.split(","))
        traces = {k: v for k, v in traces.items() if k.split(" ")[0] in wanted}
    options = pool_options(auto.max_workers)
    print(
        f"config {args.config}: queue {queue}, max {auto.max_workers}, seed {args.seed}, "
        f"{'default' if args.default_world else 'realistic'} world"
    )
    print(warm_assumptions(config, queue))
    print(f"pools swept: size × keep_for = {', '.join(f'{n}/{_dur(k)}' for n, k in options)}")
    for name, gen in traces.items():
        jobs = gen()
        started = time.perf_counter()
        print(f"\n{name}: {len(jobs)} jobs")
        print(HEADER)
        base = run(config, queue, jobs, None, args.seed, world)
        pooled = {o: run(config, queue, jobs, o, args.seed, world) for o in options}
        by_wait, by_cost = tuned(base, pooled)
        print(row("no pool", base))
        for route, pick in (("p95", by_wait), ("cost", by_cost)):
            if pick is None:
                print(f"  tuned for {route}: no pool qualifies")
                continue
            (n, keep), r = pick
            print(row(f"pool {n}/{_dur(keep)} ({route})", r, base))
        print(
            "  acceptance "
            + verdict(base, by_wait[1] if by_wait else None, by_cost[1] if by_cost else None)
        )
        print(f"  ({time.perf_counter() - started:.1f}s)")


if __name__ == "__main__":
    main()
