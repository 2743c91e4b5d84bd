"""A heartbeat that lands while a reconcile round judges the machine silent keeps it.

The round reads the rows, finds a ready machine silent in two rounds and moves it to
terminating. Its move was conditional on the state alone, which a heartbeat does not change:
an agent that spoke between the round's read and its write had its machine destroyed under its
jobs. Here the agent's heartbeat goes through the API (its real path) just before the round's
move is written, on SQLite and PostgreSQL, and the machine stays ready; without a heartbeat
the same round destroys it (the staging is proven able to destroy).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from autoscaler.api.app import create_app
from autoscaler.control import reconciler
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps import launch
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.lifecycle import InstanceState as S
from autoscaler.store import instances, intents
from autoscaler.store.db import store_now
from autoscaler.store.models import Instance
from tests.control.outbox import RecordingOutbox
from tests.fakes.runpod_server import FakeRunPod
from tests.security.kit import runpod_runtime

KEY = "rpa_SILENCE_RACE_7c1e_not_a_real_key"


class Machine:
    def __init__(self, rt: Runtime, client: TestClient, fake: FakeRunPod, launch_id: str) -> None:
        self.rt, self.client, self.launch_id = rt, client, launch_id
        with rt.transaction() as session:
            intents.add_intents(session, [(launch_id, "q", "pods", "t")], utc_now())
        assert run_step(launch.STEP, rt, launch_id).kind is Kind.DONE
        create = fake.calls("POST", "/v2/pods")[-1]
        self.token = create.body["env"]["AUTOSCALER_WORKER_TOKEN"]
        assert self.heartbeat() == {"drain": False, "state": "ready"}

    def heartbeat(self) -> Any:
        r = self.client.post(
            f"/v1/worker/{self.launch_id}/heartbeat",
            json={"state": "idle"},
            headers={"Authorization": f"Bearer {self.token}"},
        )
        assert r.status_code == 200, r.text
        return r.json()

    def silent_in_two_rounds(self) -> None:
        """Its last heartbeat past the timeout, noted silent by an earlier round."""
        with self.rt.transaction() as session:
            now = store_now(session)
            session.execute(
                sa.update(Instance)
                .where(Instance.launch_id == self.launch_id)
                .values(
                    last_heartbeat_at=now - timedelta(seconds=600),
                    silence_noted_at=now - timedelta(seconds=60),
                )
            )

    def state(self) -> S:
        with self.rt.transaction() as session:
            row = instances.get(session, self.launch_id)
            assert row is not None
            return S(row.state)


@pytest.fixture
def world(tmp_path, db_url) -> Iterator[tuple[Runtime, TestClient, FakeRunPod]]:
    fake = FakeRunPod(KEY)
    rt = runpod_runtime(tmp_path, db_url, fake, KEY, top="poll_interval: 2\nheartbeat_timeout: 60")
    client = TestClient(create_app(rt), raise_server_exceptions=False)
    try:
        yield rt, client, fake
    finally:
        client.close()
        rt.close()
        fake.close()


def _silence_move(params: Any) -> bool:
    values = params.values() if isinstance(params, dict) else params or ()
    return any(v == S.TERMINATING or v == "terminating" for v in values)


def test_a_heartbeat_during_the_round_keeps_a_machine_judged_silent(world):
    rt, client, fake = world
    spoke, quiet = Machine(rt, client, fake, "spoke"), Machine(rt, client, fake, "quiet")
    spoke.silent_in_two_rounds()
    quiet.silent_in_two_rounds()
    fired: list[bool] = []

    def heartbeat_first(conn, cursor, statement, params, context, executemany):
        if fired or not statement.lower().startswith("update instances"):
            return
        if not _silence_move(params):
            return
        fired.append(True)
        assert spoke.heartbeat() == {"drain": False, "state": "ready"}  # commits now

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", heartbeat_first)
    try:
        result = reconciler.run_reconcile(rt, RecordingOutbox())
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", heartbeat_first)
    assert fired, "the round moved nothing: the race was not staged"
    assert result["transitions"] == 2  # both judged silent ...
    assert spoke.state() == S.READY  # ... the one that spoke meanwhile stays
    assert quiet.state() == S.TERMINATING  # the silent one is destroyed as before
