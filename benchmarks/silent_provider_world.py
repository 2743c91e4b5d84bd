"""The world `silent_provider.py` runs in: its constants, the fakes' stamped request logs, the
bench config and a Celery-style job envelope, and the processes it starts (`Procs`, the
operator's drain script, line readers).

Apart from `silent_provider.py` so that one run (`silent_provider_run`) and the report each stay
readable on their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from autoscaler.brokers.base import PUBLISHED_AT_HEADER
from autoscaler.lifecycle import InstanceState
from tests.fakes import FakeServer, Recorded

ROOT = Path(__file__).resolve().parents[1]  # the processes' working directory
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
