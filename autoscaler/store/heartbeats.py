"""What machines say about themselves, written to their rows: an agent's registration and
heartbeats (through the API, with the machine's own token), a worker's replies to remote control
(through the watched broker) and the drain step's look at a worker. The columns only: what a
report means (ready, crashed, drain) is `control.machines`'."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.lifecycle import HEARD_STATES, InstanceState
from autoscaler.store.models import Instance
from autoscaler.store.moves import update_rows

HEARTBEAT_COLUMNS = frozenset(
    {
        "last_heartbeat_at",
        "running_tasks",
        "gpu_utilisation",
        "last_task_at",
        "worker_name",
        "tasks",
        "acks_late",
    }
)


def note_heartbeat(
    session: Session, launch_id: str, values: Mapping[str, Any]
) -> InstanceState | None:
    """What its agent's heartbeat said (some of HEARTBEAT_COLUMNS; `control.machines` decides
    which). Returns the row's state as this write found it (None: no such row): the state read
    when the token was checked may have moved since, and the write holds the row until commit."""
    unknown = set(values) - HEARTBEAT_COLUMNS
    if unknown:
        raise ValueError(f"not a heartbeat column: {', '.join(sorted(unknown))}")
    found = update_rows(session, [Instance.launch_id == launch_id], values, Instance.state)
    return InstanceState(found[0]) if found else None


def note_registered(session: Session, launch_id: str, worker_name: str, now: datetime) -> None:
    """Its agent registered, naming its worker. Not yet a sign of the worker's life: the agent
    deploys first, and the machine is ready only at the heartbeat that says its worker starts
    (booting is judged by the boot timeout meanwhile)."""
    values = {"worker_name": worker_name, "agent_registered_at": now}
    update_rows(session, [Instance.launch_id == launch_id], values)


def heard_through_broker(
    session: Session, launch_ids: Collection[str]
) -> list[tuple[str, int, InstanceState, str, str]]:
    """(launch_id, running_tasks, state, queue, provider) of these machines whose worker's
    broker replies may move their row: up (`HEARD_STATES`) and with no agent registered (a
    machine whose agent heartbeats is known from its authenticated heartbeats alone)."""
    if not launch_ids:
        return []
    return [
        (r[0], r[1], r[2], r[3], r[4])
        for r in session.execute(
            select(
                Instance.launch_id,
                Instance.running_tasks,
                Instance.state,
                Instance.queue,
                Instance.provider,
            ).where(
                Instance.launch_id.in_(list(launch_ids)),
                Instance.state.in_(HEARD_STATES),
                Instance.agent_registered_at.is_(None),
            )
        )
    ]


def note_worker(
    session: Session, launch_id: str, worker_name: str, running: int, now: datetime, busy: bool
) -> None:
    """What a machine's worker just said through the broker: its name, its running tasks and
    (when `busy`: a task ran since the last look) the time of its last task."""
    values: dict[str, object] = {
        "worker_name": worker_name,
        "last_heartbeat_at": now,
        "running_tasks": running,
    }
    if busy:
        values["last_task_at"] = now
    update_rows(session, [Instance.launch_id == launch_id], values)


def note_busy(session: Session, launch_id: str, running: int, now: datetime) -> None:
    """What a worker just said about its tasks (the drain step asks it directly)."""
    values = {"running_tasks": running, "last_task_at": now, "last_heartbeat_at": now}
    update_rows(session, [Instance.launch_id == launch_id], values)


__all__ = [
    "HEARTBEAT_COLUMNS",
    "heard_through_broker",
    "note_busy",
    "note_heartbeat",
    "note_registered",
    "note_worker",
]
