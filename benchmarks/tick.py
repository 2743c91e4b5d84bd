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
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import multiprocessing
import os
import pstats
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_any
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy import event, insert, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import autoscaler.control.tick.evaluate as tick
from autoscaler.brokers.base import PUBLISHED_AT_HEADER
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from autoscaler.config.models import Config
from autoscaler.control.executor import execute
from autoscaler.control.outbox import StepName
from autoscaler.control.runtime import Runtime
from autoscaler.control.tick.actions import StoreActions
from autoscaler.control.tick.evaluate import EVALUATION_LEASE, LEASE_TTL, evaluate, holder_id
from autoscaler.control.tick.read import read_metrics
from autoscaler.control.tick.snapshot import build_snapshot
from autoscaler.lifecycle import InstanceState
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
                {
                    "trigger": "schedule",
                    "cron": "0 8 * * 1-5",
                    "timezone": "America/New_York",
                    "workers": 1,
                    "duration": "2h",
                },
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
            "launch_id": launch,
            "queue": q,
            "provider": PROVIDER,
            "provider_instance_id": f"mock-{k + 1}",
            "host_id": f"host-{k}",
            "gpu": "RTX 4090",
            "price_per_hour": 0.4,
            "attempts": 1,
            "drain_requested": False,
            "pending_at": created,
            "creating_at": created + timedelta(seconds=1),
            "booting_at": created + timedelta(seconds=3),
            "created_at": created,
            "updated_at": now,
            "running_tasks": 0,
            "worker_name": f"asg-{installation}-{launch}@host-{k}",
        }
        roll = rng.random()
        if roll < 0.75:
            ready = created + timedelta(seconds=rng.uniform(60, 300))
            row.update(
                state=S.READY,
                ready_at=ready,
                state_reason="worker answered",
                last_heartbeat_at=now - timedelta(seconds=rng.uniform(0, 30)),
            )
            kind = rng.random()
            if kind < 0.60:
                row.update(
                    running_tasks=1, last_task_at=now - timedelta(seconds=rng.uniform(0, 30))
                )
            elif kind < 0.85:
                row["last_task_at"] = now - timedelta(seconds=rng.uniform(30, 240))
            else:
                row["last_task_at"] = max(ready, now - timedelta(seconds=rng.uniform(1200, 7200)))
        elif roll < 0.90:
            created = now - timedelta(seconds=rng.uniform(5, 240))
            row.update(
                state=S.BOOTING,
                state_reason="rented",
                created_at=created,
                pending_at=created,
                creating_at=created + timedelta(seconds=1),
                booting_at=created + timedelta(seconds=3),
                worker_name=None,
            )
        else:
            ready = created + timedelta(seconds=rng.uniform(60, 300))
            row.update(
                state=S.DRAINING,
                state_reason="idle",
                ready_at=ready,
                draining_at=now - timedelta(seconds=rng.uniform(5, 600)),
                last_task_at=now - timedelta(seconds=rng.uniform(0, 600)),
                running_tasks=rng.choice((0, 1)),
                last_heartbeat_at=now - timedelta(seconds=rng.uniform(0, 30)),
            )
        rows.append(row)
    return rows


def message(queue: str, stamped: bool) -> bytes:
    headers: dict[str, Any] = {"task": "app.tasks.infer", "id": str(uuid.uuid4()), "retries": 0}
    if stamped:
        headers[PUBLISHED_AT_HEADER] = time.time() - 20
    return json.dumps(
        {
            "body": "W1siaW1hZ2UucG5nIl0sIHt9LCB7ImNhbGxiYWNrcyI6IG51bGx9XQ==",
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "correlation_id": headers["id"],
                "delivery_tag": str(uuid.uuid4()),
                "priority": 0,
                "body_encoding": "base64",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
            },
        }
    ).encode()


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
    for pat, verb in (
        (r"^INSERT INTO (\w+)", "INSERT"),
        (r"^UPDATE (\w+)", "UPDATE"),
        (r"^DELETE FROM (\w+)", "DELETE"),
    ):
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
        def _stmt(
            conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
        ) -> None:
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
logging.getLogger("autoscaler.brokers").addHandler(FAILURES)
logging.getLogger("autoscaler.brokers").propagate = False


class Discard:
    """An outbox that sends nothing (the steps' tasks are not part of the tick's time)."""

    def step(self, step: StepName, launch_id: str, *, after: float | None = None) -> None:
        return None

    def evaluate(self, queue: str) -> None:
        return None

    def shard(self, number: int) -> None:
        return None


noop = Discard()


def timed_evaluate(rt: Runtime, counter: Counter_, now: datetime) -> Run:
    failures = FAILURES.count
    with counter.counting():
        t = time.perf_counter()
        res = evaluate(rt, noop, trigger="poll", now=now)
        wall = time.perf_counter() - t
    assert res.skipped is None, res.skipped
    return Run(
        wall,
        len(counter.statements),
        counter.checkouts,
        counter.commits,
        Counter(k for _, k in counter.statements),
        len(res.launched),
        len(res.drains),
        degraded=FAILURES.count > failures,
    )


def good(runs: list[Run]) -> list[Run]:
    """The runs whose metrics were read fresh (all of them, unless a source failed)."""
    return [r for r in runs if not r.degraded] or runs


PHASES = (
    "load + claim slots",
    "evaluation lease",
    "metrics read",
    "snapshot build",
    "decide()",
    "plan -> actions",
    "flush + commit",
    "lease release",
)


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
            slots = [
                (q, int(now.timestamp() // loaded.poll_interval(q))) for q in loaded.autoscaled
            ]
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
    shards: list[ShardRuns] | None = None
    limits: dict[str, Any] | None = None
    shard_seconds: float = 0.0


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def bench_size(n: int, args: argparse.Namespace, shards: Sequence[int] = ()) -> Size:
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
        doc = config_document(n, args.instances, args.redis, prefix)
        with transaction(sessions) as s:
            install = rt.installation_id(s)
            config_versions.record(s, doc, "benchmarks/tick.py", t0)
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
                buf.write(
                    f"\n--- {label} tick, {n} queues: the project's functions by "
                    "cumulative time ---\n"
                )
                stats = pstats.Stats(p, stream=buf).sort_stats("cumulative")
                stats.print_stats(r"/autoscaler/", 25)
            prof = buf.getvalue()
        by_workers = None
        shards_started = time.perf_counter()
        if shards:
            by_workers = []
            for w in shards:
                with transaction(sessions) as s:
                    config_versions.record(
                        s, {**doc, "evaluation": {"shards": w}}, "benchmarks/tick.py", t0
                    )
                by_workers.append(shard_runs(w, url, home, args.runs, now, reset))
        return Size(
            n,
            steady,
            busy,
            ph_steady,
            ph_busy,
            first,
            jobs,
            dict(states),
            prof,
            by_workers,
            doc["limits"],
            time.perf_counter() - shards_started,
        )
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


# --------------------------------------------------------------------------- shards


SHARD_PHASES = (
    "claim slots",
    "evaluation lease",
    "metrics read",
    "snapshot build",
    "decide()",
    "account lock wait",
    "execute",
    "flush",
    "rest",
)
"""Where a shard worker's evaluation goes: the steps `_evaluate` looks up on its modules at call
time, wrapped with timers in the worker processes only (`time_steps`). "evaluation lease" is
taking and renewing it (waits for its advisory lock included); "rest" is the wall time none of
them covers (loading the config, the recount under the account lock, the commit, the lease's
release)."""

SHARD_TIMEOUT = 900.0
"""Seconds the parent waits for the shard workers' answers to one tick before giving up."""


def time_steps() -> tuple[dict[str, float], dict[str, int]]:
    """Wraps `_evaluate`'s steps with timers in this process (a shard worker's); the returned
    dicts are filled with each step's seconds and calls, to be cleared before each tick."""
    spent: dict[str, float] = {}
    calls: dict[str, int] = {}

    def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t
                calls[label] = calls.get(label, 0) + 1

        return wrapper

    steps: tuple[tuple[Any, str, str], ...] = (
        (tick, "_claim_slots", "claim slots"),
        (leases, "acquire_evaluation", "evaluation lease"),
        (tick, "read_metrics", "metrics read"),
        (tick, "build_snapshot", "snapshot build"),
        (tick, "decide", "decide()"),
        (leases, "lock_account", "account lock wait"),
        (tick, "execute", "execute"),
        (StoreActions, "flush", "flush"),
    )
    for owner, name, label in steps:
        setattr(owner, name, timed(label, getattr(owner, name)))
    return spent, calls


def shard_worker(conn: Connection, url: str, home: str, shard: int | None) -> None:
    """One worker process: its own Runtime (engine, pools, sources), then one evaluation of
    `shard` (None: the plain tick) per `now` received, answered with (wall seconds, launches,
    drains, skipped, degraded, seconds and calls per step); None ends it. An error is answered with
    ("error", traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops its workers itself
    rt: Runtime | None = None
    try:
        spent, calls = time_steps()
        settings = Settings.from_env({"AUTOSCALER_DATABASE_URL": url, "AUTOSCALER_HOME": home})
        rt = Runtime(settings, env={})
        while True:
            at = conn.recv()
            if at is None:
                return
            spent.clear()
            calls.clear()
            failures = FAILURES.count
            t = time.perf_counter()
            res = evaluate(rt, noop, trigger="poll", shard=shard, now=at)
            wall = time.perf_counter() - t
            steps = {k: spent.get(k, 0.0) for k in SHARD_PHASES[:-1]}
            steps["rest"] = wall - sum(steps.values())
            conn.send(
                (
                    wall,
                    len(res.launched),
                    len(res.drains),
                    res.skipped,
                    FAILURES.count > failures,
                    steps,
                    dict(calls),
                )
            )
    except Exception:
        conn.send(("error", traceback.format_exc()))
    finally:
        if rt is not None:
            rt.close()
        conn.close()


@dataclass
class ShardAnswer:
    wall: float
    launched: int
    drained: int
    skipped: str | None
    degraded: bool
    steps: dict[str, float]
    calls: dict[str, int]


@dataclass
class ShardTick:
    wall: float
    """The parent's: from the signal to the last worker's answer."""
    answers: list[ShardAnswer]

    @property
    def slowest(self) -> ShardAnswer:
        return max(self.answers, key=lambda a: a.wall)

    @property
    def launched(self) -> int:
        return sum(a.launched for a in self.answers)

    @property
    def drained(self) -> int:
        return sum(a.drained for a in self.answers)

    @property
    def degraded(self) -> bool:
        return any(a.degraded for a in self.answers)

    @property
    def skipped(self) -> list[str]:
        return [f"shard {i}: {a.skipped}" for i, a in enumerate(self.answers) if a.skipped]


@dataclass
class ShardRuns:
    workers: int
    warmup: ShardTick
    steady: list[ShardTick]
    busy: list[ShardTick]


def good_ticks(ticks: list[ShardTick]) -> list[ShardTick]:
    """As `good`: the ticks whose metrics were read fresh (all of them, unless a source
    failed)."""
    return [t for t in ticks if not t.degraded] or ticks


def shard_runs(
    workers: int,
    url: str,
    home: str,
    runs: int,
    now: Callable[[], datetime],
    reset: Callable[[], None],
) -> ShardRuns:
    """`workers` processes (spawned, each with its own Runtime) evaluating shard i of
    `workers` at once (one process running the plain tick for 1): a warm-up, then `runs`
    steady and `runs` busy ticks, each prepared by the parent (`now()` deletes the tick slots;
    a busy tick is `reset()` first) and timed from the signal to the last answer."""
    ctx = multiprocessing.get_context("spawn")
    pipes: list[Connection] = []
    procs: list[multiprocessing.process.BaseProcess] = []

    def tick(at: datetime) -> ShardTick:
        answers: dict[int, ShardAnswer] = {}
        t = time.perf_counter()
        for c in pipes:
            c.send(at)
        done = t
        while len(answers) < len(pipes):
            left = t + SHARD_TIMEOUT - time.perf_counter()
            waiting = [c for i, c in enumerate(pipes) if i not in answers]
            ready = wait_any(
                waiting + [p.sentinel for i, p in enumerate(procs) if i not in answers],
                timeout=max(0.0, left),
            )
            if not ready:
                raise RuntimeError(f"shard workers gave no answer within {SHARD_TIMEOUT:.0f} s")
            for i, c in enumerate(pipes):
                if i in answers or not (c in ready or procs[i].sentinel in ready):
                    continue
                if not c.poll():
                    procs[i].join(timeout=5)
                    raise RuntimeError(
                        f"shard worker {i} of {workers} died (exit code {procs[i].exitcode})"
                    )
                got = c.recv()
                if got[0] == "error":
                    raise RuntimeError(f"shard worker {i} of {workers} failed:\n{got[1]}")
                answers[i] = ShardAnswer(*got)
                done = time.perf_counter()
        return ShardTick(done - t, [answers[i] for i in range(len(pipes))])

    try:
        for i in range(workers):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=shard_worker,
                name=f"bench-shard-{i}-of-{workers}",
                args=(theirs, url, home, None if workers == 1 else i),
                daemon=True,
            )
            pipes.append(ours)
            procs.append(proc)
            proc.start()
            theirs.close()
        warmup = tick(now())  # process start, config parse, connections; its slots deleted next
        steady = [tick(now()) for _ in range(runs)]
        busy = []
        for _ in range(runs):
            reset()
            busy.append(tick(now()))
        return ShardRuns(workers, warmup, steady, busy)
    finally:
        for c in pipes:
            with suppress(OSError):  # that worker is gone already
                c.send(None)
        for p in procs:
            p.join(timeout=30)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        for c in pipes:
            c.close()


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
