"""Turns in the app, shared fairly: no more requests inside at once than the store's pool has
connections, at most two of one caller, and the waiting served round robin over addresses,
then over the callers of one address (`callers.py`), so one machine's burst waits behind
itself, not in front of everyone.

Why a bound at all: every route is a plain function, and so are its dependencies (the key
check, the request's transaction): FastAPI runs each in a thread of one shared pool (40
threads), a separate hop for each, and a request holds its database connection from the key
check to its commit, across hops. Unbounded, a burst of heartbeats deadlocked `autoscaler
serve`: 40 new requests took every thread and waited in the connection pool for connections
held by requests that waited for a thread to commit, until the pool's 30 s timeout made them
503s (`benchmarks/api_load.py`). Admitted requests never outnumber the connections, so a
thread never waits for one.

Why fair: the bound was one FIFO for all callers. A hostile machine sending 256 heartbeats of
its own at once filled it; /healthz took 16 s and honest machines' heartbeats fell 22 s behind
(their agent gives up at 10 s), long enough, held longer, to have them judged silent (#33).
Now one caller (address, claim) has at most `PER_CALLER` requests inside and `WAITING_PER_CALLER`
waiting; one address at most `WAITING_PER_ADDRESS` waiting, however many launch ids it names
(a claim is free to forge); past either, 429 with Retry-After at once, nothing held. A caller
that names another machine's launch id waits in its own address's share, not the victim's.

A turn covers the app's work only, not the client's pace: the body is read before the turn is
taken (`limits.py`, outside, bounds it in size, time and memory) and the turn ends as the
answer starts (a route's transaction is closed by then), so clients that send or read slowly
hold no turn; a client that leaves while it waits gives its place up.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict, deque
from collections.abc import Callable

from autoscaler.api.callers import Caller, caller_of
from autoscaler.api.limits import ASGIApp, Message, Receive, Scope, Send, refuse

PER_CALLER = 2
"""Requests of one caller inside at once: an agent sends one at a time (a heartbeat, now and
then its boot phases)."""
WAITING_PER_CALLER = 8
WAITING_PER_ADDRESS = 256
"""Requests of one address waiting at once, whatever they claim: a proxy or a NAT in front of
many machines is one address (120 heartbeats at once through one must all be answered)."""

Waiter = asyncio.Future[None]


class Turns:
    """Which request goes in next (no I/O: a waiter is a future, resolved when its turn
    comes). At most `capacity` inside (None: no bound but the caller's), `per_caller` of one
    caller; the waiting handed turns round robin over addresses, then over the callers of
    one address, each caller's in arrival order."""

    def __init__(
        self,
        capacity: int | None,
        per_caller: int = PER_CALLER,
        waiting_per_caller: int = WAITING_PER_CALLER,
        waiting_per_address: int = WAITING_PER_ADDRESS,
    ) -> None:
        self.capacity = capacity
        self.per_caller = per_caller
        self.waiting_per_caller = waiting_per_caller
        self.waiting_per_address = waiting_per_address
        self.inside = 0
        self.running: Counter[Caller] = Counter()
        # address -> claim -> its waiters; both levels kept in round-robin order
        self.waiting: OrderedDict[str, OrderedDict[str, deque[Waiter]]] = OrderedDict()
        self.waiting_at: Counter[str] = Counter()

    def enter(self, caller: Caller) -> bool:
        """In now (True), or it must wait."""
        address, claim = caller
        callers = self.waiting.get(address)
        if self._room(caller) and not (callers and claim in callers):
            self._admit(caller)
            return True
        return False

    def queue(self, caller: Caller, waiter: Waiter) -> str | None:
        """`waiter` waits its turn; or why it may not (a bound), and it is not kept."""
        address, claim = caller
        callers = self.waiting.get(address)
        mine = len(callers[claim]) if callers and claim in callers else 0
        if mine >= self.waiting_per_caller:
            return (
                f"{mine} requests of this caller wait already (at most {self.waiting_per_caller}"
                " per launch id or key): send one at a time"
            )
        if self.waiting_at[address] >= self.waiting_per_address:
            return (
                f"{self.waiting_at[address]} requests of this address wait already (at most "
                f"{self.waiting_per_address} per address)"
            )
        self.waiting.setdefault(address, OrderedDict()).setdefault(claim, deque()).append(waiter)
        self.waiting_at[address] += 1
        return None

    def leave(self, caller: Caller) -> None:
        """A turn given back: the next waiters in."""
        self.inside -= 1
        self.running[caller] -= 1
        if self.running[caller] <= 0:
            del self.running[caller]
        self._hand_on()

    def forget(self, caller: Caller, waiter: Waiter) -> None:
        """A waiter gone before its turn came."""
        address, claim = caller
        callers = self.waiting.get(address)
        line = callers.get(claim) if callers is not None else None
        if line is None or waiter not in line:
            return
        line.remove(waiter)
        self._waited(address, claim)

    def _room(self, caller: Caller) -> bool:
        full = self.capacity is not None and self.inside >= self.capacity
        return not full and self.running[caller] < self.per_caller

    def _admit(self, caller: Caller) -> None:
        self.inside += 1
        self.running[caller] += 1

    def _waited(self, address: str, claim: str) -> None:
        """One waiter of (address, claim) left the line: drop emptied lines."""
        self.waiting_at[address] -= 1
        if self.waiting_at[address] <= 0:
            del self.waiting_at[address]
        callers = self.waiting[address]
        if not callers[claim]:
            del callers[claim]
        if not callers:
            del self.waiting[address]

    def _hand_on(self) -> None:
        while self.capacity is None or self.inside < self.capacity:
            chosen = self._next()
            if chosen is None:
                return
            address, claim = chosen
            waiter = self.waiting[address][claim].popleft()
            self._waited(address, claim)
            if address in self.waiting:
                self.waiting.move_to_end(address)
                if claim in self.waiting[address]:
                    self.waiting[address].move_to_end(claim)
            if waiter.done():  # cancelled meanwhile: not a turn taken
                continue
            self._admit((address, claim))
            waiter.set_result(None)

    def _next(self) -> Caller | None:
        """The first caller in round-robin order with a waiter and room for one more inside
        (at most capacity / per_caller callers are full, so few are passed over)."""
        for address, callers in self.waiting.items():
            for claim in callers:
                if self.running[(address, claim)] < self.per_caller:
                    return address, claim
        return None


class Admission:
    """Fair turns (`Turns`) for HTTP requests inside `app`, `capacity()` at most at once
    (asked at the first request, when the runtime exists; a failure: no turns taken, asked
    again next time; None: no bound but the caller's)."""

    def __init__(
        self,
        app: ASGIApp,
        capacity: Callable[[], int | None],
        per_caller: int = PER_CALLER,
        waiting_per_caller: int = WAITING_PER_CALLER,
        waiting_per_address: int = WAITING_PER_ADDRESS,
    ) -> None:
        self.app = app
        self.capacity = capacity
        self.bounds = (per_caller, waiting_per_caller, waiting_per_address)
        self.turns: Turns | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.turns is None:
            self._resolve()
        turns = self.turns
        if turns is None:
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body[-1]["type"] == "http.disconnect":
            return  # the client left: no one to answer
        caller = caller_of(scope)
        if not turns.enter(caller):
            waiter: Waiter = asyncio.get_running_loop().create_future()
            why = turns.queue(caller, waiter)
            if why is not None:
                await refuse(send, 429, f"{why}; retry after 1 s")
                return
            if not await _wait(turns, caller, waiter, receive, body):
                return

        async def replay() -> Message:
            return body.pop(0) if body else await receive()

        holding = True

        async def answering(message: Message) -> None:
            nonlocal holding
            if holding and message["type"] == "http.response.start":
                holding = False
                turns.leave(caller)
            await send(message)

        try:
            await self.app(scope, replay, answering)
        finally:
            if holding:
                turns.leave(caller)

    def _resolve(self) -> None:
        try:
            n = self.capacity()
        except Exception:  # the runtime cannot be made: the route's own dependency answers why
            return
        self.turns = Turns(n if n is not None and n > 0 else None, *self.bounds)


async def _wait(
    turns: Turns, caller: Caller, waiter: Waiter, receive: Receive, body: list[Message]
) -> bool:
    """Until the waiter's turn comes (True: it is in) or its client leaves (False: its place
    given up). The body is whole, so the client's next word is its disconnect."""
    gone = asyncio.ensure_future(receive())
    try:
        await asyncio.wait((waiter, gone), return_when=asyncio.FIRST_COMPLETED)
        if gone.done() and not _left(gone):
            body.append(gone.result())  # not a disconnect: the app's to read
            await waiter
    except BaseException:
        gone.cancel()
        if waiter.done() and not waiter.cancelled():
            turns.leave(caller)
        else:
            waiter.cancel()
            turns.forget(caller, waiter)
        raise
    if not gone.done():
        gone.cancel()
        return True
    if waiter.done():
        if _left(gone):
            turns.leave(caller)
            return False
        return True
    waiter.cancel()
    turns.forget(caller, waiter)
    return False


def _left(gone: asyncio.Future[Message]) -> bool:
    return gone.exception() is not None or gone.result()["type"] == "http.disconnect"


async def _read_body(receive: Receive) -> list[Message]:
    """The request's messages up to its last body part (or a disconnect), to hand on as read."""
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


__all__ = ["Admission", "Turns"]
