"""One size of `tick.py`: a fresh database and Redis prefix, the timed ticks (steady and busy)
and the replica of `evaluate`'s steps that times each phase (`bench_size`).

Apart from `tick.py`, which reports what it returns.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import redis
from sqlalchemy import insert, text
from tick_shards import ShardRuns, shard_runs
from tick_world import (
    FAILURES,
    Counter_,
    config_document,
    fill_redis,
    instance_rows,
    move_heads,
    noop,
)

from autoscaler.brokers.redis.keys import CeleryRedisLayout
from autoscaler.control.executor import execute
from autoscaler.control.runtime import Runtime
from autoscaler.control.tick.actions import StoreActions
from autoscaler.control.tick.evaluate import EVALUATION_LEASE, LEASE_TTL, evaluate, holder_id
from autoscaler.control.tick.read import read_metrics
from autoscaler.control.tick.snapshot import build_snapshot
from autoscaler.policy.decide import decide
from autoscaler.settings import Settings
from autoscaler.store import config_versions, leases, migrate
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import Instance

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
