"""The sharded measurement of `tick.py`: W spawned worker processes, each with its own
Runtime, evaluating shard i of W at once, timed from the parent; the workers time `_evaluate`'s
steps.

Apart from `tick.py` because the spawned workers import it by name (`shard_worker`), and the
single-process runs (`tick_runs`) call it for the largest size.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
import traceback
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_any
from typing import Any

from tick_world import FAILURES, noop

import autoscaler.control.tick.evaluate as tick
from autoscaler.control.runtime import Runtime
from autoscaler.control.tick.actions import StoreActions
from autoscaler.control.tick.evaluate import evaluate
from autoscaler.settings import Settings
from autoscaler.store import leases

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
