"""A Celery app for real worker processes in the deployment tests: every knob from the env.

DEPLOY_BROKER      the watched broker (Redis or RabbitMQ)
DEPLOY_TRANSPORT   broker_transport_options as JSON (key prefix, sep, priority steps)
DEPLOY_ACKS_LATE   "1" for task_acks_late
DEPLOY_PREFETCH    worker_prefetch_multiplier (default 1)
DEPLOY_QUEUES      JSON [[name, exchange, type, routing_key], ...] for task_queues ("" = default)
DEPLOY_GATE        a Redis URL: `t.hold(key)` runs until that key exists there (a test opens it)
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery
from kombu import Exchange, Queue

app = Celery("deploy-test", broker=os.environ.get("DEPLOY_BROKER", "memory://"))
app.conf.broker_transport_options = json.loads(os.environ.get("DEPLOY_TRANSPORT") or "{}")
app.conf.task_acks_late = os.environ.get("DEPLOY_ACKS_LATE") == "1"
app.conf.worker_prefetch_multiplier = int(os.environ.get("DEPLOY_PREFETCH") or "1")
app.conf.broker_connection_retry_on_startup = True
_queues = json.loads(os.environ.get("DEPLOY_QUEUES") or "[]")
if _queues:
    app.conf.task_queues = [
        Queue(name, Exchange(ex, type=kind), routing_key=rk) if ex else Queue(name)
        for name, ex, kind, rk in _queues
    ]


@app.task(name="t.hold")
def hold(key: str, limit: float = 40.0) -> None:
    """Run until the test opens `key` on the gate Redis (or `limit` seconds pass)."""
    gate = redis.Redis.from_url(os.environ["DEPLOY_GATE"])
    deadline = time.monotonic() + limit
    try:
        while time.monotonic() < deadline and not gate.exists(key):
            time.sleep(0.05)
    finally:
        gate.close()
