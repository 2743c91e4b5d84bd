"""Control-plane tasks. Arguments are names and ids only: Flower shows task arguments."""

from __future__ import annotations

from typing import Any

from autoscaler.celery import app
from autoscaler.settings import Settings, redact_url
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.inspect import store_summary


@app.task(name="autoscaler.check_store")
def check_store() -> dict[str, Any]:
    """Prove a worker reaches the state store at the migrated revision (operators' smoke test)."""
    settings = Settings.from_env()
    engine = make_engine(settings.database_url)
    try:
        with transaction(session_factory(engine)) as session:
            summary = store_summary(session)
    finally:
        engine.dispose()
    return {"database": redact_url(settings.database_url), **summary}
