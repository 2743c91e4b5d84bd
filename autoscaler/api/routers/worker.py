"""`/v1/worker/{launch_id}/…`: a rented machine's agent, with the worker token minted at its
launch, for its own launch only. Each route parses the report, asks `control.machines` what it
means, and answers; what must wait for the request's commit (a slow host avoided, a drained
machine's next step sent) runs as a background task, once the answer is sent and the request's
transaction closed."""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, HTTPException, Request

from autoscaler.access import keys
from autoscaler.api import machines
from autoscaler.api.deps import DB, Rt, Worker, bearer
from autoscaler.brokers import users as broker_users
from autoscaler.control import machines as control
from autoscaler.control.steps.credentials import remake_broker_user
from autoscaler.control.steps.resume import avoid_host
from autoscaler.lifecycle import InstanceState
from autoscaler.store.db import store_now
from autoscaler.wire import (
    BootPhases,
    DeploymentAnswer,
    Drained,
    Heartbeat,
    HeartbeatAnswer,
    PhasesKept,
    Register,
    Registered,
)

S = InstanceState
router = APIRouter(prefix="/v1/worker/{launch_id}")


@router.post("/register", response_model=Registered)
def register(body: Register, row: Worker, session: DB) -> Registered:
    control.register(session, row, body.worker_name, store_now(session))
    return Registered(
        launch_id=row.launch_id, queue=row.queue, heartbeat_interval=control.HEARTBEAT_INTERVAL
    )


@router.get("/deployment", response_model=DeploymentAnswer)
def deployment(request: Request, row: Worker, session: DB, rt: Rt) -> DeploymentAnswer:
    loaded = rt.load(session)
    queue_cfg = loaded.config.queues.get(row.queue) if loaded else None
    dep = getattr(queue_cfg, "deployment", None)
    broker_url, note = None, None
    user = row.broker_user
    if queue_cfg is not None and row.state == S.RESUMING and user is None:
        # resumed from a warm pool: its user, deleted while it was stopped, is made again
        user = remake_broker_user(rt, session, row, queue_cfg, bearer(request))
    if queue_cfg is not None:
        # the machine's own user, made at its launch: its URL needs no question to the
        # broker (the broker may be busy; the user exists)
        admin = broker_users.admin_url(queue_cfg.metrics, rt.env)
        if user and admin is not None:
            password = keys.derive(bearer(request), "broker")
            broker_url = broker_users.machine_url(admin, user, password)
        else:
            try:
                broker_users.plan_for(queue_cfg.metrics, row.queue, rt.env)
                note = "no broker user was made for this machine at its launch"
            except broker_users.NoBrokerUser as exc:
                note = str(exc)
    return machines.deployment(row.queue, dep, rt.env, broker_url, note)


@router.post("/phases", response_model=PhasesKept)
def phases(body: BootPhases, row: Worker, session: DB) -> PhasesKept:
    """This machine's boot phases, for display (where its boot's time went): written to its
    own rows only, with the provider, GPU and host of its instance row. No decision reads them:
    boot statistics and the slow-host rule use the control plane's own times."""
    reported = body.model_dump(exclude_none=True)
    boot, kept = control.phases(session, row, reported, store_now(session))
    return PhasesKept(boot=boot, resume=boot > 0, recorded=kept)


@router.post("/heartbeat", response_model=HeartbeatAnswer)
def heartbeat(
    body: Heartbeat, row: Worker, session: DB, rt: Rt, background: BackgroundTasks
) -> HeartbeatAnswer:
    """The agent's word on its worker (`control.machines.heartbeat`: a booting machine is
    ready at its first heartbeat, with the move and event reconcile would make). The answer
    tells the agent to drain, and its state (a machine no longer live gets a 401 from the
    token instead, and its agent starts nothing)."""
    report = control.Report(
        state=body.state,
        running_tasks=body.running_tasks,
        last_task_at=body.last_task_at,
        gpu_utilisation=body.gpu_utilisation,
        detail=body.detail,
        jobs=body.jobs,
        tasks=body.tasks,
        acks_late=body.acks_late,
    )
    answer = control.heartbeat(session, row, report, store_now(session))
    if answer.slow_host is not None:
        # after this request's transaction commits: a connection of its own
        slow = answer.slow_host
        rt.load(session)  # the provider is built from the running config
        background.add_task(avoid_host, rt, slow.provider, slow.host_id, slow.reason)
    return HeartbeatAnswer(drain=answer.drain, state=answer.state.value)


@router.post("/drained", response_model=Drained)
def drained(row: Worker, session: DB, background: BackgroundTasks) -> Drained:
    """The drain ends as the loop's own drain step ends it; the machine's destruction (or its
    stop, for the warm pool) is sent once this request's transaction has committed (reconcile
    sends it again if the broker cannot be reached)."""
    try:
        step = control.drained(session, row, store_now(session))
    except control.NotDraining as exc:
        raise HTTPException(409, str(exc)) from None
    if step is not None:
        from autoscaler.control.tasks import BEST_EFFORT  # the Celery app: only when needed

        background.add_task(BEST_EFFORT.step, step, row.launch_id)
    return Drained(state="stopping" if step == "stop" else "terminating")


__all__ = ["router"]
