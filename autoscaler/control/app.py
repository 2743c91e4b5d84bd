"""The control plane's Celery app (configured from `celeryconfig`); `autoscaler.celery` exposes
it to `celery -A autoscaler worker|beat|flower|call`, and `control.tasks` defines its tasks."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import worker_process_init

app = Celery("autoscaler")
app.config_from_object("celeryconfig")
app.autodiscover_tasks(["autoscaler.control"], related_name="tasks", force=True)


@worker_process_init.connect
def _fresh_runtime(**_: Any) -> None:
    """A forked pool process must not share its parent's database connections."""
    from autoscaler.control.runtime import reset_runtime

    reset_runtime()


__all__ = ["app"]
