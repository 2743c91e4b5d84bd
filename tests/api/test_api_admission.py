"""A burst of heartbeats on a small connection pool is answered, not deadlocked: the API admits
no more requests at once than its pool lends connections (`api/admission.py`), shared fairly
between callers (`Turns`: round robin over addresses, then callers; bounded per caller and per
address); the runtime is made once however many first requests ask; `pool_capacity` reads the
pool's bound."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

from autoscaler.api.admission import Admission, Turns
from autoscaler.api.app import create_app
from autoscaler.api.deps import LazyRuntime
from autoscaler.store.db import POOL_SIZE, make_engine, pool_capacity, session_factory
from tests.agent.agentkit import serve
from tests.api.apikit import S, add_machine, make_world

BODY = {"state": "idle", "running_tasks": 0, "tasks": []}


def _scope(n: int, address: str = "10.0.0.1", launch: str | None = None) -> dict[str, Any]:
    """An HTTP request of machine `launch` (m<n> by default) from `address`."""
    path = f"/v1/worker/{launch or f'm{n}'}/heartbeat"
    return {"type": "http", "n": n, "path": path, "client": (address, 40000 + n)}


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

        await asyncio.gather(*(gate(_scope(n), noop, noop) for n in range(20)))
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
    assert gate.turns is not None and gate.turns.inside == 0  # every turn given back
    assert not gate.turns.running and not gate.turns.waiting


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
            await gate(_scope(n), noop, noop)

    asyncio.run(main())
    assert seen == [0, 1, 2]
    assert len(calls) == 2  # asked again after the failure, not a third time
    assert gate.turns is not None and gate.turns.capacity is None  # None: no bound in all


def _waiters(n: int) -> list[asyncio.Future[None]]:
    loop = asyncio.new_event_loop()
    return [loop.create_future() for _ in range(n)]


def test_one_callers_burst_waits_behind_itself_and_its_excess_is_refused():
    """256 requests of one machine: 2 inside, 8 waiting, the rest refused at once; another
    machine's request goes in at once, though the burst came first (one FIFO: behind all)."""
    turns = Turns(capacity=15)
    hostile = ("10.0.0.1", "launch:evil")
    inside = [turns.enter(hostile) for _ in range(256)]
    assert inside.count(True) == 2 and turns.inside == 2
    waiters = _waiters(254)
    refusals = [turns.queue(hostile, w) for w in waiters]
    assert refusals[:8] == [None] * 8
    assert all(r is not None and "at most 8 per launch id" in r for r in refusals[8:])
    assert turns.enter(("10.0.0.2", "launch:honest"))  # in at once, 3 of 15 turns taken
    turns.leave(hostile)  # one of the burst done: the next of the burst goes in
    assert waiters[0].done() and not waiters[1].done()
    assert turns.running[hostile] == 2 and turns.inside == 3


def test_the_waiting_are_served_round_robin_over_addresses_then_callers():
    turns = Turns(capacity=1)
    a, b, c = ("1.1.1.1", "launch:a"), ("1.1.1.1", "launch:b"), ("2.2.2.2", "launch:c")
    assert turns.enter(a)
    line = [(a, "a1"), (a, "a2"), (a, "a3"), (b, "b1"), (c, "c1"), (c, "c2")]
    waiters = dict(zip((name for _, name in line), _waiters(len(line)), strict=True))
    for caller, name in line:
        assert turns.queue(caller, waiters[name]) is None
    served: list[str] = []
    held = a
    for _ in line:
        turns.leave(held)
        (name,) = [n for n, w in waiters.items() if w.done() and n not in served]
        served.append(name)
        held = next(caller for caller, n in line if n == name)
    # addresses take turns (1.1.1.1, 2.2.2.2, …), and within 1.1.1.1 its callers do; each
    # caller's own in arrival order (one FIFO: a1 a2 a3 b1 c1 c2)
    assert served == ["a1", "c1", "b1", "c2", "a2", "a3"], served


def test_claims_are_free_to_forge_so_an_address_waits_at_most_its_share():
    """One address naming 300 launch ids (a forged key each): 256 wait, 44 are refused; a
    machine of another address, arriving after all of them, is next in."""
    turns = Turns(capacity=1)
    assert turns.enter(("6.6.6.6", "-"))
    forged = [("6.6.6.6", f"launch:forged-{i}") for i in range(300)]
    refusals = [turns.queue(caller, w) for caller, w in zip(forged, _waiters(300), strict=True)]
    assert refusals.count(None) == 256
    assert all(r is not None and "at most 256 per address" in r for r in refusals[256:])
    honest = ("7.7.7.7", "launch:honest")
    (mine,) = _waiters(1)
    assert turns.queue(honest, mine) is None
    turns.leave(("6.6.6.6", "-"))  # the first forged one in: the address's turn
    turns.leave(forged[0])
    assert mine.done()  # then the other address's: not behind 255 more


def test_naming_another_machines_launch_id_fills_only_the_namers_share():
    turns = Turns(capacity=1)
    assert turns.enter(("9.9.9.9", "-"))
    named = ("6.6.6.6", "launch:victim")
    assert [turns.queue(named, w) for w in _waiters(8)] == [None] * 8
    assert turns.queue(named, _waiters(1)[0]) is not None  # the namer's 9th: refused
    victim = ("7.7.7.7", "launch:victim")
    assert turns.queue(victim, _waiters(1)[0]) is None  # the victim's own: waits its turn


def test_a_waiter_that_leaves_gives_its_place_up():
    turns = Turns(capacity=1)
    a, b = ("1.1.1.1", "-"), ("2.2.2.2", "-")
    assert turns.enter(a)
    wa, wb = _waiters(2)
    assert turns.queue(a, wa) is None and turns.queue(b, wb) is None
    wa.cancel()
    turns.forget(a, wa)
    assert turns.waiting_at == {"2.2.2.2": 1}
    turns.leave(a)
    assert wb.done() and turns.running == {b: 1}
    turns.leave(b)
    assert turns.inside == 0 and not turns.waiting and not turns.waiting_at


def test_a_client_gone_while_it_waits_is_not_served():
    """Over ASGI: the client of a waiting request disconnects; the app never runs for it and
    its place is given up (the next one in line is served)."""
    release = asyncio.Event()
    ran: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        ran.append(scope["n"])
        if scope["n"] == 0:
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gate = Admission(app, lambda: 1)

    async def main() -> None:
        leave = asyncio.Event()

        def client(gone: asyncio.Event | None) -> Any:
            sent = False

            async def receive() -> Any:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": b"{}", "more_body": False}
                if gone is not None:
                    await gone.wait()
                else:
                    await asyncio.Event().wait()
                return {"type": "http.disconnect"}

            return receive

        async def sink(message: Any) -> None:
            return None

        first = asyncio.create_task(gate(_scope(0), client(None), sink))
        await asyncio.sleep(0.01)
        leaving = asyncio.create_task(gate(_scope(1), client(leave), sink))
        staying = asyncio.create_task(gate(_scope(2), client(None), sink))
        await asyncio.sleep(0.01)
        leave.set()
        await asyncio.wait_for(leaving, 2)
        assert gate.turns is not None and gate.turns.waiting_at == {"10.0.0.1": 1}
        release.set()
        await asyncio.wait_for(asyncio.gather(first, staying), 2)

    asyncio.run(main())
    assert ran == [0, 2]


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
