"""Helpers of the agent tests: the API served for real (uvicorn in a thread) on the API tests'
small world, Git repositories made by the test, the agent as a process in its own group."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import uvicorn

from autoscaler.wire import DeploymentAnswer
from tests.api.apikit import World

TASK_APP = """
import json, os, time

import autoscaler.agent.hook

autoscaler.agent.hook.install()

from celery import Celery

app = Celery("tasks", broker=os.environ["AUTOSCALER_BROKER_URL"], set_as_current=False)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
"""
"""The head of an e2e task module deployed from Git (`tasks.py`): the agent's job hook and a
Celery app on the broker the machine is given; the tasks follow."""


def deployment(**fields: Any) -> DeploymentAnswer:
    """A deployment answer as the API gives it: `fields` over one of q1 that names nothing."""
    empty: dict[str, Any] = {
        "queue": "q1",
        "git_url": None,
        "git_ref": None,
        "startup_cmd": None,
        "env": {},
        "broker_url": None,
        "broker_note": None,
    }
    return DeploymentAnswer.model_validate(empty | fields)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(world: World) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(world.client.app, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the API did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def git_repo(path: Path, files: Mapping[str, str]) -> str:
    """A Git repository at `path` holding `files` (one commit on `main`); its file:// URL."""
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    env = {**os.environ, **GIT_ENV}
    for cmd in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "."],
        ["git", "commit", "-q", "-m", "worker"],
    ):
        subprocess.run(cmd, cwd=path, env=env, check=True, capture_output=True)
    return f"file://{path}"


def git_commit(path: Path, files: Mapping[str, str | None], message: str = "change") -> str:
    """A new commit on the repository's current branch (None: the file is removed); its id."""
    for name, text in files.items():
        if text is None:
            (path / name).unlink()
        else:
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_text(text)
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "add", "-A"], cwd=path, env=env, check=True, capture_output=True)
    subprocess.run(
        ["git", "commit", "-q", "-m", message], cwd=path, env=env, check=True, capture_output=True
    )
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=path, check=True, capture_output=True, text=True
    )
    return head.stdout.strip()


def make_wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel `name` (a module whose VERSION is `version`, and a console script
    `name` printing it) in `folder`: a requirement pip installs with no package index."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n\ndef main():\n    print(VERSION)\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[console_scripts]\n{name} = {name}:main\n",
    }

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = [f"{n},sha256={digest(t.encode())},{len(t.encode())}" for n, t in files.items()]
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for n, t in files.items():
            z.writestr(n, t)
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return wheel


class AgentProc:
    def __init__(
        self,
        env: Mapping[str, str],
        log: Path,
        *args: str,
        command: Sequence[str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        """`command` (default `python -m autoscaler.cli agent`) with `args`, from `cwd`."""
        self.log = log
        out = open(log, "ab")  # noqa: SIM115 - the child keeps it
        try:
            self.popen = subprocess.Popen(
                [*(command or [sys.executable, "-m", "autoscaler.cli", "agent"]), *args],
                env={**_base_env(), **env},
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            out.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the agent did not exit:\n{self.text()[-3000:]}") from None

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)


def _base_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH")
    return {k: os.environ[k] for k in keep if k in os.environ} | {"PYTHONUNBUFFERED": "1"}


def wait_for(pred: Callable[[], Any], timeout: float, what: str, dump: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{dump()}")
        time.sleep(0.1)
