"""Sightings of workers by (domain, worker): who is alive, and for which queues."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from autoscaler.store.db import upsert
from autoscaler.store.models import ENROLLED_DOMAIN, WorkerSighting


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
    upsert(
        session,
        WorkerSighting,
        [row],
        key=("domain", "worker"),
        update=("queues", "running", "seen_at"),
    )
