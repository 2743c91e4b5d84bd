"""A tiny Celery application: the *watched* application of the loop's end-to-end tests.

Its one task sleeps for a while and records its run in Redis (a start and an end entry), so a
test can tell that every job ran exactly once, where, and that none was cut short. The broker
comes from `E2E_BROKER_URL` (the local provider's machine command sets it); the record goes to
the Redis list named by the caller, on the same Redis database.

Start a worker of it with `python -m celery -A e2eapp worker -Q <queue> ...` with this folder's
parent (`tests/control`) on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import redis
from celery import Celery

BROKER_ENV = "E2E_BROKER_URL"
DEFAULT_BROKER = "redis://127.0.0.1:6379/12"

app = Celery("e2eapp", broker=os.environ.get(BROKER_ENV, DEFAULT_BROKER), set_as_current=False)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_redis: redis.Redis | None = None


def _client() -> redis.Redis:
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(app.conf.broker_url)
    return _redis


def _record(key: str, entry: dict[str, Any]) -> None:
    _client().rpush(key, json.dumps(entry))


@app.task(name="e2eapp.job", bind=True)
def job(self: Any, record_key: str, job_id: str, seconds: float) -> str:
    """Sleep `seconds`; push {"job", "phase": start|end, "worker", "at"} entries to record_key."""
    worker = self.request.hostname or socket.gethostname()
    _record(record_key, {"job": job_id, "phase": "start", "worker": worker, "at": time.time()})
    time.sleep(seconds)
    _record(record_key, {"job": job_id, "phase": "end", "worker": worker, "at": time.time()})
    return job_id


def publisher(broker_url: str) -> Celery:
    """A producer-only app on `broker_url` (the test publishes with it; never consumes)."""
    producer = Celery("e2eapp-producer", broker=broker_url, set_as_current=False)
    producer.conf.update(task_serializer="json", accept_content=["json"])
    return producer


def runs(broker_url: str, record_key: str) -> list[dict[str, Any]]:
    """Every recorded entry, oldest first."""
    client = redis.Redis.from_url(broker_url)
    try:
        return [json.loads(raw) for raw in client.lrange(record_key, 0, -1)]
    finally:
        client.close()
