"""Message builders that follow kombu's Redis envelope exactly (tests publish real Celery
messages too; these are for layouts Celery would take long to produce), and the producer hook
taken off again after a test that installed it."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from celery.signals import before_task_publish

from autoscaler.brokers.base import PUBLISHED_AT_HEADER
from autoscaler.brokers.stamp import DISPATCH_UID, stamp_publish_time


def uninstall_stamp() -> None:
    """Disconnect the hook `stamp.install()` connected (Celery signals are process-wide: a test
    that stamps its producer must not stamp the next test's)."""
    before_task_publish.disconnect(stamp_publish_time, dispatch_uid=DISPATCH_UID)


def envelope(
    queue: str,
    *,
    stamp: float | None = None,
    eta: datetime | None = None,
    task_id: str | None = None,
) -> bytes:
    """A message for `queue`: `stamp` the producer's publish stamp, `eta` Celery's `eta` header
    (ISO 8601, as Celery writes it)."""
    headers: dict[str, Any] = {
        "task": "t.add",
        "id": task_id or str(uuid.uuid4()),
        "eta": eta.isoformat() if eta else None,
    }
    if stamp is not None:
        headers[PUBLISHED_AT_HEADER] = stamp
    return json.dumps(
        {
            "body": "W1tdLCB7fSwge31d",
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "delivery_tag": str(uuid.uuid4()),
                "priority": 0,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "body_encoding": "base64",
                "delivery_mode": 2,
            },
        }
    ).encode()


def unacked_entry(queue: str) -> bytes:
    return json.dumps([json.loads(envelope(queue)), "", queue]).encode()
