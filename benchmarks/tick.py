"""One evaluation tick over 100 and 1,000 autoscaled queues with 5,000 machines, on PostgreSQL.

    python benchmarks/tick.py [--queues 100,1000] [--instances 5000] [--runs 5]
                              [--pg-admin "host=127.0.0.1 port=5432 user=postgres dbname=postgres"]
                              [--redis redis://127.0.0.1:6379/0] [--profile]

Per size: a fresh PostgreSQL database (migrated with `autoscaler.store.migrate.upgrade`, dropped
afterwards), one config version (mock provider; a mix of no_workers, queue_depth threshold and
target, latency and schedule triggers, every queue with an idle scale-down, some with a
scale-down schedule; every queue read from one Redis source under a throwaway key prefix, so all
queues are one round trip), `--instances` rows across the queues (ready / booting / draining with
timestamps relative to now; some queues without any machine), and pending jobs in a fifth of
the queues (heads half stamped, half unstamped so sightings are kept).

It times `autoscaler.control.loop.evaluate` (trigger "poll", a no-op enqueue) after a warm-up
tick, median of `--runs`. Every run passes the same `now`, and the tick slots of the previous run
are deleted before it, outside the timing: every queue's poll slot is due on every run (as with
a new `now` per poll interval) while the seeded idle and boot times keep their meaning.

- steady: nothing changes between ticks (the usual tick; the warm-up already drained the idle
  machines and wrote the launch intents);
- busy: before each tick the machines are put back as seeded (so it drains the same idle
  machines and launches the same machines again) and the head job of every non-empty queue is
  replaced (a worker took one, a producer added one), outside the timing.

SQL statements are counted with a `before_cursor_execute` listener on the runtime's engine (an
executemany is one), with connection checkouts and commits beside them. A replica of
`evaluate`'s steps built from the public functions (`read_metrics`, `build_snapshot`, `decide`,
`execute`, `StoreActions`) gives the time and statements per phase. The ratios 1,000/100 are
measured in the same run. Redis keys and databases are removed afterwards.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import pstats
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy import event, insert, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.config.models import Config
from autoscaler.control.executor import execute
from autoscaler.control.loop import (
    EVALUATION_LEASE,
    LEASE_TTL,
    StoreActions,
    build_snapshot,
    evaluate,
    holder_id,
    read_metrics,
)
from autoscaler.control.runtime import Runtime
from autoscaler.lifecycle import InstanceState
from autoscaler.metrics.base import PUBLISHED_AT_HEADER
from autoscaler.metrics.celery_redis import CeleryRedisLayout
from autoscaler.policy.decide import decide
from autoscaler.settings import Settings
from autoscaler.store import config_versions, leases, migrate
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import Instance

PROVIDER = "bench-mock"
S = InstanceState


# --------------------------------------------------------------------------- the world


def config_document(n: int, instances: int, redis_url: str, prefix: str) -> dict[str, Any]:
    per_queue = instances // max(1, n - n // 10) + 1
    metrics = {"source": "celery", "url": redis_url, "global_keyprefix": prefix}
    queues: dict[str, Any] = {}
    for i in range(n):
        kind = i % 5
        up: list[dict[str, Any]]
        down: list[dict[str, Any]] = [{"trigger": "idle", "timeout": ["5m", "10m", "15m"][i % 3]}]
        if kind == 0:
            up = [{"trigger": "no_workers"}]
        elif kind == 1:
            up = [{"trigger": "no_workers"}, {"trigger": "queue_depth", "threshold": 20}]
        elif kind == 2:
            up = [{"trigger": "queue_depth", "target_per_worker": 4}]
        elif kind == 3:
            up = [{"trigger": "no_workers"}, {"trigger": "latency", "max_latency": "2m"}]
            down.append({"trigger": "schedule", "cron": "0 22 * * *", "timezone": "Europe/Paris"})
        else:
            up = [
                {"trigger": "no_workers"},
                {"trigger": "schedule", "cron": "0 8 * * 1-5", "timezone": "America/New_York",
                 "workers": 1, "duration": "2h"},
            ]
        queues[qname(i)] = {
            "metrics": metrics,
            "autoscale": {
                "provider": PROVIDER,
                "min_workers": 1 if i % 7 == 0 else 0,
                "max_workers": per_queue + 10,
                "priority": i % 3,
                "scale_up": up,
                "scale_down": down,
                "instance": {"gpu": "RTX 4090", "max_price_per_hour": 0.6},
            },
        }
    doc = {
        "poll_interval": "30s",
        "limits": {"max_machines": instances * 4, "max_price_per_hour": instances * 2.0},
        "providers": {PROVIDER: {"kind": "mock", "boot_delay": "60s", "price_per_hour": 0.4}},
        "queues": queues,
    }
    return Config.model_validate(doc).model_dump(mode="json")


def qname(i: int) -> str:
    return f"bench-q{i:04d}"


def instance_rows(n: int, count: int, installation: str, now: datetime) -> list[dict[str, Any]]:
    """`count` machines over the queues that have any (every tenth queue has none): 75% ready
    (60% of them busy, 25% idle a few minutes, 15% idle for long), 15% booting, 10% draining."""
    rng = random.Random(7)
    with_machines = [i for i in range(n) if i % 10 != 5]
    rows = []
    for k in range(count):
        q = qname(with_machines[k % len(with_machines)])
        launch = uuid.UUID(int=rng.getrandbits(128)).hex
        created = now - timedelta(seconds=rng.uniform(600, 36000))
        row: dict[str, Any] = {
            "launch_id": launch, "queue": q, "provider": PROVIDER,
            "provider_instance_id": f"mock-{k + 1}", "host_id": f"host-{k}", "gpu": "RTX 4090",
            "price_per_hour": 0.4, "attempts": 1, "drain_requested": False,
            "pending_at": created, "creating_at": created + timedelta(seconds=1),
            "booting_at": created + timedelta(seconds=3), "created_at": created,
            "updated_at": now, "running_tasks": 0,
            "worker_name": f"asg-{installation}-{launch}@host-{k}",
        }
        roll = rng.random()
        if roll < 0.75:
            ready = created + timedelta(seconds=rng.uniform(60, 300))
            row.update(state=S.READY, ready_at=ready, state_reason="worker answered",
                       last_heartbeat_at=now - timedelta(seconds=rng.uniform(0, 30)))
            kind = rng.random()
            if kind < 0.60:
                row.update(running_tasks=1,
                           last_task_at=now - timedelta(seconds=rng.uniform(0, 30)))
            elif kind < 0.85:
                row["last_task_at"] = now - timedelta(seconds=rng.uniform(30, 240))
            else:
                row["last_task_at"] = max(ready, now - timedelta(seconds=rng.uniform(1200, 7200)))
        elif roll < 0.90:
            created = now - timedelta(seconds=rng.uniform(5, 240))
            row.update(state=S.BOOTING, state_reason="rented", created_at=created,
                       pending_at=created, creating_at=created + timedelta(seconds=1),
                       booting_at=created + timedelta(seconds=3), worker_name=None)
        else:
            ready = created + timedelta(seconds=rng.uniform(60, 300))
            row.update(state=S.DRAINING, state_reason="idle", ready_at=ready,
                       draining_at=now - timedelta(seconds=rng.uniform(5, 600)),
                       last_task_at=now - timedelta(seconds=rng.uniform(0, 600)),
                       running_tasks=rng.choice((0, 1)),
                       last_heartbeat_at=now - timedelta(seconds=rng.uniform(0, 30)))
        rows.append(row)
    return rows


def message(queue: str, stamped: bool) -> bytes:
    headers: dict[str, Any] = {"task": "app.tasks.infer", "id": str(uuid.uuid4()), "retries": 0}
    if stamped:
        headers[PUBLISHED_AT_HEADER] = time.time() - 20
    return json.dumps({
        "body": "W1siaW1hZ2UucG5nIl0sIHt9LCB7ImNhbGxiYWNrcyI6IG51bGx9XQ==",
        "content-encoding": "utf-8", "content-type": "application/json", "headers": headers,
        "properties": {"correlation_id": headers["id"], "delivery_tag": str(uuid.uuid4()),
                       "priority": 0, "body_encoding": "base64", "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": queue}},
    }).encode()


def pending_queues(n: int) -> list[int]:
    """A fifth of the queues hold jobs, the queues without machines among them."""
    return [i for i in range(n) if i % 5 == 0 or i % 10 == 5]


def fill_redis(r: redis.Redis, layout: CeleryRedisLayout, n: int) -> int:
    pipe = r.pipeline(transaction=False)
    total = 0
    for i in pending_queues(n):
        for _ in range(1 + (i * 7) % 30):
            pipe.lpush(layout.keys(qname(i))[0], message(qname(i), stamped=i % 2 == 0))
            total += 1
    pipe.execute()
    return total


def move_heads(r: redis.Redis, layout: CeleryRedisLayout, n: int) -> None:
    """A worker took the oldest job of every non-empty queue and a producer added one."""
    pipe = r.pipeline(transaction=False)
    for i in pending_queues(n):
        key = layout.keys(qname(i))[0]
        pipe.rpop(key)
        pipe.lpush(key, message(qname(i), stamped=i % 2 == 0))
    pipe.execute()


# --------------------------------------------------------------------------- counting


def statement_kind(sql: str) -> str:
    s = " ".join(sql.split())
    for pat, verb in ((r"^INSERT INTO (\w+)", "INSERT"), (r"^UPDATE (\w+)", "UPDATE"),
                      (r"^DELETE FROM (\w+)", "DELETE")):
        m = re.match(pat, s, re.I)
        if m:
            return f"{verb} {m.group(1)}"
    m = re.search(r"\bFROM (\w+)", s, re.I)
    return f"SELECT {m.group(1)}" if m else s[:40]


@dataclass
class Counter_:
    on: bool = False
    phase: str = "-"
    statements: list[tuple[str, str]] = field(default_factory=list)
    checkouts: int = 0
    commits: int = 0

    def attach(self, engine: Any) -> None:
        @event.listens_for(engine, "before_cursor_execute")
        def _stmt(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                  executemany: bool) -> None:
            if self.on:
                self.statements.append((self.phase, statement_kind(statement)))

        @event.listens_for(engine.pool, "checkout")
        def _checkout(*_: Any) -> None:
            if self.on:
                self.checkouts += 1

        @event.listens_for(engine, "commit")
        def _commit(*_: Any) -> None:
            if self.on:
                self.commits += 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.statements, self.checkouts, self.commits, self.on = [], 0, 0, True
        try:
            yield
        finally:
            self.on = False


# --------------------------------------------------------------------------- runs


@dataclass
class Run:
    wall: float
    statements: int
    checkouts: int
    commits: int
    kinds: Counter[str]
    launched: int = 0
    drained: int = 0
    degraded: bool = False


class SourceFailures(logging.Handler):
    """Counts "metrics source failed" warnings: such a run read no fresh numbers (e.g. Redis
    restarted under us) and is left out of the figures."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


FAILURES = SourceFailures()
logging.getLogger("autoscaler.metrics").addHandler(FAILURES)
logging.getLogger("autoscaler.metrics").propagate = False


def noop(step: str, launch_id: str) -> None:
    return None


def timed_evaluate(rt: Runtime, counter: Counter_, now: datetime) -> Run:
    failures = FAILURES.count
    with counter.counting():
        t = time.perf_counter()
        res = evaluate(rt, noop, trigger="poll", now=now)
        wall = time.perf_counter() - t
    assert res.skipped is None, res.skipped
    return Run(wall, len(counter.statements), counter.checkouts, counter.commits,
               Counter(k for _, k in counter.statements), len(res.launched), len(res.drains),
               degraded=FAILURES.count > failures)


def good(runs: list[Run]) -> list[Run]:
    """The runs whose metrics were read fresh (all of them, unless a source failed)."""
    return [r for r in runs if not r.degraded] or runs


PHASES = ("load + claim slots", "evaluation lease", "metrics read", "snapshot build", "decide()",
          "plan -> actions", "flush + commit", "lease release")


def phased_tick(rt: Runtime, counter: Counter_, now: datetime) -> dict[str, tuple[float, int]]:
    """`evaluate`'s steps, one by one, from the public functions; (seconds, statements) each."""
    out: dict[str, tuple[float, int]] = {}

    @contextmanager
    def phase(name: str) -> Iterator[None]:
        counter.phase = name
        before = len(counter.statements)
        t = time.perf_counter()
        yield
        out[name] = (time.perf_counter() - t, len(counter.statements) - before)

    with counter.counting():
        with phase(PHASES[0]), rt.transaction() as session:
            loaded = rt.load(session)
            assert loaded is not None
            slots = [(q, int(now.timestamp() // loaded.poll_interval(q)))
                     for q in loaded.autoscaled]
            due = sorted(leases.claim_ticks(session, slots, "tick", now))
        holder = holder_id()
        with phase(PHASES[1]), rt.transaction() as session:
            assert leases.acquire(session, EVALUATION_LEASE, holder, LEASE_TTL, now)
        with phase(PHASES[2]):
            metrics = read_metrics(rt, loaded, due)
        session = rt.sessions()
        session.begin()
        try:
            with phase(PHASES[3]):
                snapshot = build_snapshot(session, rt, loaded, metrics, now)
            with phase(PHASES[4]):
                plan = decide(snapshot, loaded.config, now)
            with phase(PHASES[5]):
                actions = StoreActions(session, loaded, now)
                execute(plan, actions, lambda: uuid.uuid4().hex, due)
            with phase(PHASES[6]):
                actions.flush()
                session.commit()
        finally:
            session.close()
        with phase(PHASES[7]), rt.transaction() as session:
            leases.release(session, EVALUATION_LEASE, holder)
    counter.phase = "-"
    return out


@dataclass
class Size:
    queues: int
    steady: list[Run]
    busy: list[Run]
    phases_steady: list[dict[str, tuple[float, int]]]
    phases_busy: list[dict[str, tuple[float, int]]]
    first: Run
    jobs: int
    machine_states: dict[str, int]
    profile: str | None = None


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def bench_size(n: int, args: argparse.Namespace) -> Size:
    db = f"bench_tick_{uuid.uuid4().hex[:10]}"
    url = f"postgresql+psycopg://{args.pg_user}@{args.pg_host}:{args.pg_port}/{db}"
    prefix = f"bench-tick-{uuid.uuid4().hex[:8]}:"
    r = redis.Redis.from_url(args.redis)
    layout = CeleryRedisLayout(global_keyprefix=prefix)
    with psycopg.connect(args.pg_admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    rt: Runtime | None = None
    admin = None
    home = None
    try:
        migrate.upgrade(url)
        admin = make_engine(url)
        home = tempfile.mkdtemp(prefix="bench-tick-")  # nothing is written there (mock provider)
        settings = Settings.from_env({"AUTOSCALER_DATABASE_URL": url, "AUTOSCALER_HOME": home})
        rt = Runtime(settings, env={})
        counter = Counter_()
        counter.attach(rt.engine)
        t0 = datetime.now(UTC).replace(microsecond=0)
        sessions = session_factory(admin)
        with transaction(sessions) as s:
            install = rt.installation_id(s)
            config_versions.record(s, config_document(n, args.instances, args.redis, prefix),
                                   "benchmarks/tick.py", t0)
            rows = instance_rows(n, args.instances, install, t0)
            s.execute(insert(Instance), rows)
        with admin.begin() as c:
            c.execute(text("CREATE TABLE bench_seed AS SELECT * FROM instances"))
        with admin.connect() as c:
            c.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))
        states = Counter(str(row["state"]) for row in rows)
        jobs = fill_redis(r, layout, n)

        def reset() -> None:
            with admin.begin() as c:
                c.execute(text("TRUNCATE instances"))
                c.execute(text("INSERT INTO instances SELECT * FROM bench_seed"))
            move_heads(r, layout, n)

        def now() -> datetime:
            """The same `now` every run (the seeded timestamps stay as meant), with last run's
            tick slots deleted, outside the timing, so every queue's poll slot is due again."""
            with admin.begin() as c:
                c.execute(text("DELETE FROM tick_slots"))
            return t0 + timedelta(seconds=1)

        first = timed_evaluate(rt, counter, now())  # warm-up: config parse, connections
        steady = [timed_evaluate(rt, counter, now()) for _ in range(args.runs)]
        ph_steady = [phased_tick(rt, counter, now()) for _ in range(3)]
        busy = []
        for _ in range(args.runs):
            reset()
            busy.append(timed_evaluate(rt, counter, now()))
        ph_busy = []
        for _ in range(3):
            reset()
            ph_busy.append(phased_tick(rt, counter, now()))
        prof = None
        if args.profile:
            buf = io.StringIO()
            for label in ("steady", "busy"):
                at = now()
                if label == "busy":
                    reset()
                p = cProfile.Profile()
                p.enable()
                evaluate(rt, noop, trigger="poll", now=at)
                p.disable()
                buf.write(f"\n--- {label} tick, {n} queues: the project's functions by "
                          "cumulative time ---\n")
                stats = pstats.Stats(p, stream=buf).sort_stats("cumulative")
                stats.print_stats(r"/autoscaler/", 25)
            prof = buf.getvalue()
        return Size(n, steady, busy, ph_steady, ph_busy, first, jobs, dict(states), prof)
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
            r.delete(*keys[i:i + 1000])
        r.close()


# --------------------------------------------------------------------------- report


def describe(runs: list[Run]) -> str:
    left_out = sum(r.degraded for r in runs)
    runs = good(runs)
    walls = [x.wall * 1000 for x in runs]
    st = [x.statements for x in runs]
    return (f"median {med(walls):7.1f} ms (min {min(walls):6.1f}, max {max(walls):6.1f})   "
            f"statements {med(st):5.0f}   checkouts {med([x.checkouts for x in runs]):3.0f}   "
            f"commits {med([x.commits for x in runs]):3.0f}   "
            f"launches {med([x.launched for x in runs]):4.0f}   "
            f"drains {med([x.drained for x in runs]):4.0f}"
            + (f"   ({left_out} run(s) with a failing metrics source left out)"
               if left_out else ""))


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
    ap.add_argument("--profile", action="store_true",
                    help="cProfile one steady and one busy tick per size")
    args = ap.parse_args()
    sizes = []
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    for n in (int(x) for x in args.queues.split(",")):
        started = time.perf_counter()
        size = bench_size(n, args)
        sizes.append(size)
        print(f"{n} queues, {args.instances} machines "
              f"({', '.join(f'{v} {k}' for k, v in sorted(size.machine_states.items()))}), "
              f"{size.jobs} pending jobs in {len(pending_queues(n))} queues; PostgreSQL; "
              f"{args.runs} runs after a warm-up ({time.perf_counter() - started:.0f} s in all)")
        print(f"  first tick (config parse, connections, first sightings): "
              f"{size.first.wall * 1000:.1f} ms, {size.first.statements} statements, "
              f"{size.first.launched} launches, {size.first.drained} drains")
        print(f"  steady tick: {describe(size.steady)}")
        print(f"  busy tick:   {describe(size.busy)}")
    if len(sizes) >= 2:
        a, b = sizes[0], sizes[-1]
        print(f"\nratio {b.queues}/{a.queues} queues (same {args.instances} machines):")
        picks: tuple[tuple[str, Callable[[Size], list[Run]]], ...] = (
            ("steady", lambda s: good(s.steady)), ("busy", lambda s: good(s.busy)))
        for label, pick in picks:
            wa, wb = med([x.wall for x in pick(a)]), med([x.wall for x in pick(b)])
            sa, sb = med([x.statements for x in pick(a)]), med([x.statements for x in pick(b)])
            print(f"  {label:6s} time {wb / wa:5.2f}x   statements {sb / sa:5.2f}x "
                  f"({sa:.0f} -> {sb:.0f})")
        wb = med([x.wall for x in good(b.busy)])
        print(f"  target: statements flat in queues and machines; a {b.queues}-queue tick within "
              f"1 s -> steady {med([x.wall for x in good(b.steady)]):.2f} s, busy {wb:.2f} s")
    print(f"  load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    phase_table("steady tick", sizes, lambda s: s.phases_steady)
    phase_table("busy tick", sizes, lambda s: s.phases_busy)
    kinds_table("steady tick", sizes, lambda s: s.steady)
    kinds_table("busy tick", sizes, lambda s: s.busy)
    for s in sizes:
        if s.profile:
            print(f"\ncProfile, {s.queues} queues:{s.profile}")


if __name__ == "__main__":
    main()
