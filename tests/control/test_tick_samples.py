"""Every evaluation leaves the dashboard's chart a point: pending, workers, desired at the
reading's own time (so the chart has points when nobody is looking)."""

from __future__ import annotations

import uuid

import redis
from sqlalchemy import select

from autoscaler.config import load_config_text
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.tick.evaluate import evaluate
from autoscaler.settings import Settings
from autoscaler.store import config_versions, migrate
from autoscaler.store.models import QueueSample
from tests.conftest import REDIS_URL
from tests.control.outbox import RecordingOutbox

CONFIG = """
providers:
  sandbox: {{kind: mock}}
queues:
  jobs:
    metrics: {{source: celery, url: "{redis}/10", queue: "{queue}"}}
    autoscale:
      provider: sandbox
      max_workers: 2
      scale_up: [{{trigger: no_workers}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.5}}
"""


def test_an_evaluation_records_a_chart_point(tmp_path, db_url):
    migrate.upgrade(db_url)
    queue = f"samples-{uuid.uuid4().hex[:8]}"
    watched = redis.Redis.from_url(f"{REDIS_URL}/10")
    watched.lpush(queue, *[f'{{"headers": {{"id": "j{i}"}}}}' for i in range(3)])
    settings = Settings.from_env(
        {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url}
    )
    rt = Runtime(settings, env={})
    try:
        config = load_config_text(CONFIG.format(redis=REDIS_URL, queue=queue))
        with rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())
        result = evaluate(rt, RecordingOutbox(), trigger="test")
        assert len(result.launched) == 1
        with rt.transaction() as session:
            points = session.scalars(select(QueueSample)).all()
        assert [(p.queue, p.pending, p.workers, p.booting, p.desired) for p in points] == [
            ("jobs", 3, 0, 0, 1)
        ]
    finally:
        watched.delete(queue)
        rt.close()
