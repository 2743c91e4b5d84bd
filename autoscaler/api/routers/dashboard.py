"""The dashboard's page at `/` and the admin endpoints only it needs (admin key).

Every number comes from the rows `/v1/admin/queues`, `/metrics` and the control loop share
(`config_versions`, `queue_status`, `metric_readings`, `instances`, `scale_events`), so the page,
the CLI and Flower's task view tell one story. Edits go through the same checks as
`autoscaler validate` (same refusals: path, cause, fix) and are recorded like `autoscaler apply`
(`control.apply`: a new version with who, when, why); a rollback records an old document as a
new version.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.responses import FileResponse, JSONResponse
from pydantic import Field

from autoscaler.access.credentials import registered_provider_configs
from autoscaler.api import overview as numbers
from autoscaler.api.deps import DB, Admin, Rt
from autoscaler.config.errors import ConfigError
from autoscaler.config.loader import known_providers, load_config_text, parse_yaml_document
from autoscaler.config.models import Config
from autoscaler.config.summary import describe
from autoscaler.control import apply
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.dashboard import STATIC
from autoscaler.dashboard.documents import changes, dump, normal
from autoscaler.store import (
    boots,
    config_versions,
    event_views,
    machine_views,
    queue_samples,
    spend,
)
from autoscaler.store.config_versions import ConfigRecord
from autoscaler.store.db import Session
from autoscaler.wire import RequestBody

QueueName = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^\s/]+$")]
PAGE_HEADERS = {
    # the page loads its own files only; nothing inline, nothing from elsewhere
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

router = APIRouter()


class QueueEdit(RequestBody):
    """A queue's `autoscale:` block as YAML (what the page's editor holds)."""

    yaml: str = Field(min_length=1, max_length=200_000)
    comment: str | None = Field(default=None, max_length=2000)
    changed_by: str = Field(default="dashboard", min_length=1, max_length=200)
    base_version: int | None = Field(default=None, ge=1)


class Preview(RequestBody):
    """Either a whole config (`yaml`) or one queue's `autoscale:` block (`queue` + `autoscale`)."""

    yaml: str | None = Field(default=None, min_length=1, max_length=1_000_000)
    queue: str | None = Field(default=None, min_length=1, max_length=200)
    autoscale: str | None = Field(default=None, min_length=1, max_length=200_000)


class Rollback(RequestBody):
    version: int = Field(ge=1, le=2**31 - 1)
    comment: str | None = Field(default=None, max_length=2000)
    changed_by: str = Field(default="dashboard", min_length=1, max_length=200)
    base_version: int | None = Field(default=None, ge=1)


# ------------------------------------------------------------------ helpers


def _refused(exc: ConfigError, status: int = 422) -> JSONResponse:
    return JSONResponse(
        {"detail": [{"field": r.path, "reason": r.cause, "fix": r.fix} for r in exc.refusals]},
        status_code=status,
    )


def _check(session: Session, rt: Runtime, text: str, source: str) -> tuple[Config, dict[str, Any]]:
    """`autoscaler validate`'s checks on a whole document: ConfigError with its refusals."""
    registered = registered_provider_configs(session)
    config = load_config_text(text, source, registered, runnable=True)
    return apply.runnable(config, source, rt.settings, os.environ), registered


def _current(session: Session) -> ConfigRecord:
    row = config_versions.latest(session)
    if row is None:
        raise HTTPException(404, "no config applied yet ('autoscaler apply FILE')")
    return row


def _with_queue(document: Mapping[str, Any], queue: str, text: str) -> str:
    """The whole document with `queue`'s autoscale block replaced by `text` (YAML)."""
    if queue not in (document.get("queues") or {}):
        raise HTTPException(404, f"no queue {queue!r} in the running config")
    block = parse_yaml_document(text, f"queues.{queue}.autoscale")
    merged = copy.deepcopy(dict(document))
    merged["queues"][queue]["autoscale"] = block
    return dump(merged)


def _base_check(session: Session, base: int | None) -> None:
    """An edit made on an older version than the newest is refused (409), never merged."""
    row = config_versions.latest(session)
    if base is not None and row is not None and row.version != base:
        raise HTTPException(
            409,
            f"the config changed since you opened it: version {row.version} by "
            f"{row.changed_by} at {row.changed_at.isoformat(timespec='seconds')}; reload "
            "and make your change again",
        )


def _by(changed_by: str, who: str) -> str:
    return f"{changed_by} (admin key {who})"[:200]


# ------------------------------------------------------------------ the page


@router.get("/", include_in_schema=False)
def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=PAGE_HEADERS)


# ------------------------------------------------------------------ numbers


@router.get("/v1/admin/overview")
def overview(who: Admin, session: DB, rt: Rt) -> dict[str, Any]:
    """What the page shows, from the rows `autoscaler status` reads (the store's views): every
    queue's numbers and settings, the spend, the machines that may bill, the newest
    events (newest first), the running config's version, and the median and p90 boot per
    (provider, GPU) of the last 7 days' cold boots (`boots`)."""
    at = utc_now()
    rows = numbers.queue_rows(session, rt, at)
    numbers.record_samples(session, rows, utc_now())
    row = config_versions.latest(session)
    return {
        "now": at.isoformat(),
        "admin": who,
        "spend": spend.spend(session, at).as_json(),
        "instances": [m.as_json() for m in machine_views.instances(session, at)],
        "events": [e.as_json() for e in event_views.events(session, limit=50)][::-1],
        "boots": [b.as_json() for b in boots.boot_times(session, at)],
        "config": None
        if row is None
        else {
            "version": row.version,
            "changed_by": row.changed_by,
            "changed_at": row.changed_at.isoformat(),
            "comment": row.comment,
        },
        "queues": rows,
    }


@router.get("/v1/admin/history")
def history(
    who: Admin,
    session: DB,
    rt: Rt,
    hours: Annotated[float, Query(gt=0, le=168)] = 6,
) -> dict[str, Any]:
    """Pending jobs and serving/booting machines per queue over the last `hours`."""
    numbers.take_samples(session, rt)
    start = utc_now() - timedelta(hours=hours)
    series: dict[str, list[dict[str, Any]]] = {}
    for s in queue_samples.since(session, start):
        series.setdefault(s.queue, []).append(
            {
                "at": s.at.isoformat(),
                "pending": s.pending,
                "running": s.running,
                "workers": s.workers,
                "booting": s.booting,
                "desired": s.desired,
            }
        )
    return {"since": start.isoformat(), "now": utc_now().isoformat(), "queues": series}


# ------------------------------------------------------------------ editing


@router.get("/v1/admin/queues/{queue}/autoscale")
def get_autoscale(queue: QueueName, who: Admin, session: DB) -> dict[str, Any]:
    """One queue's `autoscale:` block of the newest version, as YAML to edit."""
    row = _current(session)
    queues = row.document.get("queues") or {}
    if queue not in queues:
        raise HTTPException(404, f"no queue {queue!r} in the running config")
    block = queues[queue].get("autoscale")
    return {
        "queue": queue,
        "version": row.version,
        "yaml": dump(block) if isinstance(block, dict) else "",
    }


@router.post("/v1/admin/config/preview")
def preview(body: Preview, who: Admin, session: DB, rt: Rt) -> Any:
    """What `autoscaler validate` would say of the changed config: its refusals (422) or its
    dry run and what changes against the newest version. Nothing is stored."""
    row = config_versions.latest(session)
    old = row.document if row is not None else {}
    if body.yaml is not None and body.queue is None and body.autoscale is None:
        text, source = body.yaml, "config"
    elif body.yaml is None and body.queue is not None and body.autoscale is not None:
        try:
            text = _with_queue(old, body.queue, body.autoscale)
        except ConfigError as exc:
            return _refused(exc)
        source = f"queue {body.queue}"
    else:
        raise HTTPException(422, "send either 'yaml' (a whole config) or 'queue' + 'autoscale'")
    try:
        config, registered = _check(session, rt, text, source)
    except ConfigError as exc:
        return _refused(exc)
    document = config.model_dump(mode="json")
    return {
        "valid": True,
        "base_version": row.version if row is not None else None,
        "changes": changes(normal(old), document),
        "dry_run": describe(
            config, known_providers(config, registered), utc_now(), registered=registered
        ),
    }


@router.put("/v1/admin/queues/{queue}/autoscale")
def put_autoscale(body: QueueEdit, queue: QueueName, who: Admin, session: DB, rt: Rt) -> Any:
    """Apply one queue's edited `autoscale:` block: validated like `autoscaler validate`,
    recorded like `autoscaler apply` (a new version: who, when, why)."""
    row = _current(session)
    _base_check(session, body.base_version)
    try:
        text = _with_queue(row.document, queue, body.yaml)
        config, _ = _check(session, rt, text, f"queue {queue}")
    except ConfigError as exc:
        return _refused(exc)
    changed = changes(normal(row.document), config.model_dump(mode="json"))
    comment = body.comment or f"dashboard: {queue}'s autoscale settings"
    new = (
        apply.record(session, config, _by(body.changed_by, who), utc_now(), comment)
        if changed
        else None
    )
    return {
        "version": new.version if new else row.version,
        "changed": new is not None,
        "changes": changed,
    }


@router.get("/v1/admin/config/versions")
def versions(
    who: Admin,
    session: DB,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """Every recorded version, newest first: who, when, why (documents on their own URL)."""
    rows = list(config_versions.history(session))[::-1][:limit]
    return [
        {
            "version": r.version,
            "changed_by": r.changed_by,
            "changed_at": r.changed_at.isoformat(),
            "comment": r.comment,
        }
        for r in rows
    ]


@router.get("/v1/admin/config/versions/{version}")
def version_document(
    version: Annotated[int, Path(ge=1, le=2**31 - 1)],
    who: Admin,
    session: DB,
) -> dict[str, Any]:
    row = config_versions.get(session, version)
    if row is None:
        raise HTTPException(404, f"no version {version}")
    latest = config_versions.latest(session)
    return {
        "version": row.version,
        "changed_by": row.changed_by,
        "changed_at": row.changed_at.isoformat(),
        "comment": row.comment,
        "yaml": dump(row.document),
        "changes_to_newest": changes(normal(row.document), normal(latest.document))
        if latest
        else [],
    }


@router.post("/v1/admin/config/rollback")
def rollback(body: Rollback, who: Admin, session: DB, rt: Rt) -> Any:
    """Run an earlier version again: its document, checked as `validate` would check it
    today (a provider it names may be gone), recorded as a new version with who and why."""
    old = config_versions.get(session, body.version)
    if old is None:
        raise HTTPException(404, f"no version {body.version}")
    _base_check(session, body.base_version)
    latest = _current(session)
    try:
        config, _ = _check(session, rt, dump(old.document), f"version {body.version}")
    except ConfigError as exc:
        return _refused(exc)
    why = f"rollback to version {body.version}"
    if body.comment:
        why += f": {body.comment}"
    changed = changes(normal(latest.document), config.model_dump(mode="json"))
    new = (
        apply.record(session, config, _by(body.changed_by, who), utc_now(), why)
        if changed
        else None
    )
    if new is None:
        raise HTTPException(
            409, f"version {latest.version} already runs what version {body.version} held"
        )
    return {"version": new.version, "changed": True, "changes": changed}


__all__ = ["PAGE_HEADERS", "router"]
