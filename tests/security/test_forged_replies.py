"""Replies and heartbeats that lie count for nothing.

As queue A's broker user, a rented machine answered inspect broadcasts for five ghost workers
on queue B: the loop counted five hand-made workers for B and launched nothing for 200 waiting
jobs; a reply under another machine's label moved that machine's liveness and running count.
Now a machine whose agent heartbeats is known from its authenticated heartbeats alone, and
broker-seen hand-made capacity counts only where `hand_made` allows it — by default never on a
watched Redis where rented machines get users of their own. The loop's own tick and
worker-status port on SQLite and PostgreSQL; the sightings are written as remote control's
replies are (a forged one is a sighting like any other).
"""

from __future__ import annotations

from datetime import timedelta

from autoscaler.brokers.workers import WorkerStatus
from autoscaler.config import load_config_text
from autoscaler.control.observe import record_sightings
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.tick.evaluate import evaluate
from autoscaler.lifecycle import InstanceState as S
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.settings import Settings
from autoscaler.store import config_versions, instances, migrate
from autoscaler.store.models import Instance
from tests.control.outbox import RecordingOutbox

DOMAIN = "redis://127.0.0.1:6379/0"  # queue b's, where its replies are heard
CONFIG = """
providers:
  sandbox: {kind: mock}
queues:
  b:
    metrics: {source: celery, url: "redis://127.0.0.1:6379/0"}
    autoscale:
      provider: sandbox
      max_workers: 3
      HAND_MADE
      scale_up: [{trigger: queue_depth, target_per_worker: 10}]
      instance: {gpu: "RTX 4090", max_price_per_hour: 0.5}
"""


def _runtime(tmp_path, db_url, api_url: bool) -> Runtime:
    migrate.upgrade(db_url)
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url}
    if api_url:
        env["AUTOSCALER_API_URL"] = "https://autoscaler.example.invalid"
    return Runtime(Settings.from_env(env), env=env)


def _launches(rt: Runtime, hand_made: str | None, ghosts: int) -> int:
    text = CONFIG.replace("HAND_MADE", f"hand_made: {hand_made}" if hand_made else "")
    now = utc_now()
    with rt.transaction() as session:
        config_versions.record(session, load_config_text(text).model_dump(mode="json"), "t", now)
        install = rt.installation_id(session)
        seen = {f"ghost-{i}@host-{i}": WorkerStatus(("b",), 0) for i in range(ghosts)}
        record_sightings(session, seen, install, now, DOMAIN)
    reading = {"b": QueueMetrics("b", 200, 60.0, 0, now)}
    result = evaluate(rt, RecordingOutbox(), trigger="t", readings=reading, now=now)
    return len(result.launched)


def test_forged_hand_made_workers_do_not_stop_renting_where_machines_have_users(tmp_path, db_url):
    rt = _runtime(tmp_path, db_url, api_url=True)
    try:
        # five ghost replies for queue b: by default (auto) they are no capacity here
        assert _launches(rt, None, ghosts=5) == 3
    finally:
        rt.close()


def test_broker_seen_workers_count_where_the_operator_allows_it(tmp_path, db_url):
    rt = _runtime(tmp_path, db_url, api_url=True)
    try:
        assert _launches(rt, "broker", ghosts=5) == 0  # the operator trusts the broker
    finally:
        rt.close()


def test_without_per_machine_users_broker_seen_workers_count_as_before(tmp_path, db_url):
    rt = _runtime(tmp_path, db_url, api_url=False)
    try:
        assert _launches(rt, None, ghosts=5) == 0
    finally:
        rt.close()


def test_a_reply_under_an_agent_machines_label_moves_nothing_of_its_row(tmp_path, db_url):
    rt = _runtime(tmp_path, db_url, api_url=True)
    try:
        then = utc_now() - timedelta(minutes=3)
        with rt.transaction() as session:
            config_versions.record(
                session,
                load_config_text(CONFIG.replace("HAND_MADE", "")).model_dump(mode="json"),
                "t",
                then,
            )
            install = rt.installation_id(session)
            for lid, state, agent in (("agentrow", S.READY, then), ("bootrow", S.BOOTING, then)):
                session.add(
                    Instance(
                        launch_id=lid,
                        queue="b",
                        provider="sandbox",
                        state=state,
                        created_at=then,
                        ready_at=then if state == S.READY else None,
                        booting_at=then,
                        last_heartbeat_at=then,
                        running_tasks=0,
                        agent_registered_at=agent,
                        worker_name=f"agent@{lid}",
                    )
                )
        forged = {
            f"asg-{install}-agentrow@evil": WorkerStatus(("b",), 7),
            f"asg-{install}-bootrow@evil": WorkerStatus(("b",), 1),
        }
        with rt.transaction() as session:
            record_sightings(session, forged, install, utc_now(), DOMAIN)
        with rt.transaction() as session:
            agent_row = instances.get(session, "agentrow")
            boot_row = instances.get(session, "bootrow")
            assert agent_row is not None and boot_row is not None
            assert agent_row.running_tasks == 0 and agent_row.last_heartbeat_at == then
            assert agent_row.worker_name == "agent@agentrow"
            assert boot_row.state == S.BOOTING  # not made ready by a reply
    finally:
        rt.close()
