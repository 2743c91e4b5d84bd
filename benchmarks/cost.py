"""Cost benchmark: our policy vs runqy-original vs KEDA-like on three seeded one-day traces.

    python benchmarks/cost.py [--seed N]

Prints, per trace, machine-hours, dollars (boot and idle tails included), the ratio to the
lower bound Σ(job runtime) × price, job wait p50/p95/p99/max, jobs never served, jobs killed
with their machine, and rentals. Traces and config: autoscaler/sim/traces/.
"""

from __future__ import annotations

import argparse
import time

from autoscaler.sim.report import HEADER, fmt_bound, fmt_row
from autoscaler.sim.run import compare, load_sim_config, pick_queue
from autoscaler.sim.trace import load_trace
from autoscaler.sim.tracegen import GENERATORS, TRACES_DIR


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default=str(TRACES_DIR / "sim-config.yaml"))
    args = parser.parse_args()
    config = load_sim_config(args.config)
    queue = pick_queue(config, None)
    auto = config.queues[queue].autoscale
    assert auto is not None
    print(f"config {args.config}: queue {queue}, min {auto.min_workers}, max {auto.max_workers}, "
          f"seed {args.seed}")
    for name in GENERATORS:
        jobs = load_trace(TRACES_DIR / f"{name}.csv")
        started = time.perf_counter()
        reports, price = compare(config, queue, jobs, args.seed)
        took = time.perf_counter() - started
        print(f"\n{name}: {len(jobs)} jobs, {sum(j.runtime_s for j in jobs) / 3600:.1f} h of "
              f"work, ${price:.2f}/h  (3 policies simulated in {took:.1f}s)")
        print(HEADER)
        for r in reports:
            print(fmt_row(r))
        print(fmt_bound(reports[0], price))


if __name__ == "__main__":
    main()
