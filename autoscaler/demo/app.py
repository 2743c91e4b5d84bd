"""The demo's task app: the files of the Git repository the demo's machines deploy, and the
producer side (publishing the burst, reading what ran)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUEUE = "demo"
TASK = "demo.render"

TASKS_PY = '''"""The demo's Celery app (the agent deploys it from the demo's Git repository)."""

import json
import os
import time

import autoscaler.agent.hook

autoscaler.agent.hook.install()  # busy/idle through the agent's status file

from celery import Celery
from kombu.transport import sqlalchemy as kombu_sqla

kombu_sqla.Transport.polling_interval = 0.2  # the SQL transport polls; take jobs sooner

app = Celery("demo_tasks", broker=os.environ["DEMO_BROKER_URL"], set_as_current=False)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    task_acks_late=True,  # one job at a time per worker: nothing held while another runs
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"connect_args": {"timeout": 30}},
    worker_hijack_root_logger=False,
)


def record(entry):
    with open(os.environ["DEMO_RUNS"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\\n")


@app.task(name="demo.render", bind=True)
def render(self, job_id, seconds):
    worker = self.request.hostname or "?"
    record({"job": job_id, "phase": "start", "worker": worker, "at": time.time()})
    time.sleep(seconds)
    record({"job": job_id, "phase": "end", "worker": worker, "at": time.time()})
'''

STARTUP = (
    "exec {python} -m celery -A tasks worker -Q " + QUEUE + ' -n "$AUTOSCALER_WORKER_NAME" '
    "--pool prefork -c 1 --prefetch-multiplier 1 -l warning"
)


def startup_cmd() -> str:
    import shlex

    return STARTUP.format(python=shlex.quote(sys.executable))


def make_repo(path: Path) -> str:
    """The task app as a one-commit Git repository on branch `main`; its file:// URL."""
    path.mkdir(parents=True)
    (path / "tasks.py").write_text(TASKS_PY, encoding="utf-8")
    (path / "README.md").write_text(
        "The `autoscaler demo` task app: `demo.render(job_id, seconds)` sleeps and records.\n",
        encoding="utf-8",
    )
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "autoscaler demo",
        "GIT_AUTHOR_EMAIL": "demo@example.invalid",
        "GIT_COMMITTER_NAME": "autoscaler demo",
        "GIT_COMMITTER_EMAIL": "demo@example.invalid",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    for cmd in (
        ["git", "init", "-q"],
        ["git", "symbolic-ref", "HEAD", "refs/heads/main"],
        ["git", "add", "tasks.py", "README.md"],
        ["git", "-c", "commit.gpgsign=false", "commit", "-q", "-m", "demo task app"],
    ):
        subprocess.run(cmd, cwd=path, env=env, check=True, capture_output=True, timeout=60)
    return path.resolve().as_uri()


@dataclass(frozen=True)
class Published:
    job: str
    seconds: float
    at: float


def publish(broker_url: str, jobs: list[tuple[str, float]]) -> list[Published]:
    """Send the burst to the demo queue (stamped with its publish time, as a producer would)."""
    import time

    from celery import Celery

    import autoscaler.brokers.stamp

    autoscaler.brokers.stamp.install()
    app = Celery("demo_producer", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        broker_transport_options={"connect_args": {"timeout": 30}},
    )
    out = []
    try:
        with app.connection_for_write() as conn:
            for job, seconds in jobs:
                at = time.time()
                app.send_task(
                    TASK, args=[job, seconds], queue=QUEUE, routing_key=QUEUE, connection=conn
                )
                out.append(Published(job, seconds, at))
    finally:
        app.close()
    return out


def runs(path: Path) -> list[dict[str, Any]]:
    """What the machines recorded: one start and one end per job run."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(entry, dict):
            out.append(entry)
    return out
