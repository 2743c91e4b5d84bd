"""The Celery app found by `celery -A autoscaler worker|beat|flower|call`."""

from __future__ import annotations

from celery import Celery

app = Celery("autoscaler")
app.config_from_object("celeryconfig")
app.autodiscover_tasks(["autoscaler.control"], related_name="tasks", force=True)

__all__ = ["app"]
