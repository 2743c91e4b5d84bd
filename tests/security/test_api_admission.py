"""One machine's heartbeats cannot crowd out everyone's (#33, "One machine's heartbeats crowd
out everyone's", the admission half): a real uvicorn serving `create_app()` on PostgreSQL.

The hostile machine's heartbeats are made to hold the store the way the issue's did (each
locked its machine's row and wrote 1,000 job rows): the test holds that row locked, so each of
its heartbeats that goes in stays in until the test lets go. Under one FIFO for all callers,
256 of them took every turn (15, the pool's connections) and queued in front of everyone: the
honest machine's heartbeats and /healthz waited behind them (16 s and 22 s in the issue; for
ever here, while the row is held). Now one machine has at most 2 requests inside and 8
waiting, and the rest of its burst is refused with 429 and Retry-After at once, holding
nothing (`api/admission.py`).
"""

from __future__ import annotations

import json

import psycopg
import pytest
import requests

from tests.agent.agentkit import serve
from tests.api.apikit import make_world
from tests.security.rawhttp import answers, request_head, send

BODY = {"state": "busy", "running_tasks": 1, "tasks": []}
BURST = 256
INSIDE, WAITING = 2, 8  # admission.PER_CALLER, WAITING_PER_CALLER


@pytest.mark.timeout(240)
def test_256_heartbeats_of_one_machine_do_not_hold_up_another(pg_url, tmp_path):
    world = make_world(pg_url, tmp_path)
    lock = psycopg.connect(pg_url.replace("+psycopg", ""))
    sockets = []
    try:
        with serve(world) as api:
            assert requests.get(f"{api}/healthz", timeout=30).status_code == 200
            lock.execute("SELECT 1 FROM instances WHERE launch_id = 'm1' FOR UPDATE")
            body = json.dumps(BODY).encode()
            auth = {"Authorization": f"Bearer {world.tokens['m1']}"}
            hostile = request_head("POST", "/v1/worker/m1/heartbeat", len(body), auth) + body
            sockets = [send(api, hostile) for _ in range(BURST)]

            # the honest machine, after the whole burst was sent: every heartbeat answered,
            # while the hostile ones that went in are still held
            honest = world.h(world.tokens["m2"])
            for _ in range(5):
                r = requests.post(
                    f"{api}/v1/worker/m2/heartbeat", json=BODY, headers=honest, timeout=30
                )
                assert r.status_code == 200, r.text
            assert requests.get(f"{api}/healthz", timeout=30).status_code == 200

            # the burst's excess refused at once, holding nothing; its admitted and waiting
            # ones not answered while the row is held
            refused = answers(sockets, BURST - INSIDE - WAITING, within=60)
            assert len(refused) == BURST - INSIDE - WAITING
            assert {a.status for a in refused.values()} == {429}, {
                a.status: a.body[:200] for a in refused.values()
            }
            sample = next(iter(refused.values()))
            assert sample.header("retry-after") == "1"
            assert "per launch id" in sample.json()["detail"]

            # let go: the 10 are answered in their turn
            lock.rollback()
            held = [s for i, s in enumerate(sockets) if i not in refused]
            rest = answers(held, len(held), within=60)
            assert sorted(a.status for a in rest.values()) == [200] * (INSIDE + WAITING)
        assert world.row("m1").running_tasks == 1
    finally:
        for s in sockets:
            s.close()
        lock.close()
        world.close()
