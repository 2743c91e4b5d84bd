"""A reconciler whose clock runs ahead destroys nobody: one clock stamps and judges silence.

Heartbeats were stamped with the API host's clock and silence judged on the reconciler's: a
reconciler five minutes ahead destroyed a machine seen five seconds ago. Both now ask the state
store's clock (PostgreSQL's), and silence must be found by two reconcile rounds. Here the
machine heartbeats through the API on this host's real clock; then this process's clock jumps
five minutes ahead (time-machine) and two reconcile rounds run: the machine stays.

Real PostgreSQL, the RunPod fake holding the machine, the API in process (its heartbeat
stamps the store's clock whatever the process's says).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import time_machine
from fastapi.testclient import TestClient
from sqlalchemy import select

from autoscaler.api.app import create_app
from autoscaler.config import load_config_text
from autoscaler.control import reconciler
from autoscaler.control.launch import run_launch
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.settings import Settings
from autoscaler.store import config_versions, fleet, migrate
from autoscaler.store.db import store_now
from autoscaler.store.models import ScaleEvent
from tests.fakes.runpod_server import FakeRunPod

KEY = "rpa_SKEW_4f9c2e7b1d_not_a_real_key"


def test_a_reconciler_five_minutes_ahead_destroys_no_machine_seen_seconds_ago(tmp_path, pg_url):
    fake = FakeRunPod(KEY)
    migrate.upgrade(pg_url)
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": pg_url, "RP_KEY": KEY}
    rt = Runtime(Settings.from_env(env), env=env)
    client = TestClient(create_app(rt), raise_server_exceptions=False)
    try:
        config = load_config_text(f"""
poll_interval: 2
heartbeat_timeout: 60
providers:
  pods: {{kind: runpod, base_url: "{fake.url}", api_key_env: RP_KEY,
          gpu_types: ["NVIDIA GeForce RTX 4090"]}}
queues:
  q:
    metrics: {{url: "redis://127.0.0.1:6379/0"}}
    autoscale:
      provider: pods
      max_workers: 1
      instance: {{gpu: "RTX 4090", max_price_per_hour: 0.8}}
""")
        with rt.transaction() as session:
            config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())
            fleet.add_intents(session, [("skew1", "q", "pods", "t")], utc_now())
        assert run_launch(rt, "skew1").startswith("booting")
        (create,) = fake.calls("POST", "/v2/pods")
        token = create.body["env"]["AUTOSCALER_WORKER_TOKEN"]
        r = client.post(
            "/v1/worker/skew1/heartbeat",
            json={"state": "idle"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.json() == {"drain": False, "state": "ready"}, r.text

        ahead = datetime.now(UTC) + timedelta(minutes=5)
        with time_machine.travel(ahead, tick=True):
            with rt.transaction() as session:
                skew = (utc_now() - store_now(session)).total_seconds()
            assert 290 < skew < 310  # this process's clock is five minutes ahead of the store's
            for _ in range(2):  # two rounds, more than half a poll apart
                reconciler.run_reconcile(rt, lambda step, lid: None)
                time.sleep(1.1)
        with rt.transaction() as session:
            row = fleet.get(session, "skew1")
            assert row is not None and row.state.value == "ready", (row.state, row.state_reason)
            silent = session.scalars(
                select(ScaleEvent).where(ScaleEvent.action.in_(["silent", "ready->terminating"]))
            ).all()
            assert silent == []
    finally:
        client.close()
        rt.close()
        fake.close()
