"""A warm pool's resume against a fresh rental: the first job's wait, on real parts.

    python benchmarks/warm.py [--trials 3] [--wheel-mb 200]

Runs the real control plane on PostgreSQL and Redis (`autoscaler serve`, `celery worker` and
`celery beat`, as tests/control/loopkit starts them) with the local provider, whose machines run
the real agent: register, clone the deployment's Git repository, install its requirements.txt
(one wheel of `--wheel-mb` MB of incompressible data, a stand-in for a task's dependencies;
no package index), start a real Celery worker. Per trial, on a queue of its own
(`max_workers: 1`, `warm_pool: {size: 1}`, idle timeout 3 s):

  fresh    one job published at a queue with no machine: rented, cloned, installed, started;
  resumed  once that machine is idle, drained and stopped, one more job: the same machine is
           started again, its agent fetches the ref and skips clone and install.

Printed: each trial's wait from publish to the job's start, the medians, and their ratio
(fresh / resumed: how many times sooner the resumed machine serves). On one computer a fresh
rental is only the agent's clone and install; on RunPod or Vast it is also the image pull
(users measure 165 s for a 16 GB image, 33 s cached), which a resume never pays, so the ratio
there is larger than here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from celery import Celery

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.agent.agentkit import TASK_APP, free_port, git_repo  # noqa: E402
from tests.control.loopkit import Loop  # noqa: E402
from tests.control.loopprocs import REDIS, WATCH_BROKER, unique  # noqa: E402

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
CONTROL = f"{REDIS}/6"

TASKS = (
    TASK_APP
    + """
import warmdep


@app.task(name="warmbench.job", bind=True)
def job(self, path, job_id):
    with open(path, "a") as fh:
        fh.write(json.dumps({"job": job_id, "at": time.time()}) + "\\n")
"""
)

STARTUP = (
    f"exec {sys.executable} -m celery -A tasks worker -Q {{queue}} "
    '-n "$AUTOSCALER_WORKER_NAME" --pool solo --without-mingle --without-gossip -l warning'
)


def database() -> str:
    name = f"warmbench_{int(time.time())}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def queue_block(repo: str, queue: str) -> dict[str, Any]:
    return {
        "deployment": {
            "git_url": repo,
            "git_ref": "main",
            "startup_cmd": STARTUP.format(queue=queue),
        },
        "metrics": {"source": "celery", "url": WATCH_BROKER},
        "autoscale": {
            "provider": "desk",
            "max_workers": 1,
            "scale_up": [{"trigger": "no_workers"}],
            "scale_down": [{"trigger": "idle", "timeout": "3s"}],
            "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
            "warm_pool": {"size": 1, "keep_for": "1h", "resume_timeout": "90s"},
        },
    }


def payload_wheel(folder: Path, name: str, mb: int) -> Path:
    """A wheel whose module carries `mb` MB of random bytes (pip unpacks and hashes them all)."""
    import base64
    import hashlib
    import os
    import zipfile

    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}/__init__.py": b"VERSION = '1.0'\n",
        f"{name}/payload.bin": os.urandom(mb * 1024 * 1024),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    lines = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join([*lines, f"{info}/RECORD,,"]) + "\n").encode()
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def started(path: Path, job_id: str) -> float | None:
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if entry["job"] == job_id:
            return float(entry["at"])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--wheel-mb", type=int, default=200)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="warmbench-"))
    (tmp / "wheels").mkdir()
    wheel = payload_wheel(tmp / "wheels", "warmdep", args.wheel_mb)
    repo = git_repo(
        tmp / "repo", {"tasks.py": TASKS, "requirements.txt": f"warmdep @ {wheel.as_uri()}\n"}
    )
    queues = [unique("warmbench") for _ in range(args.trials)]
    port = free_port()
    loop = Loop(
        tmp,
        database(),
        broker_url=CONTROL,
        result_backend=CONTROL,
        extra_env={"AUTOSCALER_API_URL": f"http://127.0.0.1:{port}"},
    )
    for q in queues:
        loop.watch_keys.update({q, f"_kombu.binding.{q}"} | {f"{q}\x06\x16{p}" for p in (3, 6, 9)})
    publisher = Celery("pub", broker=WATCH_BROKER, set_as_current=False)
    record = tmp / "runs.jsonl"
    fresh: list[float] = []
    resumed: list[float] = []

    def first_job_wait(queue: str, job_id: str) -> float:
        sent = time.time()
        publisher.send_task(
            "warmbench.job", args=[str(record), job_id], queue=queue, routing_key=queue
        )
        at = loop.wait(lambda: started(record, job_id), 180, f"{job_id} started")
        return at - sent

    try:
        loop.setup(
            {
                "poll_interval": 2,
                "boot_timeout": 180,
                "providers": {"desk": {"kind": "local"}},
                "queues": {q: queue_block(repo, q) for q in queues},
            }
        )
        loop.serve_api(port)
        loop.worker("w1", concurrency=3)
        loop.beat()
        for i, q in enumerate(queues):
            fresh.append(first_job_wait(q, f"fresh-{i}"))
            loop.wait(
                lambda q=q: [r["state"] for r in loop.instances(q)] == ["stopped"],
                120,
                f"trial {i}: the machine stopped",
            )
            resumed.append(first_job_wait(q, f"resumed-{i}"))
            print(f"trial {i}: fresh {fresh[-1]:.2f} s, resumed {resumed[-1]:.2f} s", flush=True)
    finally:
        loop.close()
        publisher.close()
    shutil.rmtree(tmp, ignore_errors=True)
    f, r = statistics.median(fresh), statistics.median(resumed)
    print(f"first job after a fresh rental: median {f:.2f} s over {len(fresh)} trial(s)")
    print(f"first job after a resume:       median {r:.2f} s over {len(resumed)} trial(s)")
    print(f"ratio fresh / resumed: {f / r:.2f}x (requirements: one {args.wheel_mb} MB wheel)")


if __name__ == "__main__":
    main()
