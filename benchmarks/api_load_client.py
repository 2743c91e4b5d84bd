"""The load of `api_load.py`: open-loop heartbeats at a rate, on keep-alive HTTP/1.1 over
asyncio streams (or httpx), with the server's and PostgreSQL's CPU, transactions and the ticks
measured over the window (`run_rate`).

Apart from `api_load.py`, which sets the world up and reports each rate's `Result`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import httpx
from api_load_world import Tick, commits, loop_wait, postgres_cpu, server_cpu, spent

BODY = {"state": "idle", "running_tasks": 0, "tasks": []}
TIMEOUT = 10.0
"""A request not answered within this many seconds of its sending is an error."""
KEEP_ALIVE = 4.0


# --------------------------------------------------------------------------- the load


@dataclass
class Result:
    rate: float
    duration: float
    scheduled: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)  # from the scheduled send, ok or not
    lag: list[float] = field(default_factory=list)  # the client's own delay before sending
    elapsed: float = 0.0
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    loop_wait: float = 0.0
    postgres_cpu: float = 0.0
    commits: int = 0
    sessions: int = 0
    checkpoints: int = 0
    ticks: list[Tick] = field(default_factory=list)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


class Client:
    """POSTs a heartbeat and answers its HTTP status; at most `limit` connections, kept open
    (a request beyond them waits here, and its wait counts in its latency)."""

    async def heartbeat(self, launch: str, token: str) -> int:
        raise NotImplementedError

    async def close(self) -> None:
        return None


class HttpxClient(Client):
    def __init__(self, base: str, limit: int) -> None:
        limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
        self.client = httpx.AsyncClient(
            base_url=base, limits=limits, timeout=httpx.Timeout(TIMEOUT)
        )
        self.body = json.dumps(BODY).encode()

    async def heartbeat(self, launch: str, token: str) -> int:
        resp = await self.client.post(
            f"/v1/worker/{launch}/heartbeat",
            content=self.body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        return resp.status_code

    async def close(self) -> None:
        await self.client.aclose()


class RawClient(Client):
    """HTTP/1.1 keep-alive on asyncio streams: the same request httpx sends, for a tenth of
    its CPU (httpx's pool took ~3 ms of the client's CPU per request, as much as the server,
    on a 2-core machine where the client shares the cores with the server it measures)."""

    def __init__(self, host: str, port: int, limit: int) -> None:
        self.host, self.port = host, port
        self.slots = asyncio.Semaphore(limit)
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self.open: set[asyncio.StreamWriter] = set()
        self.body = json.dumps(BODY).encode()

    async def heartbeat(self, launch: str, token: str) -> int:
        request = (
            f"POST /v1/worker/{launch}/heartbeat HTTP/1.1\r\n"
            f"Host: {self.host}:{self.port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(self.body)}\r\n"
            "\r\n"
        ).encode() + self.body
        async with self.slots:
            reader, writer = await self.connection()
            try:
                status, close = await self.exchange(reader, writer, request)
            except BaseException:
                self.open.discard(writer)
                writer.close()
                raise
            if close:
                self.open.discard(writer)
                writer.close()
            else:
                self.idle.append((reader, writer, time.monotonic()))
            return status

    async def connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The most recently used idle connection, unless the server may have closed it (idle
        longer than uvicorn's 5 s keep-alive, or seen closed); else a new one."""
        while self.idle:
            reader, writer, since = self.idle.pop()
            if time.monotonic() - since < KEEP_ALIVE and not reader.at_eof():
                return reader, writer
            self.open.discard(writer)
            writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        self.open.add(writer)
        return reader, writer

    @staticmethod
    async def exchange(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> tuple[int, bool]:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        at = lower.find(b"\r\ncontent-length:")
        if at < 0:
            raise ConnectionError("an answer without Content-Length")
        await reader.readexactly(int(lower[at + 17 : lower.index(b"\r\n", at + 2)]))
        return status, b"\r\nconnection: close" in lower

    async def close(self) -> None:
        for writer in self.open:
            writer.close()
        self.open.clear()
        self.idle.clear()


async def drive(
    client: Client,
    creds: Sequence[tuple[str, str]],
    rate: float,
    duration: float,
    start_at: int,
    result: Result | None,
) -> int:
    """Open loop: request i is due at t0 + i / rate, whatever the earlier ones are doing, for
    `duration` seconds; machines taken in turn from `start_at`. Latency counts from the due
    time (a request the client could not send on time waits in the figure)."""
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    total = int(rate * duration)

    async def one(i: int, due: float) -> None:
        launch, token = creds[(start_at + i) % len(creds)]
        sent = loop.time()
        kind = ""
        try:
            async with asyncio.timeout(TIMEOUT):  # waiting for a connection included
                status: int | None = await client.heartbeat(launch, token)
        except Exception as exc:  # every failure is an error of the run
            status = None
            kind = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
        done = loop.time()
        if result is None:
            return
        result.latencies.append(done - due)
        result.lag.append(sent - due)
        result.elapsed = max(result.elapsed, done - t0)
        if status is None:
            result.error(kind)
        elif 200 <= status < 300:
            result.ok += 1
        else:
            result.error(f"HTTP {status}")

    i = 0
    while i < total:
        now = loop.time()
        while i < total and t0 + i / rate <= now:
            task = asyncio.create_task(one(i, t0 + i / rate))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        await asyncio.sleep(max(0.0, min(t0 + i / rate - loop.time(), 0.005)))
    if result is not None:
        result.scheduled = total
    if tasks:
        await asyncio.wait(tasks)
    return start_at + total


async def run_rate(
    port: int,
    kind: str,
    creds: Sequence[tuple[str, str]],
    rate: float,
    duration: float,
    start_at: int,
    connections: int,
    tick: Connection,
    tick_runs: int,
    pgid: int,
    url: str,
    db: str,
) -> tuple[Result, int]:
    result = Result(rate, duration)
    client: Client = (
        HttpxClient(f"http://127.0.0.1:{port}", connections)
        if kind == "httpx"
        else RawClient("127.0.0.1", port, connections)
    )
    try:
        # a second at the rate, not counted: connections opened, server threads warm
        start_at = await drive(client, creds, rate, 1.0, start_at, None)
        c0, s0, p0, x0 = time.process_time(), server_cpu(pgid), postgres_cpu(db), commits(url)
        w0 = loop_wait(pgid)
        load = asyncio.create_task(drive(client, creds, rate, duration, start_at, result))
        await asyncio.sleep(min(2.0, duration / 4))
        gap = max(0.2, (duration * 0.6) / max(1, tick_runs))
        tick.send(("run", tick_runs, gap))
        ticks = asyncio.get_running_loop().run_in_executor(None, tick.recv)
        start_at = await load
        result.ticks = await ticks
        result.client_cpu = time.process_time() - c0
        result.server_cpu = spent(s0, server_cpu(pgid))
        result.loop_wait = loop_wait(pgid) - w0
        result.postgres_cpu = spent(p0, postgres_cpu(db))
        x1 = commits(url)
        result.commits = x1[0] - x0[0]
        result.sessions = x1[1] - x0[1] - 1
        result.checkpoints = x1[2] - x0[2]
    finally:
        await client.close()
    return result, start_at
