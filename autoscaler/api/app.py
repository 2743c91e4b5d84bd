"""The server API (FastAPI): what machines and operators talk to. `autoscaler serve` runs it.

Three kinds of caller, three kinds of key (all `Authorization: Bearer <key>`):

- a rented machine's agent, with the worker token minted at its launch: only the worker
  endpoints `/v1/worker/{launch_id}/…` of its own launch (another launch's id is 403);
- a hand-made machine's agent, with an enrolment key: `/v1/hand-made/…` only;
- an operator, with an admin key: `/v1/admin/…`.

`/healthz` and `/metrics` (Prometheus) need no key and say nothing secret. Bad input is a 4xx
naming the field and the reason; an unexpected error is a 500 with one generic line (never a
trace); a store that cannot be reached is a 503.
"""

import hmac
import os
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, Field

from autoscaler.access import broker_users, keys
from autoscaler.access.credentials import describe_credentials, registered_provider_configs
from autoscaler.api.inputs import Strict, UtcTime
from autoscaler.api.limits import DEFAULT_MAX_BODY, BodyLimit
from autoscaler.config.errors import ConfigError
from autoscaler.config.loader import load_config_text
from autoscaler.control import apply
from autoscaler.control.drain import finish_drain
from autoscaler.control.runtime import Runtime, log
from autoscaler.lifecycle import InstanceState
from autoscaler.settings import Settings, redact_url
from autoscaler.store import config_versions, fleet, job_records, views, worker_sightings
from autoscaler.store import providers as provider_rows
from autoscaler.store.db import Session, StoreError, store_now
from autoscaler.store.models import Instance

S = InstanceState
HEARTBEAT_INTERVAL = 10.0
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:@\-]+$")]
LaunchId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]


class Register(Strict):
    worker_name: Name
    hostname: Name | None = None


class Registered(BaseModel):
    launch_id: str
    queue: str
    heartbeat_interval: float


EPOCH_S = Annotated[float, Field(ge=0, le=2**33, allow_inf_nan=False)]


class JobReport(Strict):
    """A job the worker finished (the agent's hook): its task id, the queue it came from (the
    message's routing key, any text), the producer's publish stamp if any, and when it started
    and ended (epoch seconds). Clocks disagree (a producer's runs ahead, a worker's steps back):
    times out of order are clamped when recorded, never a reason to refuse the heartbeat that
    carries them — the heartbeat is what keeps a busy machine alive."""

    id: Annotated[str, Field(min_length=1, max_length=200)]
    queue: Annotated[str, Field(max_length=200)] | None = None
    published_at: EPOCH_S | None = None
    started_at: EPOCH_S
    finished_at: EPOCH_S


class Heartbeat(Strict):
    state: Literal["starting", "idle", "busy", "draining", "crashed"]
    running_tasks: int = Field(default=0, ge=0, le=100_000)
    last_task_at: UtcTime | None = None
    gpu_utilisation: float | None = Field(default=None, ge=0, le=100)
    detail: str | None = Field(default=None, max_length=500)
    jobs: list[JobReport] = Field(default_factory=list, max_length=1000)


class HeartbeatAnswer(BaseModel):
    drain: bool
    state: str


class Deployment(BaseModel):
    queue: str
    git_url: str | None
    git_ref: str | None
    git_token: str | None = None
    startup_cmd: str | None
    env: dict[str, str]
    broker_url: str | None
    broker_note: str | None


def _send_terminate(launch_id: str) -> None:
    """Destroy the drained machine now rather than at the next reconcile. Sent a second later,
    after this request's transaction commits (a step that runs too early finds the row not yet
    terminating and does nothing); reconcile re-sends it if the broker cannot be reached."""
    try:
        from autoscaler.control.tasks import terminate

        terminate.apply_async((launch_id,), countdown=1.0, expires=600.0)
    except Exception:  # the broker is down: reconcile's retry destroys it a poll later
        log.warning("could not send the terminate step of %s; reconcile will", launch_id)


def _git_token(dep: Any, env: Mapping[str, str]) -> str | None:
    """The private repository's read token, from the control plane's environment (only a
    machine's own authenticated deployment request gets it)."""
    name = getattr(dep, "git_token_env", None)
    return (env.get(name) or None) if name else None


class Drained(BaseModel):
    state: str


class HandMadeBeat(Strict):
    name: Name
    queues: list[Name] = Field(min_length=1, max_length=50)
    state: Literal["starting", "idle", "busy", "draining", "crashed"] = "idle"
    running_tasks: int = Field(default=0, ge=0, le=100_000)
    jobs: list[JobReport] = Field(default_factory=list, max_length=1000)


def _job_rows(
    jobs: list[JobReport], worker: str, queues: list[str], now: datetime
) -> list[dict[str, Any]]:
    """Rows for `job_records`: a job counts for the queue it names when the worker serves it,
    else for the worker's first queue. Times after now are clamped to now, an end before the
    start to the start, a publish stamp after the start to the start (clocks disagree)."""
    def at(epoch: float) -> datetime:
        return min(datetime.fromtimestamp(epoch, UTC), now)

    rows = []
    for j in jobs:
        started = at(j.started_at)
        finished = max(at(j.finished_at), started)
        arrived = min(at(j.published_at), started) if j.published_at is not None else None
        rows.append(
            {
                "queue": j.queue if j.queue in queues else queues[0],
                "task_id": j.id,
                "worker": worker[:200],
                "arrived_at": arrived,
                "started_at": started,
                "finished_at": finished,
                "runtime_s": (finished - started).total_seconds(),
            }
        )
    return rows


class ConfigUpdate(Strict):
    yaml: str = Field(min_length=1, max_length=1_000_000)
    comment: str | None = Field(default=None, max_length=2000)
    changed_by: str = Field(default="api", min_length=1, max_length=200)


class ScaleRequest(Strict):
    workers: int | None = Field(ge=0, le=10_000)
    for_: str | None = Field(default=None, alias="for", max_length=40)


class Message(BaseModel):
    message: str


def _now() -> datetime:
    return datetime.now(UTC)


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _unauthorised() -> HTTPException:
    return HTTPException(401, "a valid key is needed", headers={"WWW-Authenticate": "Bearer"})


def create_app(rt: Runtime | None = None) -> FastAPI:
    """The API on `rt` (this process's runtime by default: the loop's session factory)."""
    app = FastAPI(
        title="gpu-queue-autoscaler",
        version="1",
        description="Worker endpoints (worker token or enrolment key), admin endpoints (admin "
        "key), /metrics and /healthz.",
    )
    settings = rt.settings if rt is not None else Settings.from_env()
    app.add_middleware(BodyLimit, limit=settings.api_max_body or DEFAULT_MAX_BODY)
    state: dict[str, Runtime] = {}

    def runtime() -> Runtime:
        if "rt" not in state:
            state["rt"] = rt if rt is not None else Runtime()
        return state["rt"]

    def db() -> Iterator[Session]:
        with runtime().transaction() as session:
            yield session

    DB = Annotated[Session, Depends(db, scope="function")]

    def admin(request: Request, session: DB) -> str:
        found = keys.check_key(session, _bearer(request), keys.ADMIN)
        if found is None:
            raise _unauthorised()
        return found.name

    def enrolled(request: Request, session: DB) -> keys.KeyInfo:
        found = keys.check_key(session, _bearer(request), keys.ENROLMENT)
        if found is None:
            raise _unauthorised()
        return found

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

    def worker(request: Request, launch_id: LaunchId, session: DB) -> Instance:
        row = keys.instance_of_token(session, _bearer(request))
        if row is None:
            raise _unauthorised()
        if row.launch_id != launch_id:
            raise HTTPException(403, "this token belongs to another machine")
        return row

    Admin = Annotated[str, Depends(admin)]
    Worker = Annotated[Instance, Depends(worker)]
    Enrolled = Annotated[keys.KeyInfo, Depends(enrolled)]

    # ------------------------------------------------------------------ errors

    @app.exception_handler(RequestValidationError)
    async def bad_input(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {
                "field": ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body",
                "reason": str(e.get("msg", "invalid")),
            }
            for e in exc.errors()
        ]
        return JSONResponse({"detail": problems}, status_code=422)

    @app.exception_handler(StoreError)
    async def store_down(request: Request, exc: StoreError) -> JSONResponse:
        log.warning("api: store error %s", type(exc).__name__)
        return JSONResponse({"detail": "the state store cannot be reached"}, status_code=503)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("api: unexpected %s on %s", type(exc).__name__, request.url.path)
        return JSONResponse({"detail": "internal error"}, status_code=500)

    # ------------------------------------------------------------------ public

    @app.get("/healthz", response_model=Message)
    def healthz(session: DB) -> Message:
        config_versions.current_version(session)
        return Message(message="ok")

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics(request: Request, session: DB) -> PlainTextResponse:
        """Prometheus text. With AUTOSCALER_METRICS_TOKEN set, only a scrape presenting it as
        a bearer token (Prometheus' `authorization: {credentials: …}`) gets an answer."""
        from autoscaler.api.metrics import render

        token = runtime().settings.metrics_token
        if token is not None and not hmac.compare_digest(
            _bearer(request).encode(), token.encode()
        ):
            raise _unauthorised()

        app.state.take_queue_samples(session)  # the dashboard's chart (autoscaler/dashboard)
        return PlainTextResponse(render(session, runtime()), media_type="text/plain")

    # ------------------------------------------------------------------ worker

    @app.post("/v1/worker/{launch_id}/register", response_model=Registered)
    def register(body: Register, row: Worker, session: DB) -> Registered:
        now = store_now(session)
        name = body.worker_name
        fleet.note_registered(session, row.launch_id, name, now)
        fleet.record_events(
            session,
            [
                fleet.event(
                    "agent",
                    "register",
                    f"agent {name} registered",
                    queue=row.queue,
                    launch_id=row.launch_id,
                )
            ],
            now,
        )
        return Registered(
            launch_id=row.launch_id, queue=row.queue, heartbeat_interval=HEARTBEAT_INTERVAL
        )

    @app.get("/v1/worker/{launch_id}/deployment", response_model=Deployment)
    def deployment(request: Request, row: Worker, session: DB) -> Deployment:
        loaded = runtime().load(session)
        queue_cfg = loaded.config.queues.get(row.queue) if loaded else None
        dep = getattr(queue_cfg, "deployment", None)
        broker_url, note = None, None
        if queue_cfg is not None:
            # the machine's own user, made at its launch: its URL needs no question to the
            # broker (the broker may be busy; the user exists)
            admin = broker_users.admin_url(queue_cfg.metrics, runtime().env)
            if row.broker_user and admin is not None:
                password = keys.derive(_bearer(request), "broker")
                broker_url = broker_users.machine_url(admin, row.broker_user, password)
            else:
                try:
                    broker_users.plan_for(queue_cfg.metrics, row.queue, runtime().env)
                    note = "no broker user was made for this machine at its launch"
                except broker_users.NoBrokerUser as exc:
                    note = str(exc)
        return Deployment(
            queue=row.queue,
            git_url=dep.git_url if dep else None,
            git_ref=dep.git_ref if dep else None,
            git_token=_git_token(dep, runtime().env),
            startup_cmd=dep.startup_cmd if dep else None,
            env={**(dep.env if dep else {}), "AUTOSCALER_QUEUE": row.queue},
            broker_url=broker_url,
            broker_note=note,
        )

    @app.post("/v1/worker/{launch_id}/heartbeat", response_model=HeartbeatAnswer)
    def heartbeat(body: Heartbeat, row: Worker, session: DB) -> HeartbeatAnswer:
        """The agent's word on its worker. Every state but `starting` and `crashed` says the
        worker is up (the agent sends its first heartbeat as it starts the worker): a booting
        machine is ready at once, with the move and event reconcile would make. The answer
        tells the agent to drain, and its state (a machine no longer live gets a 401 from the
        token instead, and its agent starts nothing)."""
        now = store_now(session)
        state = row.state
        up = body.state not in ("starting", "crashed")
        values: dict[str, Any] = {
            "last_heartbeat_at": now,
            "running_tasks": body.running_tasks,
            "gpu_utilisation": body.gpu_utilisation,
        }
        if not up:
            values.pop("last_heartbeat_at")
        if not row.worker_name:
            values["worker_name"] = f"agent@{row.launch_id}"
        busy = body.running_tasks > 0 or row.running_tasks > 0
        if body.last_task_at is not None:
            values["last_task_at"] = min(body.last_task_at, now)
        elif busy:
            values["last_task_at"] = now
        if body.state == "crashed":
            # the worker process died: no sign of life from it; reconcile replaces the machine
            values["running_tasks"] = 0
            fleet.record_events(
                session,
                [
                    fleet.event(
                        "agent",
                        "crashed",
                        f"the worker process crashed: {body.detail or 'no detail'}",
                        queue=row.queue,
                        launch_id=row.launch_id,
                    )
                ],
                now,
            )
        fleet.note_heartbeat(session, row.launch_id, values)
        if up and state == S.BOOTING:
            why = "its worker is up (its agent's first heartbeat)"
            if fleet.mark_ready(session, row.launch_id, row.queue, row.provider, now, why):
                state = S.READY
        worker = row.worker_name or f"agent@{row.launch_id}"
        job_records.record(session, _job_rows(body.jobs, worker, [row.queue], now), now)
        drain = state in (S.DRAINING, S.DRAINED)
        return HeartbeatAnswer(drain=drain, state=state.value)

    @app.post("/v1/worker/{launch_id}/drained", response_model=Drained)
    def drained(row: Worker, session: DB) -> Drained:
        now = store_now(session)
        if row.state not in (S.DRAINING, S.DRAINED):
            raise HTTPException(409, f"this machine is {row.state.value}: nobody asked it to drain")
        why = "its agent reports its worker stopped after its last task"
        if finish_drain(session, row.launch_id, row.queue, why, now):
            _send_terminate(row.launch_id)
        return Drained(state="terminating")

    # ------------------------------------------------------------------ hand-made machines

    @app.post("/v1/hand-made/heartbeat", response_model=HeartbeatAnswer)
    def hand_made_heartbeat(body: HandMadeBeat, who: Enrolled, session: DB) -> HeartbeatAnswer:
        bound(who, list(body.queues))
        now = store_now(session)
        worker_sightings.record_enrolled(
            session, body.name, body.queues, who.name, body.running_tasks, now
        )
        worker = f"agent@{body.name}"
        job_records.record(session, _job_rows(body.jobs, worker, list(body.queues), now), now)
        return HeartbeatAnswer(drain=False, state="hand-made")

    @app.get("/v1/hand-made/deployment", response_model=Deployment)
    def hand_made_deployment(
        who: Enrolled, session: DB, queue: Annotated[str, Query(min_length=1, max_length=200)]
    ) -> Deployment:
        """The deployment of a queue the key was made for. Never the control plane's own
        broker URL (it may hold rights over the broker's users): the hand-made machine's owner
        gives it its broker URL (AUTOSCALER_BROKER_URL on that machine)."""
        bound(who, [queue])
        loaded = runtime().load(session)
        queue_cfg = loaded.config.queues.get(queue) if loaded else None
        if queue_cfg is None:
            raise HTTPException(404, f"no queue {queue!r} in the running config")
        dep = queue_cfg.deployment
        return Deployment(
            queue=queue,
            git_url=dep.git_url if dep else None,
            git_ref=dep.git_ref if dep else None,
            git_token=_git_token(dep, runtime().env),
            startup_cmd=dep.startup_cmd if dep else None,
            env={**(dep.env if dep else {}), "AUTOSCALER_QUEUE": queue},
            broker_url=None,
            broker_note=(
                "a hand-made machine gets no broker URL from the control plane: set "
                "AUTOSCALER_BROKER_URL on it (a user of its own, limited to its queue)"
            ),
        )

    # ------------------------------------------------------------------ admin

    @app.get("/v1/admin/queues")
    def queues(who: Admin, session: DB) -> list[dict[str, Any]]:
        loaded = runtime().load(session)
        status = views.statuses(session)
        rows = fleet.live_rows(session)
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

    @app.get("/v1/admin/instances")
    def instances(
        who: Admin,
        session: DB,
        queue: Annotated[str | None, Query(max_length=200)] = None,
        state: InstanceState | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    ) -> list[dict[str, Any]]:
        rows = views.instance_rows(session, queue=queue, state=state, limit=limit)
        return [_instance(r) for r in rows]

    @app.get("/v1/admin/events")
    def events(
        who: Admin,
        session: DB,
        queue: Annotated[str | None, Query(max_length=200)] = None,
        kind: Annotated[str | None, Query(max_length=40)] = None,
        launch_id: Annotated[str | None, Query(max_length=64)] = None,
        since: datetime | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> list[dict[str, Any]]:
        if since is not None and since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        found = views.newest_events(
            session, queue=queue, kind=kind, launch_id=launch_id, since=since, limit=limit
        )
        return [e.as_json() for e in found]

    @app.get("/v1/admin/config")
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

    @app.put("/v1/admin/config")
    def put_config(body: ConfigUpdate, who: Admin, session: DB) -> dict[str, Any]:
        settings = runtime().settings
        try:
            registered = registered_provider_configs(session)
            loaded = load_config_text(body.yaml, "config", registered, runnable=True)
            config = apply.runnable(loaded, "config", settings, os.environ)
        except ConfigError as exc:
            return JSONResponse(  # type: ignore[return-value]
                {
                    "detail": [
                        {"field": r.path, "reason": r.cause, "fix": r.fix} for r in exc.refusals
                    ]
                },
                status_code=422,
            )
        row = apply.record(
            session, config, f"{body.changed_by} (admin key {who})", _now(), body.comment
        )
        version = row.version if row else config_versions.current_version(session)
        return {"version": version, "changed": row is not None}

    @app.post("/v1/admin/queues/{queue}/scale", response_model=Message)
    def scale(
        body: ScaleRequest,
        who: Admin,
        queue: Annotated[str, Path(min_length=1, max_length=200)],
    ) -> Message:
        from autoscaler.control.manual import ManualError, set_target

        try:
            reason = set_target(runtime(), queue, body.workers, body.for_, by=f"api:{who}")
        except ManualError as exc:
            raise HTTPException(409, str(exc)) from None
        return Message(message=reason)

    @app.post("/v1/admin/instances/{launch_id}/drain", response_model=Message)
    def drain(who: Admin, launch_id: LaunchId) -> Message:
        from autoscaler.control.drain import run_drain
        from autoscaler.control.manual import ManualError, request_drain

        try:
            request_drain(runtime(), launch_id, by=f"api:{who}")
        except ManualError as exc:
            raise HTTPException(409, str(exc)) from None
        from autoscaler.control.tasks import send_step

        why = f"api:{who} asked to drain it"
        return Message(message=run_drain(runtime(), launch_id, why, enqueue=send_step))

    @app.get("/v1/admin/providers")
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

    # ------------------------------------------------------------------ dashboard (at /)

    from autoscaler.dashboard.routes import install as install_dashboard

    install_dashboard(app, runtime, Depends(admin), Depends(db, scope="function"))
    return app


def _instance(r: Instance) -> dict[str, Any]:
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
    }


__all__ = ["create_app", "redact_url"]
