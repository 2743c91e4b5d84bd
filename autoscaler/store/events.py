"""The audit trail (`scale_events`): every decision and action with its reason, written in the
transaction of what it records, and the few reads the lifecycle makes of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from autoscaler.store.models import Instance, ScaleEvent

WARM_EVENT = "warm_pool"
"""The events' kind for a warm pool's stops, resumes, hits and misses (`status` counts them)."""

HANDBACK_EVENT = "handback"
"""Events of a lost machine's jobs: requeued by its broker (`requeued`: RabbitMQ closed its
user's connections), left to the broker's own redelivery (`left`), claimed running with early
acks (`lost`: one per machine, the ids its word only), and forged kombu mutexes deleted
(`forged_mutex`)."""

PREEMPTION_EVENT = "preemption"
"""Events of interruptible machines stopped by their provider (action `preempted`)."""


def event(
    kind: str,
    action: str,
    reason: str,
    *,
    queue: str | None = None,
    launch_id: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "kind": kind,
        "action": action,
        "reason": reason,
        "queue": queue,
        "launch_id": launch_id,
        "details": dict(details) if details is not None else None,
    }


def warm_event(action: str, why: str, queue: str, launch_id: str, **details: Any) -> dict[str, Any]:
    """A warm pool's event: `stop`, `stopped`, `resume`, `hit` or `miss`."""
    return event(WARM_EVENT, action, why, queue=queue, launch_id=launch_id, details=details or None)


def record(session: Session, events: Sequence[Mapping[str, Any]], now: datetime) -> None:
    """Audit trail rows: queue, kind, action, launch_id, reason, details (one statement)."""
    if not events:
        return
    session.execute(
        insert(ScaleEvent),
        [
            {
                "at": now,
                "queue": e.get("queue"),
                "kind": e["kind"],
                "action": e["action"],
                "launch_id": e.get("launch_id"),
                "reason": str(e["reason"])[:4000],
                "details": e.get("details"),
            }
            for e in events
        ],
    )


def last_at(session: Session, launch_id: str, kind: str, action: str) -> datetime | None:
    """When the newest (kind, action) event of one machine was written, or None (the
    `scale_events` launch index makes it one short lookup)."""
    return session.scalar(
        select(func.max(ScaleEvent.at)).where(
            ScaleEvent.launch_id == launch_id,
            ScaleEvent.kind == kind,
            ScaleEvent.action == action,
        )
    )


def preemptions_on_host(session: Session, provider: str, host: str, since: datetime) -> int:
    """Machines of `provider` on `host` preempted since `since` (events joined to their rows:
    a host that preempts often is avoided for a while). One query."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(ScaleEvent)
            .join(Instance, Instance.launch_id == ScaleEvent.launch_id)
            .where(
                ScaleEvent.kind == PREEMPTION_EVENT,
                ScaleEvent.at >= since,
                Instance.provider == provider,
                Instance.host_id == host,
            )
        )
        or 0
    )


__all__ = [
    "HANDBACK_EVENT",
    "PREEMPTION_EVENT",
    "WARM_EVENT",
    "event",
    "last_at",
    "preemptions_on_host",
    "record",
    "warm_event",
]
