"""Each evaluation moves the queue's history on (quiet gaps in `queue_status.history`) and the
snapshot carries it with the mean runtime of the jobs the agents reported: what the learned idle
timeout and the burst rule read in the loop."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from autoscaler.config import load_config_text
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.tick.evaluate import evaluate
from autoscaler.control.tick.snapshot import build_snapshot
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.settings import Settings
from autoscaler.store import config_versions, job_records, migrate, queue_status
from autoscaler.store.models import QueueStatus
from tests.conftest import REDIS_URL
from tests.control.outbox import RecordingOutbox

CONFIG = f"""
providers:
  sandbox: {{kind: mock}}
queues:
  jobs:
    metrics: {{source: celery, url: "{REDIS_URL}/10", queue: "history-never-read"}}
    autoscale:
      provider: sandbox
      max_workers: 2
      scale_up: [{{trigger: no_workers}}]
      scale_down: [{{trigger: idle, timeout: 5m}}]
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.5}}
"""


def test_quiet_gaps_and_job_runtimes_reach_the_snapshot(tmp_path, db_url):
    migrate.upgrade(db_url)
    settings = Settings.from_env(
        {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url}
    )
    rt = Runtime(settings, env={})
    t0 = utc_now()

    def tick(pending: int, at_s: float, *, stale: bool = False) -> None:
        at = t0 + timedelta(seconds=at_s)
        reading = QueueMetrics("jobs", pending, 1.0 if pending else None, 0, at, stale=stale)
        evaluate(rt, RecordingOutbox(), trigger="test", readings={"jobs": reading}, now=at)

    def stored() -> dict[str, object] | None:
        with rt.transaction() as session:
            return session.scalar(select(QueueStatus.history).where(QueueStatus.queue == "jobs"))

    try:
        config = load_config_text(CONFIG)
        with rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", t0)
        tick(0, 0)
        tick(0, 30)  # still the same quiet period
        tick(5, 90, stale=True)  # a stale reading teaches nothing
        assert stored() == {"gaps": [], "quiet_since": t0.isoformat()}
        tick(2, 100)
        assert stored() == {"gaps": [100.0], "quiet_since": None}
        tick(0, 160)
        tick(1, 400)
        assert stored() == {"gaps": [100.0, 240.0], "quiet_since": None}
        # a status written without a history (none to write) keeps the stored one
        with rt.transaction() as session:
            queue_status.record(session, [{"queue": "jobs"}], 1, t0 + timedelta(seconds=401))
        assert stored() == {"gaps": [100.0, 240.0], "quiet_since": None}

        with rt.transaction() as session:
            job_records.record(
                session,
                [
                    {
                        "queue": "jobs",
                        "task_id": f"t{i}",
                        "worker": "w@h",
                        "arrived_at": None,
                        "started_at": t0,
                        "finished_at": t0 + timedelta(seconds=10 * i),
                        "runtime_s": 10.0 * i,
                    }
                    for i in (1, 2, 3)
                ],
                t0 + timedelta(seconds=400),
            )
            loaded = rt.load(session)
            assert loaded is not None
            at = t0 + timedelta(seconds=500)
            quiet = QueueMetrics("jobs", 0, None, 0, at)
            snap = build_snapshot(session, rt, loaded, {"jobs": quiet}, at)
            waiting = QueueMetrics("jobs", 2, 5.0, 0, at)
            busy = build_snapshot(session, rt, loaded, {"jobs": waiting}, at)
        qs = snap.queue("jobs")
        assert qs is not None
        assert qs.history.quiet_gaps == (100.0, 240.0)
        assert qs.history.quiet_since == at
        assert qs.history.job_seconds is None  # read only where jobs wait (the burst rule)
        qs = busy.queue("jobs")
        assert qs is not None
        assert (qs.history.job_seconds, qs.history.jobs_seen) == (20.0, 3)
    finally:
        rt.close()
