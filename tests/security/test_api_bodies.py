"""A hostile request body cannot sink the API: a real uvicorn serving `create_app()`.

- a body over the limit (1 MiB by default) is refused with 413 before it is read: at once when
  its Content-Length says so, while it streams when it has none;
- text the store cannot hold (a NUL byte in a producer's task id, a lone surrogate) is a 422
  naming the field, on PostgreSQL, which once answered it 503 for ever;
- a time UTC cannot hold (year 1 east of Greenwich, 9999 west of it) is a 422, not a 500;
- /metrics answers a scrape only with AUTOSCALER_METRICS_TOKEN as its bearer, once set.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
import requests
from fastapi.testclient import TestClient

from autoscaler.api.app import create_app
from autoscaler.control.runtime import Runtime
from autoscaler.settings import Settings
from tests.agent.agentkit import serve
from tests.api.apikit import World

LIMIT = 1024 * 1024


def _raw(url: str, head: bytes, body: bytes = b"", timeout: float = 10.0) -> tuple[int, bytes]:
    """Send `head` (and `body`) on a socket of our own; the status and the answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(head + body)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 4:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        with_body = answer
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                with_body += chunk
        except TimeoutError:
            pass
    return int(with_body.split(b" ", 2)[1]), with_body


def test_a_body_over_the_limit_is_refused_before_it_is_read(world):
    with serve(world) as api:
        # 300 MB announced, none sent: the answer comes at once (the API waits for nothing)
        head = (
            b"PUT /v1/admin/config HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 314572800\r\n\r\n"
        )
        status, answer = _raw(api, head, timeout=5)
        assert status == 413 and b"AUTOSCALER_API_MAX_BODY" in answer, answer[:300]
        assert b"\r\nconnection: close" in answer.lower()

        # no Content-Length (chunked): counted as it comes, cut off past the limit
        def chunks() -> Iterator[bytes]:
            for _ in range(64):  # 4 MiB in all, far past the limit
                yield b"x" * 65536

        try:
            r = requests.post(f"{api}/v1/worker/m1/heartbeat", data=chunks(), timeout=10)
            assert r.status_code == 413, r.text
        except requests.ConnectionError:
            pass  # the server closed while the client still sent: refused all the same
        # a body within the limit is read and answered as before (401: no key)
        r = requests.put(f"{api}/v1/admin/config", json={"yaml": "x" * 1000}, timeout=10)
        assert r.status_code == 401
        # a Content-Length that is no number is a 400, not a crash
        status, _ = _raw(
            api, b"POST /v1/admin/config HTTP/1.1\r\nHost: x\r\nContent-Length: \xc2\xb2\r\n\r\n"
        )
        assert status == 400
        assert requests.get(f"{api}/healthz", timeout=5).status_code == 200  # still serving


def test_the_limit_is_a_setting(world, tmp_path):
    settings = Settings.from_env(
        {
            "AUTOSCALER_DATABASE_URL": world.rt.settings.database_url,
            "AUTOSCALER_HOME": str(tmp_path / "h2"),
            "AUTOSCALER_API_MAX_BODY": "2000",
        }
    )
    assert settings.api_max_body == 2000
    assert Settings.from_env({"AUTOSCALER_API_MAX_BODY": "²"}).api_max_body is None
    rt = Runtime(settings, env={})
    client = TestClient(create_app(rt), raise_server_exceptions=False)
    try:
        tok = world.h(world.tokens["m1"])
        body = {"state": "idle", "detail": "d" * 400}
        assert client.post("/v1/worker/m1/heartbeat", json=body, headers=tok).status_code == 200
        body = {"state": "idle", "jobs": [{"id": "j" * 190, "started_at": 1, "finished_at": 2}] * 9}
        r = client.post("/v1/worker/m1/heartbeat", json=body, headers=tok)
        assert r.status_code == 413, r.text
    finally:
        client.close()
        rt.close()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"jobs": [{"id": "poison\u0000id", "started_at": 1, "finished_at": 2}]}, "jobs.0.id"),
        (
            {"jobs": [{"id": "ok", "queue": "q\u0000", "started_at": 1, "finished_at": 2}]},
            "jobs.0.queue",
        ),
        ({"detail": "a lone \ud800 surrogate"}, "detail"),
        ({"last_task_at": "0001-01-01T00:00:00+05:00"}, "last_task_at"),
        ({"last_task_at": "9999-12-31T23:59:59-05:00"}, "last_task_at"),
    ],
)
def test_text_and_times_the_store_cannot_hold_are_a_422_naming_the_field(world, body, field):
    with serve(world) as api:
        tok = world.h(world.tokens["m1"])
        data = json.dumps({"state": "busy", "running_tasks": 1, **body}).encode(
            "utf-8", "surrogatepass"
        )
        r = requests.post(
            f"{api}/v1/worker/m1/heartbeat",
            data=data,
            headers={**tok, "Content-Type": "application/json"},
            timeout=10,
        )
        assert r.status_code == 422, r.text
        assert [p["field"] for p in r.json()["detail"]] == [field], r.json()
        # the machine's next heartbeat, without the poison, is taken as ever
        r = requests.post(
            f"{api}/v1/worker/m1/heartbeat", json={"state": "idle"}, headers=tok, timeout=10
        )
        assert r.status_code == 200, r.text


def test_metrics_open_without_a_token_and_only_to_it_once_set(world, tmp_path):
    with serve(world) as api:
        assert requests.get(f"{api}/metrics", timeout=10).status_code == 200
    settings = Settings.from_env(
        {
            "AUTOSCALER_DATABASE_URL": world.rt.settings.database_url,
            "AUTOSCALER_HOME": str(tmp_path / "h3"),
            "AUTOSCALER_METRICS_TOKEN": "scrape-token-0123456789",
        }
    )
    rt = Runtime(settings, env={})
    locked = World(rt=rt, client=TestClient(create_app(rt), raise_server_exceptions=False))
    try:
        with serve(locked) as api:
            for headers in (
                {},
                {"Authorization": "Bearer nope"},
                {"Authorization": f"Bearer {world.admin}"},
            ):
                r = requests.get(f"{api}/metrics", headers=headers, timeout=10)
                assert r.status_code == 401, (headers, r.text)
            r = requests.get(
                f"{api}/metrics",
                timeout=10,
                headers={"Authorization": "Bearer scrape-token-0123456789"},
            )
            assert r.status_code == 200 and "autoscaler" in r.text
    finally:
        locked.close()
