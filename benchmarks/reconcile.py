"""One reconcile pass over 2,000 and 20,000 machines, on PostgreSQL, with the mock provider.

    python benchmarks/reconcile.py [--machines 2000,20000] [--queues 100] [--runs 5]
                                   [--churn 0.01] [--redis redis://127.0.0.1:6379/0]
                                   [--pg-admin "host=127.0.0.1 port=5432 user=postgres ..."]
                                   [--profile]

Per size: a fresh PostgreSQL database (migrated with `autoscaler.store.migrate.upgrade`, dropped
afterwards), one config version (`tick_world.config_document`: `--queues` queues on the mock
provider, every queue read from one Celery-on-Redis source under a throwaway key prefix),
`--machines` instance rows over the queues (`tick_world.instance_rows`: 75% ready, 15% booting,
10% draining, with timestamps relative to now) and one mock machine per row in `mock_machines`
(the mock provider's store), under the row's label and provider id: the ready and draining ones
running, the booting ones still starting (they boot a day later), so the provider lists every
live row.

It times `autoscaler.control.reconciler.run_reconcile(rt, outbox, now)`, what the Celery task
`autoscaler.reconcile` runs, with an outbox that only counts what would be sent, after one
warm-up pass (config parse, provider and worker probe built, connections, the first retries
audited), median of `--runs`. Every pass gets the same `now`, so the seeded ages keep their
meaning (the mock's own clock, which says starting or running, is the wall clock):

- steady: nothing moves. Every draining machine older than a poll interval has its drain sent
  again, as every round does (`retries`); its audit mark is already there, so no event is written;
- churn: before each pass, outside the timing, the rows are put back as after the warm-up and
  `--churn` of the machines (ready ones) are killed at the provider (`MockProvider.kill`): the
  pass moves them ready -> terminating, due for a handback, and sends terminate, handback and an
  evaluate of their queues.

Included: the whole round, i.e. the config load, the worker probe (Celery remote control on the
local Redis under the throwaway prefix: no worker answers, so it waits its timeouts, ~2 s that do
not depend on the machines; shown apart as "observe workers"), the mock provider's list (all its
machines from `mock_machines`), the rows read, `policy.reconcile.reconcile`, the moves, retries
and events written, orphans (none) and the broker-user sweep (SCRIPT LOAD and ACL USERS on the
local Redis; no user of this installation exists). Not included: sending the tasks (the outbox only
counts them), the tasks themselves (terminate, drain, handback), PostgreSQL's own CPU (the CPU
column is this process's). Per phase, the time and statements of each step are taken by wrapping the
functions `run_reconcile` calls (`observe_celery_workers`, `list_providers`, `instances.live_rows` /
`rows_of`, `reconcile`, `_apply`, `reconcile_actions._destroy_orphans`,
`_sweep_broker_users`); "other" is the rest
(config load, the rows turned into `policy.reconcile.Row`, orphan sightings, pending handbacks,
commits). SQL statements are counted with `tick_world.Counter_` (`before_cursor_execute`; an
executemany is one). The ratios 20,000/2,000 are measured in the same run. The time Python's cycle
collector took inside the pass is counted too (`gc.callbacks`).

Measured on this 2-CPU machine, 100 queues, 5 runs, median ms; "probe" = the fixed ~2,010 ms
remote-control wait; CPU is this process's. Before: a conditional UPDATE per retried drain every
round and the cycle collector running inside the pass (load average 0.90 -> 1.06); after: one
SELECT finds the retries not yet noted (`moves.unnoted_retries`), the collector waits for the
round's end (`collector_paused`) (load average 0.46 -> 0.36):

                              machines  pass   w/o probe   CPU   gc (full)   statements  moved
    before  steady              2,000   2458      439      347    22 (0)        193        0
                               20,000   5778     3759     3494   880 (701)     1884        0
            churn (1% killed)   2,000   2430      414      383    20 (0)        234       20
                               20,000   6428     4415     3911  1028 (834)     2285      200
    after   steady              2,000   2197      184      180     0 (0)          9        0
                               20,000   3190     1179     1122     0 (0)          9        0
            churn (1% killed)   2,000   2179      169      160     0 (0)         50       20
                               20,000   3409     1399     1282     1 (0)        410      200
    ratio 20,000/2,000 after: steady w/o probe 6.4x, statements 1.0x (9 -> 9);
                              churn  w/o probe 8.3x, statements 8.2x (two UPDATEs per machine
                              moved: its state, then its hand-back due)

Per phase at 20,000 after (steady): list provider 405 ms (the mock loads all 20,000
`mock_machines` rows as ORM objects), rows read 447 ms (one query), `reconcile()` 176 ms, apply
26 ms, other 100 ms. Before, apply was 1,311 ms (1,877 statements) and the collector made five
full passes (701-834 ms). Statements now grow only with what moves, never with the machines.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy import insert, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tick_world.py, tick_runs.py

from tick_runs import med
from tick_world import PROVIDER, Counter_, config_document, instance_rows

from autoscaler.control import reconcile_actions, reconciler
from autoscaler.control.outbox import StepName
from autoscaler.control.runtime import Runtime
from autoscaler.lifecycle import InstanceState
from autoscaler.providers.labels import make_label
from autoscaler.providers.mock import MockProvider
from autoscaler.settings import Settings
from autoscaler.store import config_versions, instances, migrate
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.mock_machines import CREATED, DEAD
from autoscaler.store.models import Instance, MockMachine

S = InstanceState


# --------------------------------------------------------------------------- the world


def mock_machine_rows(rows: list[dict[str, Any]], install: str) -> list[dict[str, Any]]:
    """The mock machine of every instance row (same provider id, under its label): running since
    a minute after its row was created, or, for a booting row, starting until a day from now."""
    later = datetime.now(UTC) + timedelta(days=1)
    return [
        {
            "id": int(r["provider_instance_id"].removeprefix("mock-")),
            "provider": PROVIDER,
            "label": make_label(install, r["launch_id"]),
            "env": {},
            "gpu": r["gpu"],
            "price_per_hour": r["price_per_hour"],
            "status": CREATED,
            "boots_at": (
                later if r["state"] == S.BOOTING else r["created_at"] + timedelta(seconds=60)
            ),
            "will_fail": False,
            "created_at": r["created_at"],
        }
        for r in rows
    ]


# --------------------------------------------------------------------------- counting


PHASES: tuple[tuple[str, Any, str], ...] = (
    ("observe workers", reconciler, "observe_celery_workers"),
    ("list provider", reconciler, "list_providers"),
    ("read rows", instances, "live_rows"),
    ("read rows", instances, "rows_of"),
    ("reconcile()", reconciler, "reconcile"),
    ("apply moves", reconciler, "_apply"),
    ("destroy orphans", reconcile_actions, "_destroy_orphans"),
    ("sweep broker users", reconciler, "_sweep_broker_users"),
)
PHASE_NAMES = (*dict.fromkeys(p[0] for p in PHASES), "other")


class PhaseClock:
    """Wraps the functions `run_reconcile` calls (once, for the whole run of the benchmark) to
    add up the wall time each takes; their SQL statements are tagged through `Counter_.phase`
    (of the size being measured: `counter`)."""

    def __init__(self) -> None:
        self.counter = Counter_()
        self.walls: defaultdict[str, float] = defaultdict(float)
        for name, module, attr in PHASES:
            setattr(module, attr, self._wrap(name, getattr(module, attr)))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            before = self.counter.phase
            self.counter.phase = name
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.walls[name] += time.perf_counter() - t
                self.counter.phase = before

        return timed


class GcClock:
    """Time the cycle collector takes, its passes, and of them the full ones (generation 2,
    which walk every object the process holds), while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.seconds = self.full_seconds = 0.0
        self.passes = self.full_passes = 0
        self._t = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._t = time.perf_counter()
            return
        took = time.perf_counter() - self._t
        self.seconds += took
        self.passes += 1
        if info.get("generation") == 2:
            self.full_seconds += took
            self.full_passes += 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.seconds = self.full_seconds = 0.0
        self.passes = self.full_passes = 0
        self.on = True
        try:
            yield
        finally:
            self.on = False


GC = GcClock()
CLOCK: PhaseClock | None = None


def phase_clock(counter: Counter_) -> PhaseClock:
    global CLOCK
    if CLOCK is None:
        CLOCK = PhaseClock()
    CLOCK.counter = counter
    return CLOCK


# --------------------------------------------------------------------------- runs


@dataclass
class Run:
    wall: float
    cpu: float
    statements: int
    kinds: Counter[str]
    phases: dict[str, tuple[float, int]]
    moved: int
    retries: int
    sent: Counter[str]
    gc_seconds: float
    gc_passes: int
    gc_full_seconds: float
    gc_full_passes: int

    @property
    def without_probe(self) -> float:
        return self.wall - self.phases["observe workers"][0]


class Counting(Counter[str]):
    """An outbox that counts what would be sent, by step (sending is not part of the round)."""

    def step(self, step: StepName, launch_id: str, *, after: float | None = None) -> None:
        self[step] += 1

    def evaluate(self, queue: str) -> None:
        self["evaluate"] += 1

    def shard(self, number: int) -> None:
        self["shard"] += 1


def timed_pass(rt: Runtime, counter: Counter_, clock: PhaseClock, now: datetime) -> Run:
    sent = Counting()

    clock.walls.clear()
    with counter.counting(), GC.counting():
        c = time.process_time()
        t = time.perf_counter()
        res = reconciler.run_reconcile(rt, sent, now=now)
        wall = time.perf_counter() - t
        cpu = time.process_time() - c
    assert "skipped" not in res and not res["providers_unreadable"], res
    by_phase = Counter(p for p, _ in counter.statements)
    phases: dict[str, tuple[float, int]] = {
        name: (clock.walls[name], by_phase[name]) for name in PHASE_NAMES[:-1]
    }
    phases["other"] = (wall - sum(clock.walls.values()), by_phase["-"])
    return Run(
        wall,
        cpu,
        len(counter.statements),
        Counter(k for _, k in counter.statements),
        phases,
        res["transitions"],
        res["retries"],
        sent,
        GC.seconds,
        GC.passes,
        GC.full_seconds,
        GC.full_passes,
    )


@dataclass
class Size:
    machines: int
    states: dict[str, int]
    killed: int
    seeding: float
    first: Run
    steady: list[Run]
    churn: list[Run]
    profile: str | None = None
    runs: dict[str, list[Run]] = field(init=False)

    def __post_init__(self) -> None:
        self.runs = {"steady": self.steady, "churn": self.churn}


def bench_size(machines: int, args: argparse.Namespace) -> Size:
    db = f"bench_reconcile_{uuid.uuid4().hex[:10]}"
    url = f"postgresql+psycopg://{args.pg_user}@{args.pg_host}:{args.pg_port}/{db}"
    prefix = f"bench-reconcile-{uuid.uuid4().hex[:8]}:"
    r = redis.Redis.from_url(args.redis)
    with psycopg.connect(args.pg_admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    rt: Runtime | None = None
    admin = None
    home = None
    try:
        started = time.perf_counter()
        migrate.upgrade(url)
        admin = make_engine(url)
        home = tempfile.mkdtemp(prefix="bench-reconcile-")  # nothing is written there (mock)
        settings = Settings.from_env({"AUTOSCALER_DATABASE_URL": url, "AUTOSCALER_HOME": home})
        rt = Runtime(settings, env={})
        counter = Counter_()
        counter.attach(rt.engine)
        clock = phase_clock(counter)
        t0 = datetime.now(UTC).replace(microsecond=0)
        with transaction(session_factory(admin)) as s:
            install = rt.installation_id(s)
            config_versions.record(
                s,
                config_document(args.queues, machines, args.redis, prefix),
                "benchmarks/reconcile.py",
                t0,
            )
            rows = instance_rows(args.queues, machines, install, t0)
            s.execute(insert(Instance), rows)
            s.execute(insert(MockMachine), mock_machine_rows(rows, install))
        with admin.begin() as c:
            c.execute(
                text(
                    "SELECT setval(pg_get_serial_sequence('mock_machines', 'id'), "
                    "(SELECT max(id) FROM mock_machines))"
                )
            )
        with admin.connect() as c:
            c.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))
        seeding = time.perf_counter() - started
        now = t0 + timedelta(seconds=1)

        first = timed_pass(rt, counter, clock, now)  # warm-up
        with admin.begin() as c:  # the world as after a round: what churn starts from
            c.execute(text("CREATE TABLE bench_seed AS SELECT * FROM instances"))
            last_event = c.execute(text("SELECT coalesce(max(id), 0) FROM scale_events")).scalar()
        steady = [timed_pass(rt, counter, clock, now) for _ in range(args.runs)]

        ready = [row["provider_instance_id"] for row in rows if row["state"] == S.READY]
        doomed = random.Random(11).sample(ready, round(machines * args.churn))
        provider = rt.provider(PROVIDER)
        assert isinstance(provider, MockProvider)

        def churn_world() -> None:
            """The rows as after the warm-up, every machine alive, then `doomed` killed."""
            with admin.begin() as c:
                c.execute(text("TRUNCATE instances"))
                c.execute(text("INSERT INTO instances SELECT * FROM bench_seed"))
                c.execute(text("DELETE FROM scale_events WHERE id > :id"), {"id": last_event})
                c.execute(
                    text("UPDATE mock_machines SET status = :created WHERE status = :dead"),
                    {"created": CREATED, "dead": DEAD},
                )
            for pid in doomed:
                assert provider.kill(pid)

        churn = []
        for _ in range(args.runs):
            churn_world()
            churn.append(timed_pass(rt, counter, clock, now))
        prof = None
        if args.profile:
            buf = io.StringIO()
            for label in ("steady", "churn"):
                if label == "churn":
                    churn_world()
                p = cProfile.Profile()
                p.enable()
                reconciler.run_reconcile(rt, Counting(), now=now)
                p.disable()
                buf.write(
                    f"\n--- {label} pass, {machines} machines: the project's functions by "
                    "cumulative time ---\n"
                )
                stats = pstats.Stats(p, stream=buf).sort_stats("cumulative")
                stats.print_stats(r"/autoscaler/", args.profile_lines)
            prof = buf.getvalue()
        states = Counter(str(row["state"].value) for row in rows)
        return Size(machines, dict(states), len(doomed), seeding, first, steady, churn, prof)
    finally:
        if rt is not None:
            rt.close()
        if admin is not None:
            admin.dispose()
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)
        with psycopg.connect(args.pg_admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        keys = list(r.scan_iter(match=f"{prefix}*", count=5000))
        for i in range(0, len(keys), 1000):
            r.delete(*keys[i : i + 1000])
        r.close()


# --------------------------------------------------------------------------- report


def describe(runs: list[Run]) -> str:
    walls = [x.wall * 1000 for x in runs]
    sent = Counter[str]()
    for x in runs:
        sent.update(x.sent)
    return (
        f"median {med(walls):7.1f} ms (min {min(walls):7.1f}, max {max(walls):7.1f})   "
        f"without the probe {med([x.without_probe * 1000 for x in runs]):7.1f} ms   "
        f"CPU {med([x.cpu * 1000 for x in runs]):7.1f} ms   "
        f"gc {med([x.gc_seconds * 1000 for x in runs]):6.1f} ms "
        f"({med([x.gc_passes for x in runs]):.0f} passes; full ones "
        f"{med([x.gc_full_seconds * 1000 for x in runs]):.1f} ms, "
        f"{med([x.gc_full_passes for x in runs]):.0f})\n"
        f"      statements {med([x.statements for x in runs]):5.0f}   "
        f"moved {med([x.moved for x in runs]):4.0f}   "
        f"retries {med([x.retries for x in runs]):4.0f}   sent per pass: "
        + (", ".join(f"{k} {v / len(runs):.0f}" for k, v in sorted(sent.items())) or "-")
    )


def phase_table(label: str, sizes: list[Size]) -> None:
    print(
        f"\n  per phase, {label} (median of {len(sizes[0].runs[label])} passes; ms / statements):"
    )
    print("    " + f"{'phase':20s}" + "".join(f"{s.machines:>10d} machines " for s in sizes))
    for name in PHASE_NAMES:
        cells = []
        for s in sizes:
            runs = s.runs[label]
            ms = med([x.phases[name][0] * 1000 for x in runs])
            cells.append(f"{ms:9.1f} ms {med([x.phases[name][1] for x in runs]):5.0f} st ")
        print(f"    {name:20s}{''.join(cells)}")


def kinds_table(label: str, sizes: list[Size]) -> None:
    print(f"\n  statements by kind, {label} (last pass; '*' = differs between sizes):")
    kinds = sorted({k for s in sizes for k in s.runs[label][-1].kinds})
    print(f"    {'statement':34s}" + "".join(f"{s.machines:>9d}m" for s in sizes))
    for k in kinds:
        counts = [s.runs[label][-1].kinds.get(k, 0) for s in sizes]
        mark = " *" if len(set(counts)) > 1 else ""
        print(f"    {k:34s}" + "".join(f"{c:10d}" for c in counts) + mark)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--machines", default="2000,20000")
    ap.add_argument("--queues", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--churn",
        type=float,
        default=0.01,
        help="share of the machines killed at the provider before a churn pass",
    )
    ap.add_argument("--pg-admin", default="host=127.0.0.1 port=5432 user=postgres dbname=postgres")
    ap.add_argument("--pg-host", default="127.0.0.1")
    ap.add_argument("--pg-port", default="5432")
    ap.add_argument("--pg-user", default="postgres")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument(
        "--profile", action="store_true", help="cProfile one steady and one churn pass per size"
    )
    ap.add_argument("--profile-lines", type=int, default=15)
    args = ap.parse_args()
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    sizes = []
    for n in (int(x) for x in args.machines.split(",")):
        started = time.perf_counter()
        size = bench_size(n, args)
        sizes.append(size)
        states = ", ".join(f"{v} {k}" for k, v in sorted(size.states.items()))
        print(
            f"\n{n} machines ({states}) over {args.queues} queues; PostgreSQL; mock provider; "
            f"{args.runs} runs after a warm-up ({size.seeding:.1f} s to seed, "
            f"{time.perf_counter() - started:.0f} s in all)"
        )
        f = size.first
        print(
            f"  warm-up pass: {f.wall * 1000:.1f} ms, {f.statements} statements, "
            f"moved {f.moved}, retries {f.retries}"
        )
        print(f"  steady: {describe(size.steady)}")
        print(f"  churn ({size.killed} killed):\n          {describe(size.churn)}")
    if len(sizes) >= 2:
        a, b = sizes[0], sizes[-1]
        print(f"\nratio {b.machines}/{a.machines} machines (x{b.machines / a.machines:.0f}):")
        for label in ("steady", "churn"):
            ra, rb = a.runs[label], b.runs[label]

            def ratio(
                pick: Callable[[Run], float], ra: list[Run] = ra, rb: list[Run] = rb
            ) -> float:
                base = med([pick(x) for x in ra])
                return med([pick(x) for x in rb]) / base if base else float("nan")

            print(
                f"  {label:6s} time {ratio(lambda x: x.wall):5.2f}x   "
                f"without the probe {ratio(lambda x: x.without_probe):5.2f}x   "
                f"CPU {ratio(lambda x: x.cpu):5.2f}x   "
                f"gc {ratio(lambda x: x.gc_seconds):5.2f}x   "
                f"statements {ratio(lambda x: x.statements):5.2f}x "
                f"({med([x.statements for x in ra]):.0f} -> "
                f"{med([x.statements for x in rb]):.0f})"
            )
    print(f"  load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    for label in ("steady", "churn"):
        phase_table(label, sizes)
    for label in ("steady", "churn"):
        kinds_table(label, sizes)
    for s in sizes:
        if s.profile:
            print(f"\ncProfile, {s.machines} machines:{s.profile}")


if __name__ == "__main__":
    main()
