"""The live demo's processes, from the folder's creation to its removal.

    folder/
      home/            AUTOSCALER_HOME: state.db, broker.db (control plane), demo-broker.db
                       (the demo queue), local-machines/ (the local provider's machines)
      demo-app/        the task app's Git repository (file://), deployed by every agent
      tmp/             TMPDIR of every process: the agents' clones live here
      logs/            one log per process (kept with --keep)
      runs.jsonl       what the jobs recorded (start, end, worker)

Processes, each in its own process group: `autoscaler serve`, `celery -A autoscaler worker`,
`celery -A autoscaler beat`, and the local provider's machines (agents and their workers).
Stopping (the end, an error, Ctrl-C): beat and the control plane's worker first (no new
decision, no launch in flight), every machine destroyed through the local provider (SIGTERM to
its group, SIGKILL after a grace), any process still carrying this installation's id killed
(a worker its agent had no time to stop runs in a session of its own), then the API; then the
folder is removed unless --keep.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select

from autoscaler.demo import app as demo_app
from autoscaler.demo.summary import Summary, summarize
from autoscaler.demo.view import Status, View

PROVIDER = "demo-local"
LIVE = ("pending", "creating", "booting", "ready", "draining", "drained", "terminating")


class DemoError(Exception):
    """The demo cannot go on; the message says why and what to look at."""


@dataclass(frozen=True)
class Shape:
    jobs: int
    seconds: tuple[float, float]
    max_workers: int
    target_per_worker: int
    idle_s: int
    deadline_s: float
    price_per_hour: float = 0.40


FULL = Shape(
    jobs=30, seconds=(3.0, 7.0), max_workers=4, target_per_worker=5, idle_s=10, deadline_s=300.0
)
SHORT = Shape(
    jobs=8, seconds=(1.5, 2.5), max_workers=2, target_per_worker=3, idle_s=4, deadline_s=150.0
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


class Demo:
    def __init__(self, folder: Path, shape: Shape, view: View, seed: int = 7) -> None:
        self.folder = folder.absolute()
        self.shape = shape
        self.view = view
        self.rng = random.Random(seed)
        self.home = self.folder / "home"
        self.logs = self.folder / "logs"
        self.tmp = self.folder / "tmp"
        self.runs_path = self.folder / "runs.jsonl"
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}"
        self.database_url = f"sqlite:///{self.home / 'state.db'}"
        self.queue_broker = f"sqla+sqlite:///{self.home / 'demo-broker.db'}"
        self.procs: list[Proc] = []
        self.published: list[demo_app.Published] = []
        self.config: dict[str, Any] = {}
        self.started = time.time()
        self.last_event = 0
        self.env: dict[str, str] = {}
        self.phase = "starting"

    # ------------------------------------------------------------------ setup

    def prepare(self) -> None:
        if shutil.which("git") is None:
            raise DemoError(
                "the demo's machines deploy their task code from Git, and `git` is not on "
                "PATH: install it (Debian/Ubuntu: apt-get install git) and run again"
            )
        for d in (self.home, self.logs, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOSCALER_", "CELERY_"))}
        env.update(
            {
                "AUTOSCALER_HOME": str(self.home),
                "AUTOSCALER_API_URL": self.api_url,
                "AUTOSCALER_API_BIND": f"127.0.0.1:{self.port}",
                "TMPDIR": str(self.tmp),
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.env = env
        self.view.say(f"folder {self.folder}")
        git_url = demo_app.make_repo(self.folder / "demo-app")
        self.config = self.make_config(git_url)
        path = self.folder / "demo.yaml"
        path.write_text(yaml.safe_dump(self.config, sort_keys=False), encoding="utf-8")
        self.cli("db", "upgrade")
        self.cli("apply", str(path), "--by", "demo", "--comment", "autoscaler demo")
        self.view.say(
            f"store migrated, config applied: queue {demo_app.QUEUE!r} on the local provider, "
            f"max {self.shape.max_workers} machines, {self.shape.target_per_worker} jobs per "
            f"machine, idle timeout {self.shape.idle_s} s"
        )

    def make_config(self, git_url: str) -> dict[str, Any]:
        agent = (
            "AUTOSCALER_HEARTBEAT_INTERVAL=1 exec "
            f"{shlex.quote(sys.executable)} -m autoscaler.cli agent"
        )
        return {
            "poll_interval": 2,
            "boot_timeout": 90,
            "heartbeat_timeout": 30,
            "backoff": {"base": 2, "cap": 10},
            "providers": {
                PROVIDER: {
                    "kind": "local",
                    "command": agent,
                    "price_per_hour": self.shape.price_per_hour,
                }
            },
            "queues": {
                demo_app.QUEUE: {
                    "deployment": {
                        "git_url": git_url,
                        "git_ref": "main",
                        "startup_cmd": demo_app.startup_cmd(),
                        "env": {
                            "DEMO_BROKER_URL": self.queue_broker,
                            "DEMO_RUNS": str(self.runs_path),
                        },
                    },
                    "metrics": {"source": "celery", "url": self.queue_broker},
                    "autoscale": {
                        "provider": PROVIDER,
                        "max_workers": self.shape.max_workers,
                        "scale_up": [
                            {
                                "trigger": "queue_depth",
                                "target_per_worker": self.shape.target_per_worker,
                            }
                        ],
                        "scale_down": [{"trigger": "idle", "timeout": f"{self.shape.idle_s}s"}],
                        "instance": {
                            "gpu": "local CPU (demo)",
                            "max_price_per_hour": max(1.0, self.shape.price_per_hour),
                        },
                    },
                }
            },
        }

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "autoscaler.cli", *args],
            env=self.env,
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise DemoError(
                f"`autoscaler {' '.join(args[:2])}` failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-600:]}"
            )
        return done.stdout

    def start(self, name: str, argv: list[str]) -> Proc:
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv,
                env=self.env,
                cwd=self.folder,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def start_control_plane(self) -> None:
        py = sys.executable
        api = self.start(
            "api",
            [
                py,
                "-m",
                "autoscaler.cli",
                "serve",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--log-level",
                "warning",
            ],
        )
        worker = self.start(
            "worker",
            [
                py,
                "-m",
                "celery",
                "-A",
                "autoscaler",
                "worker",
                "-l",
                "info",
                "-n",
                f"demo-control-{self.port}@%h",
                "--pool",
                "prefork",
                "--concurrency",
                "3",
                "-Q",
                "autoscaler,autoscaler.lifecycle",
            ],
        )
        self.wait(lambda: self._api_up(), 60, "the API", api)
        self.wait(lambda: " ready." in worker.text(), 90, "the control plane's worker", worker)
        beat = self.start(
            "beat",
            [
                py,
                "-m",
                "celery",
                "-A",
                "autoscaler",
                "beat",
                "-l",
                "info",
                "-s",
                str(self.folder / "beat-schedule"),
            ],
        )
        self.wait(
            lambda: "beat: schedule for config" in beat.text(), 60, "the control plane's beat", beat
        )
        self.view.say(
            f"control plane up: API {self.api_url}, celery worker (3 processes), celery beat"
        )

    def _api_up(self) -> bool:
        import requests

        try:
            return requests.get(f"{self.api_url}/healthz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def wait(self, pred: Callable[[], bool], timeout: float, what: str, proc: Proc) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if proc.popen.poll() is not None:
                raise DemoError(
                    f"{what} exited ({proc.popen.returncode}); its log, {proc.log}, ends:\n"
                    + proc.text()[-1500:]
                )
            if time.monotonic() > deadline:
                raise DemoError(f"{what} not up after {timeout:.0f} s; see {proc.log}")
            time.sleep(0.2)

    # ------------------------------------------------------------------ the run

    def burst(self) -> None:
        lo, hi = self.shape.seconds
        jobs = [
            (f"job-{i:02d}", round(self.rng.uniform(lo, hi), 1)) for i in range(self.shape.jobs)
        ]
        self.published = demo_app.publish(self.queue_broker, jobs)
        work = sum(s for _, s in jobs)
        self.view.say(
            f"burst: {len(jobs)} jobs of {lo:g}–{hi:g} s ({work:.0f} s of work) published "
            f"to {demo_app.QUEUE!r}"
        )

    def watch(self, interval: float = 0.5) -> None:
        """Refresh the view until every job ran and every machine is gone, or the deadline."""
        from autoscaler.brokers.embedded.celery_sqla import CelerySqlaReader

        reader = CelerySqlaReader(self.queue_broker)
        deadline = time.monotonic() + self.shape.deadline_s
        try:
            while True:
                status, events, live, rows = self.status(reader)
                self.view.update(status, events)
                if status.done >= len(self.published) and rows and not live:
                    self.view.update(status, self.new_events())
                    return
                for p in self.procs:
                    if p.popen.poll() is not None:
                        raise DemoError(
                            f"{p.name} exited ({p.popen.returncode}); its log, {p.log}, ends:\n"
                            + p.text()[-1500:]
                        )
                if time.monotonic() > deadline:
                    raise DemoError(
                        f"not done after {self.shape.deadline_s:.0f} s: {status.line()}; the "
                        f"logs are in {self.logs} (run with --keep to look at them)"
                    )
                time.sleep(interval)
        finally:
            reader.close()

    def status(self, reader: Any) -> tuple[Status, list[str], int, int]:
        from autoscaler.brokers.base import SourceError

        records = demo_app.runs(self.runs_path)
        starts = Counter(str(e.get("job")) for e in records if e.get("phase") == "start")
        ends = Counter(str(e.get("job")) for e in records if e.get("phase") == "end")
        try:
            depth: int | None = reader.read([demo_app.QUEUE])[demo_app.QUEUE].pending
        except SourceError:
            depth = None
        states = self.states()
        live = sum(n for s, n in states.items() if s in LIVE)
        rows = sum(states.values())
        done = sum(1 for p in self.published if ends[p.job])
        if not rows:
            phase = "waiting for the loop to rent"
        elif done < len(self.published):
            phase = "running the burst"
        elif live:
            phase = "queue empty: machines idle, drained, destroyed"
        else:
            phase = "done"
        status = Status(
            phase=phase,
            depth=depth,
            running=max(0, sum(starts.values()) - sum(ends.values())),
            done=done,
            published=len(self.published),
            machines=states,
            elapsed=time.time() - self.started,
        )
        return status, self.new_events(), live, rows

    def _sessions(self) -> Any:
        if getattr(self, "_factory", None) is None:
            from autoscaler.store.db import make_engine, session_factory

            self._engine = make_engine(self.database_url)
            self._factory = session_factory(self._engine)
        return self._factory

    def states(self) -> dict[str, int]:
        from sqlalchemy import func

        from autoscaler.store.db import transaction
        from autoscaler.store.models import Instance

        with transaction(self._sessions()) as session:
            got = session.execute(
                select(Instance.state, func.count()).group_by(Instance.state)
            ).all()
        return {state.value: int(n) for state, n in got}

    def new_events(self) -> list[str]:
        from autoscaler.store.db import transaction
        from autoscaler.store.models import ScaleEvent

        with transaction(self._sessions()) as session:
            rows = session.scalars(
                select(ScaleEvent).where(ScaleEvent.id > self.last_event).order_by(ScaleEvent.id)
            ).all()
            out = []
            for e in rows:
                self.last_event = e.id
                t = e.at.timestamp() - self.started
                who = f" {e.launch_id[:8]}" if e.launch_id else ""
                out.append(f"{t:6.1f}s {e.kind}/{e.action}{who}: {e.reason}")
        return out

    def summary(self) -> Summary:
        return summarize(
            self.database_url,
            self.published,
            demo_app.runs(self.runs_path),
            self.config,
            self.shape.price_per_hour,
            self.started,
            datetime.now(UTC),
        )

    # ------------------------------------------------------------------ stopping

    def stop(self) -> int:
        """Stop everything this demo started; returns how many machines had to be destroyed."""
        by_name = {p.name: p for p in self.procs}
        # no new decision, then no launch in flight (a launch task finishes or is killed)
        for name in ("beat", "worker"):
            if name in by_name:
                _stop_group(by_name[name].popen, 5.0)
        destroyed = self.destroy_machines() | self.sweep_labelled()
        for p in reversed(self.procs):
            _stop_group(p.popen, 8.0)
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.dispose()
        return len(destroyed)

    def installation_id(self) -> str | None:
        from autoscaler.store import installation
        from autoscaler.store.db import transaction

        if not (self.home / "state.db").is_file():
            return None
        try:
            with transaction(self._sessions()) as session:
                return installation.installation_id(session)
        except Exception:  # a store that is not migrated yet: no machine was started
            return None

    def sweep_labelled(self) -> set[str]:
        """Any process left carrying one of this demo's machine labels: a worker its agent
        had no time to stop (it runs in a session of its own), or a machine whose state file
        was never written (its launch was killed between start and record)."""
        install = self.installation_id()
        if install is None or not Path("/proc").is_dir():
            return set()
        groups, labels = set(), set()
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            env = _environ(pid)
            if _installation_of(env) == install:
                labels.add(env.get("AUTOSCALER_LABEL", pid))
                with contextlib.suppress(OSError):
                    groups.add(os.getpgid(int(pid)))
        groups.discard(os.getpgrp())
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        return labels

    def destroy_machines(self) -> set[str]:
        """Every machine the local provider started for this demo, through the provider (all
        at once: SIGTERM to each machine's group, SIGKILL after a short grace)."""
        from concurrent.futures import ThreadPoolExecutor

        from autoscaler.config.provider_options import LocalOptions
        from autoscaler.providers.labels import parse_label
        from autoscaler.providers.local import LocalProvider

        base = self.home / "local-machines"

        def destroy(path: Path) -> str | None:
            label = path.name[: -len(".json")]
            parsed = parse_label(label)
            if parsed is None:
                return None
            provider = LocalProvider(
                PROVIDER, LocalOptions(kind="local"), parsed.installation_id, base, grace=3.0
            )
            machine = provider.get(label)
            try:
                provider.destroy(label)
            except Exception:  # killed by its recorded group instead
                _kill_recorded(path)
            return label if machine is not None and machine.status.value == "running" else None

        paths = sorted(base.glob(f"{PROVIDER}/*.json"))
        if not paths:
            return set()
        with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
            return {label for label in pool.map(destroy, paths) if label}


def _installation_of(env: dict[str, str]) -> str | None:
    return env.get("AUTOSCALER_INSTALLATION_ID")


def _environ(pid: str) -> dict[str, str]:
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


def _stop_group(popen: subprocess.Popen[bytes], grace: float) -> None:
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=5)


def _kill_recorded(path: Path) -> None:
    import json

    with contextlib.suppress(OSError, ValueError, KeyError, ProcessLookupError, PermissionError):
        os.killpg(int(json.loads(path.read_text())["pgid"]), signal.SIGKILL)
