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
from autoscaler.control import reconciler
from autoscaler.control.runtime import utc_now
from autoscaler.control.steps import launch
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.store import instances, intents
from autoscaler.store.db import store_now
from autoscaler.store.models import ScaleEvent
from tests.control.outbox import RecordingOutbox
from tests.fakes.runpod_server import FakeRunPod
from tests.security.kit import runpod_runtime

KEY = "rpa_SKEW_4f9c2e7b1d_not_a_real_key"


def test_a_reconciler_five_minutes_ahead_destroys_no_machine_seen_seconds_ago(tmp_path, pg_url):
    fake = FakeRunPod(KEY)
    rt = runpod_runtime(tmp_path, pg_url, fake, KEY, top="poll_interval: 2\nheartbeat_timeout: 60")
    client = TestClient(create_app(rt), raise_server_exceptions=False)
    try:
        with rt.transaction() as session:
            intents.add_intents(session, [("skew1", "q", "pods", "t")], utc_now())
        assert run_step(launch.STEP, rt, "skew1").kind is Kind.DONE
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
                reconciler.run_reconcile(rt, RecordingOutbox())
                time.sleep(1.1)
        with rt.transaction() as session:
            row = instances.get(session, "skew1")
            assert row is not None and row.state.value == "ready", (row.state, row.state_reason)
            silent = session.scalars(
                select(ScaleEvent).where(ScaleEvent.action.in_(["silent", "ready->terminating"]))
            ).all()
            assert silent == []
    finally:
        client.close()
        rt.close()
        fake.close()
