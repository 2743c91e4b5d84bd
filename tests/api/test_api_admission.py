"""A burst of heartbeats on a small connection pool is answered, not deadlocked: the API admits
no more requests at once than its pool lends connections (`api/admission.py`); the runtime is
made once however many first requests ask; `pool_capacity` reads the pool's bound."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

from autoscaler.api.admission import Admission
from autoscaler.api.app import create_app
from autoscaler.api.deps import LazyRuntime
from autoscaler.store.db import POOL_SIZE, make_engine, pool_capacity, session_factory
from tests.agent.agentkit import serve
from tests.api.apikit import S, add_machine, make_world

BODY = {"state": "idle", "running_tasks": 0, "tasks": []}


def test_the_gate_admits_at_most_its_capacity_in_arrival_order():
    inside = 0
    most = 0
    order: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        order.append(scope["n"])
        await asyncio.sleep(0.01)
        inside -= 1

    asked = []

    def capacity() -> int:
        asked.append(1)
        return 3

    gate = Admission(app, capacity)

    async def main() -> None:
        async def noop(*_: Any) -> Any:
            return {"type": "http.request", "body": b"", "more_body": False}

        await asyncio.gather(*(gate({"type": "http", "n": n}, noop, noop) for n in range(20)))
        await gate({"type": "lifespan", "n": -1}, noop, noop)  # not an HTTP request: not gated

    asyncio.run(main())
    assert most == 3
    assert order == [*range(20), -1]
    assert len(asked) == 1  # asked once, at the first request


def test_a_slow_client_holds_no_turn():
    """A body still arriving, or an answer the client is slow to read, holds no turn: with one
    turn, another request is served meanwhile, and the slow one gets its body whole."""
    slow_body_sent = asyncio.Event()
    reader_slow = asyncio.Event()
    done: list[str] = []
    bodies: dict[str, bytes] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        bodies[scope["name"]] = body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        done.append(scope["name"])

    gate = Admission(app, lambda: 1)

    async def main() -> None:
        async def trickle() -> Any:  # a body in three parts, the last one late
            trickle.n += 1  # type: ignore[attr-defined]
            if trickle.n == 3:  # type: ignore[attr-defined]
                await slow_body_sent.wait()
            more = trickle.n < 3  # type: ignore[attr-defined]
            return {"type": "http.request", "body": b"ab", "more_body": more}

        trickle.n = 0  # type: ignore[attr-defined]

        async def whole() -> Any:
            return {"type": "http.request", "body": b"x", "more_body": False}

        async def sink(message: Any) -> None:
            return None

        async def slow_sink(message: Any) -> None:
            if message["type"] == "http.response.body":
                await reader_slow.wait()  # the client reads its answer late

        slow = asyncio.create_task(gate({"type": "http", "name": "slow"}, trickle, sink))
        await asyncio.sleep(0.01)
        await asyncio.wait_for(gate({"type": "http", "name": "fast"}, whole, sink), 2)
        assert done == ["fast"]  # served while the slow body was still arriving
        slow_body_sent.set()
        await asyncio.wait_for(slow, 2)
        reading = asyncio.create_task(gate({"type": "http", "name": "late"}, whole, slow_sink))
        await asyncio.sleep(0.01)
        await asyncio.wait_for(gate({"type": "http", "name": "next"}, whole, sink), 2)
        assert done == ["fast", "slow", "next"]  # served while "late" was being read
        reader_slow.set()
        await asyncio.wait_for(reading, 2)

    asyncio.run(main())
    assert bodies["slow"] == b"ababab" and bodies["fast"] == b"x"
    assert gate.gate is not None and not gate.gate.locked()  # every turn given back


def test_a_capacity_that_cannot_be_read_gates_nothing_and_is_asked_again():
    calls = []

    def capacity() -> int | None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("no runtime yet")
        return None

    seen = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["n"])

    gate = Admission(app, capacity)

    async def main() -> None:
        async def noop(*_: Any) -> Any:
            return {"type": "http.request", "body": b"", "more_body": False}

        for n in range(3):
            await gate({"type": "http", "n": n}, noop, noop)

    asyncio.run(main())
    assert seen == [0, 1, 2]
    assert len(calls) == 2 and gate.gate is None  # None: no bound, not asked a third time


def test_pool_capacity_is_pool_size_plus_overflow(tmp_path):
    from sqlalchemy.pool import NullPool

    pg = "postgresql+psycopg://postgres@127.0.0.1:5432/none"
    engine = make_engine(pg)
    assert pool_capacity(engine) == POOL_SIZE == 15
    assert engine.pool.size() == POOL_SIZE  # kept, not closed as they come back
    assert pool_capacity(make_engine(pg, pool_size=2, max_overflow=1)) == 3
    assert pool_capacity(make_engine(pg, max_overflow=-1)) is None  # never waits
    assert pool_capacity(make_engine(pg, poolclass=NullPool)) is None
    assert pool_capacity(make_engine(f"sqlite:///{tmp_path / 's.db'}")) == 15  # 5 + 10
    assert pool_capacity(make_engine("sqlite://")) is None  # one shared in-memory connection


@pytest.mark.timeout(60)
def test_connections_are_kept_between_requests(pg_url):
    """Every connection the pool opened stays open for the next request: SQLAlchemy's 5 + 10
    overflow closed the 10 as they came back and opened them again under load."""
    import psycopg

    engine = make_engine(pg_url)
    sessions = session_factory(engine)
    try:
        ready = threading.Barrier(12)

        def busy() -> None:
            with sessions() as s:
                s.connection()
                ready.wait(timeout=10)  # 12 connections out at once

        threads = [threading.Thread(target=busy) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert engine.pool.checkedin() == 12
        dsn = pg_url.replace("+psycopg", "")
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            ).fetchone()
        assert row is not None and row[0] == 12
    finally:
        engine.dispose()


def test_the_runtime_is_made_once_however_many_first_requests_ask():
    made = []

    def make() -> Any:
        time.sleep(0.05)
        made.append(object())
        return made[-1]

    lazy = LazyRuntime(None, make)
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(lazy())) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(g is made[0] for g in got)


@pytest.mark.timeout(120)
def test_a_burst_on_a_small_pool_is_answered(pg_url, tmp_path):
    """120 heartbeats at once, a pool of 2 connections and FastAPI's 40 threads: unbounded,
    40 requests took every thread waiting for a connection held by requests that needed a
    thread to commit, until the pool's timeout made them 503s (every one of them, at 500 a
    second on one worker). Admitted 2 at a time, every heartbeat is answered 200."""
    world = make_world(pg_url, tmp_path)
    try:
        rt = world.rt
        rt.engine.dispose()
        rt.engine = make_engine(
            rt.settings.database_url, pool_size=1, max_overflow=1, pool_timeout=3
        )
        rt.sessions = session_factory(rt.engine)
        tokens = {f"burst-{i}": add_machine(rt, f"burst-{i}", S.READY) for i in range(120)}
        world.client.app = create_app(rt)

        async def burst(base: str) -> list[int]:
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
            async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
                answers = await asyncio.gather(
                    *(
                        client.post(
                            f"/v1/worker/{launch}/heartbeat",
                            json=BODY,
                            headers={"Authorization": f"Bearer {token}"},
                        )
                        for launch, token in tokens.items()
                    )
                )
            return [a.status_code for a in answers]

        with serve(world) as base:
            started = time.monotonic()
            statuses = asyncio.run(burst(base))
            took = time.monotonic() - started
        assert statuses == [200] * len(tokens), sorted(set(statuses))
        assert took < 30, took  # no wait for a pool timeout
        for launch in tokens:
            assert world.row(launch).last_heartbeat_at is not None
    finally:
        world.close()
