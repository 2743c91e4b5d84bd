"""The server API (FastAPI): what machines and operators talk to. `autoscaler serve` runs it.

Three kinds of caller, three kinds of key (all `Authorization: Bearer <key>`):

- a rented machine's agent, with the worker token minted at its launch: only the worker
  endpoints `/v1/worker/{launch_id}/…` of its own launch (another launch's id is 403);
- a hand-made machine's agent, with an enrolment key: `/v1/hand-made/…` only;
- an operator, with an admin key: `/v1/admin/…` (and the dashboard's, at `/`).

`/healthz` and `/metrics` (Prometheus) need no key and say nothing secret. Bad input is a 4xx
naming the field and the reason; an unexpected error is a 500 with one generic line (never a
trace); a store that cannot be reached is a 503 (`errors.py`). Before any of it, a request's
body is read within bounds of size, time and memory per address (`limits.py`), then waits for
a fair turn (`admission.py`): one caller's burst cannot crowd out the others. The endpoints
are in `routers/`, one module per kind of caller; what they share (the transaction, the key
checks) in `deps.py`.
"""

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from autoscaler.api import errors
from autoscaler.api.admission import Admission
from autoscaler.api.deps import LazyRuntime
from autoscaler.api.limits import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY, BodyLimit
from autoscaler.api.routers import admin, dashboard, hand_made, public, worker
from autoscaler.control.runtime import Runtime
from autoscaler.dashboard import STATIC
from autoscaler.settings import Settings
from autoscaler.store.db import pool_capacity


def create_app(rt: Runtime | None = None) -> FastAPI:
    """The API on `rt` (this process's runtime by default: the loop's session factory, made at
    the first request)."""
    app = FastAPI(
        title="gpu-queue-autoscaler",
        version="1",
        description="Worker endpoints (worker token or enrolment key), admin endpoints (admin "
        "key), /metrics and /healthz.",
    )
    settings = rt.settings if rt is not None else Settings.from_env()
    lazy = LazyRuntime(rt)
    # inside the body limits: a refused body never waits for a turn, a slow one holds none
    app.add_middleware(Admission, capacity=lambda: pool_capacity(lazy().engine))
    app.add_middleware(
        BodyLimit,
        limit=settings.api_max_body or DEFAULT_MAX_BODY,
        deadline=settings.api_body_timeout or DEFAULT_BODY_TIMEOUT,
    )
    errors.install(app)
    app.state.runtime = lazy
    for module in (public, worker, hand_made, admin, dashboard):
        app.include_router(module.router)
    app.mount("/dashboard/static", StaticFiles(directory=STATIC), name="dashboard-static")
    return app


__all__ = ["create_app"]
