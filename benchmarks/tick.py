"""One evaluation tick over 100, 1,000 (and 10,000) autoscaled queues, on PostgreSQL.

    python benchmarks/tick.py [--queues 100,1000] [--instances 5000] [--runs 5]
                              [--pg-admin "host=127.0.0.1 port=5432 user=postgres dbname=postgres"]
                              [--redis redis://127.0.0.1:6379/0] [--profile] [--shards 1,2,4]

Per size: a fresh PostgreSQL database (migrated with `autoscaler.store.migrate.upgrade`, dropped
afterwards), one config version (mock provider; a mix of no_workers, queue_depth threshold and
target, latency and schedule triggers, every queue with an idle scale-down, some with a
scale-down schedule; every queue read from one Redis source under a throwaway key prefix, so all
queues are one round trip), `--instances` rows across the queues (ready / booting / draining with
timestamps relative to now; some queues without any machine), and pending jobs in a fifth of
the queues (heads half stamped, half unstamped so sightings are kept).

It times `autoscaler.control.evaluate` (trigger "poll", an outbox that sends nothing) after a
warm-up tick, median of `--runs`. Every run passes the same `now`, and the tick slots of the
previous run are deleted before it, outside the timing: every queue's poll slot is due on every run
(as with a new `now` per poll interval) while the seeded idle and boot times keep their meaning.

- steady: nothing changes between ticks (the usual tick; the warm-up already drained the idle
  machines and wrote the launch intents);
- busy: before each tick the machines are put back as seeded (so it drains the same idle
  machines and launches the same machines again) and the head job of every non-empty queue is
  replaced (a worker took one, a producer added one), outside the timing.

With `--shards 1,2,4`, the largest size of `--queues` is also measured sharded, on the same
database after the measurements above: for each W, a config version with `evaluation:
{shards: W}` added, then W worker processes (multiprocessing "spawn"; each its own `Runtime`,
engine and pools) evaluating shard i of W (`evaluate(..., shard=i)`; W=1: the plain tick,
shard None, in one worker, so the baseline is measured the same way in the same run; 1 is
always measured). A warm-up tick, then `--runs` steady and `--runs` busy ticks, each prepared
in the parent as above (tick slots deleted; busy: machines and queue heads reset) with the same
`now`; all workers are signalled at once and the tick is timed in the parent from the signal to
the last worker's answer. The table gives those times, the slowest shard's own time, launches
and drains summed over the shards (they must not depend on W; a mismatch is printed as a
warning), the speed-up against W=1, and where the slowest shard's time goes (`_evaluate`'s
steps wrapped with timers in the workers: the evaluation lease, the account lock, ...). The
bench config sets account caps (`limits`) far above the fleet: they never bind, but they make
every shard whose plan launches take the account lock from its recount to its commit.

SQL statements are counted with a `before_cursor_execute` listener on the runtime's engine (an
executemany is one), with connection checkouts and commits beside them. A replica of
`evaluate`'s steps built from the public functions (`read_metrics`, `build_snapshot`, `decide`,
`execute`, `StoreActions`) gives the time and statements per phase. The ratios 1,000/100 are
measured in the same run. Redis keys and databases are removed afterwards.

Measured on this 2-CPU machine with `--queues 100,1000,10000 --instances 20000 --runs 3`
(median of 3 ticks; load average 0.2-0.6 at the start, ~1 at the end):

                               steady tick         busy tick (1,014 launches, 3,389 drains)
    10,000 queues, before      7.09 s, 32 st       9.36 s, 38 st
    10,000 queues, after       3.18-3.98 s, 22 st  3.70-3.96 s, 28 st
     1,000 queues, after       0.89-1.31 s, 22 st  1.31-1.70 s, 28 st
       100 queues, after       0.79-0.86 s, 22 st  0.90 s (1.85 s before the last fix), 28 st

(ranges: two runs ten minutes apart; this VM's speed varies by ~20 % between runs.) Where the
time went before, from `--profile` and wall-clock wrappers, and what was done:
- tying 1,014 launches to their events scanned the whole event log per launch (no index on
  `scale_events.launch_id`): 3 s, and growing with the log -> an index (migration 0016);
- two `in` tests against lists of 10,000 queue names (`FallbackReader.read`,
  `executor.execute`): 1.1 s -> sets;
- Python's cycle collector, ~5,000 passes a tick over the loaded config's objects: 1.2-1.9 s
  -> paused for the evaluation (`runtime.collector_paused`);
- 30,000 rows upserted a tick (readings, statuses, chart points) bound row by row: 1.9 s ->
  one JSON document each on PostgreSQL (`store.db.upsert`), ~0.6 s;
- readings serialized with `asdict` (a deep copy): 0.9 s -> a shallow copy;
- a URL checked character by character per queue for its broker domain: 0.6 s -> cached;
- 4,425 drains' reasons as a CASE with a branch per machine, walked for every row: quadratic,
  0.5 s at 4,425 -> a joined JSON document.

Where it goes now, 10,000 queues and 20,000 machines (steady, ~3.5 s): the snapshot ~1.7-2.2 s
(of which ~0.8 s reads and converts the 20,000 machine rows: the same at 100 queues), the metrics
read ~0.6-0.9 s (the Redis read itself 0.15-0.3 s; the rest is saving 10,000 last good
readings), `decide()` ~0.55-0.9 s (~60-90 us a queue), the writes ~0.2 s. The 3 s goal is not
met: medians 3.2-4.0 s, the fastest tick 2.8 s. No single part dominates any more; the next step
is sharding the evaluation by queue across worker processes (since built: below).

Single process, again on 2026-12-03 (load average 0.65 at the start): steady 2.39 s, busy
2.96 s (22 / 28 statements); in the shard runs' W=1 rows below 2.4-2.7 s and 2.9-3.5 s: the
3 s goal holds for a steady tick, and a busy one is at it.

Sharded, measured with `--queues 10000 --instances 20000 --runs 3 --shards 1,2,4` on the same
2-CPU machine (PostgreSQL and Redis on the same cores; ms, the parent's wall time, median of 3;
speed-up against W=1 of the same run). Three versions of the code, one run each (load average
~0.2 at the start, ~2 at the end):

    W   steady   busy    speed-up steady / busy   the slowest shard waits for
    first (the lease renewed under an exclusive advisory lock, held to the commit):
    1   2,472    2,733   1.00 / 1.00
    2   1,684    3,143   1.47 / 0.87              the account lock 0.46 s busy
    4   1,758    2,925   1.41 / 0.93              the account lock 1.05 s busy
    then with still_granted (no second decide() where the recount leaves the caps unbound):
    1   2,682    2,915   1.00 / 1.00
    2   1,556    2,303   1.72 / 1.27              the account lock 0.37 s busy
    4   1,718    2,549   1.56 / 1.14              the account lock 0.71 s busy
    now (the writes before the account lock, behind a savepoint):
    1   2,484    3,538   1.00 / 1.00
    2   1,919    2,460   1.29 / 1.44              the account lock 0.001 s busy
    4   1,833    2,082   1.36 / 1.70              the account lock 0.14 s busy

Launches and drains (1,014 / 3,389 a busy tick) matched for every W and run. Every tick is
under 3 s with 2 workers or more. Steady ticks launch nothing and never take the account lock;
busy ticks launch in every shard, and each shard's recount and commit are what the shards do
one at a time. A shard's own steps shrink (decide() 0.5 -> 0.28 s at W=2) but less than by
W: its snapshot keeps the account-wide reads (sightings, backoffs, the others' billing per
queue) and, on two cores, the processes, PostgreSQL and Redis share the CPUs (the runs vary
by ~20 %, e.g. W=2 steady 1.29x-1.72x). Before the lease renewal took its advisory lock shared,
the exclusive one held to the commit queued the shards one after another (1.0-2.3 s of lease
wait, speed-up 0.54-0.95). On more cores or hosts the shards' time is the slowest shard's.

The world and its counters live in tick_world.py (shared with reconcile.py), one size's runs in
tick_runs.py, the sharded runs in tick_shards.py; this file reports them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tick_runs import PHASES, Run, Size, bench_size, good, med
from tick_shards import SHARD_PHASES, good_ticks
from tick_world import pending_queues

# --------------------------------------------------------------------------- report


def describe(runs: list[Run]) -> str:
    left_out = sum(r.degraded for r in runs)
    runs = good(runs)
    walls = [x.wall * 1000 for x in runs]
    st = [x.statements for x in runs]
    return (
        f"median {med(walls):7.1f} ms (min {min(walls):6.1f}, max {max(walls):6.1f})   "
        f"statements {med(st):5.0f}   checkouts {med([x.checkouts for x in runs]):3.0f}   "
        f"commits {med([x.commits for x in runs]):3.0f}   "
        f"launches {med([x.launched for x in runs]):4.0f}   "
        f"drains {med([x.drained for x in runs]):4.0f}"
        + (f"   ({left_out} run(s) with a failing metrics source left out)" if left_out else "")
    )


Phases = dict[str, tuple[float, int]]


def phase_table(label: str, sizes: list[Size], pick: Callable[[Size], list[Phases]]) -> None:
    print(f"\n  per phase, {label} (median of 3 replica ticks; ms / statements):")
    head = "".join(f"{s.queues:>6d} queues       " for s in sizes)
    print(f"    {'phase':22s} {head}")
    for name in PHASES:
        cells = []
        for s in sizes:
            runs = pick(s)
            ms = med([r[name][0] * 1000 for r in runs])
            n = med([r[name][1] for r in runs])
            cells.append(f"{ms:9.1f} ms {n:5.0f} st ")
        print(f"    {name:22s} {''.join(cells)}")
    cells = []
    for s in sizes:
        runs = pick(s)
        ms = med([sum(v[0] for v in r.values()) * 1000 for r in runs])
        n = med([sum(v[1] for v in r.values()) for r in runs])
        cells.append(f"{ms:9.1f} ms {n:5.0f} st ")
    print(f"    {'total':22s} {''.join(cells)}")


def kinds_table(label: str, sizes: list[Size], pick: Callable[[Size], list[Run]]) -> None:
    print(f"\n  statements by kind, {label} (one tick; '*' = differs between sizes):")
    kinds = sorted({k for s in sizes for k in good(pick(s))[-1].kinds})
    print(f"    {'statement':34s}" + "".join(f"{s.queues:>8d}q" for s in sizes))
    for k in kinds:
        counts = [good(pick(s))[-1].kinds.get(k, 0) for s in sizes]
        mark = " *" if len(set(counts)) > 1 else ""
        print(f"    {k:34s}" + "".join(f"{c:9d}" for c in counts) + mark)


def shard_table(size: Size, instances: int) -> None:
    """The shard measurement of the largest size: one row per number of worker processes."""
    assert size.shards
    by_w = {r.workers: r for r in size.shards}
    base = by_w.get(1)
    print(
        f"\nsharded evaluation, {size.queues} queues, {instances} machines: W worker processes "
        f"(spawn, each its own Runtime) evaluating shard i of W at once (W=1: the plain tick "
        f"in one worker), timed in the parent from the signal to the last answer; median of "
        f"{len(size.shards[0].steady)} runs after a warm-up"
    )
    load = os.getloadavg()
    print(
        f"  os.cpu_count() {os.cpu_count()}, load average {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f} (1, 5, 15 min) after the shard runs; the workers share this machine's "
        f"cores with PostgreSQL and Redis"
    )
    limits = {k: v for k, v in (size.limits or {}).items() if v is not None}
    if limits:
        caps = ", ".join(f"{k} {v:g}" for k, v in limits.items())
        print(
            f"  account caps are set in the bench config ({caps}): "
            "far above the fleet, they never bind, but a shard whose plan launches or "
            "resumes takes the account lock from its recount to its commit (those "
            "recounts and commits run one at a time)"
        )
    print(
        f"    {'W':>3s}  {'steady: median':>14s} {'min':>7s} {'max':>7s} {'slowest shard':>13s}"
        f"  {'busy: median':>12s} {'slowest shard':>13s}  {'launches':>8s} {'drains':>6s}"
        f"  {'speed-up steady':>15s} {'busy':>5s}"
    )

    def ms(x: float) -> str:
        return f"{x * 1000:7.0f}"

    for r in size.shards:
        st, bu = good_ticks(r.steady), good_ticks(r.busy)
        sw, bw = [t.wall for t in st], [t.wall for t in bu]
        if base is not None:
            up = (
                f"{med([t.wall for t in good_ticks(base.steady)]) / med(sw):14.2f}x "
                f"{med([t.wall for t in good_ticks(base.busy)]) / med(bw):4.2f}x"
            )
        else:
            up = f"{'n/a':>15s} {'n/a':>5s}"
        print(
            f"    {r.workers:3d}  {ms(med(sw)):>11s} ms {ms(min(sw))} {ms(max(sw))} "
            f"{ms(med([t.slowest.wall for t in st])):>10s} ms  {ms(med(bw)):>9s} ms "
            f"{ms(med([t.slowest.wall for t in bu])):>10s} ms  "
            f"{med([t.launched for t in bu]):8.0f} {med([t.drained for t in bu]):6.0f}  {up}"
        )
    print(
        f"    (same run, in this process: steady "
        f"{med([x.wall for x in good(size.steady)]):.2f} s, "
        f"busy {med([x.wall for x in good(size.busy)]):.2f} s, "
        f"{med([x.launched for x in good(size.busy)]):.0f} launches, "
        f"{med([x.drained for x in good(size.busy)]):.0f} drains)"
    )
    busy_counts = {
        (r.workers, t.launched, t.drained) for r in size.shards for t in good_ticks(r.busy)
    }
    if len({(la, dr) for _, la, dr in busy_counts}) > 1:
        print(
            "  WARNING: launches / drains per busy tick differ between worker counts or runs: "
            + ", ".join(f"W={w}: {la} launches, {dr} drains" for w, la, dr in sorted(busy_counts))
        )
    else:
        print("  launches and drains per busy tick: the same for every W and run")
    for r in size.shards:
        for label, ticks in (("warm-up", [r.warmup]), ("steady", r.steady), ("busy", r.busy)):
            skipped = sorted({x for t in ticks for x in t.skipped})
            if skipped:
                print(f"  WARNING: W={r.workers} {label}: skipped {'; '.join(skipped)}")
            left_out = sum(t.degraded for t in ticks)
            if left_out and label != "warm-up":
                print(
                    f"  W={r.workers} {label}: {left_out} run(s) with a failing metrics source "
                    "left out"
                )
    print(
        "  warm-up (process start, config parse, connections): "
        + ", ".join(f"W={r.workers} {r.warmup.wall:.1f} s" for r in size.shards)
    )
    print(
        "\n  where the slowest shard's time goes (median over runs of the slowest worker's "
        "steps; ms):"
    )
    print(
        f"    {'step':18s}"
        + "".join(f"{f'W={r.workers} steady':>13s}{'busy':>7s}" for r in size.shards)
    )
    for step in SHARD_PHASES:
        cells = []
        for r in size.shards:
            for ticks in (good_ticks(r.steady), good_ticks(r.busy)):
                cells.append(med([t.slowest.steps[step] * 1000 for t in ticks]))
        print(
            f"    {step:18s}"
            + "".join(f"{cells[k]:13.0f}{cells[k + 1]:7.0f}" for k in range(0, len(cells), 2))
        )
    print("    calls, all shards of a tick (median over runs):")
    for step in ("decide()", "account lock wait"):
        cells = []
        for r in size.shards:
            for ticks in (good_ticks(r.steady), good_ticks(r.busy)):
                cells.append(med([sum(a.calls.get(step, 0) for a in t.answers) for t in ticks]))
        print(
            f"    {step:18s}"
            + "".join(f"{cells[k]:13.0f}{cells[k + 1]:7.0f}" for k in range(0, len(cells), 2))
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queues", default="100,1000")
    ap.add_argument("--instances", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pg-admin", default="host=127.0.0.1 port=5432 user=postgres dbname=postgres")
    ap.add_argument("--pg-host", default="127.0.0.1")
    ap.add_argument("--pg-port", default="5432")
    ap.add_argument("--pg-user", default="postgres")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument(
        "--profile", action="store_true", help="cProfile one steady and one busy tick per size"
    )
    ap.add_argument(
        "--shards",
        default="",
        help="worker counts, e.g. 1,2,4: the largest size is also evaluated in that "
        "many shards by as many processes (1, the baseline, is always added)",
    )
    args = ap.parse_args()
    shards = sorted({int(x) for x in args.shards.split(",") if x.strip()})
    if shards and not 1 <= shards[0] <= shards[-1] <= 64:
        ap.error("--shards: worker counts between 1 and 64")
    if shards and shards[0] != 1:
        shards.insert(0, 1)
    sizes_wanted = [int(x) for x in args.queues.split(",")]
    sizes = []
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    for k, n in enumerate(sizes_wanted):
        started = time.perf_counter()
        size = bench_size(n, args, shards if k == len(sizes_wanted) - 1 else ())
        sizes.append(size)
        print(
            f"{n} queues, {args.instances} machines "
            f"({', '.join(f'{v} {k}' for k, v in sorted(size.machine_states.items()))}), "
            f"{size.jobs} pending jobs in {len(pending_queues(n))} queues; PostgreSQL; "
            f"{args.runs} runs after a warm-up "
            f"({time.perf_counter() - started - size.shard_seconds:.0f} s in all)"
        )
        print(
            f"  first tick (config parse, connections, first sightings): "
            f"{size.first.wall * 1000:.1f} ms, {size.first.statements} statements, "
            f"{size.first.launched} launches, {size.first.drained} drains"
        )
        print(f"  steady tick: {describe(size.steady)}")
        print(f"  busy tick:   {describe(size.busy)}")
    if len(sizes) >= 2:
        a, b = sizes[0], sizes[-1]
        print(f"\nratio {b.queues}/{a.queues} queues (same {args.instances} machines):")
        picks: tuple[tuple[str, Callable[[Size], list[Run]]], ...] = (
            ("steady", lambda s: good(s.steady)),
            ("busy", lambda s: good(s.busy)),
        )
        for label, pick in picks:
            wa, wb = med([x.wall for x in pick(a)]), med([x.wall for x in pick(b)])
            sa, sb = med([x.statements for x in pick(a)]), med([x.statements for x in pick(b)])
            print(
                f"  {label:6s} time {wb / wa:5.2f}x   statements {sb / sa:5.2f}x "
                f"({sa:.0f} -> {sb:.0f})"
            )
        wb = med([x.wall for x in good(b.busy)])
        print(
            f"  target: statements flat in queues and machines; a {b.queues}-queue tick within "
            f"1 s -> steady {med([x.wall for x in good(b.steady)]):.2f} s, busy {wb:.2f} s"
        )
    print(f"  load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    phase_table("steady tick", sizes, lambda s: s.phases_steady)
    phase_table("busy tick", sizes, lambda s: s.phases_busy)
    kinds_table("steady tick", sizes, lambda s: s.steady)
    kinds_table("busy tick", sizes, lambda s: s.busy)
    for s in sizes:
        if s.shards:
            shard_table(s, args.instances)
    for s in sizes:
        if s.profile:
            print(f"\ncProfile, {s.queues} queues:{s.profile}")


if __name__ == "__main__":
    main()
