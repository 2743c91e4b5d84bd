"""A launch's worker token never leaks through a provider's error text.

Some APIs quote the request in their errors; the request of a create carries the machine's
environment, its worker token included. The token is registered with the HTTP client's redaction
for the call, and the launch scrubs it again before anything is written: not in the events, the
logs or the task's result. Against the RunPod fake echoing the request in its refusal.
"""

from __future__ import annotations

import logging

from sqlalchemy import select

from autoscaler.config import load_config_text
from autoscaler.control.launch import run_launch
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.settings import Settings
from autoscaler.store import config_versions, fleet, migrate
from autoscaler.store.models import ScaleEvent
from tests.fakes.runpod_server import FakeRunPod

KEY = "rpa_SECRETS_4f9c2e7b1d_not_a_real_key"


def test_a_refusal_quoting_the_request_never_carries_the_worker_token(tmp_path, db_url, caplog):
    caplog.set_level(logging.DEBUG)
    fake = FakeRunPod(KEY)
    fake.refuse_create = True
    fake.capacity_status = 400
    fake.echo_request_in_errors = True
    migrate.upgrade(db_url)
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url, "RP_KEY": KEY}
    rt = Runtime(Settings.from_env(env), env=env)
    try:
        config = load_config_text(f"""
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
            fleet.add_intents(session, [("l1", "q", "pods", "t")], utc_now())
        result = run_launch(rt, "l1")
        (create,) = fake.calls("POST", "/v2/pods")
        token = create.body["env"]["AUTOSCALER_WORKER_TOKEN"]
        assert len(token) >= 32
        assert result.startswith("failed") and "request:" in result  # the echo did come back
        with rt.transaction() as session:
            said = [
                f"{e.reason} {e.details}"
                for e in session.scalars(select(ScaleEvent).where(ScaleEvent.launch_id == "l1"))
            ]
        assert said and all(token not in s for s in said), said
        assert token not in result
        assert all(token not in r.getMessage() for r in caplog.records)
    finally:
        rt.close()
        fake.close()
