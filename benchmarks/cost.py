"""Cost benchmark: our policy vs fair runqy and KEDA baselines on seeded traces.

    python benchmarks/cost.py [--seed N] [--realistic] [--unseen]

The three shipped one-day traces, and with --unseen five more generated ones (sparse, a burst
of short jobs, a long + short mix, a trickle, a second diurnal day).

Prints, per trace, machine-hours, dollars (boot and idle tails included), the ratio to the
lower bound Σ(job runtime) × price, job wait p50/p95/p99/max, jobs never served, jobs killed
with their machine, and rentals — for ours with and without a warm pool (`ours+pool`, and what
its pool did), and the baselines (no pool). Traces and config: autoscaler/sim/traces/.
`benchmarks/warm_pool_sim.py` tunes the pool per trace against issue 21's goal.
"""

from __future__ import annotations

import argparse
import time

from autoscaler.sim.candidates import CANDIDATES
from autoscaler.sim.engine import World
from autoscaler.sim.run import compare, load_sim_config, pick_queue, table
from autoscaler.sim.trace import Job, load_trace
from autoscaler.sim.tracegen import GENERATORS, TRACES_DIR, UNSEEN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default=str(TRACES_DIR / "sim-config.yaml"))
    parser.add_argument(
        "--realistic",
        action="store_true",
        help="metric lag, drain races, per-rental cost, failed boots reported dead",
    )
    parser.add_argument("--unseen", action="store_true", help="also the generated traces")
    parser.add_argument(
        "--month",
        action="store_true",
        help="also time a 30-day trace (30 diurnal days) through every policy",
    )
    parser.add_argument(
        "--candidates",
        action="store_true",
        help="also the candidate rules of autoscaler/sim/candidates.py",
    )
    args = parser.parse_args()
    world = World.realistic() if args.realistic else World()
    config = load_sim_config(args.config)
    queue = pick_queue(config, None)
    auto = config.queues[queue].autoscale
    assert auto is not None
    print(
        f"config {args.config}: queue {queue}, min {auto.min_workers}, max {auto.max_workers}, "
        f"seed {args.seed}, world {world}"
    )
    traces = {name: load_trace(TRACES_DIR / f"{name}.csv") for name in GENERATORS}
    if args.unseen:
        traces.update({f"{name} (unseen)": gen() for name, gen in UNSEEN.items()})
    if args.month:
        month = [
            Job(j.arrival_s + day * 86400.0, j.runtime_s)
            for day in range(30)
            for j in GENERATORS["diurnal"](1000 + day)
        ]
        traces["month (30 diurnal days)"] = month
    for name, jobs in traces.items():
        started = time.perf_counter()
        reports, price = compare(
            config, queue, jobs, args.seed, world, CANDIDATES if args.candidates else None
        )
        took = time.perf_counter() - started
        print(
            f"\n{name}: {len(jobs)} jobs, {sum(j.runtime_s for j in jobs) / 3600:.1f} h of "
            f"work, ${price:.2f}/h  ({len(reports)} policies simulated in {took:.1f}s)"
        )
        for line in table(config, queue, jobs, reports, price, world):
            print(line)


if __name__ == "__main__":
    main()
