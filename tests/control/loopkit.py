"""Shared helpers of the control loop's end-to-end and chaos tests.

`Loop` drives the real thing the way an operator does: `autoscaler db upgrade`, `autoscaler
apply FILE`, then `celery -A autoscaler worker` and `celery -A autoscaler beat` as separate
processes, each in its own process group (so a SIGKILL takes its pool children too), with their
output in log files that every failed wait prints. It reads the state store directly to wait
on conditions and to check the invariants (`check_invariants`), and it cleans up everything it
started — control-plane processes, the local provider's machines (process groups from the
provider's state files, then any process still carrying this installation's label) and the
Redis keys its test created — even when the test fails.

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
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import redis
import yaml
from celery import Celery
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.lifecycle import LIVE_STATES, InstanceState
from autoscaler.providers.labels import parse_label
from autoscaler.store import installation
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import Instance, MockMachine, ScaleEvent
from tests.control import e2eapp

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BIN = Path(sys.executable).parent
CELERY = str(BIN / "celery")
AUTOSCALER = str(BIN / "autoscaler")

REDIS = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379")
CONTROL_DB = 13
WATCH_DB = 12
CONTROL_BROKER = f"{REDIS}/{CONTROL_DB}"
WATCH_BROKER = f"{REDIS}/{WATCH_DB}"

S = InstanceState
ENDED = {"terminated_at", "failed_at", "lost_at"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(popen: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL it after `grace` s; always reap the leader."""
    if popen.poll() is None:
        _killpg(popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=grace)
    # Pool children may outlive a leader that exited: kill whatever is left of the group.
    _killpg(popen.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=5)


def _proc_env(pid: str) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _proc_state(pid: str) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[0] if fields else None


def labelled_processes(installation_id: str) -> dict[int, str]:
    """Living (not zombie) processes whose AUTOSCALER_LABEL is one of this installation's."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        label = _proc_env(entry).get("AUTOSCALER_LABEL")
        parsed = parse_label(label)
        if parsed is None or parsed.installation_id != installation_id:
            continue
        if _proc_state(entry) in (None, "Z", "X"):
            continue
        found[int(entry)] = str(label)
    return found


# --------------------------------------------------------------------------- the loop


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
        _killpg(proc.pid, sig)
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


def purge_control_plane(url: str, prefix: str) -> None:
    """One control plane's keys on its Redis database (tasks, bindings, results: all carry its
    prefix, letters, digits and dashes only), nobody else's."""
    r = redis.Redis.from_url(url)
    try:
        keys = list(r.scan_iter(match=f"{prefix}*", count=500))
        if keys:
            r.delete(*keys)
    finally:
        r.close()


def forget_watched(keys: set[str]) -> None:
    """Delete the watched app's keys of this test, and the `unacked` entries of its queues (a
    machine killed with a prefetched job leaves one; kombu would restore it an hour later)."""
    r = redis.Redis.from_url(WATCH_BROKER)
    try:
        r.delete(*keys)
        stale = []
        for tag, raw in r.hgetall("unacked").items():
            with contextlib.suppress(ValueError, TypeError, IndexError):
                if json.loads(raw)[2] in keys:
                    stale.append(tag)
        if stale:
            r.hdel("unacked", *stale)
            r.zrem("unacked_index", *stale)
    finally:
        r.close()


def kill_local_machines(home: Path, installation_id: str | None) -> list[str]:
    """SIGKILL every local machine: groups from the state files, then labelled stragglers."""
    killed = []
    for path in home.glob("local-machines/*/*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            record = json.loads(path.read_text())
            pid = int(record["pid"])
            stat_ok = _proc_state(str(pid)) not in (None, "Z", "X")
            if stat_ok:
                _killpg(int(record["pgid"]), signal.SIGKILL)
                killed.append(str(record["label"]))
    if installation_id:
        for pid, label in labelled_processes(installation_id).items():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            killed.append(label)
    return killed


# --------------------------------------------------------------------------- the watched app


class Watched:
    """A unique queue on the watched Redis, jobs published with the e2e app's Celery app."""

    def __init__(self, loop: Loop, prefix: str = "e2e") -> None:
        self.queue = unique(prefix)
        self.record_key = f"e2e:{self.queue}:runs"
        self.loop = loop
        loop.watch_keys.update(
            {
                self.queue,
                self.record_key,
                f"_kombu.binding.{self.queue}",
                f"_kombu.binding_permanent.{self.queue}",
            }
            | {f"{self.queue}\x06\x16{p}" for p in (3, 6, 9)}
        )
        self.app = e2eapp.publisher(WATCH_BROKER)

    @property
    def metrics(self) -> dict[str, Any]:
        return {"source": "celery", "url": WATCH_BROKER}

    def publish(self, n: int, seconds: float = 1.0, prefix: str = "job") -> list[str]:
        ids = [f"{prefix}-{i}" for i in range(n)]
        with self.app.connection_for_write() as conn:
            for job_id in ids:
                self.app.send_task(
                    "e2eapp.job",
                    args=[self.record_key, job_id, seconds],
                    queue=self.queue,
                    routing_key=self.queue,
                    connection=conn,
                )
        return ids

    def pending(self) -> int:
        r = redis.Redis.from_url(WATCH_BROKER)
        try:
            return int(r.llen(self.queue))
        finally:
            r.close()

    def empty(self) -> int:
        """Delete the waiting jobs (the test stands in for workers that took them)."""
        r = redis.Redis.from_url(WATCH_BROKER)
        try:
            return int(r.delete(self.queue))
        finally:
            r.close()

    def runs(self) -> list[dict[str, Any]]:
        return e2eapp.runs(WATCH_BROKER, self.record_key)

    def close(self) -> None:
        self.app.close()


def local_command(queue: str) -> str:
    """The local provider's machine: a real Celery worker of the e2e app on `queue`."""
    return (
        f"E2E_BROKER_URL={WATCH_BROKER} exec {sys.executable} -m celery -A e2eapp worker "
        f'-Q {queue} -n "$AUTOSCALER_LABEL@%h" --pool prefork -c 1 '
        "--prefetch-multiplier 1 -l warning"
    )


# --------------------------------------------------------------------------- provider views


@dataclass(frozen=True)
class AtProvider:
    """One machine a provider holds (not destroyed): its provider, id and label."""

    provider: str
    machine_id: str
    label: str


def mock_machines(loop: Loop) -> list[AtProvider]:
    with transaction(loop.sessions) as session:
        return [
            AtProvider(m.provider, f"mock-{m.id}", m.label)
            for m in session.scalars(select(MockMachine).where(MockMachine.status != "destroyed"))
        ]


def local_machines(loop: Loop, provider: str) -> list[AtProvider]:
    """State files of the local provider plus any living process with our label."""
    out = {}
    for path in loop.home.glob(f"local-machines/{provider}/*.json"):
        label = path.name[: -len(".json")]
        out[label] = AtProvider(provider, label, label)
    for label in labelled_processes(loop.installation_id).values():
        out.setdefault(label, AtProvider(provider, label, label))
    return list(out.values())


# --------------------------------------------------------------------------- invariants


def check_invariants(
    loop: Loop,
    max_workers: Mapping[str, int],
    at_provider: Iterable[AtProvider],
    *,
    extra: str = "",
) -> None:
    """The loop's promises, checked against the store and the providers:

    1. no two live rows hold the same provider machine;
    2. every machine a provider holds is owned by a live row of that provider (no orphan, no
       leak: nothing here waits for ORPHAN_GRACE);
    3. no machine was destroyed busy: a row reaches terminating from ready/draining without
       being drained only when its machine was dead, silent or never booted;
    4. never more rows that may bill than max_workers, at any instant (from the timestamps);
    5. every action is audited: a launch event per row, and an event with a reason for every
       drain, destroy, failure and reconcile move the row made.
    """
    rows = loop.instances()
    events = loop.events()
    problems: list[str] = []
    by_launch: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["launch_id"]:
            by_launch[e["launch_id"]].append(e)
        if not (e["reason"] or "").strip():
            problems.append(f"event without a reason: {e}")

    live = [r for r in rows if r["state"] in LIVE_STATES]
    # 1.
    holders: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in live:
        if r["provider_instance_id"]:
            holders[(r["provider"], r["provider_instance_id"])].append(r["launch_id"])
    for key, launches in holders.items():
        if len(launches) > 1:
            problems.append(f"live rows {launches} share the machine {key}")
    # 2.
    live_by_launch = {r["launch_id"]: r for r in live}
    for m in at_provider:
        parsed = parse_label(m.label)
        if parsed is None or parsed.installation_id != loop.installation_id:
            continue
        owner = live_by_launch.get(parsed.launch_id)
        if owner is None or owner["provider"] != m.provider:
            state = next((r["state"] for r in rows if r["launch_id"] == parsed.launch_id), None)
            problems.append(
                f"{m.provider} holds {m.machine_id} ({m.label}) but no live row owns it "
                f"(its row: {state})"
            )
    # 3.
    for r in rows:
        if r["terminating_at"] is None or r["drained_at"] is not None:
            continue
        if r["ready_at"] is None:
            continue  # never served: a failed boot
        moves = [
            e
            for e in by_launch[r["launch_id"]]
            if e["kind"] == "reconcile" and e["action"].endswith("->terminating")
        ]
        if not any(
            ("dead at the provider" in e["reason"]) or ("silent for" in e["reason"]) for e in moves
        ):
            problems.append(
                f"{r['launch_id']} went to terminating from service without being drained, "
                f"and not for a dead or silent machine: {[e['reason'] for e in moves]}"
            )
    # 4.
    for queue, limit in max_workers.items():
        points: list[tuple[datetime, int]] = []
        for r in rows:
            if r["queue"] != queue:
                continue
            points.append((r["created_at"], 1))
            end = min((r[k] for k in ENDED if r[k] is not None), default=None)
            if end is not None:
                points.append((end, -1))
        points.sort(key=lambda p: (p[0], p[1]))  # an end before a start at the same instant
        n = peak = 0
        for _, d in points:
            n += d
            peak = max(peak, n)
        if peak > limit:
            problems.append(
                f"{queue}: {peak} machines may have billed at once, max_workers {limit}"
            )
    # 5.
    for r in rows:
        mine = by_launch[r["launch_id"]]
        actions = {(e["kind"], e["action"]) for e in mine}
        if ("scale_up", "launch") not in actions:
            problems.append(f"{r['launch_id']}: no launch event")
        if r["draining_at"] is not None and not (
            actions & {("scale_down", "drain"), ("drain", "start")}
        ):
            problems.append(f"{r['launch_id']}: drained without a drain event")
        if r["terminating_at"] is not None and not (
            ("drain", "drained") in actions
            or any(k == "reconcile" and a.endswith("->terminating") for k, a in actions)
        ):
            problems.append(f"{r['launch_id']}: terminating without a drained/reconcile event")
        if r["terminated_at"] is not None and not (
            ("terminate", "destroyed") in actions
            or ("reconcile", "terminating->terminated") in actions
        ):
            problems.append(f"{r['launch_id']}: terminated without a destroy event")
        if r["failed_at"] is not None and not (
            ("launch", "failed") in actions
            or any(k == "reconcile" and a.endswith("->failed") for k, a in actions)
        ):
            problems.append(f"{r['launch_id']}: failed without an event")
        if r["lost_at"] is not None and not any(
            k == "reconcile" and a.endswith("->lost") for k, a in actions
        ):
            problems.append(f"{r['launch_id']}: lost without an event")
    if problems:
        raise AssertionError(
            "invariants broken:\n  " + "\n  ".join(problems) + f"\n{extra}\n{loop.dump()}"
        )


def first_event(
    events: Iterable[Mapping[str, Any]], kind: str, action: str, launch_id: str | None = None
) -> Mapping[str, Any] | None:
    return next(
        (
            e
            for e in events
            if e["kind"] == kind
            and e["action"] == action
            and (launch_id is None or e["launch_id"] == launch_id)
        ),
        None,
    )


# --------------------------------------------------------------------------- configs

POLL = 2


def mock_queue(
    watched: Watched,
    *,
    max_workers: int = 2,
    scale_up: list[dict[str, Any]] | None = None,
    scale_down: list[dict[str, Any]] | None = None,
    provider: str = "sandbox",
) -> dict[str, Any]:
    return {
        "metrics": watched.metrics,
        "autoscale": {
            "provider": provider,
            "max_workers": max_workers,
            "scale_up": scale_up if scale_up is not None else [{"trigger": "no_workers"}],
            "scale_down": scale_down
            if scale_down is not None
            else [{"trigger": "idle", "timeout": "3s"}],
            "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
        },
    }


def mock_config(queues: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "poll_interval": POLL,
        "boot_timeout": 30,
        "heartbeat_timeout": 60,
        "backoff": {"base": 2, "cap": 10},
        "providers": {"sandbox": {"kind": "mock", "boot_delay": 1, "price_per_hour": 0.1}},
        "queues": queues,
        **top,
    }
