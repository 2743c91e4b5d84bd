"""The busy/idle hook of a Celery worker run by the agent.

Add one line to the worker's app module (it does nothing outside an agent):

    import autoscaler.agent.hook; autoscaler.agent.hook.install()

It connects to Celery's `task_received` / `task_prerun` / `task_postrun` / `worker_ready`
signals and keeps the status file the agent reads (`$AUTOSCALER_STATUS_FILE`) up to date:
`{"running": n, "last_task_at": epoch, "jobs": [...], "tasks": [...], "acks_late": bool}`,
where `tasks` are the ids of the jobs the worker holds (received, not finished: what is handed
back to the broker if the machine is lost), `acks_late` the app's setting, and `jobs` the
last JOBS_KEPT finished jobs (task id, queue, publish stamp if the producer stamped it, start
and end, epoch seconds): the agent sends the new ones with its heartbeats, and they become the
queue's runtimes and `autoscaler trace export`.

Any other worker reports the same way: write that JSON to `$AUTOSCALER_STATUS_FILE` (atomically:
write a temporary file, then rename; `write_status` does it), or POST it to the agent's
loopback endpoint `$AUTOSCALER_STATUS_URL`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from typing import Any

from autoscaler.brokers.base import PUBLISHED_AT_HEADER

STATUS_ENV = "AUTOSCALER_STATUS_FILE"
JOBS_KEPT = 500
"""Finished jobs kept in the status file: the agent reads it every heartbeat (10 s), so a
process would have to finish more than 50 jobs a second for one to go unreported."""
_lock = threading.Lock()
_running = 0
_last: float | None = None
_started: dict[str, tuple[float, str | None, float | None]] = {}
_jobs: deque[dict[str, Any]] = deque(maxlen=JOBS_KEPT)
_received: dict[str, None] = {}
_acks_late: bool | None = None
_installed = False
TASKS_KEPT = 1000
"""Task ids a status file lists at most (the heartbeat's limit)."""


def write_status(
    path: str,
    running: int,
    last_task_at: float | None,
    jobs: list[dict[str, Any]] | None = None,
    tasks: list[str] | None = None,
    acks_late: bool | None = None,
) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    doc: dict[str, Any] = {"running": running, "last_task_at": last_task_at, "at": time.time()}
    if jobs:
        doc["jobs"] = jobs
    if tasks:
        doc["tasks"] = tasks
    if acks_late is not None:
        doc["acks_late"] = acks_late
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def _update(delta: int) -> None:
    global _running, _last
    path = os.environ.get(STATUS_ENV)
    if not path:
        return
    with _lock:
        _running = max(0, _running + delta)
        if delta:  # a task started or ended (a message received is no work done)
            _last = time.time()
        write_status(path, _running, _last, list(_jobs), _held(), _acks_late)


def _queue_and_stamp(task: Any) -> tuple[str | None, float | None]:
    request: Any = getattr(task, "request", None)
    info = getattr(request, "delivery_info", None) or {}
    queue = info.get("routing_key") if isinstance(info, dict) else None
    # Celery copies a message's headers onto its request: the producer's stamp is one of them
    stamp = request.get(PUBLISHED_AT_HEADER) if hasattr(request, "get") else None
    headers = getattr(request, "headers", None)
    if stamp is None and isinstance(headers, dict):
        stamp = headers.get(PUBLISHED_AT_HEADER)
    try:
        published = float(stamp) if stamp is not None else None
    except (TypeError, ValueError):
        published = None
    return (str(queue) if queue else None), published


def _held() -> list[str]:
    """Task ids this process holds: received and not finished, running ones included. Called
    under the lock. What the control plane hands back to the broker if the machine is lost."""
    return [*_received, *(t for t in _started if t not in _received)][:TASKS_KEPT]


def _received_task(request: Any = None, **_: Any) -> None:
    """A message reached the worker (prefetched or about to run): its id is held from now."""
    task_id = getattr(request, "id", None)
    if not task_id:
        return
    with _lock:
        if len(_received) < TASKS_KEPT:
            _received[str(task_id)] = None
    _update(0)


def _prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if task_id:
        queue, published = _queue_and_stamp(task)
        with _lock:
            _started[task_id] = (time.time(), queue, published)
    _update(+1)


def _postrun(task_id: str | None = None, **_: Any) -> None:
    with _lock:
        begun = _started.pop(task_id, None) if task_id else None
        _received.pop(task_id or "", None)
        if begun is not None:
            started, queue, published = begun
            _jobs.append(
                {
                    "id": task_id,
                    "queue": queue,
                    "published_at": published,
                    "started_at": started,
                    "finished_at": time.time(),
                }
            )
    _update(-1)


def install() -> None:
    """Connect the hook (idempotent). With prefork, each child process counts its own task and
    the agent sums the files (`<file>.<pid>`)."""
    global _installed
    if _installed or not os.environ.get(STATUS_ENV):
        return
    from celery.signals import (
        task_postrun,
        task_prerun,
        task_received,
        worker_process_init,
        worker_ready,
    )

    def ready(sender: Any = None, **_: Any) -> None:
        global _acks_late
        app = getattr(sender, "app", None)
        conf = getattr(app, "conf", None)
        if conf is not None:
            _acks_late = bool(conf.task_acks_late)
            _update(0)

    def per_child(**_: Any) -> None:
        base = os.environ.get(STATUS_ENV, "")
        if base and not base.endswith(f".{os.getpid()}"):
            os.environ[STATUS_ENV] = f"{base}.{os.getpid()}"

    worker_process_init.connect(per_child, weak=False)
    task_prerun.connect(_prerun, weak=False)
    task_received.connect(_received_task, weak=False)
    worker_ready.connect(ready, weak=False)
    task_postrun.connect(_postrun, weak=False)
    _installed = True
