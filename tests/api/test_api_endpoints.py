"""What the API does: heartbeats write the columns reconcile reads, the answer carries "drain
now", drained hands the machine over to be destroyed, bad input is a 4xx naming the field,
config updates validate like `autoscaler validate` and version like `apply`, /metrics."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import pytest

from autoscaler.lifecycle import InstanceState as S
from tests.api.apikit import World, add_warm_pool, make_world, stop_machine, warm_events


@pytest.fixture
def world(db_url, tmp_path) -> Iterator[World]:
    w = make_world(db_url, tmp_path)
    try:
        yield w
    finally:
        w.close()


def test_register_and_heartbeat_write_the_columns_observe_writes(world):
    tok = world.h(world.tokens["m1"])
    r = world.client.post("/v1/worker/m1/register", json={"worker_name": "agent@m1"}, headers=tok)
    assert r.status_code == 200 and r.json()["queue"] == "q1"
    row = world.row("m1")
    assert row.worker_name == "agent@m1" and row.agent_registered_at is not None
    last = (datetime.now(UTC) - timedelta(seconds=30)).isoformat()
    r = world.client.post(
        "/v1/worker/m1/heartbeat",
        json={"state": "busy", "running_tasks": 2, "last_task_at": last, "gpu_utilisation": 80},
        headers=tok,
    )
    assert r.status_code == 200 and r.json() == {"drain": False, "state": "ready"}
    row = world.row("m1")
    assert row.running_tasks == 2 and row.last_heartbeat_at is not None
    assert row.gpu_utilisation == 80
    assert abs((row.last_task_at - datetime.fromisoformat(last)).total_seconds()) < 1
    # a last task time in the future is clamped to now
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    world.client.post(
        "/v1/worker/m1/heartbeat", json={"state": "idle", "last_task_at": future}, headers=tok
    )
    assert world.row("m1").last_task_at <= datetime.now(UTC)


def test_a_booting_machine_is_ready_at_its_agents_first_heartbeat(world):
    """Registering is no sign of the worker (the agent deploys first); the heartbeat the agent
    sends as it starts its worker makes the machine ready at once — the move, the event and the
    cleared backoff reconcile would give — so status, the dashboard and drain never show a
    machine that runs jobs as booting."""
    from sqlalchemy import select

    from autoscaler.config.models import Backoff
    from autoscaler.control import machines
    from autoscaler.store import backoffs
    from autoscaler.store.models import ScaleEvent
    from tests.api.apikit import add_machine

    token = add_machine(world.rt, "m3", S.BOOTING)
    tok = world.h(token)
    with world.rt.transaction() as session:
        machines.rental_failed(
            session, "q1", "sandbox", datetime.now(UTC), Backoff(base=30, jitter=0), "boom"
        )
    world.client.post("/v1/worker/m3/register", json={"worker_name": "agent@m3"}, headers=tok)
    row = world.row("m3")
    assert row.state == S.BOOTING and row.last_heartbeat_at is None
    r = world.client.post("/v1/worker/m3/heartbeat", json={"state": "starting"}, headers=tok)
    assert r.json() == {"drain": False, "state": "booting"}
    assert world.row("m3").last_heartbeat_at is None  # starting: not its worker's life yet
    r = world.client.post("/v1/worker/m3/heartbeat", json={"state": "idle"}, headers=tok)
    assert r.status_code == 200 and r.json() == {"drain": False, "state": "ready"}
    row = world.row("m3")
    assert row.state == S.READY and row.ready_at is not None and row.last_heartbeat_at
    world.client.post(
        "/v1/worker/m3/heartbeat", json={"state": "busy", "running_tasks": 1}, headers=tok
    )
    with world.rt.transaction() as session:
        moves = session.scalars(
            select(ScaleEvent.action).where(
                ScaleEvent.launch_id == "m3", ScaleEvent.kind == "lifecycle"
            )
        ).all()
        assert moves == ["booting->ready"]  # once
        assert backoffs.by_queue(session) == {}


def test_heartbeat_answers_drain_now_once_draining_and_drained_hands_it_over(world):
    tok = world.h(world.tokens["m1"])
    r = world.client.post("/v1/worker/m1/drained", headers=tok)
    assert r.status_code == 409 and "nobody asked" in r.json()["detail"]
    world.set_state("m1", S.DRAINING)
    r = world.client.post(
        "/v1/worker/m1/heartbeat", json={"state": "busy", "running_tasks": 1}, headers=tok
    )
    assert r.json()["drain"] is True
    r = world.client.post("/v1/worker/m1/drained", headers=tok)
    assert r.status_code == 200
    assert world.row("m1").state == S.TERMINATING
    # its token is now dead: terminating machines call nothing
    r = world.client.post("/v1/worker/m1/heartbeat", json={"state": "idle"}, headers=tok)
    assert r.status_code == 401


def test_a_heartbeat_answers_from_the_state_its_write_found_not_the_token_checks(world):
    """A booting machine cancelled (or timed out by reconcile) between the token check's read
    and the heartbeat's write: the answer says drain and its state as the write found it, so
    the agent starts no worker on a machine being destroyed."""
    import sqlalchemy as sa

    from autoscaler.store.models import Instance

    world.set_state("m1", S.BOOTING)
    other = sa.create_engine(world.rt.settings.database_url)
    fired: list[str] = []

    def cancel_first(conn, cursor, statement, params, context, executemany):
        sql = statement.lower()
        heartbeat_write = sql.startswith("update instances") and "running_tasks" in sql
        if fired or conn.engine is other or not heartbeat_write:
            return
        fired.append(statement)
        with other.begin() as c:  # another transaction commits the move first
            moved = c.execute(
                sa.update(Instance)
                .where(Instance.launch_id == "m1", Instance.state == S.BOOTING)
                .values(state=S.TERMINATING)
            ).rowcount
        assert moved == 1

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", cancel_first)
    try:
        r = world.client.post(
            "/v1/worker/m1/heartbeat",
            json={"state": "idle", "running_tasks": 0},
            headers=world.h(world.tokens["m1"]),
        )
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", cancel_first)
        other.dispose()
    assert fired, "the heartbeat wrote nothing: the race was not staged"
    assert r.status_code == 200, r.text
    assert r.json() == {"drain": True, "state": "terminating"}
    assert world.row("m1").state == S.TERMINATING


def test_a_crashed_worker_is_reported_in_the_events(world):
    tok = world.h(world.tokens["m1"])
    r = world.client.post(
        "/v1/worker/m1/heartbeat", json={"state": "crashed", "detail": "exit 3"}, headers=tok
    )
    assert r.status_code == 200
    events = world.client.get(
        "/v1/admin/events?kind=agent&launch_id=m1", headers=world.h(world.admin)
    ).json()
    assert any(e["action"] == "crashed" and "exit 3" in e["reason"] for e in events)


def test_an_events_since_outside_utc_is_refused_and_one_inside_is_converted(world):
    """Year 1 at +08:00 is before UTC's first instant: a 422 naming `since`, not a 503 from
    the store's conversion (found by the API fuzz)."""
    admin = world.h(world.admin)
    r = world.client.get("/v1/admin/events?since=0001-01-01T01:00:00%2B08:00", headers=admin)
    assert r.status_code == 422, r.text
    assert [p["field"] for p in r.json()["detail"]] == ["query.since"]
    tok = world.h(world.tokens["m1"])
    world.client.post(
        "/v1/worker/m1/heartbeat", json={"state": "crashed", "detail": "x"}, headers=tok
    )
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    earlier = (datetime.now(UTC) - timedelta(hours=1)).astimezone(timezone(timedelta(hours=-5)))
    for since, seen in ((later, False), (earlier.isoformat(), True)):
        r = world.client.get("/v1/admin/events", params={"since": since}, headers=admin)
        assert r.status_code == 200, r.text
        assert any(e["action"] == "crashed" for e in r.json()) is seen, since


def test_bad_input_is_a_4xx_naming_the_field(world):
    tok = world.h(world.tokens["m1"])
    r = world.client.post(
        "/v1/worker/m1/heartbeat", json={"state": "dancing", "running_tasks": -1}, headers=tok
    )
    assert r.status_code == 422
    fields = {p["field"] for p in r.json()["detail"]}
    assert fields == {"state", "running_tasks"}, r.json()
    r = world.client.post("/v1/worker/m1/heartbeat", content=b"{not json", headers=tok)
    assert r.status_code == 422 and "Traceback" not in r.text
    r = world.client.get("/v1/admin/instances?state=nonsense", headers=world.h(world.admin))
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "query.state"


def test_deployment_gives_the_broker_through_the_machines_own_user_only(world):
    tok = world.h(world.tokens["m1"])
    dep = world.client.get("/v1/worker/m1/deployment", headers=tok).json()
    assert dep["git_url"] == "file:///nowhere/repo.git" and dep["git_ref"] == "main"
    assert dep["startup_cmd"] == "celery -A tasks worker"
    # no user was made at this (hand-written) launch: no URL, and it says why
    assert dep["broker_url"] is None and "no broker user" in dep["broker_note"]


def test_config_update_is_validated_and_versioned(world):
    adm = world.h(world.admin)
    r = world.client.put(
        "/v1/admin/config", json={"yaml": "queues:\n  q1:\n    bogus: 1\n"}, headers=adm
    )
    assert r.status_code == 422
    problem = r.json()["detail"][0]
    assert "bogus" in problem["field"] and problem["reason"] and problem["fix"]
    assert world.client.get("/v1/admin/config", headers=adm).json()["version"] == 1
    import yaml

    from tests.api.apikit import CONFIG

    doc = {**CONFIG, "poll_interval": 7}
    r = world.client.put(
        "/v1/admin/config", json={"yaml": yaml.safe_dump(doc), "comment": "x"}, headers=adm
    )
    assert r.status_code == 200 and r.json() == {"version": 2, "changed": True}, r.text
    got = world.client.get("/v1/admin/config", headers=adm).json()
    assert got["version"] == 2 and got["document"]["poll_interval"] == 7.0
    assert "ops" in got["changed_by"]


def test_scale_drain_and_providers_for_admins(world):
    adm = world.h(world.admin)
    r = world.client.post("/v1/admin/queues/q1/scale", json={"workers": 9}, headers=adm)
    assert r.status_code == 409 and "max_workers" in r.json()["detail"]
    r = world.client.post(
        "/v1/admin/queues/q1/scale", json={"workers": 2, "for": "10m"}, headers=adm
    )
    assert r.status_code == 200 and "pinned q1 at 2" in r.json()["message"]
    r = world.client.post("/v1/admin/instances/m2/drain", headers=adm)
    assert r.status_code == 200, r.text
    assert world.row("m2").state in (S.DRAINING, S.TERMINATING)
    provs = world.client.get("/v1/admin/providers", headers=adm).json()
    assert isinstance(provs, list)


def test_metrics_and_healthz(world):
    r = world.client.get("/healthz")
    assert r.status_code == 200
    text = world.client.get("/metrics").text
    assert 'autoscaler_workers{queue="q1",state="ready"} 2.0' in text
    assert 'autoscaler_spend_rate_dollars_per_hour{queue="q1"} 0.2' in text


def test_metrics_show_the_warm_pool(world):
    """Stopped machines per queue, what they bill (their storage price, also in the spend
    rate), the pool's size, warm hits and misses from the audit trail; the admin list shows a
    stopped machine's warm columns."""
    before = world.client.get("/metrics").text
    assert "autoscaler_warm_pool_size{" not in before  # no pool configured: no series
    assert "autoscaler_warm_pool_stopped{" not in before
    add_warm_pool(world, size=2)
    stopped_at = datetime.now(UTC) - timedelta(minutes=5)
    stop_machine(world, "m2", 0.005, stopped_at)
    warm_events(world, "hit", "hit", "miss", "stopped", "resume")
    text = world.client.get("/metrics").text
    assert 'autoscaler_workers{queue="q1",state="stopped"} 1.0' in text
    assert 'autoscaler_workers{queue="q1",state="ready"} 1.0' in text
    # m1 at its price (0.1), the stopped m2 at its storage price only
    spend = text.split('autoscaler_spend_rate_dollars_per_hour{queue="q1"} ')[1].split()[0]
    assert float(spend) == pytest.approx(0.105)
    assert 'autoscaler_warm_pool_size{queue="q1"} 2.0' in text
    assert 'autoscaler_warm_pool_stopped{queue="q1"} 1.0' in text
    assert 'autoscaler_warm_pool_storage_dollars_per_hour{queue="q1"} 0.005' in text
    assert 'autoscaler_warm_hits_total{queue="q1"} 2.0' in text
    assert 'autoscaler_warm_misses_total{queue="q1"} 1.0' in text
    r = world.client.get("/v1/admin/instances?state=stopped", headers=world.h(world.admin))
    assert r.status_code == 200, r.text
    (m2,) = r.json()
    assert m2["launch_id"] == "m2" and m2["storage_price_per_hour"] == 0.005
    assert datetime.fromisoformat(m2["stopped_at"]) == stopped_at
    assert m2["keep_warm"] is True and m2["resumes"] == 0


def test_hand_made_heartbeat_counts_as_capacity(world):
    from autoscaler.control.observe import read_sightings

    r = world.client.post(
        "/v1/hand-made/heartbeat",
        json={"name": "desk-1", "queues": ["q1"], "running_tasks": 1},
        headers=world.h(world.enrolment),
    )
    assert r.status_code == 200 and r.json()["drain"] is False
    with world.rt.transaction() as session:
        seen, _, _ = read_sightings(session, "inst", set(), datetime.now(UTC), 60)
    assert seen == {"q1": ("agent@desk-1",)}


def _jobs(now: float, *ids: str, queue: str | None = "q1") -> list[dict[str, object]]:
    return [
        {
            "id": i,
            "queue": queue,
            "published_at": now - 30 - n,
            "started_at": now - 20,
            "finished_at": now - 20 + 5 + n,
        }
        for n, i in enumerate(ids)
    ]


def _records(world: World) -> list[tuple[object, ...]]:
    from sqlalchemy import select

    from autoscaler.store.models import JobRecord

    with world.rt.transaction() as session:
        return [
            (r.queue, r.task_id, r.worker, round(r.runtime_s, 3), r.arrived_at is not None)
            for r in session.scalars(select(JobRecord).order_by(JobRecord.task_id))
        ]


def test_heartbeats_record_the_jobs_the_worker_finished_once_each(world):
    tok = world.h(world.tokens["m1"])
    now = datetime.now(UTC).timestamp()
    body = {"state": "idle", "jobs": _jobs(now, "t1", "t2")}
    for _ in range(2):  # a retried heartbeat records nothing twice
        assert (
            world.client.post("/v1/worker/m1/heartbeat", json=body, headers=tok).status_code == 200
        )
    assert _records(world) == [
        ("q1", "t1", "agent@m1", 5.0, True),
        ("q1", "t2", "agent@m1", 6.0, True),
    ]
    # a hand-made machine's jobs count for the queue they name when it serves it
    r = world.client.post(
        "/v1/hand-made/heartbeat",
        json={"name": "desk-1", "queues": ["q1"], "jobs": _jobs(now, "h1", queue="other")},
        headers=world.h(world.enrolment),
    )
    assert r.status_code == 200
    assert ("q1", "h1", "agent@desk-1", 5.0, True) in _records(world)


def test_job_reports_never_cost_the_heartbeat_clocks_are_clamped_garbage_refused(world):
    tok = world.h(world.tokens["m1"])
    now = datetime.now(UTC).timestamp()
    skewed = _jobs(now, "t1")
    skewed[0]["finished_at"] = now - 100  # a worker clock stepping back
    skewed[0]["published_at"] = now - 10  # a producer clock ahead of the worker's
    skewed[0]["queue"] = "not a/name"  # any routing key: it is only compared
    r = world.client.post(
        "/v1/worker/m1/heartbeat", json={"state": "busy", "jobs": skewed}, headers=tok
    )
    assert r.status_code == 200
    assert _records(world) == [("q1", "t1", "agent@m1", 0.0, True)]
    with world.rt.transaction() as session:
        from sqlalchemy import select

        from autoscaler.store.models import JobRecord

        row = session.scalars(select(JobRecord)).one()
        assert row.arrived_at == row.started_at == row.finished_at
    # what no agent sends is still refused, naming the field
    r = world.client.post(
        "/v1/worker/m1/heartbeat",
        json={"state": "idle", "jobs": [{"id": "x", "started_at": -1, "finished_at": 1}]},
        headers=tok,
    )
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "jobs.0.started_at"
    r = world.client.post(
        "/v1/worker/m1/heartbeat",
        json={"state": "idle", "jobs": _jobs(now, "x") * 1001},
        headers=tok,
    )
    assert r.status_code == 422
    assert len(_records(world)) == 1


def test_a_flood_of_crash_reports_writes_one_event_a_minute(world):
    """2,051 `crashed` reports in 8 s once filled the newest events with one machine's: now
    at most one event per machine per minute (the state still moves with every report)."""
    tok = world.h(world.tokens["m1"])
    for i in range(40):
        r = world.client.post(
            "/v1/worker/m1/heartbeat", json={"state": "crashed", "detail": f"exit {i}"}, headers=tok
        )
        assert r.status_code == 200
    events = world.client.get(
        "/v1/admin/events?kind=agent&launch_id=m1", headers=world.h(world.admin)
    ).json()
    crashed = [e for e in events if e["action"] == "crashed"]
    assert len(crashed) == 1 and "exit 0" in crashed[0]["reason"]
