"""Placement across providers in the simulator: the cheaper provider out of capacity for 2 h.

    python benchmarks/placement_sim.py [--seeds 0,1,2] [--realistic] [--hours 2] [--traces diurnal]

The issue's measure: a queue listing two providers (`autoscaler/sim/traces/placement-config.yaml`:
the benchmark's queue on `sim-cheap` $0.40/h and `sim-dear` $0.60/h, both 3 min boots ±25 %,
3 % failed boots, 2 % capacity errors; `placement: cheapest`), the cheaper one with no capacity
for 2 h at the day's busiest stretch (the 2 h, on a 15 min grid, into which the most work
arrives). Per shipped day: (a) the list without the outage, (b) the list with it, (c) the
cheaper alone with it, (d) the dearer alone. Goals: (b)'s p95 wait within 10 % of (a)'s, and
(b)'s cost within (a)'s plus the price difference ($0.20/h) on the machine-hours billed during
those 2 h in (b). "window mach-h": machine-hours billed during the outage's 2 h; "dear
mach-h": machine-hours on sim-dear over the whole run.

Measured (default world, seed 0, about 10 s; $ / p95 wait s; "extra" = (b)'s $ − (a)'s,
"allowed" = $0.20/h × the machine-hours billed during the outage in (b)):

| day, outage         | (a) list    | (b) list    | (c) cheap alone     | (d) dear alone | b/a p95 |
|---------------------|-------------|-------------|---------------------|----------------|---------|
| steady 15:00–17:00  | 23.17 / 277 | 24.17 / 276 | 22.24 / 541 (1166)  | 34.24 / 285    | 1.00    |
| diurnal 13:15–15:15 | 28.70 / 270 | 32.19 / 270 | 27.98 / 2909 (3028) | 42.71 / 262    | 1.00    |
| spiky 06:15–08:15   | 20.43 / 898 | 22.85 / 870 | 19.61 / 7957 (8422) | 30.38 / 905    | 0.97    |

(c) in brackets: its longest wait. Cost goal, extra vs allowed: steady $1.00 ≤ $1.13 (5.7
window mach-h), diurnal $3.49 ≤ $4.55 (22.8), spiky $2.42 > $2.31 (11.6): missed by 5 %.

- Waits: the goal holds on every day, seeds 0–2, in both worlds: (b)/(a) p95 0.93–1.03
  (`--realistic`: 0.96–1.01). A launch in the outage fails over to sim-dear at once (the
  failed rental costs no wait), and sim-cheap's own backoff keeps later launches off it.
- Cost: the goal as written holds on 3 of the 9 seed × day runs (default world) and 4 of 9
  (realistic); the misses reach +15 % of the allowance (spiky, seed 2: $2.77 vs $2.40) and
  +34 % realistic (steady, seed 1: $1.54 vs $1.15; diurnal seed 0: $5.96 vs $4.72, +26 %).
  The extra is the price gap on the dearer provider's machine-hours ("dear mach-h"), and
  those outlast the outage: the machines rented on sim-dear in it keep serving (the work that
  arrived in the busiest 2 h is served after them too), and decide() never moves a queue
  back to the cheaper provider — diurnal, seed 0: 19.3 mach-h on sim-dear for a 2 h outage,
  its last machine leaving 80 min after it.
- Alone, the cheaper provider makes the jobs arriving in the outage wait for its end plus
  its backoff (10 min cap): p95 2.0× (steady), 10.8× (diurnal), 9.1× (spiky) the list's with
  the same outage; the dearer alone costs 1.3–1.4× the list with it.
"""

from __future__ import annotations

import argparse
import time

from autoscaler.sim.engine import World
from autoscaler.sim.placement import P95_SLACK, OutageDay, OutageRun, by_price, outage_day
from autoscaler.sim.run import load_sim_config
from autoscaler.sim.trace import load_trace
from autoscaler.sim.tracegen import GENERATORS, TRACES_DIR

CONFIG = TRACES_DIR / "placement-config.yaml"
QUEUE = "inference"

HEADER = (
    f"  {'':<30}{'$':>8}{'p50 s':>7}{'p95 s':>7}{'p99 s':>7}{'max s':>7}{'rentals':>8}"
    f"{'failed':>7}{'window mach-h':>14}{'dear mach-h':>12}"
)


def row(r: OutageRun) -> str:
    p = r.report
    return (
        f"  {r.label:<30}{p.dollars:>8.2f}{p.wait_p50:>7.0f}{p.wait_p95:>7.0f}{p.wait_p99:>7.0f}"
        f"{p.wait_max:>7.0f}{p.launches:>8}{p.failed_rentals:>7}{r.window_hours:>14.1f}"
        f"{r.dear_hours:>12.1f}"
    )


def verdict(day: OutageDay) -> str:
    return (
        f"  p95 (b)/(a) = {day.p95_ratio():.2f} (goal ≤ {1 + P95_SLACK:.2f}: "
        f"{'holds' if day.waits_hold() else 'DOES NOT HOLD'}); cost (b) − (a) = "
        f"${day.extra():.2f} vs ${day.price_gap:.2f}/h × {day.runs[1].window_hours:.1f} window "
        f"mach-h = ${day.allowance():.2f} ({'holds' if day.cost_holds() else 'DOES NOT HOLD'}; "
        f"the gap on the dearer provider's {day.runs[1].dear_hours:.1f} mach-h: "
        f"${day.price_gap * day.runs[1].dear_hours:.2f})"
    )


def main() -> None:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("--realistic", action="store_true", help="the realistic world")
    parser.add_argument("--hours", type=float, default=2.0, help="the outage's length")
    parser.add_argument("--traces", default=None, help="comma-separated names (default: all)")
    args = parser.parse_args()
    config = load_sim_config(args.config)
    world = World.realistic() if args.realistic else World()
    names = [n for n in GENERATORS if not args.traces or n in args.traces.split(",")]
    cheap, dear, gap = by_price(config, QUEUE)
    print(
        f"config {args.config}: queue {QUEUE} on {cheap} and {dear} (${gap:.2f}/h apart), "
        f"{'realistic' if args.realistic else 'default'} world; {cheap} out of capacity "
        f"{args.hours:g} h at each day's busiest stretch"
    )
    missed = {"p95": 0, "cost": 0}
    for seed in (int(s) for s in args.seeds.split(",")):
        for name in names:
            jobs = load_trace(TRACES_DIR / f"{name}.csv")
            started = time.perf_counter()
            day = outage_day(config, QUEUE, jobs, args.hours, seed, world)
            print(f"\n{name}, seed {seed}: {len(jobs)} jobs, outage {day.outage.describe()}")
            print(HEADER)
            for r in day.runs:
                print(row(r))
            print(verdict(day))
            print(f"  ({time.perf_counter() - started:.1f}s)")
            missed["p95"] += not day.waits_hold()
            missed["cost"] += not day.cost_holds()
    print(f"\ndays missing the p95 goal: {missed['p95']}; the cost goal: {missed['cost']}")


if __name__ == "__main__":
    main()
