"""`/v1/worker/{launch_id}/…`: a rented machine's agent, with the worker token minted at its
launch, for its own launch only."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, BackgroundTasks, HTTPException, Request
from pydantic import BaseModel, Field

from autoscaler.access import broker_users, keys
from autoscaler.api import machines
from autoscaler.api.deps import DB, Rt, Worker, bearer
from autoscaler.api.inputs import Strict, UtcTime
from autoscaler.api.machines import (
    Deployment,
    HeartbeatAnswer,
    JobReport,
    Name,
    TaskId,
    WorkerState,
)
from autoscaler.config.models import Queue
from autoscaler.control.drain import finish_drain
from autoscaler.control.launch import create_broker_user
from autoscaler.control.resume import avoid_host
from autoscaler.control.runtime import Runtime, log
from autoscaler.lifecycle import InstanceState
from autoscaler.policy.reports import Grant, Want
from autoscaler.store import boot_phases, fleet, job_records, report_budgets
from autoscaler.store.db import Session, store_now
from autoscaler.store.models import Instance

S = InstanceState
HEARTBEAT_INTERVAL = 10.0
CRASH_EVENT_EVERY = timedelta(seconds=60)
"""At most one `crashed` event per machine in this span: an agent restarts a crashing worker
and says so with its next heartbeat (every 10 s), so an honest machine's crash loop still
shows, while a hostile one (2,051 `crashed` reports in 8 s, issue 33) cannot bury the audit
trail; the machine's state is moved by every report as before."""

MAY_SERVE = (S.CREATING, S.BOOTING, S.RESUMING, S.READY)
"""The states whose heartbeat answer lets the worker run (a create's answer may still be on
its way back when a fast machine first calls); any other is told to drain and start nothing."""

router = APIRouter(prefix="/v1/worker/{launch_id}")


class Register(Strict):
    worker_name: Name
    hostname: Name | None = None


class Registered(BaseModel):
    launch_id: str
    queue: str
    heartbeat_interval: float


class Heartbeat(Strict):
    state: WorkerState
    running_tasks: int = Field(default=0, ge=0, le=100_000)
    last_task_at: UtcTime | None = None
    gpu_utilisation: float | None = Field(default=None, ge=0, le=100)
    detail: str | None = Field(default=None, max_length=500)
    jobs: list[JobReport] = Field(default_factory=list, max_length=1000)
    tasks: list[TaskId] = Field(default_factory=list, max_length=1000)
    """Ids of the jobs its worker holds now (received, not finished): what is handed back to
    the broker if the machine is lost (`control.handback`)."""
    acks_late: bool | None = None
    """Its worker's `task_acks_late`: with early acks a lost machine's running jobs are gone."""


class Drained(BaseModel):
    state: str


class BootPhases(Strict):
    """When each phase of this boot happened, on the machine's clock (UTC; ISO 8601 or epoch
    seconds): the fields are `policy.boots.BOOT_PHASES` (a test holds them alike), any other
    name refused. A phase already kept for this boot is left as it was (the first report
    wins); a time before the boot began or after the store's now is clamped into that span."""

    started: UtcTime | None = None
    registered: UtcTime | None = None
    code_fetched: UtcTime | None = None
    requirements_installed: UtcTime | None = None
    worker_up: UtcTime | None = None
    first_job: UtcTime | None = None


class PhasesKept(BaseModel):
    boot: int
    """The row's resumes when reported: 0 for the cold boot, n for its n-th resume."""
    resume: bool
    recorded: list[str]
    """The phases newly kept by this report (those kept before are not changed)."""


@router.post("/register", response_model=Registered)
def register(body: Register, row: Worker, session: DB) -> Registered:
    now = store_now(session)
    name = body.worker_name
    granted = report_budgets.spend(session, row.launch_id, Want(events=1), now)
    said = [
        fleet.event(
            "agent",
            "register",
            f"agent {name} registered",
            queue=row.queue,
            launch_id=row.launch_id,
        )
    ]
    fleet.record_events(session, said[: granted.events] + _told(row, granted), now)
    fleet.note_registered(session, row.launch_id, name, now)
    return Registered(
        launch_id=row.launch_id, queue=row.queue, heartbeat_interval=HEARTBEAT_INTERVAL
    )


@router.get("/deployment", response_model=Deployment)
def deployment(request: Request, row: Worker, session: DB, rt: Rt) -> Deployment:
    loaded = rt.load(session)
    queue_cfg = loaded.config.queues.get(row.queue) if loaded else None
    dep = getattr(queue_cfg, "deployment", None)
    broker_url, note = None, None
    if queue_cfg is not None and row.state == S.RESUMING and row.broker_user is None:
        _broker_user_again(rt, session, row, queue_cfg, bearer(request))
    if queue_cfg is not None:
        # the machine's own user, made at its launch: its URL needs no question to the
        # broker (the broker may be busy; the user exists)
        admin = broker_users.admin_url(queue_cfg.metrics, rt.env)
        if row.broker_user and admin is not None:
            password = keys.derive(bearer(request), "broker")
            broker_url = broker_users.machine_url(admin, row.broker_user, password)
        else:
            try:
                broker_users.plan_for(queue_cfg.metrics, row.queue, rt.env)
                note = "no broker user was made for this machine at its launch"
            except broker_users.NoBrokerUser as exc:
                note = str(exc)
    return machines.deployment(row.queue, dep, rt.env, broker_url, note)


def _broker_user_again(
    rt: Runtime, session: Session, row: Instance, queue_cfg: Queue, token: str
) -> None:
    """A machine resumed from a warm pool: its broker user, deleted while it was stopped, is
    made again from the token it presents (the server keeps only the token's hash)."""
    install = rt.installation_id(session)
    user, why = create_broker_user(rt, install, row.launch_id, row.queue, queue_cfg, token)
    if user is not None:
        fleet.set_broker_user(session, row.launch_id, user)
        row.broker_user = user
    elif why is not None:
        log.warning("resumed %s has no broker user yet: %s", row.launch_id, why)


@router.post("/phases", response_model=PhasesKept)
def phases(body: BootPhases, row: Worker, session: DB) -> PhasesKept:
    """This machine's boot phases, for display (where its boot's time went): written to its
    own rows only, with the provider, GPU and host of its instance row. No decision reads them:
    boot statistics and the slow-host rule use the control plane's own times."""
    now = store_now(session)
    reported = body.model_dump(exclude_none=True)
    kept = boot_phases.record(session, row, reported, now)
    boot = row.resumes or 0
    return PhasesKept(boot=boot, resume=boot > 0, recorded=kept)


@router.post("/heartbeat", response_model=HeartbeatAnswer)
def heartbeat(
    body: Heartbeat, row: Worker, session: DB, rt: Rt, background: BackgroundTasks
) -> HeartbeatAnswer:
    """The agent's word on its worker. Every state but `starting` and `crashed` says the
    worker is up (the agent sends its first heartbeat as it starts the worker): a booting
    machine is ready at once, with the move and event reconcile would make. The answer
    tells the agent to drain, and its state (a machine no longer live gets a 401 from the
    token instead, and its agent starts nothing)."""
    now = store_now(session)
    up = body.state not in ("starting", "crashed")
    values: dict[str, Any] = {
        "last_heartbeat_at": now,
        "running_tasks": body.running_tasks,
        "gpu_utilisation": body.gpu_utilisation,
        "tasks": list(dict.fromkeys(body.tasks)),
    }
    if body.acks_late is not None:
        values["acks_late"] = body.acks_late
    if not up:
        values.pop("last_heartbeat_at")
    if not row.worker_name:
        values["worker_name"] = f"agent@{row.launch_id}"
    busy = body.running_tasks > 0 or row.running_tasks > 0
    if body.last_task_at is not None:
        values["last_task_at"] = min(body.last_task_at, now)
    elif busy:
        values["last_task_at"] = now
    said = []
    if body.state == "crashed":
        # the worker process died: no sign of life from it; reconcile replaces the machine
        values["running_tasks"] = 0
        last = fleet.last_event_at(session, row.launch_id, "agent", "crashed")
        if last is None or now - last >= CRASH_EVENT_EVERY:
            why = f"the worker process crashed: {body.detail or 'no detail'}"
            said.append(
                fleet.event("agent", "crashed", why, queue=row.queue, launch_id=row.launch_id)
            )
    # what the report writes beyond its own row, within the machine's budget, first: the
    # instance row's UPDATE comes last, so its lock is held only for the commit's tail
    want = Want(jobs=len(body.jobs), events=len(said), running=body.running_tasks)
    granted = report_budgets.spend(session, row.launch_id, want, now)
    worker = row.worker_name or f"agent@{row.launch_id}"
    jobs = machines.job_rows(body.jobs[: granted.jobs], worker, row.launch_id, [row.queue], now)
    job_records.record(session, jobs, now)
    fleet.record_events(session, said[: granted.events] + _told(row, granted), now)
    # the answer comes from the state this write found, not the token check's read: a cancel
    # or a boot timeout committed in between makes it drain, so no worker starts on a machine
    # that is being destroyed
    state = fleet.note_heartbeat(session, row.launch_id, values) or S.TERMINATED
    if up and state in (S.BOOTING, S.RESUMING):
        why = "its worker is up (its agent's first heartbeat)"
        if state == S.RESUMING:
            why = "its worker is up again: resumed from the warm pool (its agent's heartbeat)"
        ready = fleet.mark_ready(session, row.launch_id, row.queue, row.provider, now, why)
        if ready:
            state = S.READY
        if ready and ready.slow_host is not None:
            # after this request's transaction commits (background tasks run once the answer
            # is sent, the request's transaction closed before it): a connection of its own
            slow = ready.slow_host
            rt.load(session)  # the provider is built from the running config
            background.add_task(avoid_host, rt, slow.provider, slow.host_id, slow.reason)
    return HeartbeatAnswer(drain=state not in MAY_SERVE, state=state.value)


def _told(row: Instance, granted: Grant) -> list[dict[str, Any]]:
    """The event saying what the machine's budget dropped, when it is time to say it."""
    if granted.tell is None:
        return []
    return [
        fleet.event(
            "agent", "reports_dropped", granted.tell, queue=row.queue, launch_id=row.launch_id
        )
    ]


@router.post("/drained", response_model=Drained)
def drained(row: Worker, session: DB) -> Drained:
    # the drain ends as the loop's own drain step ends it, then the machine's destruction is sent
    now = store_now(session)
    if row.state not in (S.DRAINING, S.DRAINED):
        raise HTTPException(409, f"this machine is {row.state.value}: nobody asked it to drain")
    why = "its agent reports its worker stopped after its last task"
    step = finish_drain(session, row.launch_id, row.queue, why, now)
    if step is not None:
        _send_step(step, row.launch_id)
    return Drained(state="stopping" if step == "stop" else "terminating")


def _send_step(step: str, launch_id: str) -> None:
    """Destroy (or stop, for the warm pool) the drained machine now rather than at the next
    reconcile. Sent a second later, after this request's transaction commits (a step that runs
    too early finds the row not yet moved and does nothing); reconcile re-sends it if the
    broker cannot be reached."""
    try:
        from autoscaler.control.tasks import STEPS  # the Celery app: only when needed

        STEPS[step].apply_async((launch_id,), countdown=1.0, expires=600.0)
    except Exception:  # the broker is down: reconcile's retry sends it a poll later
        log.warning("could not send the %s step of %s; reconcile will", step, launch_id)


__all__ = ["router"]
