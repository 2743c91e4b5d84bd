"""`/v1/admin/…`: an operator, with an admin key. The queues and machines as the loop left them,
the audit trail, the config (a new one checked and recorded like `autoscaler apply`), manual
targets and drains, the registered providers (never their keys)."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.responses import JSONResponse
from pydantic import Field

from autoscaler.access.credentials import describe_credentials, registered_provider_configs
from autoscaler.api.deps import DB, Admin, LaunchId, Message, Rt
from autoscaler.config.errors import ConfigError
from autoscaler.config.loader import load_config_text
from autoscaler.control import apply
from autoscaler.control.manual import ManualError, request_drain, set_target
from autoscaler.control.runtime import utc_now
from autoscaler.control.steps.drain import DrainStep
from autoscaler.control.steps.frame import run_step
from autoscaler.lifecycle import InstanceState
from autoscaler.store import config_versions, event_views, machine_views, queue_status
from autoscaler.store import providers as provider_rows
from autoscaler.store.instances import InstanceDetails, live_rows
from autoscaler.wire import RequestBody, UtcTime

router = APIRouter(prefix="/v1/admin")


class ConfigUpdate(RequestBody):
    yaml: str = Field(min_length=1, max_length=1_000_000)
    comment: str | None = Field(default=None, max_length=2000)
    changed_by: str = Field(default="api", min_length=1, max_length=200)


class ScaleRequest(RequestBody):
    workers: int | None = Field(ge=0, le=10_000)
    for_: str | None = Field(default=None, alias="for", max_length=40)


@router.get("/queues")
def queues(who: Admin, session: DB, rt: Rt) -> list[dict[str, Any]]:
    loaded = rt.load(session)
    status = queue_status.evaluations(session)
    rows = live_rows(session)
    names = sorted(set(loaded.config.queues if loaded else ()) | set(status))
    out = []
    for q in names:
        st = status.get(q)
        by_state: dict[str, int] = {}
        for r in rows:
            if r.queue == q:
                by_state[r.state.value] = by_state.get(r.state.value, 0) + 1
        out.append(
            {
                "queue": q,
                "evaluated_at": st.evaluated_at.isoformat() if st else None,
                "status": st.status if st else None,
                "machines": by_state,
            }
        )
    return out


@router.get("/instances")
def instances(
    who: Admin,
    session: DB,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    state: InstanceState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[dict[str, Any]]:
    rows = machine_views.instance_rows(session, queue=queue, state=state, limit=limit)
    return [_instance(r) for r in rows]


@router.get("/events")
def events(
    who: Admin,
    session: DB,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    kind: Annotated[str | None, Query(max_length=40)] = None,
    launch_id: Annotated[str | None, Query(max_length=64)] = None,
    since: UtcTime | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    found = event_views.newest_events(
        session, queue=queue, kind=kind, launch_id=launch_id, since=since, limit=limit
    )
    return [e.as_json() for e in found]


@router.get("/config")
def get_config(who: Admin, session: DB) -> dict[str, Any]:
    row = config_versions.latest(session)
    if row is None:
        raise HTTPException(404, "no config applied yet")
    return {
        "version": row.version,
        "changed_by": row.changed_by,
        "changed_at": row.changed_at.isoformat(),
        "comment": row.comment,
        "document": row.document,
    }


@router.put("/config")
def put_config(body: ConfigUpdate, who: Admin, session: DB, rt: Rt) -> dict[str, Any]:
    try:
        registered = registered_provider_configs(session)
        loaded = load_config_text(body.yaml, "config", registered, runnable=True)
        config = apply.runnable(loaded, "config", rt.settings, os.environ)
    except ConfigError as exc:
        return JSONResponse(  # type: ignore[return-value]
            {"detail": [{"field": r.path, "reason": r.cause, "fix": r.fix} for r in exc.refusals]},
            status_code=422,
        )
    row = apply.record(
        session, config, f"{body.changed_by} (admin key {who})", utc_now(), body.comment
    )
    version = row.version if row else config_versions.current_version(session)
    return {"version": version, "changed": row is not None}


@router.post("/queues/{queue}/scale", response_model=Message)
def scale(
    body: ScaleRequest,
    who: Admin,
    rt: Rt,
    queue: Annotated[str, Path(min_length=1, max_length=200)],
) -> Message:
    try:
        reason = set_target(rt, queue, body.workers, body.for_, by=f"api:{who}")
    except ManualError as exc:
        raise HTTPException(409, str(exc)) from None
    return Message(message=reason)


@router.post("/instances/{launch_id}/drain", response_model=Message)
def drain(who: Admin, rt: Rt, launch_id: LaunchId) -> Message:
    try:
        request_drain(rt, launch_id, by=f"api:{who}")
    except ManualError as exc:
        raise HTTPException(409, str(exc)) from None
    from autoscaler.control.tasks import BEST_EFFORT  # the Celery app: only when needed

    why = f"api:{who} asked to drain it"
    return Message(message=str(run_step(DrainStep(why), rt, launch_id, BEST_EFFORT)))


@router.get("/providers")
def providers(who: Admin, session: DB) -> list[dict[str, Any]]:
    out = []
    for row in provider_rows.list_providers(session):
        opts = {k: v for k, v in (row.options or {}).items() if k != "api_key_env"}
        out.append(
            {
                "name": row.name,
                "kind": row.kind,
                "credentials": describe_credentials(row),
                "options": opts,
            }
        )
    return out


def _instance(r: InstanceDetails) -> dict[str, Any]:
    def t(v: datetime | None) -> str | None:
        return v.isoformat() if v else None

    return {
        "launch_id": r.launch_id,
        "queue": r.queue,
        "provider": r.provider,
        "state": r.state.value,
        "state_reason": r.state_reason,
        "provider_instance_id": r.provider_instance_id,
        "gpu": r.gpu,
        "price_per_hour": r.price_per_hour,
        "worker_name": r.worker_name,
        "running_tasks": r.running_tasks,
        "last_heartbeat_at": t(r.last_heartbeat_at),
        "last_task_at": t(r.last_task_at),
        "created_at": t(r.created_at),
        "has_broker_user": r.broker_user is not None,
        "keep_warm": r.keep_warm,
        "storage_price_per_hour": r.storage_price_per_hour,
        "stopped_at": t(r.stopped_at),
        "resuming_at": t(r.resuming_at),
        "resumes": r.resumes,
    }


__all__ = ["router"]
