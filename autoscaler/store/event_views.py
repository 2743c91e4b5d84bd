"""The audit trail (`scale_events`) as the operator views read it: the events that match
(`autoscaler events`, the admin API, the dashboard) and the counts `status` and `/metrics` take
from it (launches, preempting hosts, lost work). One query each; nothing here writes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from autoscaler.store.events import HANDBACK_EVENT, PREEMPTION_EVENT
from autoscaler.store.models import ScaleEvent


@dataclass(frozen=True)
class EventView:
    id: int
    at: datetime
    queue: str | None
    kind: str
    action: str
    launch_id: str | None
    reason: str
    details: dict[str, Any] | None

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "at": self.at.isoformat()}


def _view(e: ScaleEvent) -> EventView:
    return EventView(e.id, e.at, e.queue, e.kind, e.action, e.launch_id, e.reason, e.details)


def events(
    session: Session,
    *,
    queue: str | None = None,
    launch_id: str | None = None,
    kinds: Sequence[str] = (),
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 50,
) -> list[EventView]:
    """The newest `limit` events that match, oldest first (one query)."""
    q = select(ScaleEvent)
    if queue is not None:
        q = q.where(ScaleEvent.queue == queue)
    if launch_id is not None:  # a launch id or a prefix of one (the tables show 12 chars)
        q = q.where(ScaleEvent.launch_id.startswith(launch_id, autoescape=True))
    if kinds:
        q = q.where(or_(ScaleEvent.kind.in_(list(kinds)), ScaleEvent.action.in_(list(kinds))))
    if since is not None:
        q = q.where(ScaleEvent.at >= since)
    if until is not None:
        q = q.where(ScaleEvent.at <= until)
    rows = list(
        session.scalars(q.order_by(ScaleEvent.at.desc(), ScaleEvent.id.desc()).limit(limit))
    )
    return [_view(e) for e in reversed(rows)]


def newest_events(
    session: Session,
    *,
    queue: str | None = None,
    kind: str | None = None,
    launch_id: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
) -> list[EventView]:
    """The newest `limit` events that match exactly (a whole launch id, a kind), newest
    first: the admin API's filter, where `events` is the CLI's. One query."""
    q = select(ScaleEvent).order_by(ScaleEvent.id.desc()).limit(limit)
    if queue is not None:
        q = q.where(ScaleEvent.queue == queue)
    if kind is not None:
        q = q.where(ScaleEvent.kind == kind)
    if launch_id is not None:
        q = q.where(ScaleEvent.launch_id == launch_id)
    if since is not None:
        q = q.where(ScaleEvent.at >= since)
    return [_view(e) for e in session.scalars(q)]


def launch_counts(session: Session) -> dict[tuple[str, str], int]:
    """(queue, "created" | "failed") -> launches of the audit trail (queue "" for none)."""
    rows = session.execute(
        select(ScaleEvent.queue, ScaleEvent.action, func.count())
        .where(ScaleEvent.kind == "launch", ScaleEvent.action.in_(("created", "failed")))
        .group_by(ScaleEvent.queue, ScaleEvent.action)
    )
    return {(queue or "", action): n for queue, action, n in rows}


def preempting_hosts(session: Session, since: datetime) -> dict[tuple[str, str, str], int]:
    """(queue, provider, host) -> our machines preempted there since `since` (the events)."""
    out: dict[tuple[str, str, str], int] = {}
    for queue, details in session.execute(
        select(ScaleEvent.queue, ScaleEvent.details).where(
            ScaleEvent.at >= since, ScaleEvent.kind == PREEMPTION_EVENT
        )
    ):
        info = details if isinstance(details, dict) else {}
        key = (queue or "", str(info.get("provider") or ""), str(info.get("host") or "?"))
        out[key] = out.get(key, 0) + 1
    return out


def lost_work(session: Session, since: datetime) -> dict[str, tuple[int, int, int]]:
    """Queue -> (machines preempted, machines lost while their workers said they ran early-acked
    jobs, machines whose jobs their broker requeued) since `since`, from the events (one query
    over the day's few hand-back and preemption events). Machines, not jobs: the ids a machine
    names are its word, and no broker keeps a record of an early-acked job."""
    out: dict[str, list[int]] = {}
    for queue, kind, action, details in session.execute(
        select(ScaleEvent.queue, ScaleEvent.kind, ScaleEvent.action, ScaleEvent.details).where(
            ScaleEvent.at >= since,
            ScaleEvent.kind.in_([PREEMPTION_EVENT, HANDBACK_EVENT]),
        )
    ):
        counts = out.setdefault(queue or "", [0, 0, 0])
        info = details if isinstance(details, dict) else {}
        if kind == PREEMPTION_EVENT:
            counts[0] += 1
        elif action == "lost":
            counts[1] += 1
        elif action == "requeued" and info.get("connections_closed"):
            counts[2] += 1
    return {q: (a, b, c) for q, (a, b, c) in out.items()}


__all__ = ["EventView", "events", "launch_counts", "lost_work", "newest_events", "preempting_hosts"]
