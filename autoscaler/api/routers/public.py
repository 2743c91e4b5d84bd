"""`/healthz` and `/metrics`: no key (a scrape token if one is set), nothing secret."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from autoscaler.api import overview
from autoscaler.api.deps import DB, Message, Rt, bearer, unauthorised
from autoscaler.api.metrics import render
from autoscaler.store import config_versions

router = APIRouter()


@router.get("/healthz", response_model=Message)
def healthz(session: DB) -> Message:
    config_versions.current_version(session)
    return Message(message="ok")


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request, session: DB, rt: Rt) -> PlainTextResponse:
    """Prometheus text. With AUTOSCALER_METRICS_TOKEN set, only a scrape presenting it as
    a bearer token (Prometheus' `authorization: {credentials: …}`) gets an answer."""
    token = rt.settings.metrics_token
    if token is not None and not hmac.compare_digest(bearer(request).encode(), token.encode()):
        raise unauthorised()
    overview.take_samples(session, rt)  # the dashboard's chart
    return PlainTextResponse(render(session, rt), media_type="text/plain")


__all__ = ["router"]
