"""Request bodies are bounded before they are read: an unauthenticated client cannot make the
API hold what it sends.

A 300 MB body once took `autoscaler serve` from 116 MB to 1 GB resident before the 401 came (the
key is checked after FastAPI has read and parsed the body). This ASGI middleware answers 413 at
once when `Content-Length` says more than the limit, and counts a body without one (chunked,
streamed) as it arrives, cutting it off at the limit. `AUTOSCALER_API_MAX_BODY` sets the limit
(bytes, 1 MiB by default: a config document is at most 1 MiB of YAML).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from autoscaler.digits import ascii_whole

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY = 1024 * 1024


class _TooLarge(BaseException):
    """Raised from `receive` past the limit. A BaseException, so that the app's own handlers
    (which turn an `Exception` into a 500) let it through to this middleware."""


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, before or while they are read."""

    def __init__(self, app: ASGIApp, limit: int = DEFAULT_MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared == "bad":
            await _refuse(send, 400, "Content-Length is not a number")
            return
        if isinstance(declared, int) and declared > self.limit:
            await _refuse(send, 413, self._why())
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _TooLarge:
            if not started:
                await _refuse(send, 413, self._why())

    def _why(self) -> str:
        return f"the request body is larger than {self.limit} bytes (AUTOSCALER_API_MAX_BODY)"


def _content_length(scope: Scope) -> int | str | None:
    for name, value in scope.get("headers") or ():
        if name.lower() == b"content-length":
            n = ascii_whole(value.decode("latin-1").strip())
            return "bad" if n is None else n
    return None


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
