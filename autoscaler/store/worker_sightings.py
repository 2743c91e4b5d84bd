"""Every worker seen lately, ours or hand-made: one row per (domain it was heard through, worker).

The rows are what every control-plane process counts hand-made capacity and reported loads from
(`control.observe`); a row not renewed within the loop's window is forgotten. Broker sightings
come from remote control (`record`), hand-made machines' heartbeats from the API
(`record_enrolled`, domain "").
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from autoscaler.store.db import upsert
from autoscaler.store.models import WorkerSighting

ENROLLED_DOMAIN = ""
"""The `domain` of a hand-made machine's sighting from its enrolled agent's heartbeat (the API)."""


class Sighting(NamedTuple):
    """One worker seen lately, as the loop counts it (`control.observe`)."""

    domain: str
    """Where it was heard: a broker domain, or ENROLLED_DOMAIN for a hand-made machine's agent."""
    worker: str
    queues: dict[str, Any]
    """{"queues": [...]}, with "loads" (per queue) and "enrolled_by" where they were reported."""
    running: int
    seen_at: datetime


def record(session: Session, sightings: Sequence[dict[str, Any]]) -> None:
    """Upsert sightings (domain, worker, queues, running, seen_at): one statement; a worker
    seen again gets its new queues, running count and time."""
    upsert(
        session,
        WorkerSighting,
        sightings,
        key=("domain", "worker"),
        update=("queues", "running", "seen_at"),
    )


def record_enrolled(
    session: Session,
    name: str,
    queues: Sequence[str],
    enrolled_by: str,
    running: int,
    now: datetime,
) -> None:
    """A hand-made machine's heartbeat (domain ""): its agent `agent@name` serves `queues`,
    runs `running` tasks, and came in with the enrolment key `enrolled_by`. One row per
    machine, moved on by each heartbeat."""
    row = {
        "domain": ENROLLED_DOMAIN,
        "worker": f"agent@{name}"[:200],
        "queues": {"queues": list(queues), "enrolled_by": enrolled_by},
        "running": running,
        "seen_at": now,
    }
    record(session, [row])


def recent(session: Session, since: datetime) -> list[Sighting]:
    """The sightings since `since`, by worker then domain, as frozen records; older ones are
    deleted on the way (two statements)."""
    session.execute(delete(WorkerSighting).where(WorkerSighting.seen_at < since))
    rows = session.execute(
        select(
            WorkerSighting.domain,
            WorkerSighting.worker,
            WorkerSighting.queues,
            WorkerSighting.running,
            WorkerSighting.seen_at,
        ).order_by(WorkerSighting.worker, WorkerSighting.domain)
    )
    return [Sighting(*row) for row in rows]
