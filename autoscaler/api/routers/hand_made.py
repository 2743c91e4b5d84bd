"""`/v1/hand-made/…`: a machine its owner runs by hand, with an enrolment key, for the queues
that key was made for. Its heartbeats are sightings (it counts as a worker of its queues) and
its finished jobs; the loop never rents, drains or destroys it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from autoscaler.access import keys
from autoscaler.api import machines
from autoscaler.api.deps import DB, Enrolled, Rt
from autoscaler.control.machines import job_rows
from autoscaler.policy.reports import Want
from autoscaler.store import events, job_records, report_budgets, worker_sightings
from autoscaler.store.db import store_now
from autoscaler.wire import DeploymentAnswer, HandMadeBeat, HeartbeatAnswer

router = APIRouter(prefix="/v1/hand-made")


def bound(key: keys.KeyInfo, queues: list[str]) -> None:
    """An enrolment key opens the queues it was made for, no other."""
    outside = sorted(q for q in queues if not key.opens(q))
    if outside:
        made_for = ", ".join(key.queues) or "no queue (it predates queue binding)"
        raise HTTPException(
            403,
            f"enrolment key {key.name!r} is bound to {made_for}, not {', '.join(outside)}: "
            "make one with 'autoscaler keys create-enrolment --queue Q'",
        )


@router.post("/heartbeat", response_model=HeartbeatAnswer)
def hand_made_heartbeat(body: HandMadeBeat, who: Enrolled, session: DB) -> HeartbeatAnswer:
    bound(who, list(body.queues))
    now = store_now(session)
    worker_sightings.record_enrolled(
        session, body.name, body.queues, who.name, body.running_tasks, now
    )
    # its budget is its key's and name's: the name is its word, so one key's machines share
    # the key's address turns (`api/admission.py`) as well
    reporter = f"enrolled:{who.name}:{body.name}"
    want = Want(jobs=len(body.jobs), running=body.running_tasks)
    granted = report_budgets.spend(session, reporter, want, now)
    worker = f"agent@{body.name}"
    rows = job_rows(body.jobs[: granted.jobs], worker, reporter, list(body.queues), now)
    job_records.record(session, rows, now)
    if granted.tell is not None:
        said = events.event(
            "agent", "reports_dropped", f"{body.name}: {granted.tell}", queue=body.queues[0]
        )
        events.record(session, [said], now)
    return HeartbeatAnswer(drain=False, state="hand-made")


@router.get("/deployment", response_model=DeploymentAnswer)
def hand_made_deployment(
    who: Enrolled,
    session: DB,
    rt: Rt,
    queue: Annotated[str, Query(min_length=1, max_length=200)],
) -> DeploymentAnswer:
    """The deployment of a queue the key was made for. Never the control plane's own
    broker URL (it may hold rights over the broker's users): the hand-made machine's owner
    gives it its broker URL (AUTOSCALER_BROKER_URL on that machine)."""
    bound(who, [queue])
    loaded = rt.load(session)
    queue_cfg = loaded.config.queues.get(queue) if loaded else None
    if queue_cfg is None:
        raise HTTPException(404, f"no queue {queue!r} in the running config")
    note = (
        "a hand-made machine gets no broker URL from the control plane: set "
        "AUTOSCALER_BROKER_URL on it (a user of its own, limited to its queue)"
    )
    return machines.deployment(queue, queue_cfg.deployment, rt.env, None, note)


__all__ = ["router"]
