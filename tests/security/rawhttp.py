"""HTTP/1.1 on sockets of our own, for attacks an HTTP library will not make: many requests
sent at once before any answer is read, bodies that stop half-way, a chosen source address
(any of 127.0.0.0/8 on loopback)."""

from __future__ import annotations

import json
import selectors
import socket
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    status: int
    head: bytes
    body: bytes

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower().encode():
                return value.strip().decode("latin-1")
        return None

    def json(self) -> Any:
        return json.loads(self.body)


def request_head(
    method: str, path: str, length: int | None, headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: api", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def send(base: str, data: bytes, source: str = "127.0.0.1", timeout: float = 30.0) -> socket.socket:
    """A new connection from `source` to the API at `base`, `data` written on it."""
    host, port = base.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=timeout, source_address=(source, 0))
    s.sendall(data)
    return s


def answer(s: socket.socket, within: float = 30.0) -> Answer | None:
    """The answer on `s`, or None if none came within `within` seconds."""
    return answers([s], 1, within).get(0)


def answers(sockets: list[socket.socket], want: int, within: float = 60.0) -> dict[int, Answer]:
    """Answers on `sockets` (by index) as they come, until `want` of them are whole or
    `within` seconds have passed; a socket reset with nothing read counts as status 0."""
    got: dict[int, bytes] = {i: b"" for i in range(len(sockets))}
    done: dict[int, Answer] = {}
    deadline = time.monotonic() + within
    with selectors.DefaultSelector() as sel:
        for i, s in enumerate(sockets):
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, i)
        while len(done) < want and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(timeout=min(left, 1.0)):
                i = key.data
                try:
                    chunk = key.fileobj.recv(65536)  # type: ignore[union-attr]
                except ConnectionResetError:
                    chunk = b""
                got[i] += chunk
                whole = _whole(got[i])
                if whole is None and not chunk:
                    whole = Answer(0, b"", b"")
                if whole is not None:
                    done[i] = whole
                    sel.unregister(key.fileobj)
    for s in sockets:
        s.setblocking(True)
    return done


def _whole(got: bytes) -> Answer | None:
    if b"\r\n\r\n" not in got:
        return None
    head, _, rest = got.partition(b"\r\n\r\n")
    length = _length(head)
    if length is None or len(rest) < length:
        return None
    return Answer(int(head.split(b" ", 2)[1]), head, rest[:length])


def closed(s: socket.socket, within: float = 10.0) -> bool:
    """The server closed `s` (after what it answered) within `within` seconds."""
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def _length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            return int(value.strip())
    return None
