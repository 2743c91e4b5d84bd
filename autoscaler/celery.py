"""The Celery app found by `celery -A autoscaler worker|beat|flower|call` (`control.app`)."""

from __future__ import annotations

from autoscaler.control.app import app

__all__ = ["app"]
