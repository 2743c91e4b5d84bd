"""A launch's worker token never leaks through a provider's error text.

Some APIs quote the request in their errors; the request of a create carries the machine's
environment, its worker token included. The token is registered with the HTTP client's redaction
for the call, and the launch scrubs it again before anything is written: not in the events, the
logs or the task's result. Against the RunPod fake echoing the request in its refusal.
"""

from __future__ import annotations

import logging

from sqlalchemy import select

from autoscaler.control.runtime import utc_now
from autoscaler.control.steps import launch
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.store import intents
from autoscaler.store.models import ScaleEvent
from tests.fakes.runpod_server import FakeRunPod
from tests.security.kit import runpod_runtime

KEY = "rpa_SECRETS_4f9c2e7b1d_not_a_real_key"


def test_a_refusal_quoting_the_request_never_carries_the_worker_token(tmp_path, db_url, caplog):
    caplog.set_level(logging.DEBUG)
    fake = FakeRunPod(KEY)
    fake.refuse_create = True
    fake.capacity_status = 400
    fake.echo_request_in_errors = True
    rt = runpod_runtime(tmp_path, db_url, fake, KEY)
    try:
        with rt.transaction() as session:
            intents.add_intents(session, [("l1", "q", "pods", "t")], utc_now())
        result = run_step(launch.STEP, rt, "l1")
        (create,) = fake.calls("POST", "/v2/pods")
        token = create.body["env"]["AUTOSCALER_WORKER_TOKEN"]
        assert len(token) >= 32
        assert result.kind is Kind.FAILED and "request:" in str(result)  # the echo came back
        with rt.transaction() as session:
            said = [
                f"{e.reason} {e.details}"
                for e in session.scalars(select(ScaleEvent).where(ScaleEvent.launch_id == "l1"))
            ]
        assert said and all(token not in s for s in said), said
        assert token not in str(result)
        assert all(token not in r.getMessage() for r in caplog.records)
    finally:
        rt.close()
        fake.close()
