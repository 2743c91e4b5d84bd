"""What the worker on this machine tells the agent: the status files the Celery hook (or any
worker) writes, the finished jobs in them, and `StatusServer`, the local endpoint a worker may
POST its status to instead. Everything read here comes from the user's code: it is bounded and
checked before it goes into a heartbeat (`wire`'s limits)."""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from autoscaler import wire
from autoscaler.agent import gpu
from autoscaler.agent.server_api import said
from autoscaler.digits import ascii_whole

log = logging.getLogger("autoscaler.agent")


@dataclass(frozen=True)
class StatusFile:
    """One status file: `path` itself or `path.<pid>` (one per prefork child), what it says,
    and whether the process writing it still runs (a child killed mid-task leaves its last
    word behind: "running": 1 for ever)."""

    name: str
    doc: dict[str, Any]
    alive: bool


def _writer_alive(name: str, base: str) -> bool:
    suffix = name[len(base) :]
    pid = ascii_whole(suffix[1:]) if suffix.startswith(".") else None
    if pid is None:
        return True  # the agent's own file, or one a non-prefork worker writes
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def status_files(path: str) -> Iterator[StatusFile]:
    """Each readable status file."""
    for p in glob.glob(glob.escape(path) + "*"):
        if p.endswith(".tmp"):
            continue
        try:
            data = json.loads(Path(p).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            yield StatusFile(p, data, _writer_alive(p, path))


def read_held(path: str) -> tuple[list[str], bool | None]:
    """The task ids the worker holds (received, not finished; of every status file, less those
    any file lists finished: a prefork child finishes what the main process received) and
    whether it runs with acks_late, when it said."""
    held: dict[str, None] = {}
    finished: set[str] = set()
    acks_late: bool | None = None
    for f in status_files(path):
        tasks = f.doc.get("tasks")
        for t in tasks if isinstance(tasks, list) else ():
            if isinstance(t, str) and 0 < len(t) <= 255:
                held[t] = None
        jobs = f.doc.get("jobs")
        for j in jobs if isinstance(jobs, list) else ():
            if isinstance(j, dict) and isinstance(j.get("id"), str):
                finished.add(j["id"])
        late = f.doc.get("acks_late")
        if isinstance(late, bool):
            acks_late = late if acks_late is None else acks_late and late
    return [t for t in held if t not in finished][:1000], acks_late


def read_status(path: str) -> tuple[int, float | None]:
    """Running tasks (of live writers only) and last task time from the status file(s)."""
    running, last = 0, None
    for f in status_files(path):
        if f.alive:
            with contextlib.suppress(TypeError, ValueError):
                running += max(0, int(f.doc.get("running") or 0))
        t = f.doc.get("last_task_at")
        if isinstance(t, int | float):
            last = t if last is None else max(last, t)
    return running, last


JOBS_PER_BEAT = wire.HEARTBEAT_JOBS
"""Finished jobs sent with one heartbeat at most (the API's limit); the rest go with the next."""

Mark = tuple[float, str]
"""(finished_at, task id): how far a status file's jobs were sent (a file lists them in the
order they finished)."""


def is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 2**33


def read_jobs(path: str) -> list[tuple[str, dict[str, Any]]]:
    """(status file, job) for the finished jobs the hook listed, well-formed ones only."""
    out: list[tuple[str, dict[str, Any]]] = []
    for f in status_files(path):
        jobs = f.doc.get("jobs")
        for j in jobs if isinstance(jobs, list) else ():
            if (
                isinstance(j, dict)
                and isinstance(j.get("id"), str)
                and 0 < len(j["id"]) <= 200
                and is_time(j.get("started_at"))
                and is_time(j.get("finished_at"))
            ):
                out.append((f.name, j))
    out.sort(key=lambda fj: (fj[1]["finished_at"], fj[1]["id"]))
    return out


def job_reports(
    jobs: list[tuple[str, dict[str, Any]]], marks: Mapping[str, Mark]
) -> list[tuple[str, Mark, wire.JobReport | None]]:
    """The heartbeat's `jobs`: those past their file's mark, at most JOBS_PER_BEAT, oldest
    first; each with its file and its own mark (recorded once the heartbeat is answered). A job
    the API would refuse (`wire.JobReport`: a task id it cannot store) has no report: it is
    dropped here, and marked sent with the others, so it never costs the heartbeat."""
    out: list[tuple[str, Mark, wire.JobReport | None]] = []
    for name, j in jobs:
        mark: Mark = (float(j["finished_at"]), j["id"])
        if name in marks and mark <= marks[name]:
            continue
        queue, stamp = j.get("queue"), j.get("published_at")
        report: wire.JobReport | None
        try:
            report = wire.JobReport(
                id=j["id"],
                queue=queue[:200] if isinstance(queue, str) else None,
                published_at=stamp if is_time(stamp) else None,
                started_at=j["started_at"],
                finished_at=j["finished_at"],
            )
        except ValidationError as exc:
            log.warning("a finished job the API would refuse; dropped: %s", said(exc))
            report = None
        out.append((name, mark, report))
        if len(out) == JOBS_PER_BEAT:
            break
    return out


def gpu_utilisation() -> float | None:
    """The mean utilisation of this machine's GPUs, None without GPU data."""
    return gpu.mean_utilisation(gpu.read())


_TASK_ID = TypeAdapter(wire.TaskId)


def sendable_task(task_id: str) -> bool:
    """A held task id the heartbeat can carry (`wire.TaskId`, storable): another one is left
    out of the list rather than costing the heartbeat."""
    try:
        wire.storable(_TASK_ID.validate_python(task_id))
    except ValueError:  # pydantic's ValidationError is one
        return False
    return True


def sendable_detail(text: str | None) -> str | None:
    """A heartbeat's `detail` the API takes: at most 500 characters, a NUL or an undecodable
    file name (a lone surrogate) written out rather than refused."""
    if not text:
        return None
    clean = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return clean[:500]


class StatusServer:
    """`POST /status` on 127.0.0.1 (a port of its own): the body becomes the status file."""

    def __init__(self, path: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        target = path + ".http"
        folder, name = os.path.split(target)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                try:
                    size = min(int(self.headers.get("content-length") or 0), 4096)
                    data = json.loads(self.rfile.read(size) or b"{}")
                    running = max(0, int(data.get("running") or 0))
                    last = data.get("last_task_at")
                    last = float(last) if isinstance(last, int | float) else None
                except (ValueError, TypeError, AttributeError):
                    self.send_response(400)
                    self.end_headers()
                    return
                # a name of its own (O_EXCL): never through a link the worker left in the folder
                fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{name}.", suffix=".tmp")
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump({"running": running, "last_task_at": last}, fh)
                os.replace(tmp, target)
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/status"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
