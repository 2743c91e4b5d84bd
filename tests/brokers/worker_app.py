"""A Celery app for a real worker process in the tests (broker and key prefix from the env)."""

from __future__ import annotations

import os

from celery import Celery

app = Celery("metrics-test-worker", broker=os.environ["TEST_WORKER_BROKER"])
app.conf.broker_transport_options = {"global_keyprefix": os.environ.get("TEST_WORKER_PREFIX", "")}
app.conf.worker_prefetch_multiplier = 1
app.conf.broker_connection_retry_on_startup = True


@app.task(name="t.noop")
def noop() -> None:
    return None
