"""The dashboard's page and the admin endpoints only it needs. Mounted by `api.app.create_app`.

Every number comes from the rows `/v1/admin/queues`, `/metrics` and the control loop share
(`config_versions`, `queue_status`, `metric_readings`, `instances`, `scale_events`), so the page,
the CLI and Flower's task view tell one story. Edits go through the same checks as
`autoscaler validate` (same refusals: path, cause, fix) and are recorded like `autoscaler apply`
(a new version with who, when, why); a rollback records an old document as a new version.
"""

import copy
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path as FsPath
from typing import Annotated, Any

import yaml
from fastapi import FastAPI, HTTPException, Path, Query
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import Field

from autoscaler.access.credentials import registered_provider_configs
from autoscaler.api.inputs import Strict
from autoscaler.config.errors import ConfigError
from autoscaler.config.loader import known_providers, load_config_text, parse_yaml_document
from autoscaler.config.models import Config
from autoscaler.config.summary import describe
from autoscaler.control import apply
from autoscaler.control.runtime import log
from autoscaler.store import config_versions, queue_samples, views
from autoscaler.store.db import Session

STATIC = FsPath(__file__).parent / "static"
QueueName = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^\s/]+$")]
PAGE_HEADERS = {
    # the page loads its own files only; nothing inline, nothing from elsewhere
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class QueueEdit(Strict):
    """A queue's `autoscale:` block as YAML (what the page's editor holds)."""

    yaml: str = Field(min_length=1, max_length=200_000)
    comment: str | None = Field(default=None, max_length=2000)
    changed_by: str = Field(default="dashboard", min_length=1, max_length=200)
    base_version: int | None = Field(default=None, ge=1)


class Preview(Strict):
    """Either a whole config (`yaml`) or one queue's `autoscale:` block (`queue` + `autoscale`)."""

    yaml: str | None = Field(default=None, min_length=1, max_length=1_000_000)
    queue: str | None = Field(default=None, min_length=1, max_length=200)
    autoscale: str | None = Field(default=None, min_length=1, max_length=200_000)


class Rollback(Strict):
    version: int = Field(ge=1, le=2**31 - 1)
    comment: str | None = Field(default=None, max_length=2000)
    changed_by: str = Field(default="dashboard", min_length=1, max_length=200)
    base_version: int | None = Field(default=None, ge=1)


def _t(v: datetime | None) -> str | None:
    return v.isoformat() if v else None


def _refused(exc: ConfigError, status: int = 422) -> JSONResponse:
    return JSONResponse(
        {"detail": [{"field": r.path, "reason": r.cause, "fix": r.fix} for r in exc.refusals]},
        status_code=status,
    )


def _changes(old: Any, new: Any, path: str = "") -> list[str]:
    """What differs between two config documents, one line per changed leaf."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in old:
                out.append(f"{sub}: added {_short(new[k])}")
            elif k not in new:
                out.append(f"{sub}: removed (was {_short(old[k])})")
            else:
                out += _changes(old[k], new[k], sub)
        return out
    if old != new:
        return [f"{path or '(document)'}: {_short(old)} → {_short(new)}"]
    return []


def _normal(document: Mapping[str, Any]) -> Any:
    """A stored document as `apply` stores it (defaults filled in), so a preview lists what the
    edit changes, not what an older writer left implicit."""
    try:
        return Config.model_validate(dict(document)).model_dump(mode="json")
    except Exception:  # an old document the schema no longer takes: compare it as stored
        return dict(document)


def _short(v: Any) -> str:
    text = yaml.safe_dump(v, default_flow_style=True, width=10_000).strip()
    text = text.removesuffix("...").strip()
    return text if len(text) <= 200 else text[:199] + "…"


def _dump(document: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True)


def install(
    app: FastAPI,
    runtime: Callable[[], Any],
    admin: Any,
    db: Any,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> None:
    """Add the page and its endpoints to `app`. `admin`, `db`: the app's own dependencies
    (`Depends(...)` objects), so the same key check and the same transaction apply."""

    def check(session: Session, text: str, source: str) -> tuple[Config, dict[str, Any]]:
        """`autoscaler validate`'s checks on a whole document: ConfigError with its refusals."""
        registered = registered_provider_configs(session)
        config = load_config_text(text, source, registered, runnable=True)
        return apply.runnable(config, source, runtime().settings, os.environ), registered

    def current(session: Session) -> Any:
        row = config_versions.latest(session)
        if row is None:
            raise HTTPException(404, "no config applied yet ('autoscaler apply FILE')")
        return row

    def with_queue(document: Mapping[str, Any], queue: str, text: str) -> str:
        """The whole document with `queue`'s autoscale block replaced by `text` (YAML)."""
        if queue not in (document.get("queues") or {}):
            raise HTTPException(404, f"no queue {queue!r} in the running config")
        block = parse_yaml_document(text, f"queues.{queue}.autoscale")
        merged = copy.deepcopy(dict(document))
        merged["queues"][queue]["autoscale"] = block
        return _dump(merged)

    def base_check(session: Session, base: int | None) -> None:
        row = config_versions.latest(session)
        if base is not None and row is not None and row.version != base:
            raise HTTPException(
                409,
                f"the config changed since you opened it: version {row.version} by "
                f"{row.changed_by} at {row.changed_at.isoformat(timespec='seconds')}; reload "
                "and make your change again",
            )

    def by(changed_by: str, who: str) -> str:
        return f"{changed_by} (admin key {who})"[:200]

    # ------------------------------------------------------------------ the page

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=PAGE_HEADERS)

    app.mount("/dashboard/static", StaticFiles(directory=STATIC), name="dashboard-static")

    # ------------------------------------------------------------------ numbers

    def queue_rows(session: Session, at: datetime) -> list[dict[str, Any]]:
        """`autoscaler status`'s own queue views (store/views.py: the same rows, the same
        arithmetic), each with its autoscale settings from the newest config."""
        loaded = runtime().load(session)
        configured = loaded.config.queues if loaded else {}
        out = []
        for view in views.queues(session, at):
            row = view.as_json()
            cfg = configured.get(view.queue)
            auto = cfg.autoscale if cfg is not None else None
            row["configured"] = cfg is not None
            row["autoscale"] = (
                None
                if auto is None
                else {
                    "enabled": auto.enabled,
                    "provider": auto.provider,
                    "min_workers": auto.min_workers,
                    "max_workers": auto.max_workers,
                    "priority": auto.priority,
                    "gpu": auto.instance.gpu,
                    "max_price_per_hour": auto.instance.max_price_per_hour,
                }
            )
            out.append(row)
        return out

    def sample(session: Session, rows: list[dict[str, Any]]) -> None:
        samples = [
            {
                "queue": r["queue"],
                "at": datetime.fromisoformat(r["reading_at"]),
                "pending": r["pending"] or 0,
                "running": r["running"],
                "workers": r["workers"]["live"],
                "booting": r["workers"]["booting"],
                "desired": r["desired"],
            }
            for r in rows
            if r["reading_at"] is not None
        ]
        queue_samples.record(session, samples, now())

    def take_samples(session: Session) -> None:
        """Record the chart's samples on the side of another answer (/metrics, the history):
        a sample that cannot be written costs that answer nothing."""
        try:
            with session.begin_nested():
                sample(session, queue_rows(session, now()))
        except Exception as exc:  # the chart misses a point; the scrape still answers
            log.warning("dashboard: no chart sample this time (%s)", type(exc).__name__)

    app.state.take_queue_samples = take_samples

    @app.get("/v1/admin/overview")
    def overview(who: str = admin, session: Session = db) -> dict[str, Any]:
        """What the page shows, from the rows `autoscaler status` reads (store/views.py): every
        queue's numbers and settings, the spend, the machines that may bill, the newest
        events (newest first) and the running config's version."""
        at = now()
        rows = queue_rows(session, at)
        sample(session, rows)
        row = config_versions.latest(session)
        return {
            "now": at.isoformat(),
            "admin": who,
            "spend": views.spend(session, at).as_json(),
            "instances": [m.as_json() for m in views.instances(session, at)],
            "events": [e.as_json() for e in views.events(session, limit=50)][::-1],
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

    @app.get("/v1/admin/history")
    def history(
        who: str = admin,
        session: Session = db,
        hours: Annotated[float, Query(gt=0, le=168)] = 6,
    ) -> dict[str, Any]:
        """Pending jobs and serving/booting machines per queue over the last `hours`."""
        take_samples(session)
        start = now() - timedelta(hours=hours)
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
        return {"since": start.isoformat(), "now": now().isoformat(), "queues": series}

    # ------------------------------------------------------------------ editing

    @app.get("/v1/admin/queues/{queue}/autoscale")
    def get_autoscale(queue: QueueName, who: str = admin, session: Session = db) -> dict[str, Any]:
        """One queue's `autoscale:` block of the newest version, as YAML to edit."""
        row = current(session)
        queues = row.document.get("queues") or {}
        if queue not in queues:
            raise HTTPException(404, f"no queue {queue!r} in the running config")
        block = queues[queue].get("autoscale")
        return {
            "queue": queue,
            "version": row.version,
            "yaml": _dump(block) if isinstance(block, dict) else "",
        }

    @app.post("/v1/admin/config/preview")
    def preview(body: Preview, who: str = admin, session: Session = db) -> Any:
        """What `autoscaler validate` would say of the changed config: its refusals (422) or its
        dry run and what changes against the newest version. Nothing is stored."""
        row = config_versions.latest(session)
        old = row.document if row is not None else {}
        if body.yaml is not None and body.queue is None and body.autoscale is None:
            text, source = body.yaml, "config"
        elif body.yaml is None and body.queue is not None and body.autoscale is not None:
            try:
                text = with_queue(old, body.queue, body.autoscale)
            except ConfigError as exc:
                return _refused(exc)
            source = f"queue {body.queue}"
        else:
            raise HTTPException(422, "send either 'yaml' (a whole config) or 'queue' + 'autoscale'")
        try:
            config, registered = check(session, text, source)
        except ConfigError as exc:
            return _refused(exc)
        document = config.model_dump(mode="json")
        return {
            "valid": True,
            "base_version": row.version if row is not None else None,
            "changes": _changes(_normal(old), document),
            "dry_run": describe(
                config, known_providers(config, registered), now(), registered=registered
            ),
        }

    @app.put("/v1/admin/queues/{queue}/autoscale")
    def put_autoscale(
        body: QueueEdit, queue: QueueName, who: str = admin, session: Session = db
    ) -> Any:
        """Apply one queue's edited `autoscale:` block: validated like `autoscaler validate`,
        recorded like `autoscaler apply` (a new version: who, when, why)."""
        row = current(session)
        base_check(session, body.base_version)
        try:
            text = with_queue(row.document, queue, body.yaml)
            config, _ = check(session, text, f"queue {queue}")
        except ConfigError as exc:
            return _refused(exc)
        document = config.model_dump(mode="json")
        changes = _changes(_normal(row.document), document)
        new = (
            apply.record(
                session,
                config,
                by(body.changed_by, who),
                now(),
                body.comment or f"dashboard: {queue}'s autoscale settings",
            )
            if changes
            else None
        )
        return {
            "version": new.version if new else row.version,
            "changed": new is not None,
            "changes": changes,
        }

    @app.get("/v1/admin/config/versions")
    def versions(
        who: str = admin,
        session: Session = db,
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

    @app.get("/v1/admin/config/versions/{version}")
    def version_document(
        version: Annotated[int, Path(ge=1, le=2**31 - 1)],
        who: str = admin,
        session: Session = db,
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
            "yaml": _dump(row.document),
            "changes_to_newest": _changes(_normal(row.document), _normal(latest.document))
            if latest
            else [],
        }

    @app.post("/v1/admin/config/rollback")
    def rollback(body: Rollback, who: str = admin, session: Session = db) -> Any:
        """Run an earlier version again: its document, checked as `validate` would check it
        today (a provider it names may be gone), recorded as a new version with who and why."""
        old = config_versions.get(session, body.version)
        if old is None:
            raise HTTPException(404, f"no version {body.version}")
        base_check(session, body.base_version)
        latest = current(session)
        try:
            config, _ = check(session, _dump(old.document), f"version {body.version}")
        except ConfigError as exc:
            return _refused(exc)
        why = f"rollback to version {body.version}"
        if body.comment:
            why += f": {body.comment}"
        document = config.model_dump(mode="json")
        changes = _changes(_normal(latest.document), document)
        new = (
            apply.record(session, config, by(body.changed_by, who), now(), why)
            if changes
            else None
        )
        if new is None:
            raise HTTPException(
                409, f"version {latest.version} already runs what version {body.version} held"
            )
        return {"version": new.version, "changed": True, "changes": changes}


__all__ = ["install"]
