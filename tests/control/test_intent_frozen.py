"""An intent freezes its decision: the pending row holds the config version `decide()` judged
and the id of its `launch` event; the launch rents exactly that version's machine even when a
newer version changed it meanwhile, and terminate destroys it with the provider it was rented
from even when the newest version no longer has that provider.

Before, the launch step read the newest version, so a machine could be rented under a config no
decision ever judged, and `Instance.decision_id` was never written. The loop's own tick, launch
and terminate steps in this process, on SQLite and PostgreSQL, with the mock provider.
"""

from __future__ import annotations

from sqlalchemy import select

from autoscaler.config import load_config_text
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps import launch, terminate
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.control.tick.evaluate import evaluate
from autoscaler.lifecycle import InstanceState as S
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.settings import Settings
from autoscaler.store import config_versions, instances, migrate, moves
from autoscaler.store.models import MockMachine, ScaleEvent
from tests.control.outbox import RecordingOutbox

CONFIG = """
providers:
  PROVIDER: {kind: mock, boot_delay: 0}
queues:
  q:
    metrics: {source: celery, url: "redis://127.0.0.1:6379/0"}
    autoscale:
      provider: PROVIDER
      max_workers: 1
      scale_up: [{trigger: queue_depth, target_per_worker: 1}]
      instance: {gpu: "GPU", max_price_per_hour: 1.0}
"""


def _version(rt: Runtime, provider: str, gpu: str) -> int:
    text = CONFIG.replace("PROVIDER", provider).replace("GPU", gpu)
    with rt.transaction() as session:
        row = config_versions.record(
            session, load_config_text(text).model_dump(mode="json"), "t", utc_now()
        )
        assert row is not None
        return row.version


def test_a_launch_rents_what_its_decision_judged_and_terminate_finds_its_provider(tmp_path, db_url):
    migrate.upgrade(db_url)
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url}
    rt = Runtime(Settings.from_env(env), env=env)
    try:
        judged = _version(rt, "sandbox", "RTX 4090")
        now = utc_now()
        reading = {"q": QueueMetrics("q", 5, 60.0, 0, now)}
        (launch_id,) = evaluate(
            rt, RecordingOutbox(), trigger="t", readings=reading, now=now
        ).launched
        with rt.transaction() as session:
            row = instances.get(session, launch_id)
            assert row is not None and row.state == S.PENDING
            assert row.config_version == judged
            event = session.get(ScaleEvent, row.decision_id)
            assert event is not None and (event.kind, event.action) == ("scale_up", "launch")
            assert event.launch_id == launch_id
        # a newer version renames the provider and asks for another GPU before the launch runs
        newer = _version(rt, "elsewhere", "H100")
        assert newer > judged
        assert run_step(launch.STEP, rt, launch_id).kind is Kind.DONE
        with rt.transaction() as session:
            row = instances.get(session, launch_id)
            assert row is not None and row.state == S.BOOTING
            assert row.gpu == "RTX 4090"  # what was decided, not the newest version's H100
            (machine,) = session.scalars(select(MockMachine)).all()
            assert (machine.provider, machine.gpu) == ("sandbox", "RTX 4090")
            moves.move(session, launch_id, S.BOOTING, S.TERMINATING, utc_now(), "test: go")
        # the newest version has no provider "sandbox": the row's version still destroys it
        assert run_step(terminate.STEP, rt, launch_id).kind is Kind.DONE
        with rt.transaction() as session:
            row = instances.get(session, launch_id)
            assert row is not None and row.state == S.TERMINATED
            (machine,) = session.scalars(select(MockMachine)).all()
            assert machine.status == "destroyed"
    finally:
        rt.close()
