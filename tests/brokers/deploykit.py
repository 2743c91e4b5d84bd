"""Real Celery deployments for the metrics tests: producers, worker processes, gates, a runtime.

A worker runs `tests.brokers.deploy_app` in its own process group and is always killed (killpg)
when its block ends. Tasks `t.hold(key)` run until the test opens `key` on the gate Redis, so
"2 running, 2 prefetched, 4 waiting" is a state the test holds as long as it counts.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import redis
from celery import Celery
from kombu import Exchange, Queue

from autoscaler.brokers.workers import CeleryWorkerProbe
from autoscaler.config import load_config_text
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.settings import Settings
from autoscaler.store import config_versions, migrate
from tests.conftest import REDIS_URL

ROOT = Path(__file__).resolve().parents[2]
GATE_URL = f"{REDIS_URL}/7"
T = TypeVar("T")


def wait_for(read: Callable[[], T], ok: Callable[[T], bool], timeout: float = 15.0) -> T:
    """Poll `read` until `ok` (bounded); the last value either way."""
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        if ok(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


class Deployment:
    """One watched application: its broker, transport options, queues and the gate."""

    def __init__(
        self,
        broker: str,
        *,
        transport: dict[str, Any] | None = None,
        queues: list[tuple[str, str, str, str]] | None = None,
    ) -> None:
        self.broker = broker
        self.transport = dict(transport or {})
        self.queues = list(queues or [])
        self.run = uuid.uuid4().hex[:8]
        self.gate = redis.Redis.from_url(GATE_URL)
        self._workers: list[subprocess.Popen[bytes]] = []

    def producer(self) -> Celery:
        """A producer app configured as the application's own (same transport and queues)."""
        app = Celery("producer", broker=self.broker, set_as_current=False)
        app.conf.broker_transport_options = dict(self.transport)
        if self.queues:
            app.conf.task_queues = [
                Queue(n, Exchange(x, type=k), routing_key=rk) if x else Queue(n)
                for n, x, k, rk in self.queues
            ]
        return app

    def key(self, name: str) -> str:
        return f"gate-{self.run}-{name}"

    def open(self, name: str) -> None:
        self.gate.set(self.key(name), 1, ex=120)

    def send(self, app: Celery, n: int, gate: str, **options: Any) -> None:
        for _ in range(n):
            app.send_task("t.hold", args=[self.key(gate)], **options)

    @contextlib.contextmanager
    def worker(
        self,
        queues: str,
        *,
        name: str | None = None,
        concurrency: int = 2,
        acks_late: bool = False,
        prefetch: int = 1,
    ) -> Iterator[str]:
        """A real `celery worker` process for `queues`; yields its name once it answers."""
        node = name or f"w-{self.run}-{len(self._workers)}@deploy-host-{self.run}"
        env = os.environ | {
            "DEPLOY_BROKER": self.broker,
            "DEPLOY_TRANSPORT": json.dumps(self.transport),
            "DEPLOY_ACKS_LATE": "1" if acks_late else "0",
            "DEPLOY_PREFETCH": str(prefetch),
            "DEPLOY_QUEUES": json.dumps(self.queues),
            "DEPLOY_GATE": GATE_URL,
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.brokers.deploy_app",
                "worker",
                "-Q",
                queues,
                "-c",
                str(concurrency),
                "--pool",
                "prefork",
                "-n",
                node,
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "WARNING",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._workers.append(proc)
        try:
            probe = CeleryWorkerProbe(self.broker, transport_options=self.transport, timeout=0.5)
            try:
                seen = wait_for(probe.poll, lambda r: node in r, timeout=20)
            finally:
                probe.close()
            assert node in seen, f"worker {node} never answered"
            yield node
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def close(self) -> None:
        keys = list(self.gate.scan_iter(match=f"gate-{self.run}-*", count=1000))
        if keys:
            self.gate.delete(*keys)
        self.gate.close()


def clear_redis(url: str, prefix: str) -> None:
    r = redis.Redis.from_url(url)
    keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
    # remote-control reply queues and bindings are not under the prefix only when it is empty
    if keys:
        r.delete(*keys)
    r.close()


def runtime_with(config_text: str, home: Path) -> Runtime:
    """A control-plane runtime on a fresh SQLite store running `config_text`."""
    url = f"sqlite:///{home / 'state.db'}"
    migrate.upgrade(url)
    rt = Runtime(
        Settings.from_env({"AUTOSCALER_HOME": str(home), "AUTOSCALER_DATABASE_URL": url}), env={}
    )
    config = load_config_text(config_text)
    with rt.transaction() as session:
        config_versions.record(session, config.model_dump(mode="json"), "test", utc_now())
    return rt
