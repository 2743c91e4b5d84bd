"""A silent provider holds no other: with RunPod silent, a Vast-only queue's first job -> its
Vast create, and how often each provider is listed.

    python benchmarks/silent_provider.py [--trials 5] [--setup embedded|postgres-redis]
                                         [--poll 5] [--machines 4] [--keep-logs]

The issue: "With RunPod silent (accepts connections, never answers), a queue that rents only
from Vast must get its machine within 5 s of its job; every other provider is listed every
poll." Runs the real control plane as deploy/compose.yaml does — `celery -A autoscaler beat`,
a loop worker (`-Q autoscaler --concurrency 2`) and a lifecycle worker (`-Q
autoscaler.lifecycle --concurrency 4`), each in its own process group, stopped at the end, even
on Ctrl-C or an error — against the project's RunPod and Vast fakes (tests/fakes: real HTTP on
loopback, the real APIs' paths and bodies) with the real provider clients. Setups:

  embedded        AUTOSCALER_HOME in a temp dir: SQLite state, `sqla+sqlite` control broker
                  (the default);
  postgres-redis  a fresh PostgreSQL database, Redis DB 11 as the control broker (its own
                  control queue and key prefix, deleted at the end).

Two providers (`pods`: RunPod, `vast`: Vast) and two watched Celery queues on Redis DB 13
under a throwaway prefix: `rp` rents only from RunPod, `va` only from Vast (`no_workers`,
max_workers 1, poll `--poll` s). Each of two runs, on a fresh control plane and fresh fakes:

  1. a warm-up `va` trial (not counted), then `va` back to zero;
  2. `--machines` jobs on `rp`: it rents that many RunPod pods, which stay booting (no agent
     ever runs on them); `rp` is emptied;
  3. silent run only: RunPod goes silent (`silent_for`: every request is held 60 s unanswered);
  4. the operator drains the RunPod machines (`autoscaler drain ID`, in parallel): each is
     cancelled and its terminate step sent to the lifecycle queue, where it calls RunPod;
  5. `--trials` trials on `va`: the queue at zero (job, machine rows and Vast instance removed
     behind the control plane's back, as benchmarks/latency.py does, the Vast market restored),
     a random 0.5-1.5 s wait, one Celery-style envelope LPUSHed; the time is until the Vast fake
     receives the create (`PUT /api/v0/asks/{id}/`; every request to the fakes is stamped with
     this process's monotonic clock on arrival).

The healthy run is the same scenario with RunPod answering. Printed for both: per-trial
latencies, median and max; from step 4 to the end of the trials, each provider's machine
listings (reconcile's: RunPod `GET /v2/pods`, Vast `GET /api/v1/instances/` unfiltered — Vast's
lookups by label, a launch's own, counted apart) per poll interval, and the longest Vast went
unlisted; RunPod's calls in that window (held unanswered in the silent run); the silent/healthy
ratio of the median latencies.

Measured on this 2-core machine (embedded, poll 5 s, 4 RunPod machines drained, 5 trials):
  healthy  Vast create 0.44 0.74 0.21 0.93 1.06 s (median 0.74, max 1.06); Vast and RunPod
           listed 1.00 times per poll; reconcile rounds 2.0 s median, none skipped;
  silent   Vast create 1.74 0.09 0.48 0.59 0.10 s (median 0.48, max 1.74: goal <= 5 s met);
           Vast listed 1.00 times per poll (longest unlisted 5.4 s), RunPod asked once per poll
           and unread; rounds 3.0 s median (the 3 s list deadline, workers observed meanwhile),
           none skipped; the 4 terminates each spent one deadline and then waited held, the rows
           left terminating for the next answer.
  ratio silent/healthy of the medians 0.66.
At the default 30 s poll (`--poll 30 --observe 90`): healthy max 1.04 s; silent 2.76 0.27 0.36
0.70 1.01 s (max 2.76: met). With each step's calls bounded by a third of the poll (10 s)
instead of `STEP_CALL_MAX` (4 s), the 4 terminates held all 4 lifecycle slots 10 s and the
first job waited 8.91 s (not met); reconcile rounds take 10.0 s there (its lists keep a third
of the poll: they run in threads and hold no lifecycle slot).
Before the deadlines (the issue's run, RunPod silent 45 s, compose's concurrency): the
Vast-only queue's machine came 20.1 s after its job and no other provider was listed for 31 s.
With observation and listing one after the other instead of at once, rounds took 5.1 s at a
5 s poll and every other one was skipped (Vast listed 0.50 times per poll).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import itertools
import json
import os
import queue
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoscaler.brokers.base import PUBLISHED_AT_HEADER  # noqa: E402
from autoscaler.config import load_config_text  # noqa: E402
from autoscaler.lifecycle import LIVE_STATES, InstanceState  # noqa: E402
from autoscaler.settings import CONTROL_QUEUE, LIFECYCLE_SUFFIX  # noqa: E402
from autoscaler.store import config_versions, migrate  # noqa: E402
from autoscaler.store.db import make_engine, session_factory, transaction  # noqa: E402
from autoscaler.store.models import Instance  # noqa: E402
from tests.fakes import FakeServer, Recorded  # noqa: E402
from tests.fakes.runpod_server import FakeRunPod  # noqa: E402
from tests.fakes.vast_server import FakeVast, default_offers  # noqa: E402

BIN = Path(sys.executable).parent
CELERY = str(BIN / "celery")
RUNPOD_KEY = "rpa_BENCH_silent_provider_not_a_real_key"
VAST_KEY = "vast_BENCH_silent_provider_not_a_real_key"
RP, VA = "rp", "va"
CONTROL_DB = 11
WATCH_DB = 13
SILENT_FOR = 60.0  # each request to the silent RunPod is held this long unanswered
TRIAL_TIMEOUT = 45.0
GOAL = 5.0

S = InstanceState


class Stamped(list[Recorded]):
    """A fake's request log that also notes when each request arrived (this process's
    monotonic clock; the fakes append under their lock, so `at[i]` is `self[i]`'s)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    def append(self, item: Recorded) -> None:
        self.at.append(time.monotonic())
        super().append(item)

    def since(self, t0: float, t1: float = float("inf")) -> list[tuple[float, Recorded]]:
        return [(t, r) for t, r in zip(self.at, self, strict=True) if t0 <= t <= t1]


def stamped(fake: FakeServer) -> Stamped:
    log = Stamped()
    with fake.lock:
        fake.requests = log
    return log


def config_text(runpod: str, vast: str, watch_url: str, prefix: str, poll: float, n: int) -> str:
    source = f'{{source: celery, url: "{watch_url}", global_keyprefix: "{prefix}"}}'
    return f"""
poll_interval: {poll:g}
providers:
  pods: {{kind: runpod, base_url: "{runpod}", api_key_env: BENCH_RUNPOD_KEY,
          gpu_types: ["NVIDIA GeForce RTX 4090"]}}
  vast: {{kind: vast, base_url: "{vast}", api_key_env: BENCH_VAST_KEY}}
queues:
  {RP}:
    metrics: {source}
    autoscale:
      provider: pods
      max_workers: {n}
      scale_up: [{{trigger: queue_depth, target_per_worker: 1}}]
      scale_down: [{{trigger: idle, timeout: 10m}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 1.0}}
  {VA}:
    metrics: {source}
    autoscale:
      provider: vast
      max_workers: 1
      scale_up: [{{trigger: no_workers}}]
      scale_down: [{{trigger: idle, timeout: 10m}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.6}}
"""


def envelope(queue: str) -> bytes:
    task_id = str(uuid.uuid4())
    return json.dumps(
        {
            "body": "W1siaW1hZ2UucG5nIl0sIHt9LCB7ImNhbGxiYWNrcyI6IG51bGx9XQ==",
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {
                "lang": "py",
                "task": "app.tasks.infer",
                "id": task_id,
                "retries": 0,
                "eta": None,
                PUBLISHED_AT_HEADER: time.time(),
            },
            "properties": {
                "correlation_id": task_id,
                "delivery_tag": str(uuid.uuid4()),
                "priority": 0,
                "body_encoding": "base64",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
            },
        }
    ).encode()


# --------------------------------------------------------------------------- processes


class Procs:
    """Every process this benchmark starts, each in its own process group; `close` stops them
    all (warm shutdown of the leader, then SIGKILL to whatever is left of the group)."""

    def __init__(self) -> None:
        self.running: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(
        self, name: str, argv: list[str], env: dict[str, str], log: Path, pipes: bool = False
    ) -> subprocess.Popen[bytes]:
        """`argv` in its own process group, its output to `log` (with `pipes`: its stdin and
        stdout are pipes, its stderr goes to `log`)."""
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=ROOT,
                stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
                stdout=subprocess.PIPE if pipes else out,
                stderr=out if pipes else subprocess.STDOUT,
                start_new_session=True,
            )
        self.running.append((name, proc, log))
        return proc

    def check(self) -> None:
        for name, proc, log in self.running:
            if name.startswith(("worker", "beat")) and proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}):\n{tail(log)}")

    @staticmethod
    def stop(proc: subprocess.Popen[bytes], grace: float) -> None:
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def close(self, grace: float = 10.0) -> None:
        # beat first (no new task), then the workers, then anything else (CLI calls)
        order = sorted(self.running, key=lambda p: (not p[0].startswith("beat"), p[0]))
        for _, proc, _ in order:
            self.stop(proc, grace)
        self.running.clear()


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_for(what: str, check: Any, timeout: float, procs: Procs, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        procs.check()
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


OPERATOR = """
import sys, threading
from autoscaler.control.manual import request_drain
from autoscaler.control.runtime import Runtime
from autoscaler.control.steps.drain import Drain
from autoscaler.control.steps.frame import run_step
from autoscaler.control.tasks import BEST_EFFORT
from autoscaler.settings import Settings

def drain(launch_id):  # what `autoscaler drain ID --by benchmark` does
    rt = Runtime(Settings.from_env())
    try:
        request_drain(rt, launch_id, "benchmark")
        said = run_step(Drain("benchmark asked to drain it"), rt, launch_id, BEST_EFFORT)
    except Exception as exc:
        said = f"failed: {exc!r}"
    finally:
        rt.close()
    print(f"{launch_id[:12]}: {said}", flush=True)

print("ready", flush=True)
sys.stdin.readline()
threads = [threading.Thread(target=drain, args=(i,)) for i in sys.argv[1:]]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""
"""The operator's drain of every given machine, all at once once told to go (the same calls as
`autoscaler drain ID`, in one process whose imports are done before the go)."""


def reader(proc: subprocess.Popen[bytes]) -> queue.Queue[str | None]:
    """`proc`'s stdout, line by line (None at its end), read in a thread."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw.decode(errors="replace").rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def next_line(lines: queue.Queue[str | None], timeout: float) -> str | None:
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return None


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


# --------------------------------------------------------------------------- report


def report(run: Run, poll: float) -> None:
    polls = run.window / poll
    lat = run.latencies
    print(f"\n  {run.name}:")
    print(
        "    va first job -> Vast create (s): "
        + (" ".join(f"{x:.2f}" for x in lat) or "none")
        + (f"  (+{run.failed} with no create within {TRIAL_TIMEOUT:.0f} s)" if run.failed else "")
    )
    if lat:
        print(
            f"    median {statistics.median(lat):.2f}  max {max(lat):.2f}  "
            f"(warm-up {run.warmup:.2f} not counted; goal <= {GOAL:g} s: "
            f"{'met' if max(lat) <= GOAL and not run.failed else 'NOT met'})"
        )
    print(
        f"    from the drains to the end ({run.window:.1f} s = {polls:.1f} polls): "
        f"listings per poll: Vast {run.listings['vast'] / polls:.2f} "
        f"({run.listings['vast']}; longest unlisted {run.vast_max_gap:.1f} s), "
        f"RunPod {run.listings['runpod'] / polls:.2f} ({run.listings['runpod']}); "
        f"Vast lookups by label {run.listings['vast lookups by label']}"
    )
    calls = ", ".join(f"{k} ×{n}" for k, n in sorted(run.runpod_calls.items())) or "none"
    print(
        f"    RunPod calls in that window: {sum(run.runpod_calls.values())} ({calls}); "
        + (f"each held {SILENT_FOR:.0f} s unanswered" if run.silent else "all answered")
    )
    print(
        "    rp machines at the end: "
        + ", ".join(f"{k} {n}" for k, n in sorted(run.rp_states.items()))
    )
    if run.rounds:
        unread = ", ".join(f"{k} in {n}" for k, n in sorted(run.unread.items())) or "none"
        print(
            f"    reconcile rounds in that window: {len(run.rounds)} run (median "
            f"{statistics.median(run.rounds):.1f} s, max {max(run.rounds):.1f} s; unread: "
            f"{unread}), {run.skipped} skipped (the previous round still running)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--setup", choices=["embedded", "postgres-redis"], default="embedded")
    ap.add_argument("--poll", type=float, default=5.0, help="poll_interval (s)")
    ap.add_argument("--machines", type=int, default=4, help="RunPod machines to drain")
    ap.add_argument(
        "--observe", type=float, default=30.0, help="listings watched at least this long (s)"
    )
    ap.add_argument("--redis-host", default="127.0.0.1")
    ap.add_argument("--pg-admin", default="host=127.0.0.1 port=5432 user=postgres dbname=postgres")
    ap.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/{db}")
    ap.add_argument("--keep-logs", action="store_true", help="keep the temp dir (logs, SQLite)")
    args = ap.parse_args()

    def terminated(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminated)  # clean up as on Ctrl-C
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started ignoring it
    random.seed(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-silent-"))
    print(
        f"silent provider: {args.trials} trials per run, {args.setup}, poll {args.poll:g} s, "
        f"{args.machines} RunPod machines drained; load average (1 min) "
        f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    runs: list[Run] = []
    ok = False
    try:
        for name, silent in (("healthy", False), ("silent", True)):
            setup: dict[str, Any] = {"db_url": None, "env": {}}
            db = None
            control = f"redis://{args.redis_host}:6379/{CONTROL_DB}"
            control_queue = f"bench-silent-{uuid.uuid4().hex[:8]}"
            keyprefix = f"{control_queue}-control:"
            if args.setup == "postgres-redis":
                db = f"bench_silent_{uuid.uuid4().hex[:10]}"
                with psycopg.connect(args.pg_admin, autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{db}"')
                url = args.pg_url.format(db=db)
                setup = {
                    "db_url": url,
                    "env": {
                        "AUTOSCALER_DATABASE_URL": url,
                        "AUTOSCALER_BROKER_URL": control,
                        "AUTOSCALER_RESULT_BACKEND": control,
                        "AUTOSCALER_CONTROL_QUEUE": control_queue,
                        "AUTOSCALER_CONTROL_KEYPREFIX": keyprefix,
                    },
                }
            try:
                runs.append(one_run(name, silent, setup, tmp / name, args))
            finally:
                if db is not None:
                    with psycopg.connect(args.pg_admin, autocommit=True) as conn:
                        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                    r = redis.Redis.from_url(control)
                    for k in r.scan_iter(match=f"{keyprefix}*", count=1000):
                        r.delete(k)
                    r.close()
        ok = True
    finally:
        if args.keep_logs or not ok:
            print(f"logs kept under {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nload average (1 min) at the end {os.getloadavg()[0]:.2f}")
    for run in runs:
        report(run, args.poll)
    healthy, silent_run = runs
    if healthy.latencies and silent_run.latencies:
        ratio = statistics.median(silent_run.latencies) / statistics.median(healthy.latencies)
        print(f"\n  ratio silent/healthy of the median latencies: {ratio:.2f}")


if __name__ == "__main__":
    main()
