"""An enrolment key opens the queues it was made for, and never the control plane's broker.

`/v1/hand-made/deployment` returned, for any queue, the watched broker's own URL (rights over its
ACL users) and the queue's git token. Now an enrolment key is bound to its queues
(`keys create-enrolment --queue Q`): another queue's deployment or heartbeat is a 403; no
hand-made deployment carries a broker URL (the machine's owner gives it one of its own).
A real uvicorn serving `create_app()`, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import requests

from autoscaler.access import keys
from autoscaler.store import config_versions
from tests.agent.agentkit import serve
from tests.api.apikit import CONFIG, World


@pytest.fixture
def world(world: World) -> Iterator[World]:
    """The API world with a second queue, each with its own git token."""
    w = world
    doc = json.loads(json.dumps(CONFIG))
    doc["queues"]["q1"]["deployment"]["git_token_env"] = "Q1_GIT_TOKEN"
    doc["queues"]["secret-q"] = json.loads(json.dumps(doc["queues"]["q1"]))
    doc["queues"]["secret-q"]["deployment"]["git_token_env"] = "SECRET_GIT_TOKEN"
    with w.rt.transaction() as session:
        config_versions.record(session, doc, "test", datetime.now(UTC), "two queues")
    w.rt.env = {"Q1_GIT_TOKEN": "ghp_q1_token_0123456789", "SECRET_GIT_TOKEN": "ghp_SECRET_987"}
    yield w


def test_an_enrolment_key_opens_its_own_queues_and_no_broker_url(world):
    with serve(world) as api:
        h = world.h(world.enrolment)  # made for q1

        mine = requests.get(f"{api}/v1/hand-made/deployment?queue=q1", headers=h, timeout=10)
        assert mine.status_code == 200, mine.text
        assert mine.json()["git_token"] == "ghp_q1_token_0123456789"
        assert (
            mine.json()["broker_url"] is None
            and "AUTOSCALER_BROKER_URL" in (mine.json()["broker_note"])
        )
        assert "redis://" not in mine.text

        theirs = requests.get(
            f"{api}/v1/hand-made/deployment?queue=secret-q", headers=h, timeout=10
        )
        assert theirs.status_code == 403 and "bound to q1" in theirs.text, theirs.text
        assert "ghp_SECRET" not in theirs.text

        beat = {"name": "desk-1", "queues": ["q1", "secret-q"], "running_tasks": 0}
        r = requests.post(f"{api}/v1/hand-made/heartbeat", json=beat, headers=h, timeout=10)
        assert r.status_code == 403 and "secret-q" in r.text
        beat["queues"] = ["q1"]
        r = requests.post(f"{api}/v1/hand-made/heartbeat", json=beat, headers=h, timeout=10)
        assert r.status_code == 200

        # a key made before keys were bound to queues opens none
        with world.rt.transaction() as session:
            info, legacy = keys.create_key(
                session, keys.ENROLMENT, "old", datetime.now(UTC), ("q1",)
            )
            from sqlalchemy import update

            from autoscaler.store.models import ApiKey

            session.execute(update(ApiKey).where(ApiKey.id == info.id).values(queues=None))
        r = requests.get(
            f"{api}/v1/hand-made/deployment?queue=q1", headers=world.h(legacy), timeout=10
        )
        assert r.status_code == 403 and "predates" in r.text


def test_keys_refuse_an_enrolment_key_without_queues_and_an_admin_key_with_them(world):
    with world.rt.transaction() as session:
        with pytest.raises(ValueError, match="--queue"):
            keys.create_key(session, keys.ENROLMENT, "desk", datetime.now(UTC))
        with pytest.raises(ValueError, match="no --queue"):
            keys.create_key(session, keys.ADMIN, "ops2", datetime.now(UTC), ("q1",))
