"""Slow bodies cannot hold the API's memory or time (#33, "Slow bodies"): a real uvicorn
serving `create_app()`, before any key is checked.

The issue's probe: 120 unauthenticated connections each holding 1,023 KiB of a 1 MiB body
raised the API's RSS by 122 MB, not returned after they closed, and none was ever answered.
Now (`api/limits.py`) a body must be whole within AUTOSCALER_API_BODY_TIMEOUT seconds of its
headers (else 408, the connection closed), one address may have at most 8 bodies' worth of
bytes in the API (else 429 at once) and all addresses 64 (else 503 at once); the memory is
given back as the bodies go. Here with a 64 KiB limit and a 2 s deadline, to stay small and
quick; `benchmarks/slow_bodies.py` measures the 1 MiB case and the server's RSS.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from click.testing import CliRunner
from fastapi.testclient import TestClient

from autoscaler.api.app import create_app
from autoscaler.api.limits import BodyLimit
from autoscaler.cli import main
from autoscaler.control.runtime import Runtime
from autoscaler.settings import Settings
from autoscaler.store import migrate
from tests.agent.agentkit import serve
from tests.api.apikit import World, make_world
from tests.security.rawhttp import answer, answers, closed, request_head, send

LIMIT = 64 * 1024
HELD = LIMIT - 1024  # what each slow body sends of its LIMIT bytes, then nothing
BODY = {"state": "idle", "running_tasks": 0, "tasks": []}


@pytest.fixture
def slow(sqlite_url, tmp_path) -> Iterator[tuple[World, World]]:
    """The small world, and the same store behind an app with a 64 KiB limit and 2 s."""
    world = make_world(sqlite_url, tmp_path)
    env = {
        "AUTOSCALER_DATABASE_URL": sqlite_url,
        "AUTOSCALER_HOME": str(tmp_path / "slow"),
        "AUTOSCALER_API_MAX_BODY": str(LIMIT),
        "AUTOSCALER_API_BODY_TIMEOUT": "2",
    }
    rt = Runtime(Settings.from_env(env), env=env)
    limited = World(rt=rt, client=TestClient(create_app(rt), raise_server_exceptions=False))
    limited.tokens = world.tokens
    try:
        yield world, limited
    finally:
        limited.close()
        world.close()


def body_limit(world: World) -> BodyLimit:
    """The app's BodyLimit middleware (built at its first request)."""
    layer: Any = world.client.app.middleware_stack  # type: ignore[attr-defined]
    while not isinstance(layer, BodyLimit):
        layer = layer.app
    return layer


def all_given_back(limits: BodyLimit, within: float = 10) -> bool:
    """Whether every body's bytes are given back (an app's last step runs after its answer
    reached the client, so the test waits for it)."""
    deadline = time.monotonic() + within
    while limits.held or limits.held_in_all:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_body_that_stops_is_answered_408_and_its_connection_closed(slow):
    _, world = slow
    with serve(world) as api:
        head = request_head("PUT", "/v1/admin/config", LIMIT)
        s = send(api, head + b"x" * (LIMIT // 2))
        got = answer(s, within=30)
        assert got is not None, "a body that stopped half-way was never answered"
        assert got.status == 408, got
        assert "AUTOSCALER_API_BODY_TIMEOUT" in got.json()["detail"]
        assert closed(s)
        # chunked, no Content-Length: the same
        head = request_head(
            "POST", "/v1/worker/m1/heartbeat", None, {"Transfer-Encoding": "chunked"}
        )
        s = send(api, head + b"400\r\n" + b"x" * 1024 + b"\r\n")
        got = answer(s, within=30)
        assert got is not None and got.status == 408, got
        s.close()
        # a body sent at once is read as ever (401: no key)
        r = requests.put(f"{api}/v1/admin/config", json={"yaml": "x" * 1000}, timeout=30)
        assert r.status_code == 401
        assert all_given_back(body_limit(world))


@pytest.mark.timeout(120)
def test_slow_bodies_of_one_address_hold_at_most_its_share_and_the_api_answers(slow):
    """40 connections of one address each holding 63 KiB of a 64 KiB body: 8 bodies' worth
    held until the deadline (408), the others refused at once (429); meanwhile /healthz and
    another machine's heartbeats are answered; then nothing is held."""
    world, limited = slow
    with serve(limited) as api:
        head = request_head("PUT", "/v1/admin/config", LIMIT)
        sockets = [send(api, head + b"x" * HELD, source="127.0.0.3") for _ in range(40)]
        try:
            assert requests.get(f"{api}/healthz", timeout=30).status_code == 200
            r = requests.post(
                f"{api}/v1/worker/m2/heartbeat",
                json=BODY,
                headers=world.h(world.tokens["m2"]),
                timeout=30,
            )
            assert r.status_code == 200, r.text
            got = answers(sockets, len(sockets), within=60)
            assert len(got) == len(sockets), "slow bodies left unanswered"
            statuses = Counter(a.status for a in got.values())
            assert set(statuses) == {408, 429}, statuses
            assert statuses[408] <= 9, statuses  # 8 bodies' worth (and a part of one more)
            refused = next(a for a in got.values() if a.status == 429)
            assert refused.header("retry-after") == "1"
            assert "AUTOSCALER_API_MAX_BODY" in refused.json()["detail"]
        finally:
            for s in sockets:
                s.close()
        assert all_given_back(body_limit(limited))


@pytest.mark.timeout(120)
def test_slow_bodies_of_many_addresses_hold_at_most_the_total(slow):
    """10 addresses x 8 slow bodies = 80 bodies: at most 64 bodies' worth held in all (408 at
    the deadline), the rest refused at once (503, Retry-After)."""
    _, limited = slow
    with serve(limited) as api:
        head = request_head("PUT", "/v1/admin/config", LIMIT)
        sockets = [
            send(api, head + b"x" * HELD, source=f"127.0.0.{10 + i % 10}") for i in range(80)
        ]
        try:
            got = answers(sockets, len(sockets), within=60)
            assert len(got) == len(sockets), "slow bodies left unanswered"
            statuses = Counter(a.status for a in got.values())
            assert set(statuses) == {408, 503}, statuses
            assert statuses[408] <= 65, statuses
            refused = next(a for a in got.values() if a.status == 503)
            assert refused.header("retry-after") == "1"
            assert requests.get(f"{api}/healthz", timeout=30).status_code == 200
        finally:
            for s in sockets:
                s.close()
        assert all_given_back(body_limit(limited))


@pytest.mark.timeout(60)
def test_the_deadline_is_a_setting_and_serve_refuses_a_bad_one(sqlite_url, tmp_path):
    assert Settings.from_env({}).api_body_timeout == 10
    assert Settings.from_env({"AUTOSCALER_API_BODY_TIMEOUT": " 3 "}).api_body_timeout == 3
    for bad in ("0", "-1", "soon", "1.5", "\u0663"):
        assert Settings.from_env({"AUTOSCALER_API_BODY_TIMEOUT": bad}).api_body_timeout is None
    migrate.upgrade(sqlite_url)
    env = {
        "AUTOSCALER_DATABASE_URL": sqlite_url,
        "AUTOSCALER_HOME": str(tmp_path),
        "AUTOSCALER_API_BODY_TIMEOUT": "soon",
    }
    r = CliRunner().invoke(main, ["serve"], env=env)
    assert r.exit_code == 2, r.output
    assert "AUTOSCALER_API_BODY_TIMEOUT must be" in r.output and "e.g. 10" in r.output
