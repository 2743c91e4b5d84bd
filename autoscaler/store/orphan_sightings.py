"""Machines with our label that no live row owns, and when reconcile first saw each: an orphan
is destroyed once it has been seen for its grace time, by whichever reconcile round comes then.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from autoscaler.store.models import OrphanSighting

Orphans = Mapping[tuple[str, str], tuple[str, datetime]]
"""(provider, provider_instance_id) -> (label, first seen at)."""


def seen(session: Session) -> dict[tuple[str, str], tuple[str, datetime]]:
    """Every orphan sighting kept by the last round (one query)."""
    return {
        (o.provider, o.provider_instance_id): (o.label, o.first_seen_at)
        for o in session.scalars(select(OrphanSighting))
    }


def replace(session: Session, orphans: Orphans | None) -> None:
    """Keep exactly these sightings (None: none): an orphan no longer listed is forgotten."""
    session.execute(delete(OrphanSighting))
    if orphans:
        session.add_all(
            OrphanSighting(provider=p, provider_instance_id=pid, label=label, first_seen_at=first)
            for (p, pid), (label, first) in orphans.items()
        )
