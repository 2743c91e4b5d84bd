"""The busy/idle hook of a Celery worker run by the agent.

Add one line to the worker's app module (it does nothing outside an agent):

    import autoscaler.agent.hook; autoscaler.agent.hook.install()

It connects to Celery's `task_prerun` / `task_postrun` signals and keeps the status file the
agent reads (`$AUTOSCALER_STATUS_FILE`) up to date: `{"running": n, "last_task_at": epoch}`.

Any other worker reports the same way: write that JSON to `$AUTOSCALER_STATUS_FILE` (atomically:
write a temporary file, then rename; `write_status` does it), or POST it to the agent's
loopback endpoint `$AUTOSCALER_STATUS_URL`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

STATUS_ENV = "AUTOSCALER_STATUS_FILE"
_lock = threading.Lock()
_running = 0
_last: float | None = None
_installed = False


def write_status(path: str, running: int, last_task_at: float | None) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"running": running, "last_task_at": last_task_at, "at": time.time()}, fh)
    os.replace(tmp, path)


def _update(delta: int) -> None:
    global _running, _last
    path = os.environ.get(STATUS_ENV)
    if not path:
        return
    with _lock:
        _running = max(0, _running + delta)
        _last = time.time()
        write_status(path, _running, _last)


def _prerun(**_: Any) -> None:
    _update(+1)


def _postrun(**_: Any) -> None:
    _update(-1)


def install() -> None:
    """Connect the hook (idempotent). With prefork, each child process counts its own task and
    the agent sums the files (`<file>.<pid>`)."""
    global _installed
    if _installed or not os.environ.get(STATUS_ENV):
        return
    from celery.signals import task_postrun, task_prerun, worker_process_init

    def per_child(**_: Any) -> None:
        base = os.environ.get(STATUS_ENV, "")
        if base and not base.endswith(f".{os.getpid()}"):
            os.environ[STATUS_ENV] = f"{base}.{os.getpid()}"

    worker_process_init.connect(per_child, weak=False)
    task_prerun.connect(_prerun, weak=False)
    task_postrun.connect(_postrun, weak=False)
    _installed = True
