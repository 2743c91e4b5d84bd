"""The worker agent: register, deploy from Git, run the worker, heartbeat, drain.

On a rented machine it reads from its environment only what the launch put there:
`AUTOSCALER_API_URL`, `AUTOSCALER_WORKER_TOKEN`, `AUTOSCALER_LAUNCH_ID` (and the queue). On a
hand-made machine it is given an enrolment key, a name and the queue instead; it then counts
as capacity and is never drained or destroyed by the control plane.

    register -> GET deployment -> the checkout at its ref and its requirements.txt installed
    in the work folder (deploy.py: a fetch and no install when a stopped machine resumes with
    the folder it had) -> a heartbeat saying the worker starts, with how the deploy went (the
    machine is ready from it; an answer "drain" or a refused token starts nothing) -> start the
    startup command in its own process group ->
    heartbeat every few seconds (running tasks and last task time from the status file the
    Celery hook or any worker writes, or that a worker POSTs to `$AUTOSCALER_STATUS_URL`; GPU
    utilisation from nvidia-smi where there is one).
    Its boot's phases (started, registered, code fetched, requirements installed, worker up,
    first job: `policy.boots.BOOT_PHASES`) are reported as they happen, wall clock UTC, to
    `POST /v1/worker/<launch>/phases` (best effort: a report that fails goes again with the
    next; one the API refuses is dropped, never a reason to stop).
    A heartbeat answered "drain": SIGTERM to the worker (Celery's warm shutdown: it takes no
    new job and finishes the running one) -> wait for it to exit -> report drained -> exit 0.
    The worker exiting on its own: reported as crashed (with its exit code), agent exits 1.

The worker's environment: the agent's own minus the worker token, plus `AUTOSCALER_BROKER_URL`
(and `CELERY_BROKER_URL`) with the machine's own broker user, `AUTOSCALER_STATUS_FILE`,
`AUTOSCALER_STATUS_URL` and `AUTOSCALER_WORKER_NAME`; PYTHONPATH and PATH lead to the checkout
and the requirements installed in the work folder (`<workdir>/site-packages`, its `bin/`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from autoscaler import wire
from autoscaler.agent.deploy import STATE, Deployed, DeployError, prepare, usable_workdir
from autoscaler.agent.deploy import git_auth_env as git_auth_env  # where tests look for it
from autoscaler.agent.guard import SECRET_ENV, worker_user
from autoscaler.agent.server_api import AgentConfig, AgentError, Api, ApiAnswered, said
from autoscaler.agent.worker_status import (
    Mark,
    StatusServer,
    gpu_utilisation,
    is_time,
    job_reports,
    read_held,
    read_jobs,
    read_status,
    sendable_detail,
    sendable_task,
    status_files,
)
from autoscaler.policy.boots import BOOT_PHASES

log = logging.getLogger("autoscaler.agent")

SHELL_CHARS = set(";&|<>$`()*?[]{}~#\n\\'\"=")


def prepare_deploy(dep: wire.DeploymentAnswer, workdir: Path) -> Deployed:
    """`deploy.prepare`, its refusals as the agent's (said once, the agent exits 2)."""
    try:
        return prepare(dep, workdir)
    except DeployError as exc:
        raise AgentError(str(exc)) from None


def _give(folder: Path, uid: int, gid: int) -> None:
    """The worker's folder (checkout, status files) to the worker's account; the deploy
    record stays the agent's (deploy.load_state trusts no file of another uid)."""
    os.chown(folder, uid, gid)
    record = os.path.join(folder, STATE)
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            if path == record:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.chown(path, uid, gid, follow_symlinks=False)


BUSY_POLL = 0.5
"""Seconds between two looks at the worker's status while the agent waits for its next
heartbeat: a worker that turns busy after an idle heartbeat is reported at once, not up to a
heartbeat interval (10 s) later. The control plane drains a machine it believes idle: a job
taken just after an idle heartbeat looked idle until the next one, and an idle timeout shorter
than the interval drained the machine with the job in hand (the worker image's e2e, under
load). Only the idle-to-busy turn is sent early: at most one extra heartbeat per idle spell."""


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.api = Api(cfg)
        self.proc: subprocess.Popen[bytes] | None = None
        self.status_file = str(cfg.workdir / "status.json")
        self.stopping = threading.Event()
        self.draining = False
        self._status_server: StatusServer | None = None
        self.marks: dict[str, Mark] = {}
        self.reported_busy = False  # the last heartbeat said the worker runs or holds a job
        self.phases: dict[str, float] = {}  # phase -> wall-clock epoch seconds
        self.phases_sent: set[str] = set()

    def phase(self, name: str, at: float | None = None) -> None:
        """Note a boot phase (`BOOT_PHASES`) as it happens (wall clock); once."""
        if name not in BOOT_PHASES:
            raise ValueError(f"not a boot phase: {name}")
        self.phases.setdefault(name, time.time() if at is None else at)

    def report_phases(self) -> None:
        """Send the phases not sent yet (a rented machine's only: the route is its worker
        token's). Best effort: unreachable or a 5xx keeps them for the next report; a refusal
        (4xx) drops them; the boot goes on either way."""
        todo = {k: v for k, v in self.phases.items() if k not in self.phases_sent}
        if self.cfg.launch_id is None or not todo:
            return
        try:
            body = wire.BootPhases.model_validate(
                {k: datetime.fromtimestamp(v, UTC) for k, v in todo.items()}
            )
        except ValidationError as exc:  # dropped, as the API's refusal would be
            log.warning("boot phases %s the API would refuse: %s", sorted(todo), said(exc))
            self.phases_sent |= set(todo)
            return
        try:
            self.api.call("POST", "phases", wire.PhasesKept, body)
        except ApiAnswered as exc:
            if exc.status >= 500:
                log.warning("boot phases not kept yet: %s", exc)
                return
            log.warning("the API refused the boot phases %s: %s", sorted(todo), exc)
        except AgentError as exc:
            log.warning("boot phases not sent yet: %s", exc)
            return
        self.phases_sent |= set(todo)

    def status_url(self) -> str:
        """A loopback HTTP endpoint for workers that would rather POST their status
        (`{"running": N, "last_task_at": epoch}`) than write the file; started once."""
        if self._status_server is None:
            self._status_server = StatusServer(self.status_file)
        return self._status_server.url

    def start_worker(
        self, dep: wire.DeploymentAnswer, repo: Path, site_packages: Path | None = None
    ) -> None:
        cmd = dep.startup_cmd
        if not cmd:
            raise AgentError("the deployment has no startup_cmd")
        env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        env.update(dep.env)
        env["AUTOSCALER_STATUS_FILE"] = self.status_file
        env["AUTOSCALER_STATUS_URL"] = self.status_url()
        # the name a Celery worker should take (`-n "$AUTOSCALER_WORKER_NAME"`): a rented
        # machine's worker after its launch label (remote control then knows it as ours), a
        # hand-made one's as its agent reports it (one sighting, not two)
        if self.cfg.launch_id is not None:
            label = os.environ.get("AUTOSCALER_LABEL") or f"agent-{self.cfg.launch_id}"
            env["AUTOSCALER_WORKER_NAME"] = f"{label}@{os.uname().nodename}"
        else:
            env["AUTOSCALER_WORKER_NAME"] = f"agent@{self.cfg.name}"
        broker = dep.broker_url
        if broker:
            env["AUTOSCALER_BROKER_URL"] = broker
            env["CELERY_BROKER_URL"] = broker
        elif self.cfg.launch_id is None and os.environ.get("AUTOSCALER_BROKER_URL"):
            # a hand-made machine: its owner gave it its broker (never the control plane's)
            env.setdefault("CELERY_BROKER_URL", os.environ["AUTOSCALER_BROKER_URL"])
        elif dep.broker_note:
            log.warning("no broker connection from the API: %s", dep.broker_note)
        # the checkout, then its requirements (installed in the work folder, which a stop
        # keeps), then the agent's own packages as before (the hook); their scripts first
        site = [str(site_packages)] if site_packages is not None else []
        env["PYTHONPATH"] = os.pathsep.join(
            [str(repo), *site, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        if site_packages is not None and (site_packages / "bin").is_dir():
            env["PATH"] = os.pathsep.join(
                [str(site_packages / "bin"), *filter(None, [env.get("PATH")])]
            )
        # a plain command runs as the group's leader itself, so the drain's SIGTERM reaches
        # the worker's main process only (Celery's warm shutdown; its pool children are not
        # signalled and finish their task); a shell command line runs under /bin/sh: give it
        # `exec` in front of the worker for the same effect
        argv = shlex.split(cmd) if not SHELL_CHARS & set(cmd) else None
        try:
            account = worker_user(os.environ)
        except ValueError as exc:
            raise AgentError(str(exc)) from None
        drop: dict[str, Any] = {}
        if account is not None:  # root here: the worker runs as its own, unprivileged uid
            _give(self.cfg.workdir, account.pw_uid, account.pw_gid)
            env["HOME"] = account.pw_dir
            drop = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        self.proc = subprocess.Popen(
            argv or ["/bin/sh", "-c", cmd],
            cwd=repo,
            env=env,
            start_new_session=True,
            **drop,
        )
        log.info("worker started (pid %d)", self.proc.pid)

    def stop_worker(self, sig: int = signal.SIGTERM) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=self.cfg.stop_grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # the rest of its group (pool children) must not outlive it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.returncode

    def beat(
        self, state: wire.WorkerState | Literal["auto"], detail: str | None = None
    ) -> wire.HeartbeatAnswer:
        running, last = read_status(self.status_file)
        if running > 0:  # this heartbeat is the first to report a running task, or a later one
            self.phase("first_job")
        said_state: wire.WorkerState = ("busy" if running else "idle") if state == "auto" else state
        jobs = job_reports(read_jobs(self.status_file), self.marks)
        held, acks_late = read_held(self.status_file)
        self.reported_busy = running > 0 or bool(held)
        running = min(running, 100_000)  # the API's bound: more is no less busy
        body: wire.Heartbeat | wire.HandMadeBeat
        try:
            if self.cfg.launch_id is None:
                body = wire.HandMadeBeat(
                    name=self.cfg.name or "",
                    queues=[self.cfg.queue or ""],
                    state=said_state,
                    running_tasks=running,
                )
            else:
                gpu = gpu_utilisation()
                body = wire.Heartbeat(
                    state=said_state,
                    running_tasks=running,
                    last_task_at=(
                        datetime.fromtimestamp(int(last), UTC)
                        if last is not None and is_time(last)
                        else None
                    ),
                    gpu_utilisation=max(0.0, min(100.0, gpu)) if gpu is not None else None,
                    detail=sendable_detail(detail),
                    tasks=[t for t in held if sendable_task(t)],
                    acks_late=acks_late,
                )
        except ValidationError as exc:
            raise AgentError(f"the heartbeat cannot be sent: {said(exc)}") from None
        return self._post_beat(body, jobs)

    def _post_beat(
        self,
        body: wire.Heartbeat | wire.HandMadeBeat,
        jobs: list[tuple[str, Mark, wire.JobReport | None]],
    ) -> wire.HeartbeatAnswer:
        """Send the heartbeat with the finished jobs. Jobs are never why a heartbeat is lost:
        if the API answers anything but success with them (a report it refuses, a 5xx it
        cannot store — a producer's task id with a NUL byte once was one, resent for ever) they
        are dropped and the heartbeat goes without them; only a connection failure keeps them
        for the next beat. Answered: the jobs are marked sent, and the files of children that
        are gone are removed once all their jobs went."""
        reports = [j for *_, j in jobs if j is not None]
        try:
            with_jobs = body.model_copy(update={"jobs": reports})
            answer = self.api.call("POST", "heartbeat", wire.HeartbeatAnswer, with_jobs)
        except ApiAnswered as exc:
            if not reports:
                raise
            log.warning("the API refused %d finished job(s); dropped: %s", len(reports), exc)
            answer = self.api.call("POST", "heartbeat", wire.HeartbeatAnswer, body)
        for name, mark, _ in jobs:
            self.marks[name] = max(self.marks.get(name, mark), mark)
        self._forget_gone_children()
        return answer

    def _forget_gone_children(self) -> None:
        jobs = read_jobs(self.status_file)
        for f in status_files(self.status_file):
            mine = [(n, j) for n, j in jobs if n == f.name]
            if not f.alive and not job_reports(mine, self.marks):
                with contextlib.suppress(OSError):
                    os.remove(f.name)
                self.marks.pop(f.name, None)

    def run(self) -> int:
        cfg = self.cfg
        t0 = time.monotonic()
        self.phase("started")
        cfg.workdir = usable_workdir(cfg.workdir)
        self.status_file = str(cfg.workdir / "status.json")
        log.info("work folder %s", cfg.workdir)
        seconds: dict[str, float] = {}
        if cfg.launch_id is not None:
            reg = self.register()
            seconds["register"] = time.monotonic() - t0
            self.phase("registered")
            self.report_phases()
            interval = cfg.heartbeat_interval or reg.heartbeat_interval or 10.0
        else:
            self.beat("starting")
            seconds["register"] = time.monotonic() - t0
            interval = cfg.heartbeat_interval or 10.0
        dep = self.deployment()
        seconds["deployment"] = time.monotonic() - t0 - seconds["register"]
        done = prepare_deploy(dep, cfg.workdir)
        for name in ("code_fetched", "requirements_installed"):
            self.phase(name, done.at.get(name))
        self.report_phases()
        done.seconds = seconds | done.seconds
        # one line the e2e and the benchmark read: warm or not, and each phase's seconds
        log.info("deploy report %s", json.dumps(done.report(), sort_keys=True))
        log.info("deploy: %s", done.summary())
        if cfg.launch_id is not None and not self.may_start(done.summary()):
            return 0
        self.start_worker(dep, done.repo, done.site_packages)
        self.phase("worker_up")
        log.info("worker started %.2f s after the agent", time.monotonic() - t0)
        self.report_phases()
        assert self.proc is not None
        while True:
            if self.wait_beat(interval):
                log.info("stopping: the machine is going away")
                self.stop_worker()
                return 0
            code = self.proc.poll()
            if code is not None:
                log.error("the worker exited on its own (code %s)", code)
                with contextlib.suppress(AgentError):
                    self.beat("crashed", f"the worker process exited with code {code}")
                self.stop_worker()
                return 1
            try:
                answer = self.beat("auto")
            except AgentError as exc:
                log.warning("heartbeat not sent: %s", exc)
                continue
            self.report_phases()
            if answer.drain and cfg.launch_id is not None:
                return self.drain(interval)

    def register(self) -> wire.Registered:
        """A rented machine's first word: its agent is up (the launch id names its worker)."""
        try:
            body = wire.Register(worker_name=f"agent@{self.cfg.launch_id}")
        except ValidationError as exc:
            raise AgentError(f"the launch id cannot name a worker: {said(exc)}") from None
        return self.api.call_retrying("POST", "register", wire.Registered, body)

    def deployment(self) -> wire.DeploymentAnswer:
        """What to run: a rented machine's own deployment, a hand-made one's queue's."""
        if self.cfg.launch_id is not None:
            return self.api.call_retrying("GET", "deployment", wire.DeploymentAnswer)
        params = {"queue": self.cfg.queue or ""}
        return self.api.call_retrying("GET", "deployment", wire.DeploymentAnswer, params=params)

    def wait_beat(self, interval: float) -> bool:
        """Wait for the next heartbeat: `interval` seconds, or less when the worker turns busy
        after an idle heartbeat (`BUSY_POLL`). True when the machine is stopping."""
        deadline = time.monotonic() + interval
        while (left := deadline - time.monotonic()) > 0:
            if self.stopping.wait(min(BUSY_POLL, left)):
                return True
            if not self.reported_busy and self.busy_now():
                return False
        return False

    def busy_now(self) -> bool:
        """The worker runs a job or holds one (prefetched), as its status files say now."""
        running, _ = read_status(self.status_file)
        return running > 0 or bool(read_held(self.status_file)[0])

    def may_start(self, detail: str | None = None) -> bool:
        """The heartbeat that says the worker starts now, sent *before* it starts: the control
        plane marks the machine ready on it (and from then on drains it like any ready one),
        so a machine cancelled while it booted never starts a worker that a destroy could
        catch mid-job. A token refused (4xx: the machine is being destroyed) or an answer
        "drain" (drained before its worker ran) means: start nothing. `detail`: how the deploy
        went (warm or cold start, each phase's time)."""
        body = wire.Heartbeat(state="idle", running_tasks=0, detail=sendable_detail(detail))
        try:
            answer = self.api.call_retrying("POST", "heartbeat", wire.HeartbeatAnswer, body)
        except ApiAnswered as exc:
            if not 400 <= exc.status < 500:
                raise
            log.info("the machine is no longer wanted (%s): starting no worker", exc)
            return False
        if answer.drain:
            log.info("drained before its worker started: starting no worker")
            self.report_drained()
            return False
        return True

    def report_drained(self) -> None:
        """Say the worker is stopped. A refusal (4xx: the machine is already being destroyed,
        its token dead, or nobody asked it to drain) leaves nothing to report."""
        try:
            answer = self.api.call_retrying("POST", "drained", wire.Drained)
        except ApiAnswered as exc:
            if not 400 <= exc.status < 500:
                raise
            log.info("drained not recorded (%s): the machine is already on its way out", exc)
            return
        log.info("drained recorded: the machine is %s", answer.state)

    def drain(self, interval: float) -> int:
        """Warm shutdown: SIGTERM once (Celery stops taking jobs and finishes the running
        one), heartbeats while it finishes, then report drained."""
        assert self.proc is not None
        log.info("drain: warm shutdown of the worker (running tasks finish)")
        self.draining = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)  # the leader only: a warm shutdown
        while self.proc.poll() is None and not self.stopping.wait(min(interval, 1.0)):
            with contextlib.suppress(AgentError):
                self.beat("draining")
        code = self.stop_worker(signal.SIGTERM)
        log.info("worker stopped (code %s); reporting drained", code)
        with contextlib.suppress(AgentError):
            self.beat("draining")  # the jobs it finished since the last heartbeat
        self.report_phases()
        self.report_drained()
        return 0


def run_agent(cfg: AgentConfig) -> int:
    agent = Agent(cfg)

    def on_term(signum: int, frame: object) -> None:
        agent.stopping.set()
        if agent.proc is None:  # still registering or deploying: nothing to wind down
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        return agent.run()
    finally:
        agent.stop_worker()
