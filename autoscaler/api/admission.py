"""No more requests in the app at once than the store's pool has connections; the others wait
their turn on the event loop, in arrival order.

Every route is a plain function, and so are its dependencies (the key check, the request's
transaction): FastAPI runs each in a thread of one shared pool (40 threads), a separate hop
for each, and a request holds its database connection from the key check to its commit, across
hops. Unbounded, a burst of heartbeats deadlocked `autoscaler serve`: 40 new requests took
every thread and waited in the connection pool (then 5 + 10 overflow connections) for
connections held by requests that waited for a thread to commit, until the pool's 30 s
timeout made them 503s. At 200 and 500 heartbeats a second on one worker almost none was
answered (`benchmarks/api_load.py`). Admitted requests never outnumber the connections, so a
thread never waits for one: past its capacity the API answers as fast as it can and the others
queue, where nothing is held.

A turn covers the app's work only, not the client's pace: the body is read before the turn is
taken (the body limit, outside, bounds it) and the turn ends as the answer starts (a route's
transaction is closed by then), so clients that send or read slowly hold no turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from autoscaler.api.limits import ASGIApp, Message, Receive, Scope, Send


class Admission:
    """At most `capacity()` HTTP requests inside `app` at once (asked at the first request,
    when the runtime exists; None or a failure: no bound, asked again next time)."""

    def __init__(self, app: ASGIApp, capacity: Callable[[], int | None]) -> None:
        self.app = app
        self.capacity = capacity
        self.gate: asyncio.Semaphore | None = None
        self.known = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.known:
            self._resolve()
        gate = self.gate
        if gate is None:
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)

        async def replay() -> Message:
            return body.pop(0) if body else await receive()

        holding = False

        async def answering(message: Message) -> None:
            nonlocal holding
            if holding and message["type"] == "http.response.start":
                holding = False
                gate.release()
            await send(message)

        await gate.acquire()
        holding = True
        try:
            await self.app(scope, replay, answering)
        finally:
            if holding:
                gate.release()

    def _resolve(self) -> None:
        try:
            n = self.capacity()
        except Exception:  # the runtime cannot be made: the route's own dependency answers why
            return
        self.known = True
        if n is not None and n > 0:
            self.gate = asyncio.Semaphore(n)


async def _read_body(receive: Receive) -> list[Message]:
    """The request's messages up to its last body part (or a disconnect), to hand on as read."""
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


__all__ = ["Admission"]
