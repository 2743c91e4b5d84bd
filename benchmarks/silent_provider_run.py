"""One run of `silent_provider.py` (healthy or silent): a fresh control plane and fresh fakes,
the RunPod machines drained, the Vast-only trials timed, and what the fakes and the control
plane's log say about the listings and reconcile rounds (`one_run`).

Apart from `silent_provider.py`, which runs it twice and reports.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import itertools
import os
import random
import re
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from silent_provider_world import (
    CELERY,
    OPERATOR,
    RP,
    RUNPOD_KEY,
    SILENT_FOR,
    TRIAL_TIMEOUT,
    VA,
    VAST_KEY,
    WATCH_DB,
    Procs,
    S,
    config_text,
    envelope,
    next_line,
    reader,
    stamped,
    tail,
    wait_for,
)
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config import load_config_text
from autoscaler.lifecycle import LIVE_STATES, InstanceState
from autoscaler.settings import CONTROL_QUEUE, LIFECYCLE_SUFFIX
from autoscaler.store import config_versions, migrate
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import Instance
from tests.fakes import Recorded
from tests.fakes.runpod_server import FakeRunPod
from tests.fakes.vast_server import FakeVast, default_offers

# --------------------------------------------------------------------------- one run


@dataclass
class Run:
    name: str
    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    warmup: float | None = None
    window: float = 0.0  # the drains -> the end of the observation (s)
    listings: dict[str, int] = field(default_factory=dict)
    vast_max_gap: float = 0.0
    runpod_calls: Counter[str] = field(default_factory=Counter)
    silent: bool = False
    drains: list[str] = field(default_factory=list)
    rp_states: Counter[str] = field(default_factory=Counter)
    rounds: list[float] = field(default_factory=list)  # reconcile rounds' durations (s)
    skipped: int = 0  # reconcile rounds that found one still running
    unread: Counter[str] = field(default_factory=Counter)  # providers unread, by rounds


def vast_full_listing(r: Recorded) -> bool:
    """Reconcile's listing of every Vast instance (`list_owned`: no filter); a lookup by
    label (a launch's or terminate's own) has `select_filters` on the label."""
    return (
        r.method == "GET"
        and r.path.rstrip("/") == "/api/v1/instances"
        and r.query.get("select_filters", ["{}"]) == ["{}"]
    )


def runpod_kind(r: Recorded) -> str:
    if r.path == "/v2/pods":
        return f"{r.method} /v2/pods"
    if r.path.startswith("/v2/pods/"):
        return f"{r.method} /v2/pods/{{id}}" + ("/action" if r.path.endswith("/action") else "")
    return f"{r.method} {r.path}"


def max_gap(times: list[float], t0: float, t1: float) -> float:
    """The longest stretch of [t0, t1] with no listing: between consecutive listings (the last
    one before t0 included), and from the last listing to t1."""
    before = [t for t in times if t < t0]
    inside = [t for t in times if t0 <= t <= t1]
    points = ([before[-1]] if before else [t0]) + inside + [t1]
    return max((b - a for a, b in itertools.pairwise(points)), default=t1 - t0)


ROUND = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/[^\]]*\] "
    r"Task autoscaler\.reconcile\[[^\]]*\] succeeded in ([\d.]+)s: (.*)$"
)


def reconcile_rounds(run: Run, log: Path, t0: float, t1: float) -> None:
    """The lifecycle worker's reconcile results that ended in [t0, t1] (wall clock; Celery
    logs local time): each round's duration and unread providers, and the rounds skipped
    because one was still running."""
    for line in log.read_text(errors="replace").splitlines():
        m = ROUND.match(line)
        if m is None:
            continue
        at = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if not t0 <= at <= t1:
            continue
        try:
            result = ast.literal_eval(m[3])
        except (ValueError, SyntaxError):
            continue
        if not isinstance(result, dict):
            continue
        if "skipped" in result:
            run.skipped += 1
            continue
        run.rounds.append(float(m[2]))
        run.unread.update(result.get("providers_unreadable") or [])


def one_run(
    name: str, silent: bool, setup: dict[str, Any], home: Path, args: argparse.Namespace
) -> Run:
    run = Run(name)
    home.mkdir(parents=True, exist_ok=True)
    runpod, vast = FakeRunPod(RUNPOD_KEY), FakeVast(VAST_KEY)
    rp_log, va_log = stamped(runpod), stamped(vast)
    watch_url = f"redis://{args.redis_host}:6379/{WATCH_DB}"
    prefix = f"bench-silent-{uuid.uuid4().hex[:8]}:"
    watched = redis.Redis.from_url(watch_url)
    db_url = setup["db_url"] or f"sqlite:///{home / 'state.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")}
    env.update(
        {
            "AUTOSCALER_HOME": str(home),
            "BENCH_RUNPOD_KEY": RUNPOD_KEY,
            "BENCH_VAST_KEY": VAST_KEY,
            "PYTHONUNBUFFERED": "1",
            **setup["env"],
        }
    )
    control_queue = setup["env"].get("AUTOSCALER_CONTROL_QUEUE", CONTROL_QUEUE)
    if "AUTOSCALER_BROKER_URL" not in setup["env"]:
        migrate.prepare_embedded_broker(f"sqla+sqlite:///{home / 'broker.db'}")
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    sessions: sessionmaker[Session] = session_factory(engine)
    config = load_config_text(
        config_text(runpod.url, vast.url, watch_url, prefix, args.poll, args.machines)
    )
    with transaction(sessions) as s:
        config_versions.record(
            s, config.model_dump(mode="json"), "benchmarks/silent_provider.py", datetime.now(UTC)
        )
    procs = Procs()
    logs = {n: home / f"{n}.log" for n in ("worker-loop", "worker-lifecycle", "beat", "operator")}
    tag = uuid.uuid4().hex[:6]
    try:
        for worker, consumed, concurrency in (
            ("worker-loop", control_queue, 2),
            ("worker-lifecycle", control_queue + LIFECYCLE_SUFFIX, 4),
        ):
            argv = [CELERY, "-A", "autoscaler", "worker", "-l", "info", "-Q", consumed]
            argv += ["--concurrency", str(concurrency), "-n", f"bench-{worker}-{tag}@%h"]
            procs.start(worker, argv, env, logs[worker])
        procs.start(
            "beat",
            [CELERY, "-A", "autoscaler", "beat", "-l", "info", "-s", str(home / "beat-schedule")],
            env,
            logs["beat"],
        )
        for n in ("worker-loop", "worker-lifecycle"):
            wait_for(f"{n} up", lambda n=n: " ready." in tail(logs[n], 200), 90, procs)

        def rows(queue: str, states: tuple[InstanceState, ...]) -> list[Instance]:
            with transaction(sessions) as s:
                got = list(
                    s.scalars(
                        select(Instance).where(Instance.queue == queue, Instance.state.in_(states))
                    )
                )
                for r in got:
                    s.expunge(r)
                return got

        def va_to_zero() -> None:
            """No job, no live `va` row, no Vast instance, the market as it was."""
            watched.delete(prefix + VA)
            with contextlib.suppress(RuntimeError):  # let the trial's launch finish first
                wait_for(
                    "va's launch to finish",
                    lambda: not rows(VA, (S.PENDING, S.CREATING)),
                    TRIAL_TIMEOUT,
                    procs,
                )
            with transaction(sessions) as s:
                now = datetime.now(UTC)
                s.execute(
                    update(Instance)
                    .where(Instance.queue == VA, Instance.state.in_(LIVE_STATES))
                    .values(
                        state=S.TERMINATED,
                        terminated_at=now,
                        updated_at=now,
                        state_reason="benchmarks/silent_provider.py: back to zero between trials",
                    )
                )
            with vast.lock:
                vast.instances.clear()
                vast.offers = {o["id"]: o for o in default_offers()}

        def trial() -> float | None:
            va_to_zero()
            time.sleep(random.uniform(0.5, 1.5))
            seen = len(vast.calls("PUT", "/api/v0/asks/"))
            pushed = time.monotonic()
            watched.lpush(prefix + VA, envelope(VA))
            deadline = pushed + TRIAL_TIMEOUT
            while time.monotonic() < deadline:
                with vast.lock:
                    creates = [
                        t
                        for t, r in zip(va_log.at, va_log, strict=True)
                        if r.method == "PUT" and r.path.startswith("/api/v0/asks/")
                    ]
                if len(creates) > seen:
                    return creates[seen] - pushed
                procs.check()
                time.sleep(0.01)
            return None

        # 1. warm-up: the processes load everything
        for _ in range(3):
            run.warmup = trial()
            if run.warmup is not None:
                break
        if run.warmup is None:
            raise RuntimeError(
                f"{name}: no Vast create within {3 * TRIAL_TIMEOUT:.0f} s\n"
                + "\n".join(f"--- {n} ---\n{tail(p)}" for n, p in logs.items())
            )
        va_to_zero()
        print(f"  {name}: warm-up {run.warmup:.2f} s; renting {args.machines} RunPod machines")

        # 2. rp rents its machines; they stay booting
        for _ in range(args.machines):
            watched.lpush(prefix + RP, envelope(RP))
        booting = wait_for(
            f"{args.machines} RunPod machines booting",
            lambda: (b := rows(RP, (S.BOOTING,))) and len(b) >= args.machines and b,
            120,
            procs,
            0.2,
        )
        watched.delete(prefix + RP)

        # 3.-4. RunPod silent (or not) just after a reconcile round listed it, then the
        # operator drains its machines at once: their terminate steps call RunPod before the
        # next round finds it silent
        operator = procs.start(
            "operator",
            [sys.executable, "-c", OPERATOR, *(r.launch_id for r in booting)],
            env,
            logs["operator"],
            pipes=True,
        )
        lines = reader(operator)
        if next_line(lines, 60) != "ready":
            raise RuntimeError(f"the operator's drain did not start:\n{tail(logs['operator'])}")
        listed = len(runpod.calls("GET", "/v2/pods"))
        wait_for(
            "a reconcile round to list RunPod",
            lambda: len(runpod.calls("GET", "/v2/pods")) > listed,
            3 * args.poll,
            procs,
            0.01,
        )
        time.sleep(0.1)  # its answer is out
        if silent:
            runpod.silent_for = SILENT_FOR
        t_drain = time.monotonic()
        assert operator.stdin is not None
        operator.stdin.write(b"go\n")
        operator.stdin.flush()
        for _ in booting:
            run.drains.append(next_line(lines, 60) or "no answer within 60 s")
        print(
            f"  {name}: drained {len(booting)} RunPod machines in "
            f"{time.monotonic() - t_drain:.1f} s"
            + ("; RunPod silent" if silent else "")
            + "".join(f"\n    {d}" for d in run.drains),
            flush=True,
        )

        # 5. the trials
        for i in range(args.trials):
            got = trial()
            if got is None:
                run.failed += 1
            else:
                run.latencies.append(got)
            print(
                f"  {name} trial {i + 1}/{args.trials}: "
                + (f"Vast create {got:.2f} s after the job" if got is not None else "no create"),
                flush=True,
            )
        while time.monotonic() < t_drain + args.observe:  # the listings, a while longer
            procs.check()
            time.sleep(0.2)
        t_end = time.monotonic()
        wall_end = time.time()
        run.window = t_end - t_drain
        reconcile_rounds(run, logs["worker-lifecycle"], wall_end - run.window, wall_end)
        with vast.lock:
            vast_at = [t for t, r in zip(va_log.at, va_log, strict=True) if vast_full_listing(r)]
            vast_lookups = [
                t
                for t, r in va_log.since(t_drain, t_end)
                if r.method == "GET" and r.path.rstrip("/") == "/api/v1/instances"
            ]
        with runpod.lock:
            rp_calls = rp_log.since(t_drain, t_end)
        run.listings = {
            "vast": sum(1 for t in vast_at if t_drain <= t <= t_end),
            "vast lookups by label": len(vast_lookups)
            - sum(1 for t in vast_at if t_drain <= t <= t_end),
            "runpod": sum(1 for _, r in rp_calls if r.method == "GET" and r.path == "/v2/pods"),
        }
        run.vast_max_gap = max_gap(vast_at, t_drain, t_end)
        run.runpod_calls = Counter(runpod_kind(r) for _, r in rp_calls)
        run.silent = silent
        with transaction(sessions) as s:
            run.rp_states = Counter(
                str(st.value)
                for st in s.scalars(select(Instance.state).where(Instance.queue == RP))
            )
        watched.delete(prefix + VA)
    except Exception:
        for n, p in logs.items():
            print(f"--- {n} (last lines) ---\n{tail(p)}", file=sys.stderr)
        raise
    finally:
        runpod.silent_for = 0.0
        procs.close(grace=10.0)
        engine.dispose()
        for k in watched.scan_iter(match=f"{prefix}*"):
            watched.delete(k)
        watched.close()
        runpod.close()
        vast.close()
    return run
