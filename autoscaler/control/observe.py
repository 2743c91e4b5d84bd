"""The worker-status port: what the loop knows about each worker comes through here.

Two sources feed the same columns of an instance row (`worker_name`, `last_heartbeat_at`,
`running_tasks`, `last_task_at`):
(a) Celery workers on a watched broker, seen through Celery's remote control. Our machines
    name their worker after the launch label (`celery worker -n <label>@%h`), so a reply from
    `asg-<installation>-<launch>@host` is the machine `<launch>`; no agent is needed;
(b) heartbeats the worker agent sends through the API (written to the same columns there).
Every worker seen, ours or hand-made, is also kept in `worker_sightings`, so that every process
counts hand-made machines (the GPU under the desk) as capacity alike.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from autoscaler.control.runtime import Loaded, Runtime, log
from autoscaler.lifecycle import InstanceState
from autoscaler.metrics.base import SourceError
from autoscaler.metrics.workers import host_of
from autoscaler.providers.labels import parse_label
from autoscaler.store.models import Instance, WorkerSighting

SEEN_STATES = (InstanceState.BOOTING, InstanceState.READY, InstanceState.DRAINING)


def launch_of(worker: str, installation_id: str) -> str | None:
    """The launch id of one of our workers (`<label>@host`), None for anyone else's."""
    parsed = parse_label(worker.rsplit("@", 1)[0])
    if parsed is None or parsed.installation_id != installation_id:
        return None
    return parsed.launch_id


def observe_celery_workers(rt: Runtime, loaded: Loaded, now: datetime) -> dict[str, str]:
    """Probe every watched Celery broker once; write what answered. Returns errors by source."""
    seen: dict[str, tuple[tuple[str, ...], int]] = {}
    errors: dict[str, str] = {}
    probed: set[object] = set()
    for q in loaded.autoscaled.values():
        key = q.metrics.model_copy(update={"queue": None})
        if key in probed:
            continue
        probed.add(key)
        probe = rt.worker_probe(q.metrics)
        if probe is None:
            continue
        try:
            seen.update(probe.status())
        except SourceError as exc:
            errors[str(exc)[:80]] = str(exc)
            log.warning("worker probe failed: %s", exc)
    with rt.transaction() as session:
        record_sightings(session, seen, rt.installation_id(session), now)
    return errors


def record_sightings(
    session: Session,
    seen: dict[str, tuple[tuple[str, ...], int]],
    installation_id: str,
    now: datetime,
) -> None:
    """Upsert every sighting; move our machines' rows to what their worker just said."""
    if seen:
        ins = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
        sightings = [
            {"worker": name[:200], "queues": {"queues": list(qs)}, "running": n, "seen_at": now}
            for name, (qs, n) in seen.items()
        ]
        stmt = ins(WorkerSighting)
        stmt = stmt.on_conflict_do_update(
            index_elements=[WorkerSighting.worker],
            set_={
                "queues": stmt.excluded.queues,
                "running": stmt.excluded.running,
                "seen_at": stmt.excluded.seen_at,
            },
        )
        session.execute(stmt, sightings)
    ours = {
        launch: (name, n)
        for name, (_, n) in seen.items()
        if (launch := launch_of(name, installation_id)) is not None
    }
    if not ours:
        return
    rows = session.execute(
        select(Instance.launch_id, Instance.running_tasks).where(
            Instance.launch_id.in_(list(ours)), Instance.state.in_(SEEN_STATES)
        )
    ).all()
    params = []
    for launch_id, before in rows:
        name, running = ours[launch_id]
        params.append(
            {
                "b_launch": launch_id,
                "worker_name": name[:200],
                "last_heartbeat_at": now,
                "running_tasks": running,
                # a task ran since the last look if one runs now or one ran then
                "busy": running > 0 or before > 0,
            }
        )
    for p in params:
        values: dict[str, object] = {
            "worker_name": p["worker_name"],
            "last_heartbeat_at": now,
            "running_tasks": p["running_tasks"],
        }
        if p["busy"]:
            values["last_task_at"] = now
        session.execute(
            update(Instance)
            .where(Instance.launch_id == p["b_launch"])
            .values(**values)
            .execution_options(synchronize_session=False)
        )


def hand_made_workers(
    session: Session, installation_id: str, ours: set[str], now: datetime, window: float
) -> dict[str, tuple[str, ...]]:
    """Per consumed queue, workers seen within `window` that are not our machines (one per
    host); older sightings are forgotten on the way."""
    since = now - timedelta(seconds=window)
    session.execute(delete(WorkerSighting).where(WorkerSighting.seen_at < since))
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for w in session.scalars(select(WorkerSighting)):
        if launch_of(w.worker, installation_id) is not None or host_of(w.worker) in ours:
            continue
        for q in (w.queues or {}).get("queues", []):
            out[str(q)].setdefault(host_of(w.worker), w.worker)
    return {q: tuple(sorted(names.values())) for q, names in out.items()}
