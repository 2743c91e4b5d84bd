"""Request bodies are bounded in size, in time and in memory per address before they are read
whole, and before any key is checked: an unauthenticated client cannot make the API hold what
it sends, nor hold it for long.

- **Size**: 413 at once when `Content-Length` says more than the limit, and a body without one
  (chunked) counted as it arrives and cut off there. `AUTOSCALER_API_MAX_BODY` (bytes, 1 MiB by
  default: a config document is at most 1 MiB of YAML). A 300 MB body once took `autoscaler
  serve` from 116 MB to 1 GB resident before the 401 came.
- **Time**: the whole body within `AUTOSCALER_API_BODY_TIMEOUT` seconds (10 by default) of its
  headers, else 408 and the connection closed. The agent sends its body at once and gives up
  on an answer after 10 s; 1 MiB in 10 s is 100 KiB/s.
- **Memory**: the bodies one address has in the API (read, or being read, and not yet
  answered) hold at most 8 bodies' worth (8 MiB by default), all addresses together 64; past
  it, 429 (503 for the total) with Retry-After, at once. The address is the client's IP, an
  IPv6 client's /64 (`callers.py`).

Measured (`benchmarks/slow_bodies.py`, 120 unauthenticated connections each holding 1,023 KiB
of a 1 MiB body for 20 s, then closed): before, RSS +124 MB while held and the same 5 s after
they closed, no connection answered; now RSS +10 MB at the peak and +0 MB 5 s after the close,
8 answered 408 at 10 s and 112 refused 429 at once, /healthz answered in 5 ms (max 7 ms).

The body is read whole here, before the request waits for a turn (`admission.py`), so a slow
sender holds no turn; each part is counted as it comes, so nothing past the bounds is kept.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from autoscaler.api.callers import address_of
from autoscaler.digits import ascii_whole

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY = 1024 * 1024
DEFAULT_BODY_TIMEOUT = 10
BODIES_PER_ADDRESS = 8
"""Bodies' worth of bytes one address may have in the API at once (8 x the limit)."""
BODIES_IN_ALL = 64
"""Bodies' worth of bytes all addresses together may have in the API at once."""
RETRY_AFTER = 1


class BodyLimit:
    """Read each request's body whole, within `limit` bytes and `deadline` seconds of its
    headers, within the memory its address and all may hold, then hand it to `app`."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int = DEFAULT_MAX_BODY,
        deadline: float = DEFAULT_BODY_TIMEOUT,
        per_address: int | None = None,
        in_all: int | None = None,
    ) -> None:
        self.app = app
        self.limit = limit
        self.deadline = deadline
        self.per_address = per_address or BODIES_PER_ADDRESS * limit
        self.in_all = in_all or BODIES_IN_ALL * limit
        self.held: Counter[str] = Counter()
        self.held_in_all = 0
        self.given_back = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared == "bad":
            await refuse(send, 400, "Content-Length is not a number")
            return
        if isinstance(declared, int) and declared > self.limit:
            await refuse(send, 413, self._too_large())
            return
        address = address_of(scope)
        if isinstance(declared, int) and (why := self._no_room(address, declared)):
            await refuse(send, *why)
            return
        body = _Body()
        try:
            refusal = await self._read(receive, address, body)
            if refusal is not None:
                await refuse(send, *refusal)
                return
            if body.messages[-1]["type"] == "http.disconnect":
                return  # the client left before its body was whole: no one to answer
            await self.app(scope, body.replay(receive), send)
        finally:
            self._give(address, body.taken)

    async def _read(self, receive: Receive, address: str, body: _Body) -> tuple[int, str] | None:
        """The body's parts into `body`, or why it is refused (and nothing of it kept)."""
        try:
            async with asyncio.timeout(self.deadline):
                while True:
                    message = await receive()
                    if message["type"] == "http.request":
                        n = len(message.get("body", b""))
                        if body.taken + n > self.limit:
                            body.messages.clear()
                            return 413, self._too_large()
                        if why := self._no_room(address, n):
                            body.messages.clear()
                            return why
                        self._take(address, n)
                        body.taken += n
                    body.messages.append(message)
                    if message["type"] != "http.request" or not message.get("more_body"):
                        return None
        except TimeoutError:
            body.messages.clear()
            return 408, self._too_slow()

    def _no_room(self, address: str, n: int) -> tuple[int, str] | None:
        if self.held[address] + n > self.per_address:
            return 429, (
                f"this address has {self.held[address]} bytes of request bodies in the API, "
                f"at most {self.per_address} ({BODIES_PER_ADDRESS} x AUTOSCALER_API_MAX_BODY): "
                f"retry after {RETRY_AFTER} s"
            )
        if self.held_in_all + n > self.in_all:
            return 503, (
                f"the API holds {self.held_in_all} bytes of request bodies, at most "
                f"{self.in_all} ({BODIES_IN_ALL} x AUTOSCALER_API_MAX_BODY): retry after "
                f"{RETRY_AFTER} s"
            )
        return None

    def _take(self, address: str, n: int) -> None:
        if n <= 0:
            return  # nothing held: no entry (an empty body is most requests)
        self.held[address] += n
        self.held_in_all += n

    def _give(self, address: str, n: int) -> None:
        if n <= 0:
            return
        self.held_in_all -= n
        self.held[address] -= n
        if self.held[address] <= 0:
            del self.held[address]
        self.given_back += n
        if self.given_back >= self.per_address and self.held_in_all <= self.limit:
            self.given_back = 0
            return_memory()

    def _too_large(self) -> str:
        return f"the request body is larger than {self.limit} bytes (AUTOSCALER_API_MAX_BODY)"

    def _too_slow(self) -> str:
        return (
            f"the request body did not arrive whole within {self.deadline:g} s of its headers "
            "(AUTOSCALER_API_BODY_TIMEOUT): send it at once"
        )


class _Body:
    """A request's body as read: its messages, to hand on in order, and the bytes counted."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.taken = 0

    def replay(self, receive: Receive) -> Receive:
        async def replayed() -> Message:
            return self.messages.pop(0) if self.messages else await receive()

        return replayed


def _libc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc: its allocator returns what it returns
        return None
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim


_TRIM = _libc_trim()


def return_memory() -> None:
    """Give the freed heap back to the system (glibc's `malloc_trim`). Bodies freed amid
    longer-lived objects leave the heap's pages free but mapped: 120 addresses' slow bodies
    left the API 54 MB larger after they were closed and freed, and 4 MB after a trim."""
    if _TRIM is not None:
        _TRIM(0)


def _content_length(scope: Scope) -> int | str | None:
    for name, value in scope.get("headers") or ():
        if name.lower() == b"content-length":
            n = ascii_whole(value.decode("latin-1").strip())
            return "bad" if n is None else n
    return None


async def refuse(send: Send, status: int, detail: str) -> None:
    """A one-line JSON answer that closes the connection (a body may still be arriving on it);
    429 and 503 say when to try again."""
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if status in (429, 503):
        headers.append((b"retry-after", str(RETRY_AFTER).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_MAX_BODY",
    "ASGIApp",
    "BodyLimit",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "refuse",
]
