"""auth: every endpoint × {no key, wrong key, another instance's token, own token, revoked
token, admin key, enrolment key, revoked admin/enrolment key}: only the right key opens it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.apikit import World, make_world

WORKER = [
    ("POST", "/v1/worker/m1/register", {"worker_name": "agent@m1"}),
    ("GET", "/v1/worker/m1/deployment", None),
    ("POST", "/v1/worker/m1/heartbeat", {"state": "idle", "running_tasks": 0}),
    ("POST", "/v1/worker/m1/drained", None),
    ("POST", "/v1/worker/m1/phases", {"started": "2026-12-01T10:00:00Z"}),
]
HAND_MADE = [
    ("POST", "/v1/hand-made/heartbeat", {"name": "desk-1", "queues": ["q1"]}),
    ("GET", "/v1/hand-made/deployment?queue=q1", None),
]
ADMIN = [
    ("GET", "/v1/admin/queues", None),
    ("GET", "/v1/admin/instances", None),
    ("GET", "/v1/admin/events?queue=q1", None),
    ("GET", "/v1/admin/config", None),
    ("PUT", "/v1/admin/config", {"yaml": "queues: {}"}),
    ("POST", "/v1/admin/queues/q1/scale", {"workers": None}),
    ("POST", "/v1/admin/instances/nope/drain", None),
    ("GET", "/v1/admin/providers", None),
    # the dashboard's (autoscaler/api/routers/dashboard.py)
    ("GET", "/v1/admin/overview", None),
    ("GET", "/v1/admin/history", None),
    ("GET", "/v1/admin/queues/q1/autoscale", None),
    ("PUT", "/v1/admin/queues/q1/autoscale", {"yaml": "provider: sandbox"}),
    ("POST", "/v1/admin/config/preview", {"yaml": "queues: {}"}),
    ("GET", "/v1/admin/config/versions", None),
    ("GET", "/v1/admin/config/versions/1", None),
    ("POST", "/v1/admin/config/rollback", {"version": 1}),
]
PUBLIC = [("GET", "/healthz", None), ("GET", "/metrics", None), ("GET", "/", None)]

CREDENTIALS = [
    "none",
    "wrong",
    "other_instance",
    "own_token",
    "revoked_token",
    "admin",
    "admin_revoked",
    "enrolment",
    "enrolment_revoked",
]


@pytest.fixture
def world(db_url, tmp_path) -> Iterator[World]:
    w = make_world(db_url, tmp_path)
    try:
        yield w
    finally:
        w.close()


def key_of(world: World, cred: str) -> str | None:
    return {
        "none": None,
        "wrong": "asga_" + "x" * 43,
        "other_instance": world.tokens["m2"],
        "own_token": world.tokens["m1"],
        "revoked_token": world.tokens["gone"],
        "admin": world.admin,
        "admin_revoked": world.admin_revoked,
        "enrolment": world.enrolment,
        "enrolment_revoked": world.enrolment_revoked,
    }[cred]


def expected(group: str, cred: str) -> set[int] | str:
    """'open' (anything but 401/403 and 5xx) or the refusal codes."""
    if group == "public":
        return "open"
    if group == "worker":
        return "open" if cred == "own_token" else {403} if cred == "other_instance" else {401}
    if group == "hand-made":
        return "open" if cred == "enrolment" else {401}
    return "open" if cred == "admin" else {401}


def call(world: World, method: str, path: str, body: Any, key: str | None) -> Any:
    return world.client.request(method, path, json=body, headers=world.h(key))


def test_auth_matrix_every_endpoint_every_key(world):
    results: dict[tuple[str, str], int] = {}
    groups = [("worker", WORKER), ("hand-made", HAND_MADE), ("admin", ADMIN), ("public", PUBLIC)]
    for group, endpoints in groups:
        for method, path, body in endpoints:
            for cred in CREDENTIALS:
                r = call(world, method, path, body, key_of(world, cred))
                want = expected(group, cred)
                results[(f"{method} {path}", cred)] = r.status_code
                assert r.status_code < 500, (method, path, cred, r.text)
                if want == "open":
                    assert r.status_code not in (401, 403), (method, path, cred, r.text)
                else:
                    assert r.status_code in want, (method, path, cred, r.status_code, r.text)
                # no key of any kind ever comes back
                for secret in (world.admin, world.enrolment, *world.tokens.values()):
                    assert secret not in r.text
    cells = len(results)
    print(f"auth matrix: {cells} cells, all as expected")
    assert cells == (len(WORKER) + len(HAND_MADE) + len(ADMIN) + len(PUBLIC)) * len(CREDENTIALS)


def every_route(routes: Any) -> Iterator[Any]:
    """The app's routes, those of its included routers too (FastAPI keeps an included
    APIRouter as one entry of `app.routes`; the endpoints are in autoscaler/api/routers/)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from every_route(inner.routes)
        else:
            yield route


def test_auth_matrix_covers_every_route(world):
    covered = {(m, p.split("?")[0]) for m, p, _ in WORKER + HAND_MADE + ADMIN + PUBLIC}
    routes = set()
    for route in every_route(world.client.app.routes):  # type: ignore[attr-defined]
        path = getattr(route, "path", "")
        if path.startswith(("/docs", "/redoc", "/openapi")):
            continue
        for m in getattr(route, "methods", ()) or ():
            if m == "HEAD":
                continue
            concrete = (
                path.replace("{launch_id}", "m1")
                if path.startswith("/v1/worker")
                else path.replace("{launch_id}", "nope")
                .replace("{queue}", "q1")
                .replace("{version}", "1")
            )
            routes.add((m, concrete))
    assert routes == covered, routes ^ covered


def test_auth_a_token_dies_with_its_machine(world):
    """Terminating, terminated, failed or lost: the token opens nothing any more."""
    from autoscaler.lifecycle import InstanceState as S

    for state in (S.TERMINATING, S.TERMINATED, S.FAILED, S.LOST):
        world.set_state("m1", state)
        r = call(world, "POST", "/v1/worker/m1/heartbeat", {"state": "idle"}, world.tokens["m1"])
        assert r.status_code == 401, (state, r.text)
    world.set_state("m1", S.READY)
    r = call(world, "POST", "/v1/worker/m1/heartbeat", {"state": "idle"}, world.tokens["m1"])
    assert r.status_code == 200


def test_auth_a_stopped_machines_token_opens_nothing_until_its_resume(world):
    """A warm pool's machine holds no live credential while stopped (or being stopped): every
    worker route refuses its token; from the resume on it works again."""
    from autoscaler.lifecycle import InstanceState as S

    routes = [
        ("POST", "/v1/worker/m1/register", {"worker_name": "w"}),
        ("GET", "/v1/worker/m1/deployment", None),
        ("POST", "/v1/worker/m1/heartbeat", {"state": "idle"}),
        ("POST", "/v1/worker/m1/drained", None),
    ]
    for state in (S.STOPPING, S.STOPPED):
        world.set_state("m1", state)
        for method, path, body in routes:
            r = call(world, method, path, body, world.tokens["m1"])
            assert r.status_code == 401, (state, path, r.text)
    world.set_state("m1", S.RESUMING)
    r = call(world, "POST", "/v1/worker/m1/heartbeat", {"state": "idle"}, world.tokens["m1"])
    assert r.status_code == 200 and r.json()["state"] == "ready", r.text  # a warm hit


def test_auth_a_revoked_admin_key_stops_at_once(world):
    from datetime import UTC, datetime

    from autoscaler.access import keys

    assert call(world, "GET", "/v1/admin/queues", None, world.admin).status_code == 200
    with world.rt.transaction() as session:
        assert keys.revoke_key(session, "ops", datetime.now(UTC))
    assert call(world, "GET", "/v1/admin/queues", None, world.admin).status_code == 401


def test_auth_only_hashes_are_stored(world):
    from sqlalchemy import select

    from autoscaler.store.models import ApiKey, Instance

    with world.rt.transaction() as session:
        stored = [r.key_hash for r in session.scalars(select(ApiKey))]
        stored += [r.worker_token_hash or "" for r in session.scalars(select(Instance))]
    blob = " ".join(stored)
    for secret in (world.admin, world.enrolment, *world.tokens.values()):
        assert secret not in blob
