"""`autoscaler serve`: the server API and the operators' dashboard, on the checked store."""

from __future__ import annotations

import os

import click

from autoscaler.boundary import Refused
from autoscaler.cli.common import sessions, settings
from autoscaler.digits import ASCII_FORM, ascii_whole

DEFAULT_WORKERS = 1
MAX_WORKERS = 64


def worker_count(option: str | None, env: str) -> int:
    """`--workers`, else $AUTOSCALER_API_WORKERS, else DEFAULT_WORKERS: a whole number from 1
    to MAX_WORKERS (each process holds up to 15 connections to the store)."""
    raw, where = (option, "--workers") if option is not None else (env, "AUTOSCALER_API_WORKERS")
    if not raw.strip():
        return DEFAULT_WORKERS
    n = ascii_whole(raw.strip())
    if n is None or not 1 <= n <= MAX_WORKERS:
        raise Refused(
            f"{where} must be a whole number of processes from 1 to {MAX_WORKERS} in "
            f"{ASCII_FORM}, not {raw!r}"
        )
    return n


@click.command("serve")
@click.option(
    "--bind", help="host:port to listen on (default $AUTOSCALER_API_BIND, 127.0.0.1:8480)"
)
@click.option(
    "--workers",
    help="processes serving the API, each with its own connection pool (default "
    f"$AUTOSCALER_API_WORKERS, {DEFAULT_WORKERS}); one process is one CPU's worth of requests",
)
@click.option("--log-level", default="info", show_default=True)
def serve(bind: str | None, workers: str | None, log_level: str) -> None:
    """Run the server API (worker and admin endpoints, /metrics, /healthz; OpenAPI at
    /openapi.json) and the operators' dashboard at / (it asks for an admin key)."""
    import uvicorn

    from autoscaler.api.app import create_app
    from autoscaler.control.runtime import Runtime

    current = settings()
    sessions(current)  # refuses a store that is not set up, with the fix
    host, _, port_text = (bind or current.api_bind).rpartition(":")
    port = ascii_whole(port_text)
    if not host or port is None or not 0 < port < 65536:
        raise Refused(
            f"--bind must be host:port with a port from 1 to 65535 in {ASCII_FORM}, "
            f"not {bind or current.api_bind!r}"
        )
    if current.api_max_body is None:
        raise Refused(
            "AUTOSCALER_API_MAX_BODY must be the largest request body in bytes (a whole number "
            f"> 0 in {ASCII_FORM}), e.g. 1048576"
        )
    if current.api_body_timeout is None:
        raise Refused(
            "AUTOSCALER_API_BODY_TIMEOUT must be the seconds a request's whole body may take "
            f"after its headers (a whole number > 0 in {ASCII_FORM}), e.g. 10"
        )
    processes = worker_count(workers, os.environ.get("AUTOSCALER_API_WORKERS", ""))
    if processes > 1:
        # each process builds the app and its own runtime (and pool) from the same environment
        uvicorn.run(
            "autoscaler.api.app:create_app",
            factory=True,
            workers=processes,
            host=host.strip("[]"),
            port=port,
            log_level=log_level,
            server_header=False,
        )
        return
    rt = Runtime(current)
    try:
        uvicorn.run(
            create_app(rt),
            host=host.strip("[]"),
            port=port,
            log_level=log_level,
            server_header=False,
        )
    finally:
        rt.close()
