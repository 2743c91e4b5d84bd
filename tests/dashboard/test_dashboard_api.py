"""The dashboard's endpoints: admin key only; the numbers are `autoscaler status`'s (the same
store views); the chart's history is recorded once per reading; a preview gives validate's
refusals or its dry run and stores nothing; a queue edit and a rollback are new versions with
who and why; a stale edit is refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from sqlalchemy import text as sql

from autoscaler.store import config_versions, machine_views, queue_views
from tests.api.apikit import CONFIG, World, add_warm_pool, stop_machine, warm_events
from tests.dashboard.dashkit import HISTORY, PENDING_NOW, dashboard_world

ENDPOINTS = [
    ("GET", "/v1/admin/overview", None),
    ("GET", "/v1/admin/history?hours=6", None),
    ("GET", "/v1/admin/queues/q1/autoscale", None),
    ("PUT", "/v1/admin/queues/q1/autoscale", {"yaml": "provider: sandbox"}),
    ("POST", "/v1/admin/config/preview", {"yaml": "queues: {}"}),
    ("GET", "/v1/admin/config/versions", None),
    ("GET", "/v1/admin/config/versions/1", None),
    ("POST", "/v1/admin/config/rollback", {"version": 1}),
]

SLOW_POLL = "max_workers: 3\npoll_interval: 10m"
"""An edit `validate` refuses: a poll longer than heartbeat_timeout (5 min)."""


@pytest.fixture
def world(db_url, tmp_path) -> Iterator[World]:
    w = dashboard_world(db_url, tmp_path)
    try:
        yield w
    finally:
        w.close()


def versions(world: World) -> list[dict]:
    r = world.client.get("/v1/admin/config/versions", headers=world.h(world.admin))
    assert r.status_code == 200
    return r.json()


def autoscale_yaml(world: World) -> str:
    r = world.client.get("/v1/admin/queues/q1/autoscale", headers=world.h(world.admin))
    assert r.status_code == 200, r.text
    return r.json()["yaml"]


def test_dashboard_endpoints_need_a_live_admin_key(world):
    keys = {
        None: 401,
        "asga_" + "x" * 43: 401,
        world.admin_revoked: 401,
        world.enrolment: 401,
        world.tokens["m1"]: 401,
    }
    before = versions(world)
    for method, path, body in ENDPOINTS:
        for key, status in keys.items():
            r = world.client.request(method, path, json=body, headers=world.h(key))
            assert r.status_code == status, (method, path, key, r.text)
        r = world.client.request(method, path, json=body, headers=world.h(world.admin))
        assert r.status_code not in (401, 403) and r.status_code < 500, (method, path, r.text)
    # the page itself is public and holds no key, no data
    page = world.client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for secret in (world.admin, world.enrolment, *world.tokens.values()):
        assert secret not in page.text
    assert world.client.get("/dashboard/static/app.js").status_code == 200
    assert len(versions(world)) >= len(before)


def test_dashboard_overview_shows_what_status_reads(world):
    r = world.client.get("/v1/admin/overview", headers=world.h(world.admin))
    assert r.status_code == 200
    got = r.json()
    with world.rt.transaction() as session:
        now = datetime.fromisoformat(got["now"])
        want = [v.as_json() for v in queue_views.queues(session, now)]
        machines = [m.as_json() for m in machine_views.instances(session, now)]
    q1 = next(q for q in got["queues"] if q["queue"] == "q1")
    assert {k: v for k, v in q1.items() if k not in ("configured", "autoscale")} == want[0]
    assert q1["pending"] == PENDING_NOW and q1["workers"]["live"] == 2
    assert q1["desired"] == 2 and "no_workers: quiet" in q1["why"]
    assert q1["autoscale"]["max_workers"] == 3 and q1["autoscale"]["provider"] == "sandbox"
    assert [m["launch_id"] for m in got["instances"]] == [m["launch_id"] for m in machines]
    assert got["events"][0]["action"] in ("drained", "launch")
    assert got["config"]["version"] == 1


def test_dashboard_overview_shows_the_warm_pool(world):
    """Per queue the pool (stopped of its size, storage $/h, today's hits and misses); the
    machines list has the stopped one with its storage price, since when, and when it goes."""
    add_warm_pool(world, size=2, keep_for=3600)
    stopped_at = datetime.now(UTC) - timedelta(minutes=10)
    stop_machine(world, "m2", 0.004, stopped_at)
    warm_events(world, "hit", "miss", "miss")
    got = world.client.get("/v1/admin/overview", headers=world.h(world.admin)).json()
    q1 = next(q for q in got["queues"] if q["queue"] == "q1")
    assert q1["warm_pool"] == {
        "size": 2,
        "keep_for_seconds": 3600.0,
        "stopped": 1,
        "stopping": 0,
        "resuming": 0,
        "storage_per_hour": 0.004,
        "hits_today": 1,
        "misses_today": 2,
    }
    assert q1["workers"]["live"] == 1  # a stopped machine is not capacity
    m2 = next(m for m in got["instances"] if m["launch_id"] == "m2")
    assert m2["state"] == "stopped" and m2["storage_price_per_hour"] == 0.004
    assert datetime.fromisoformat(m2["stopped_at"]) == stopped_at
    assert datetime.fromisoformat(m2["destroy_at"]) == stopped_at + timedelta(hours=1)
    m1 = next(m for m in got["instances"] if m["launch_id"] == "m1")
    assert m1["stopped_at"] is None and m1["destroy_at"] is None


def test_dashboard_history_has_one_point_per_reading(world):
    adm = world.h(world.admin)
    for _ in range(3):  # showing the same reading again records nothing new
        world.client.get("/v1/admin/overview", headers=adm)
        world.client.get("/metrics")
    hist = world.client.get("/v1/admin/history?hours=6", headers=adm).json()
    points = hist["queues"]["q1"]
    assert [p["pending"] for p in points] == [p for _, p, _ in HISTORY]
    assert [p["workers"] for p in points] == [w for _, _, w in HISTORY]
    assert all(p["desired"] == 2 for p in points)
    short = world.client.get("/v1/admin/history?hours=1", headers=adm).json()
    assert [p["pending"] for p in short["queues"]["q1"]] == [PENDING_NOW]
    r = world.client.get("/v1/admin/history?hours=0", headers=adm)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "query.hours"


def test_dashboard_history_is_recorded_by_a_metrics_scrape(world):
    from tests.dashboard.dashkit import save_reading

    save_reading(world, 77, datetime.now(UTC))
    assert world.client.get("/metrics").status_code == 200
    with world.rt.transaction() as session:
        from autoscaler.store import queue_samples

        rows = queue_samples.since(session, datetime(2000, 1, 1, tzinfo=UTC))
    assert [s.pending for s in rows][-1] == 77 and len(rows) == len(HISTORY) + 1


def test_dashboard_preview_gives_validates_refusals_and_stores_nothing(world):
    adm = world.h(world.admin)
    text = autoscale_yaml(world)
    assert "max_workers: 3" in text
    bad = text.replace("max_workers: 3", SLOW_POLL)
    r = world.client.post(
        "/v1/admin/config/preview", json={"queue": "q1", "autoscale": bad}, headers=adm
    )
    assert r.status_code == 422
    (problem,) = r.json()["detail"]
    assert problem["field"] == "queues.q1.autoscale.poll_interval"
    assert "declared silent between two checks" in problem["reason"] and problem["fix"]
    # the same refusal `autoscaler validate` gives for that document
    from autoscaler.config.errors import ConfigError
    from autoscaler.config.loader import load_config_text

    doc = yaml.safe_load(yaml.safe_dump(CONFIG))
    doc["queues"]["q1"]["autoscale"]["poll_interval"] = "10m"
    with pytest.raises(ConfigError) as exc:
        load_config_text(yaml.safe_dump(doc), "x", {}, runnable=True)
    assert f"{problem['field']}: {problem['reason']} — fix: {problem['fix']}" in exc.value.render()
    # YAML that does not parse, and an unknown key: refusals too, with a path
    r = world.client.post(
        "/v1/admin/config/preview", json={"queue": "q1", "autoscale": "a: [1"}, headers=adm
    )
    assert r.status_code == 422 and r.json()["detail"][0]["fix"]
    r = world.client.post(
        "/v1/admin/config/preview",
        json={"queue": "q1", "autoscale": text + "bogus: 1\n"},
        headers=adm,
    )
    assert r.status_code == 422 and "bogus" in r.json()["detail"][0]["field"]
    good = text.replace("max_workers: 3", "max_workers: 5")
    r = world.client.post(
        "/v1/admin/config/preview", json={"queue": "q1", "autoscale": good}, headers=adm
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["changes"] == ["queues.q1.autoscale.max_workers: 3 → 5"]
    assert "bounds: 0..5 machines" in body["dry_run"] and body["base_version"] == 1
    # a whole config, and neither form
    r = world.client.post(
        "/v1/admin/config/preview", json={"yaml": yaml.safe_dump(CONFIG)}, headers=adm
    )
    assert r.status_code == 200 and r.json()["changes"] == []
    r = world.client.post("/v1/admin/config/preview", json={"queue": "q1"}, headers=adm)
    assert r.status_code == 422
    r = world.client.post(
        "/v1/admin/config/preview", json={"queue": "nope", "autoscale": good}, headers=adm
    )
    assert r.status_code == 404
    assert [v["version"] for v in versions(world)] == [1]


def test_dashboard_queue_edit_and_rollback_are_new_versions_with_who_and_why(world):
    adm = world.h(world.admin)
    text = autoscale_yaml(world)
    r = world.client.put(
        "/v1/admin/queues/q1/autoscale",
        json={"yaml": text.replace("max_workers: 3", SLOW_POLL), "changed_by": "alice"},
        headers=adm,
    )
    assert r.status_code == 422 and [v["version"] for v in versions(world)] == [1]
    r = world.client.put(
        "/v1/admin/queues/q1/autoscale",
        json={
            "yaml": text.replace("max_workers: 3", "max_workers: 5"),
            "changed_by": "alice",
            "comment": "evening burst",
            "base_version": 1,
        },
        headers=adm,
    )
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 2 and r.json()["changed"] is True
    v2 = versions(world)[0]
    assert v2["changed_by"] == "alice (admin key ops)" and v2["comment"] == "evening burst"
    # an edit made on version 1 after version 2 exists is refused, not silently merged
    r = world.client.put(
        "/v1/admin/queues/q1/autoscale",
        json={"yaml": text, "changed_by": "bob", "base_version": 1},
        headers=adm,
    )
    assert r.status_code == 409 and "version 2 by alice" in r.json()["detail"]
    r = world.client.post(
        "/v1/admin/config/rollback",
        json={"version": 1, "comment": "burst over", "changed_by": "bob", "base_version": 2},
        headers=adm,
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "version": 3,
        "changed": True,
        "changes": ["queues.q1.autoscale.max_workers: 5 → 3"],
    }
    v3 = versions(world)[0]
    assert v3["version"] == 3 and v3["changed_by"] == "bob (admin key ops)"
    assert v3["comment"] == "rollback to version 1: burst over"
    with world.rt.transaction() as session:
        latest = config_versions.latest(session)
        assert latest is not None
        assert latest.document["queues"]["q1"]["autoscale"]["max_workers"] == 3
        assert len(config_versions.history(session)) == 3
    # rolling back to what already runs, or to a version that does not exist
    r = world.client.post("/v1/admin/config/rollback", json={"version": 1}, headers=adm)
    assert r.status_code == 409
    r = world.client.post("/v1/admin/config/rollback", json={"version": 99}, headers=adm)
    assert r.status_code == 404
    doc = world.client.get("/v1/admin/config/versions/2", headers=adm).json()
    assert "max_workers: 5" in doc["yaml"]
    assert doc["changes_to_newest"] == ["queues.q1.autoscale.max_workers: 5 → 3"]


def test_dashboard_metrics_still_answer_when_no_sample_can_be_written(world):
    with world.rt.transaction() as session:
        session.execute(sql("DROP TABLE queue_samples"))
    r = world.client.get("/metrics")
    assert r.status_code == 200
    assert 'autoscaler_queue_pending{queue="q1"} 4.0' in r.text
