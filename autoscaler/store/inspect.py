"""Read-only facts about the store for health checks and status output."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from autoscaler.store.models import LIVE_STATES, Instance, ProviderRow


def store_summary(session: Session) -> dict[str, Any]:
    revision = session.execute(text("SELECT version_num FROM alembic_version")).scalar()
    providers = session.scalar(select(func.count()).select_from(ProviderRow))
    live = session.scalar(
        select(func.count()).select_from(Instance).where(Instance.state.in_(LIVE_STATES))
    )
    return {"revision": revision, "providers": providers, "live_instances": live}
