"""The one-line producer hook: stamp every published task with its publish time.

Celery records no publish time, so the age of the oldest pending job can only be measured if
the producer writes one. In the producer (the code that calls `.delay()` / `send_task`):

    import autoscaler.brokers.stamp; autoscaler.brokers.stamp.install()

It connects a `before_task_publish` handler (Celery signals are process-wide, so one call
covers every app) that sets the header `x-autoscaler-published-at` (float seconds since the
epoch) and, unless the producer set one, the AMQP `timestamp` property (whole seconds), which
RabbitMQ's management API reports as `head_message_timestamp`. An existing stamp is kept, so a
message re-published as-is keeps its original time.
"""

from __future__ import annotations

import time
from typing import Any

from celery.signals import before_task_publish

from autoscaler.brokers.base import PUBLISHED_AT_HEADER

DISPATCH_UID = "autoscaler.brokers.stamp"
"""The hook's `dispatch_uid`: one connection however often `install` runs."""


def stamp_publish_time(
    sender: Any = None,
    headers: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    """The `before_task_publish` handler; may also be connected by hand."""
    now = time.time()
    if headers is not None:
        headers.setdefault(PUBLISHED_AT_HEADER, now)
    if properties is not None:
        properties.setdefault("timestamp", int(now))


def install(app: Any = None) -> None:
    """Connect the hook once (idempotent). `app` is accepted for readability; signals are global."""
    before_task_publish.connect(stamp_publish_time, weak=False, dispatch_uid=DISPATCH_UID)
