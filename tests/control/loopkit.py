"""Shared harness of the control loop's end-to-end and chaos tests: `Loop`.

`Loop` drives the real thing the way an operator does: `autoscaler db upgrade`, `autoscaler
apply FILE`, then `celery -A autoscaler worker` and `celery -A autoscaler beat` as separate
processes, each in its own process group (so a SIGKILL takes its pool children too), with their
output in log files that every failed wait prints. It reads the state store directly to wait
on conditions and to check the invariants (`check_invariants`), and it cleans up everything it
started — control-plane processes, the local provider's machines (process groups from the
provider's state files, then any process still carrying this installation's label) and the
Redis keys its test created — even when the test fails.

Beside it: `loopprocs` (processes, Redis databases, cleanup), `loopworld` (the watched app and
the configs) and `loopchecks` (the invariants).

Redis: the control plane's broker and results on database 13 (CONTROL_DB), watched
applications on database 12 (WATCH_DB) with a unique queue name per test. Each Loop has its own
control queue and key prefix (AUTOSCALER_CONTROL_QUEUE / _KEYPREFIX), so two runs of the suite
on one Redis (a flake hunt beside a developer's run) never take or purge each other's tasks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from celery import Celery
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.lifecycle import InstanceState
from autoscaler.store import installation
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import Instance, ScaleEvent
from tests.control.loopprocs import (
    AUTOSCALER,
    CELERY,
    CONTROL_BROKER,
    HERE,
    REPO,
    Proc,
    forget_watched,
    kill_local_machines,
    killpg,
    purge_control_plane,
    stop_group,
    unique,
)

T = TypeVar("T")

S = InstanceState


@dataclass
class Loop:
    """One control plane under test: its environment, its processes and its store."""

    tmp_path: Path
    database_url: str | None
    broker_url: str | None = CONTROL_BROKER
    result_backend: str | None = CONTROL_BROKER
    extra_env: Mapping[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    watch_keys: set[str] = field(default_factory=set)
    _engine: Engine | None = None
    _installation: str | None = None
    _client: Celery | None = None

    def __post_init__(self) -> None:
        self.control_queue = unique("autoscaler")
        self.control_prefix = f"{self.control_queue}-control:"
        self.home = self.tmp_path / "home"
        self.logs = self.tmp_path / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")}
        env["AUTOSCALER_HOME"] = str(self.home)
        if self.database_url:
            env["AUTOSCALER_DATABASE_URL"] = self.database_url
        if self.broker_url:
            env["AUTOSCALER_BROKER_URL"] = self.broker_url
        if self.result_backend:
            env["AUTOSCALER_RESULT_BACKEND"] = self.result_backend
        # The local provider passes PYTHONPATH on to its machines: they import the e2e app.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env["AUTOSCALER_CONTROL_QUEUE"] = self.control_queue
        env["AUTOSCALER_CONTROL_KEYPREFIX"] = self.control_prefix
        env.update(self.extra_env)
        self.env = env
        if self.database_url is None:
            self.database_url = f"sqlite:///{self.home / 'state.db'}"
        if self.broker_url and self.broker_url.startswith("redis"):
            purge_control_plane(self.broker_url, self.control_prefix)

    # ------------------------------------------------------------------ CLI

    def cli(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [AUTOSCALER, *args],
            env=self.env,
            cwd=self.tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and out.returncode != 0:
            raise AssertionError(
                f"autoscaler {' '.join(args)} -> {out.returncode}\n{out.stdout}\n{out.stderr}"
            )
        return out

    def setup(self, config: Mapping[str, Any] | str) -> None:
        """`autoscaler db upgrade` then `autoscaler apply` the config."""
        self.cli("db", "upgrade")
        with transaction(self.sessions) as session:
            self._installation = installation.installation_id(session)
        self.apply(config)

    def apply(self, config: Mapping[str, Any] | str) -> None:
        text = config if isinstance(config, str) else yaml.safe_dump(dict(config), sort_keys=False)
        path = self.tmp_path / f"config-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(text)
        self.cli("apply", str(path), "--by", "loop-test")

    def celery_call(self, task: str, args: list[Any], timeout: float = 60) -> str:
        """`celery -A autoscaler call TASK --args JSON`; returns the task id."""
        out = subprocess.run(
            [CELERY, "-A", "autoscaler", "call", task, "--args", json.dumps(args)],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise AssertionError(f"celery call {task} failed:\n{out.stdout}\n{out.stderr}")
        return out.stdout.strip().splitlines()[-1].strip()

    def client(self) -> Celery:
        """A client of the control plane's broker and result backend (sends, reads results)."""
        if self._client is None:
            assert self.broker_url is not None
            app = Celery(
                "loop-client",
                broker=self.broker_url,
                backend=self.result_backend,
                set_as_current=False,
            )
            app.conf.update(
                task_serializer="json",
                accept_content=["json"],
                result_serializer="json",
                task_default_queue=self.control_queue,
            )
            if self.broker_url.startswith("redis"):
                prefixed = {"global_keyprefix": self.control_prefix}
                app.conf.broker_transport_options = prefixed
                app.conf.result_backend_transport_options = prefixed
            self._client = app
        return self._client

    def result(self, task_id: str, timeout: float = 30) -> Any:
        return self.client().AsyncResult(task_id).get(timeout=timeout)

    # ------------------------------------------------------------------ processes

    def start(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> Proc:
        """`celery -A autoscaler ARGS…` as a process of this loop."""
        return self.spawn(name, [CELERY, "-A", "autoscaler", *args], env)

    def spawn(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> Proc:
        """`argv` in its own process group, its output in logs/NAME.log, stopped at close."""
        log = self.logs / f"{name}.log"
        out = open(log, "ab")  # noqa: SIM115 - the child keeps it
        try:
            popen = subprocess.Popen(
                argv,
                env={**self.env, **(env or {})},
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            out.close()
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def worker(
        self,
        name: str = "w1",
        *,
        concurrency: int = 3,
        pool: str = "prefork",
        wait: bool = True,
        env: Mapping[str, str] | None = None,
        events: bool = False,
        queues: str = "both",
    ) -> Proc:
        """A control-plane worker of the loop's queue, of the lifecycle queue, or (the default,
        what a worker given no -Q does) both."""
        lifecycle = f"{self.control_queue}.lifecycle"
        consumed = {"loop": self.control_queue, "lifecycle": lifecycle}.get(
            queues, f"{self.control_queue},{lifecycle}"
        )
        proc = self.start(
            name,
            "worker",
            "-l",
            "info",
            "-n",
            f"{name}@%h",
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
            "-Q",
            consumed,
            *(["-E"] if events else []),
            env=env,
        )
        if wait:
            self.wait(lambda: " ready." in proc.text() or self._died(proc), 60, f"worker {name} up")
        return proc

    def serve_api(self, port: int) -> str:
        """`autoscaler serve` on 127.0.0.1:`port` (a process of this loop, stopped with it);
        returns its URL once /healthz answers."""
        argv = [sys.executable, "-m", "autoscaler.cli", "serve", "--bind", f"127.0.0.1:{port}"]
        proc = self.spawn("serve", argv)
        url = f"http://127.0.0.1:{port}"
        self.wait(lambda: _answers(url) or self._died(proc), 30, "the API up")
        return url

    def beat(self, name: str = "beat", *, wait: bool = True) -> Proc:
        proc = self.start(name, "beat", "-l", "info", "-s", str(self.tmp_path / f"{name}-schedule"))
        if wait:
            self.wait(
                lambda: "beat: schedule for config" in proc.text() or self._died(proc),
                60,
                f"beat {name} up",
            )
        return proc

    def _died(self, proc: Proc) -> bool:
        if not proc.alive():
            raise AssertionError(
                f"{proc.name} exited ({proc.popen.returncode}):\n{proc.text()[-4000:]}"
            )
        return False

    def kill(self, proc: Proc, sig: signal.Signals = signal.SIGKILL) -> None:
        """Signal the whole process group (a SIGKILLed worker takes its pool with it)."""
        killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=10)

    def stop(self, proc: Proc) -> None:
        stop_group(proc.popen)

    # ------------------------------------------------------------------ store

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            assert self.database_url is not None
            self._engine = make_engine(self.database_url)
        return self._engine

    @property
    def sessions(self) -> sessionmaker[Session]:
        return session_factory(self.engine)

    @property
    def installation_id(self) -> str:
        if self._installation is None:
            with transaction(self.sessions) as session:
                self._installation = installation.installation_id(session)
        return self._installation

    def instances(self, queue: str | None = None) -> list[dict[str, Any]]:
        with transaction(self.sessions) as session:
            stmt = select(Instance).order_by(Instance.id)
            if queue is not None:
                stmt = stmt.where(Instance.queue == queue)
            return [_as_dict(r) for r in session.scalars(stmt)]

    def events(self, queue: str | None = None) -> list[dict[str, Any]]:
        with transaction(self.sessions) as session:
            stmt = select(ScaleEvent).order_by(ScaleEvent.id)
            if queue is not None:
                stmt = stmt.where(ScaleEvent.queue == queue)
            return [_as_dict(r) for r in session.scalars(stmt)]

    def sql(self, statement: str, **params: Any) -> list[Any]:
        """A raw statement on the store (test instrumentation: triggers, direct edits)."""
        from sqlalchemy import text

        with self.engine.begin() as conn:
            result = conn.execute(text(statement), params)
            return list(result.all()) if result.returns_rows else []

    # ------------------------------------------------------------------ waiting

    def wait(
        self, predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.2
    ) -> T:
        """Poll until `predicate()` is truthy; on timeout fail with the store and the logs."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what}\n{self.dump()}"
                )
            time.sleep(interval)

    def rows_in(self, queue: str, *states: InstanceState) -> list[dict[str, Any]]:
        return [r for r in self.instances(queue) if r["state"] in states]

    def dump(self, tail: int = 6000) -> str:
        parts = []
        with contextlib.suppress(Exception):
            parts.append("--- instances ---")
            for r in self.instances():
                parts.append(
                    f"{r['launch_id'][:12]} {r['queue']} {r['provider']} {r['state']} "
                    f"pid={r['provider_instance_id']} worker={r['worker_name']} "
                    f"running={r['running_tasks']} reason={r['state_reason']!r}"
                )
            parts.append("--- events ---")
            for e in self.events()[-80:]:
                parts.append(
                    f"{e['at']:%H:%M:%S.%f} {e['queue']} {e['kind']}/{e['action']} "
                    f"{(e['launch_id'] or '')[:12]} {e['reason']!r}"
                )
        for proc in self.procs:
            parts.append(f"--- {proc.name} (alive={proc.alive()}) ---")
            parts.append(proc.text()[-tail:])
        for log in sorted(self.home.glob("local-machines/*/*.log")):
            parts.append(f"--- machine {log.name} ---")
            parts.append(log.read_text(errors="replace")[-2000:])
        return "\n".join(parts)

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        for proc in reversed(self.procs):
            stop_group(proc.popen, grace=8.0)
        kill_local_machines(self.home, self._installation)
        if self._client is not None:
            self._client.close()
        if self.broker_url and self.broker_url.startswith("redis"):
            purge_control_plane(self.broker_url, self.control_prefix)
        if self.watch_keys:
            forget_watched(self.watch_keys)
        if self._engine is not None:
            self._engine.dispose()


def _answers(url: str) -> bool:
    import requests

    try:
        return requests.get(f"{url}/healthz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _as_dict(row: Any) -> dict[str, Any]:
    return {c.key: getattr(row, c.key) for c in row.__mapper__.column_attrs}
