"""Scale from zero: a first job arrives at a queue with no machine -> the provider's create call.

    python benchmarks/latency.py [--trials 20] [--only embedded|postgres-redis]
                                 [--redis-host 127.0.0.1] [--concurrency 2]

Runs the real control plane — `celery -A autoscaler worker` and `celery -A autoscaler beat`, each
in its own process group, stopped at the end — with a mock provider whose machines take an hour
to boot (nothing becomes ready while we measure), on two setups:

  embedded        AUTOSCALER_HOME in a temp dir: SQLite state, `sqla+sqlite` control broker;
  postgres-redis  a fresh PostgreSQL database for the state, Redis DB 11 as the control broker.

The watched queue is a Celery queue on Redis DB 13 under a throwaway key prefix (`no_workers`
trigger, max_workers 1). Per trial: the queue is emptied of jobs and machines, we wait a random
0.5-1.5 s (so the job lands at a random phase of beat's one-second fast path), LPUSH one
Celery-style envelope and note the time; the create time is the `created_at` of the mock
provider's machine row, written inside `create()` with the worker's clock (same host, same
clock). Also shown: when the launch intent's tick started (`instances.pending_at`: the start of
the fast-path task that saw the job, so it may precede the push by a few ms) and when the
'launch created' event was written. The first trial of each setup is a warm-up and is not
counted.

Between trials the queue is emptied "behind the control plane's back" rather than with a new
queue per trial: the job is deleted from the watched list, the trial's machine row is set
`terminated` once its launch has finished, and the mock provider's machine rows are deleted.
The config version, the worker's runtime caches and beat's schedule then stay as they are in
production when a queue that scaled to zero gets its first job; a new queue per trial would
instead make every trial pay a config reload (and beat's schedule rebuild) or wait for it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy import delete, select, update

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.brokers.base import PUBLISHED_AT_HEADER
from autoscaler.lifecycle import LIVE_STATES, InstanceState
from autoscaler.settings import CONTROL_KEYPREFIX
from autoscaler.store import config_versions, migrate
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import Instance, MockMachine, ScaleEvent

ROOT = Path(__file__).resolve().parents[1]
CELERY = str(Path(sys.executable).with_name("celery"))
QUEUE = "bench-latency"
PROVIDER = "bench-mock"
CONTROL_DB = 11
WATCH_DB = 13
TRIAL_TIMEOUT = 30.0


def document(watch_url: str, prefix: str) -> dict[str, Any]:
    return {
        "poll_interval": "30s",
        "providers": {PROVIDER: {"kind": "mock", "boot_delay": "1h", "price_per_hour": 0.4}},
        "queues": {
            QUEUE: {
                "metrics": {"source": "celery", "url": watch_url, "global_keyprefix": prefix},
                "autoscale": {
                    "provider": PROVIDER,
                    "min_workers": 0,
                    "max_workers": 1,
                    "scale_up": [{"trigger": "no_workers"}],
                    "scale_down": [{"trigger": "idle", "timeout": "10m"}],
                    "instance": {"gpu": "RTX 4090", "max_price_per_hour": 0.6},
                },
            }
        },
    }


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


@dataclass
class Trial:
    created: float  # push -> provider create (s)
    intent: float  # push -> start of the tick that wrote the intent (s)
    event: float | None  # push -> 'launch created' event (s)


@dataclass
class Result:
    name: str
    trials: list[Trial] = field(default_factory=list)
    failed: int = 0
    warmup: float | None = None


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen(
        [CELERY, "-A", "autoscaler", *args],
        env=env,
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Warm shutdown of the main process (it stops its pool), then the whole group is killed
    in case anything of it is left."""
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_setup(
    name: str, db_url: str, extra_env: dict[str, str], home: Path, args: argparse.Namespace
) -> Result:
    result = Result(name)
    home.mkdir(parents=True, exist_ok=True)
    watch_url = f"redis://{args.redis_host}:6379/{WATCH_DB}"
    prefix = f"bench-lat-{uuid.uuid4().hex[:8]}:"
    key = prefix + QUEUE
    watched = redis.Redis.from_url(watch_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")}
    env.update({"AUTOSCALER_HOME": str(home), **extra_env})
    if "AUTOSCALER_BROKER_URL" not in extra_env:
        migrate.prepare_embedded_broker(f"sqla+sqlite:///{home / 'broker.db'}")
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    sessions = session_factory(engine)
    with transaction(sessions) as s:
        config_versions.record(
            s, document(watch_url, prefix), "benchmarks/latency.py", datetime.now(UTC)
        )
    procs = []
    logs = {"worker": home / "worker.log", "beat": home / "beat.log"}
    try:
        procs.append(
            start(
                [
                    "worker",
                    "-l",
                    "warning",
                    "--concurrency",
                    str(args.concurrency),
                    "-n",
                    f"bench-latency-{uuid.uuid4().hex[:6]}@%h",
                ],
                env,
                logs["worker"],
            )
        )
        procs.append(start(["beat", "-l", "warning"], env, logs["beat"]))

        def empty_queue() -> None:
            """No job, no live machine row, no mock machine: the queue has scaled to zero."""
            watched.delete(key)
            deadline = time.monotonic() + TRIAL_TIMEOUT
            while time.monotonic() < deadline:  # let the trial's launch finish first
                with transaction(sessions) as s:
                    busy = s.scalar(
                        select(Instance.id)
                        .where(Instance.state.in_((InstanceState.PENDING, InstanceState.CREATING)))
                        .limit(1)
                    )
                if busy is None:
                    break
                time.sleep(0.05)
            with transaction(sessions) as s:
                now = datetime.now(UTC)
                s.execute(
                    update(Instance)
                    .where(Instance.state.in_(LIVE_STATES))
                    .values(
                        state=InstanceState.TERMINATED,
                        terminated_at=now,
                        updated_at=now,
                        state_reason="benchmarks/latency.py: back to zero between trials",
                    )
                )
                s.execute(delete(MockMachine))

        def launch_event(pushed: float) -> float | None:
            """Push -> the 'launch created' event (written just after the create returns)."""
            since = datetime.fromtimestamp(pushed, UTC)
            for _ in range(100):
                with transaction(sessions) as s:
                    at = s.scalar(
                        select(ScaleEvent.at)
                        .where(
                            ScaleEvent.kind == "launch",
                            ScaleEvent.action == "created",
                            ScaleEvent.at >= since,
                        )
                        .limit(1)
                    )
                if at is not None:
                    return at.timestamp() - pushed
                time.sleep(0.02)
            return None

        def trial() -> Trial | None:
            empty_queue()
            time.sleep(random.uniform(0.5, 1.5))
            pushed = time.time()
            watched.lpush(key, envelope(QUEUE))
            deadline = time.monotonic() + TRIAL_TIMEOUT
            while time.monotonic() < deadline:
                with transaction(sessions) as s:
                    created = s.scalar(select(MockMachine.created_at).limit(1))
                    pending = s.scalar(
                        select(Instance.pending_at).where(Instance.state.in_(LIVE_STATES)).limit(1)
                    )
                if created is not None:
                    return Trial(
                        created.timestamp() - pushed,
                        (pending.timestamp() - pushed) if pending else float("nan"),
                        launch_event(pushed),
                    )
                for p, (label, log) in zip(procs, logs.items(), strict=True):
                    if p.poll() is not None:
                        raise RuntimeError(f"{label} exited ({p.returncode}):\n{tail(log)}")
                time.sleep(0.02)
            return None

        warm = None
        for _ in range(3):  # the processes may take a while to start and load everything
            warm = trial()
            if warm is not None:
                break
        if warm is None:
            raise RuntimeError(
                f"{name}: no machine created within {3 * TRIAL_TIMEOUT:.0f} s\n"
                f"--- worker ---\n{tail(logs['worker'])}\n"
                f"--- beat ---\n{tail(logs['beat'])}"
            )
        result.warmup = warm.created
        for i in range(args.trials):
            got = trial()
            if got is None:
                result.failed += 1
            else:
                result.trials.append(got)
            print(
                f"  {name} trial {i + 1:2d}/{args.trials}: "
                + (
                    f"create {got.created:6.3f} s after the push (tick started "
                    f"{got.intent:+6.3f} s)"
                    if got
                    else f"nothing within {TRIAL_TIMEOUT:.0f} s"
                ),
                flush=True,
            )
        watched.delete(key)
    finally:
        for p in procs:
            stop(p)
        engine.dispose()
        for k in watched.scan_iter(match=f"{prefix}*"):
            watched.delete(k)
        watched.close()
    return result


def pct(xs: list[float], p: float) -> float:
    """Nearest-rank percentile: p95 of 20 trials is the 19th smallest, of 15 the largest."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--only", choices=["embedded", "postgres-redis"])
    ap.add_argument("--redis-host", default="127.0.0.1")
    ap.add_argument("--pg-admin", default="host=127.0.0.1 port=5432 user=postgres dbname=postgres")
    ap.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/{db}")
    ap.add_argument("--concurrency", type=int, default=2, help="worker pool processes")
    ap.add_argument("--keep-logs", action="store_true", help="keep the temp dir (logs, SQLite)")
    args = ap.parse_args()
    random.seed(1)
    results: list[Result] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    print(
        f"scale from zero, {args.trials} trials per setup after a warm-up; worker pool "
        f"{args.concurrency} processes; load average (1 min) {os.getloadavg()[0]:.2f} on "
        f"{os.cpu_count()} CPUs"
    )
    if args.only in (None, "embedded"):
        home = tmp / "embedded"
        results.append(run_setup("embedded", f"sqlite:///{home / 'state.db'}", {}, home, args))
    if args.only in (None, "postgres-redis"):
        db = f"bench_latency_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(args.pg_admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{db}"')
        control = f"redis://{args.redis_host}:6379/{CONTROL_DB}"
        try:
            url = args.pg_url.format(db=db)
            results.append(
                run_setup(
                    "postgres-redis",
                    url,
                    {
                        "AUTOSCALER_DATABASE_URL": url,
                        "AUTOSCALER_BROKER_URL": control,
                        "AUTOSCALER_RESULT_BACKEND": control,
                    },
                    tmp / "postgres-redis",
                    args,
                )
            )
        finally:
            with psycopg.connect(args.pg_admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            r = redis.Redis.from_url(control)
            for pattern in (f"{CONTROL_KEYPREFIX}*", "celery-task-meta-*"):
                keys = list(r.scan_iter(match=pattern, count=1000))
                for i in range(0, len(keys), 500):
                    r.delete(*keys[i : i + 500])
            r.close()

    if args.keep_logs or any(r.failed for r in results):
        print(f"logs kept under {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"\nfirst job at an empty queue -> provider create (seconds); load average (1 min) at "
        f"the end {os.getloadavg()[0]:.2f}:"
    )
    for res in results:
        xs = [t.created for t in res.trials]
        if not xs:
            print(f"  {res.name:15s} no trial succeeded ({res.failed} timed out)")
            continue
        intents = [t.intent for t in res.trials]
        events = [t.event for t in res.trials if t.event is not None]
        print(
            f"  {res.name:15s} p50 {statistics.median(xs):5.2f}   p95 {pct(xs, 95):5.2f}   "
            f"max {max(xs):5.2f}   mean {statistics.fmean(xs):5.2f}   trials {len(xs)}"
            f" (+{res.failed} timed out; warm-up {res.warmup:.2f} s not counted)"
        )
        print(
            f"  {'':15s} of which: tick that wrote the intent started p50 "
            f"{statistics.median(intents):+5.2f} s, intent tick start -> create p50 "
            f"{statistics.median([t.created - t.intent for t in res.trials]):5.2f} s"
            + (f"; 'launch created' event p50 {statistics.median(events):5.2f} s" if events else "")
        )
    verdicts = []
    for res in results:
        met = res.trials and pct([t.created for t in res.trials], 95) <= 2
        verdicts.append(f"{res.name} {'met' if met else 'NOT met'}")
    print("  goal: p95 <= 2 s -> " + ", ".join(verdicts))
    print(
        "  baselines (KEDA, runqy: poll every 30 s; a job arriving at a random time waits for "
        "the next poll): average 15 s, worst 30 s, before their create call even starts"
    )


if __name__ == "__main__":
    main()
