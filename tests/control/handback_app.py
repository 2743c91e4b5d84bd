"""A Celery app for the hand-back tests' real workers: broker, key prefix and acks mode from
the environment; one task that marks its start and end (with the worker's name) and sleeps."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from celery import Celery

app = Celery("handback-test", broker=os.environ["HB_BROKER"], set_as_current=False)
app.conf.update(
    broker_transport_options={
        "global_keyprefix": os.environ.get("HB_PREFIX", ""),
        # kombu's default (an hour) unless HB_VISIBILITY shortens it; then the worker sweeps
        # for expired deliveries at each restore interval (no throttle)
        "visibility_timeout": float(os.environ.get("HB_VISIBILITY", 3600)),
        "unacked_restore_throttle": 1 if os.environ.get("HB_VISIBILITY") else 10,
        "unacked_restore_interval": 1 if os.environ.get("HB_VISIBILITY") else 10,
    },
    task_acks_late=os.environ.get("HB_ACKS") == "late",
    task_reject_on_worker_lost=os.environ.get("HB_ACKS") == "late",
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
)


@app.task(name="hb.work", bind=True)
def work(self, marks: str, seconds: float) -> None:
    def mark(what: str) -> None:
        line = {"what": what, "worker": self.request.hostname, "id": self.request.id}
        with Path(marks).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")

    mark("start")
    time.sleep(seconds)
    mark("end")
