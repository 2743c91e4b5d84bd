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

The world and the processes live in silent_provider_world.py, one run in silent_provider_run.py;
this file runs both and reports.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from silent_provider_run import Run, one_run  # noqa: E402
from silent_provider_world import CONTROL_DB, GOAL, SILENT_FOR, TRIAL_TIMEOUT  # noqa: E402

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
