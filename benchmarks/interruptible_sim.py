"""Interruptible machines in the simulator: the mixed fleet against all on demand.

    python benchmarks/interruptible_sim.py [--seeds 0] [--realistic] [--traces diurnal]
                                           [--no-sweep]

The issue's measure: the benchmark's queue (`autoscaler/sim/traces/sim-config.yaml`: $0.60/h,
3 min boots ±25 %, 3 % failed boots, 2 % capacity errors, max_workers 16) all on demand, and
mixed — up to 70 % of its machines rented at a bid of "50%" of the on-demand price ($0.30/h),
decide()'s launch rule (`policy/decide._interruptible_launches`) — at 2 %, 5 % and 20 %
preemptions per machine-hour with `acks_late`, and at 5 % with Celery's default early acks.
Goal at 5 %/h, acks late: cost ≤ 0.7× all on demand, p95 wait within 10 % of it, no job lost.
Then a sweep of the rate for where interruptible stops paying: the first rate at which the
mixed fleet's p95 leaves the 10 % band, or its cost reaches all on demand's. The model's
assumptions: `autoscaler/sim/provider.py` (preempted: billing and capacity end at once, the
queue evaluated at once, the jobs handed back 20 s later). The loader accepts `interruptible`
only with a Vast provider; the benchmark puts the bid on the loaded config
(`sim.interruptible.with_interruptible`), its mock provider standing for the Vast offer.

Measured (default world, seed 0, after decide() keeps the share when draining too; "×od":
over all on demand; "int. share": the share of machine-hours billed on interruptible
machines; rerun = jobs handed back and run again, lost = jobs lost with their machine):

| day | fleet | $ | ×od $ | p95 s | ×od p95 | int. share | preempt. | rerun | lost |
|---|---|---|---|---|---|---|---|---|---|
| steady | all on demand | 34.25 | 1.00 | 285 | 1.00 | 0 % | 0 | 0 | 0 |
| steady | mixed 2 %/h | 25.92 | 0.757 | 264 | 0.93 | 51 % | 0 | 0 | 0 |
| steady | mixed 5 %/h | 26.17 | 0.764 | 265 | 0.93 | 51 % | 2 | 2 | 0 |
| steady | mixed 20 %/h | 25.78 | 0.753 | 274 | 0.96 | 52 % | 10 | 7 | 0 |
| steady | mixed 5 %/h, early acks | 25.87 | 0.755 | 265 | 0.93 | 51 % | 2 | 0 | 2 |
| diurnal | all on demand | 42.72 | 1.00 | 262 | 1.00 | 0 % | 0 | 0 | 0 |
| diurnal | mixed 2 %/h | 30.77 | 0.720 | 276 | 1.05 | 56 % | 0 | 0 | 0 |
| diurnal | mixed 5 %/h | 30.83 | 0.722 | 270 | 1.03 | 56 % | 2 | 2 | 0 |
| diurnal | mixed 20 %/h | 30.59 | 0.716 | 276 | 1.05 | 56 % | 5 | 4 | 0 |
| diurnal | mixed 5 %/h, early acks | 31.07 | 0.727 | 274 | 1.04 | 56 % | 2 | 0 | 2 |
| spiky | all on demand | 30.40 | 1.00 | 905 | 1.00 | 0 % | 0 | 0 | 0 |
| spiky | mixed 2 %/h | 22.05 | 0.725 | 905 | 1.00 | 56 % | 0 | 0 | 0 |
| spiky | mixed 5 %/h | 22.31 | 0.734 | 902 | 1.00 | 56 % | 3 | 3 | 0 |
| spiky | mixed 20 %/h | 22.15 | 0.729 | 914 | 1.01 | 56 % | 9 | 7 | 0 |
| spiky | mixed 5 %/h, early acks | 22.22 | 0.731 | 905 | 1.00 | 56 % | 3 | 0 | 3 |

The 0.70× goal is not met: at most floor(0.7 × n) of n machines are interruptible (none of 1,
1 of 2, 2 of 3, 2 of 4), and these fleets average 3–4 machines, so about half the
machine-hours are billed at the bid, not 70 %. Before decide() kept the share when draining
(the launch rule alone) the same runs cost 0.705–0.727× with the fleet above max_share at 2–16
% of the evaluations; keeping the promise costs 0.02–0.05 more. max_share 0.8 or a bid of 45 %
brings the cost under 0.70×.

Where interruptible stops paying (acks late, seed 0, the sweep of `main`): the p95 leaves the
10 % band at 1.5/h (steady), 0.75/h (diurnal), 3/h (spiky) preemptions per machine-hour; the
cost reaches all on demand's only near 20/h (diurnal 1.27×, spiky 1.12×, steady 0.89×).
"""

from __future__ import annotations

import argparse
import time

from autoscaler.sim.engine import World
from autoscaler.sim.interruptible import (
    BID,
    COST_GOAL,
    MAX_SHARE,
    P95_SLACK,
    RATES,
    SWEEP,
    MixedRun,
    mixed,
    on_demand,
    point,
    stops_paying,
    with_interruptible,
)
from autoscaler.sim.report import PolicyReport
from autoscaler.sim.run import load_sim_config
from autoscaler.sim.trace import load_trace
from autoscaler.sim.tracegen import GENERATORS, TRACES_DIR

CONFIG = TRACES_DIR / "sim-config.yaml"
QUEUE = "inference"
GOAL_RATE = 0.05

HEADER = (
    f"  {'':<28}{'$':>8}{'×od $':>8}{'p95 s':>7}{'×od p95':>8}{'p99 s':>7}{'int. h':>8}"
    f"{'share':>7}{'preempt':>8}{'rerun':>6}{'lost':>5}{'unserved':>9}"
)


def row(label: str, r: PolicyReport, base: PolicyReport) -> str:
    cost = r.dollars / base.dollars if base.dollars else 1.0
    p95 = r.wait_p95 / base.wait_p95 if base.wait_p95 else 1.0
    share = r.interruptible_hours / r.machine_hours if r.machine_hours else 0.0
    return (
        f"  {label:<28}{r.dollars:>8.2f}{cost:>8.3f}{r.wait_p95:>7.0f}{p95:>8.2f}"
        f"{r.wait_p99:>7.0f}{r.interruptible_hours:>8.1f}{share:>7.0%}{r.preemptions:>8}"
        f"{r.reruns:>6}{r.lost:>5}{r.never_served:>9}"
    )


def verdict(run: MixedRun) -> str:
    holds = run.goal_holds()
    return (
        f"  goal at {run.rate:.0%}/h, acks {run.acks}: cost {run.cost_ratio():.3f}× (≤ "
        f"{COST_GOAL:.2f}), p95 {run.p95_ratio():.2f}× (≤ {1 + P95_SLACK:.2f}), "
        f"{run.report.lost} lost: {'HOLDS' if holds else 'DOES NOT HOLD'}"
    )


def main() -> None:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("--realistic", action="store_true", help="the realistic world")
    parser.add_argument("--traces", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the rate sweep")
    parser.add_argument("--bid", default=BID, help='the bid: dollars or a share ("50%%")')
    parser.add_argument("--max-share", type=float, default=MAX_SHARE)
    args = parser.parse_args()
    bid: float | str = args.bid if args.bid.endswith("%") else float(args.bid)
    plain = load_sim_config(args.config)
    config = with_interruptible(plain, QUEUE, bid, args.max_share)
    world = World.realistic() if args.realistic else World()
    seeds = [int(s) for s in args.seeds.split(",")]
    names = [n for n in GENERATORS if not args.traces or n in args.traces.split(",")]
    auto = config.queues[QUEUE].autoscale
    assert auto is not None and auto.instance.interruptible is not None
    spec = auto.instance.interruptible
    od_price = auto.instance.max_price_per_hour
    print(
        f"config {args.config}: queue {QUEUE}, bid {spec.bid} (${spec.price(od_price):.2f}/h of "
        f"${od_price:.2f}/h) on at most {spec.max_share:.0%} of the machines, "
        f"{'realistic' if args.realistic else 'default'} world, seeds {args.seeds}; handed back "
        f"{world.handback_s:g} s after reconcile's round sees a preemption"
    )
    missed = 0
    sweeps: dict[str, dict[float, list[MixedRun]]] = {}
    for name in names:
        jobs = load_trace(TRACES_DIR / f"{name}.csv")
        for seed in seeds:
            started = time.perf_counter()
            base = on_demand(config, QUEUE, jobs, seed, world)
            print(f"\n{name}, seed {seed}: {len(jobs)} jobs")
            print(HEADER)
            print(row("all on demand", base, base))
            runs = [mixed(config, QUEUE, jobs, r, "late", seed, world, base) for r in RATES]
            early = mixed(config, QUEUE, jobs, GOAL_RATE, "early", seed, world, base)
            for run in [*runs, early]:
                print(row(f"mixed {run.rate:.0%}/h, acks {run.acks}", run.report, base))
            goal = next(r for r in runs if r.rate == GOAL_RATE)
            print(verdict(goal))
            missed += not goal.goal_holds()
            if not args.no_sweep:
                day = sweeps.setdefault(name, {})
                for r in runs:
                    day.setdefault(r.rate, []).append(r)
                for rate in SWEEP:
                    if rate not in RATES:
                        day.setdefault(rate, []).append(
                            mixed(config, QUEUE, jobs, rate, "late", seed, world, base)
                        )
            print(f"  ({time.perf_counter() - started:.1f}s)")
    print(f"\nday × seed runs missing the goal at {GOAL_RATE:.0%}/h: {missed}")
    if args.no_sweep:
        return
    print(
        f"\nsweep (acks late; mean over seeds {args.seeds}): ×od $ / ×od p95 per rate; stops "
        f"paying where the p95 leaves +{P95_SLACK:.0%} or the cost reaches on demand's"
    )
    print(f"  {'rate /h':>8}" + "".join(f"{n:>16}" for n in sweeps))
    for rate in SWEEP:
        cells = [point(sweeps[name][rate]) for name in sweeps]
        print(f"  {rate:>8g}" + "".join(f"{f'{c:.3f} / {w:.2f}':>16}" for _, c, w in cells))
    for name, day in sweeps.items():
        mean = stops_paying([point(rs) for rs in day.values()])
        each = [stops_paying([point([rs[i]]) for rs in day.values()]) for i in range(len(seeds))]
        print(
            f"  {name}: on the mean, the p95 leaves the band at {_rate(mean.p95_leaves)}, the "
            f"cost reaches on demand's at {_rate(mean.cost_reaches)}; per seed the p95 leaves "
            f"at {', '.join(_rate(t.p95_leaves) for t in each)}"
        )


def _rate(rate: float | None) -> str:
    return f"{rate:g}/h" if rate is not None else f"no swept rate (≤ {max(SWEEP):g}/h)"


if __name__ == "__main__":
    main()
