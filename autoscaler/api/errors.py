"""How the API fails: bad input is a 422 naming each field and why, a store that cannot be
reached a 503, anything unforeseen a 500 with one generic line (never a trace)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from autoscaler.control.runtime import log
from autoscaler.store.db import StoreError


async def bad_input(request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    problems = [
        {
            "field": ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body",
            "reason": str(e.get("msg", "invalid")),
        }
        for e in errors
    ]
    return JSONResponse({"detail": problems}, status_code=422)


async def store_down(request: Request, exc: Exception) -> JSONResponse:
    log.warning("api: store error %s", type(exc).__name__)
    return JSONResponse({"detail": "the state store cannot be reached"}, status_code=503)


async def internal(request: Request, exc: Exception) -> JSONResponse:
    log.error("api: unexpected %s on %s", type(exc).__name__, request.url.path)
    return JSONResponse({"detail": "internal error"}, status_code=500)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, bad_input)
    app.add_exception_handler(StoreError, store_down)
    app.add_exception_handler(Exception, internal)


__all__ = ["install"]
