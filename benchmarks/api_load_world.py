"""The world `api_load.py` loads and its instruments: the bench config and the ready machines
with their worker tokens, the CLI and a free port, the CPU accounting from /proc and
pg_stat_database, and the tick process timed under the load.

Apart from `api_load.py` because the tick process is spawned by name (`tick_process`) and the
load (`api_load_client`) reads the same accounting.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psycopg

PROVIDER = "bench-mock"
QUEUES = 4


# --------------------------------------------------------------------------- the world


def config_document(machines: int) -> dict[str, Any]:
    """A few queues on a mock provider, room for every machine, no idle drain within the run
    (the seeded machines stay ready, so every tick sees the same fleet)."""
    queues = {
        f"load-q{i}": {
            "metrics": {"source": "celery", "url": "redis://127.0.0.1:6379/15"},
            "autoscale": {
                "provider": PROVIDER,
                "max_workers": machines,
                "scale_up": [{"trigger": "queue_depth", "target_per_worker": 4}],
                "scale_down": [{"trigger": "idle", "timeout": "2h"}],
                "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
            },
        }
        for i in range(QUEUES)
    }
    return {
        "poll_interval": "30s",
        "limits": {"max_machines": machines * 2, "max_price_per_hour": machines * 1.0},
        "providers": {PROVIDER: {"kind": "mock", "boot_delay": "60s", "price_per_hour": 0.4}},
        "queues": queues,
    }


def machine_rows(n: int, now: datetime) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """`n` ready machines spread over the queues, each with its own worker token (only its
    SHA-256 is stored, as a launch stores it); the (launch id, token) pairs."""
    from autoscaler.access import keys
    from autoscaler.lifecycle import InstanceState

    rows, creds = [], []
    for k in range(n):
        launch = uuid.uuid4().hex
        token = keys.new_secret()
        created = now - timedelta(minutes=30)
        rows.append(
            {
                "launch_id": launch,
                "queue": f"load-q{k % QUEUES}",
                "provider": PROVIDER,
                "state": InstanceState.READY,
                "state_reason": "worker answered",
                "provider_instance_id": f"mock-{k + 1}",
                "host_id": f"host-{k}",
                "gpu": "RTX 4090",
                "price_per_hour": 0.4,
                "attempts": 1,
                "drain_requested": False,
                "pending_at": created,
                "creating_at": created,
                "booting_at": created,
                "ready_at": created + timedelta(minutes=2),
                "created_at": created,
                "updated_at": now,
                "running_tasks": 0,
                "last_task_at": now,
                "last_heartbeat_at": now,
                "worker_name": f"agent@{launch}",
                "agent_registered_at": created + timedelta(minutes=1),
                "worker_token_hash": keys.digest(token),
            }
        )
        creds.append((launch, token))
    return rows, creds


def cli(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise SystemExit(f"autoscaler {' '.join(argv)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- CPU accounting


TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(match: Any) -> dict[int, float]:
    """CPU seconds (user + system) of each live process whose /proc stat `match`es."""
    total: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        if match(int(entry), name, fields):
            total[int(entry)] = (int(fields[11]) + int(fields[12])) / TICK
    return total


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two samples, over the processes alive at the second (one that
    exited in between is not counted, so the figure is a lower bound)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def server_cpu(pgid: int) -> dict[int, float]:
    return cpu_of(lambda _pid, _name, f: int(f[2]) == pgid)


def loop_wait(pgid: int) -> float:
    """Seconds the server's processes' main threads (their event loops) waited for a CPU
    (run-queue delay, /proc/PID/schedstat): how much the other programs on the machine held
    the server back, as opposed to the server being busy or idle."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[2]) != pgid:
                continue
            total += int(Path(f"/proc/{entry}/schedstat").read_text().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return total


def postgres_cpu(db: str) -> dict[int, float]:
    """The PostgreSQL backends serving this benchmark's database (their title names it)."""

    def ours(pid: int, name: str, _f: list[str]) -> bool:
        if not name.startswith("postgres"):
            return False
        try:
            return f" {db} ".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    return cpu_of(ours)


def commits(url: str) -> tuple[int, int, int]:
    """Transactions committed in the database, sessions opened on it (PostgreSQL 14+; this
    one counts itself, taken out by the caller), and checkpoints the server was asked for
    (CREATE / DROP DATABASE by anyone: each flushes the cluster and commits wait)."""
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, sessions FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        try:
            asked = conn.execute("SELECT checkpoints_req FROM pg_stat_bgwriter").fetchone()
        except psycopg.Error:  # PostgreSQL 17 moved it
            asked = conn.execute("SELECT num_requested FROM pg_stat_checkpointer").fetchone()
        return int(row[0]), int(row[1]), int(asked[0]) if asked else 0


# --------------------------------------------------------------------------- the tick


@dataclass(frozen=True)
class Tick:
    wall: float
    cpu: float
    cpu_wait: float


def ticks_text(ticks: Sequence[Tick]) -> str:
    """Median wall, CPU and CPU-wait of `ticks`, in ms."""
    if not ticks:
        return "no tick"
    wall, cpu, wait = (
        statistics.median(getattr(t, k) for t in ticks) * 1000 for k in ("wall", "cpu", "cpu_wait")
    )
    return f"{wall:.0f} ms (cpu {cpu:.0f}, waiting for a cpu {wait:.0f})"


def tick_process(url: str, home: str, conn: Connection) -> None:
    """A process of the benchmark that runs the loop's tick (`control.tick.evaluate.evaluate`, every
    queue, readings injected: nothing pending, so the store alone is read and written) on
    demand: ("run", n, gap) -> n Tick records (its wall time, its own CPU time, and its time
    waiting for a CPU: what is left is waiting for the store)."""
    from autoscaler.control.runtime import Runtime
    from autoscaler.control.tick.evaluate import evaluate
    from autoscaler.policy.snapshot import QueueMetrics
    from autoscaler.settings import Settings
    from tests.control.outbox import RecordingOutbox

    rt = Runtime(
        Settings.from_env({"AUTOSCALER_DATABASE_URL": url, "AUTOSCALER_HOME": home}), env={}
    )

    schedstat = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")

    def one() -> Tick:
        now = datetime.now(UTC)
        readings = {
            f"load-q{i}": QueueMetrics(f"load-q{i}", 0, None, 0, now) for i in range(QUEUES)
        }
        w0 = int(schedstat.read_text().split()[1])
        c0, t = time.thread_time(), time.perf_counter()
        res = evaluate(rt, RecordingOutbox(), trigger="manual", readings=readings, now=now)
        wall, cpu = time.perf_counter() - t, time.thread_time() - c0
        waited = (int(schedstat.read_text().split()[1]) - w0) / 1e9
        assert res.skipped is None and not res.launched and not res.drains, res.as_dict()
        return Tick(wall, cpu, waited)

    one()  # warm-up: config parse, connections
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            _, n, gap = msg
            walls = []
            for i in range(n):
                if i:
                    time.sleep(gap)
                walls.append(one())
            conn.send(walls)
    finally:
        rt.close()
