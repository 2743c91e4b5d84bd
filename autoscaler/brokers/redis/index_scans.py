"""Sorted sets, hashes and sets read in bounded pages: kombu's unacked index in rank slices of
the budget with each tag's value from the hash in the same call (`IndexView`, through the
script's 'u' mode in `redis_pieces`), other keys by SSCAN / HSCAN pages (`CursorScan`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def _score(raw: Any) -> float | None:
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


class IndexView:
    """kombu's unacked index (delivery tag -> delivery time) as one pass over it saw it, read
    in slices of ranks (overlapping by `MARGIN`: an entry removed meanwhile shifts the ranks
    behind it), all sent in one round when the index is no bigger than `expected` (the last
    read's size, +25%); more slices follow if it grew. With `hash_key`, each tag's value in the
    unacked hash comes along. A script call per slice (`sha`), or ZCARD / HLEN / ZRANGE and
    HMGET where scripting is refused. An entry present the whole time is seen unless more
    than MARGIN entries before it went between two slices; no entry is made up."""

    MARGIN = 32

    def __init__(
        self, index_key: str, hash_key: str | None, per: int, expected: int, sha: str | None
    ) -> None:
        self.index_key, self.hash_key = index_key, hash_key
        self.per, self.expected, self.sha = max(10, per), expected, sha
        self.size: int | None = None  # ZCARD, as the last slice saw it
        self.hash_size = 0
        self.requested = 0  # ranks below this were asked for
        self.found: dict[bytes, float | None] = {}
        self.values: dict[bytes, bytes] = {}
        self.error: str | None = None
        self.hash_error: str | None = None
        self.noscript = False  # a slice found the script gone (a restarted or flushed server)
        self._sent: list[str] = []

    @property
    def done(self) -> bool:
        return self.error is not None or (self.size is not None and self.requested >= self.size)

    def needs_values(self) -> bool:
        """Values still to fetch (HMGET, without scripting)."""
        return (
            self.sha is None
            and self.hash_key is not None
            and self.done
            and self.hash_error is None
            and any(t not in self.values for t in self.found)
        )

    def calls(self) -> list[tuple[Any, ...]]:
        """This round's commands for the view."""
        out: list[tuple[Any, ...]] = []
        self._sent = []
        if self.sha is None and self.size is None:
            out.append(("ZCARD", self.index_key))
            self._sent.append("zcard")
            if self.hash_key is not None:
                out.append(("HLEN", self.hash_key))
                self._sent.append("hlen")
        end = max(self.expected + self.expected // 4, self.size or 0) + self.MARGIN
        start = self.requested
        while True:
            lo = max(0, start - (self.MARGIN if start else 0))
            hi = start + self.per - 1
            if self.sha is not None:
                out.append(
                    (
                        "EVALSHA",
                        self.sha,
                        0,
                        "u",
                        "",
                        0,
                        0,
                        0,
                        0,
                        self.index_key,
                        self.hash_key or "",
                        lo,
                        hi,
                    )
                )
            else:
                out.append(("ZRANGE", self.index_key, lo, hi, "WITHSCORES"))
            self._sent.append("slice")
            start = hi + 1
            if start >= end:
                break
        self.requested = start
        return out

    def value_calls(self) -> list[tuple[Any, ...]]:
        missing = [t for t in self.found if t not in self.values]
        self._sent = ["values"] * -(-len(missing) // self.per)
        return [
            ("HMGET", self.hash_key, *missing[i : i + self.per])
            for i in range(0, len(missing), self.per)
        ]

    def feed(self, replies: Iterator[Any]) -> None:
        """Take this round's replies, in the order of `calls` / `value_calls`."""
        for kind in self._sent:
            reply = next(replies)
            if self.error is not None:
                continue
            if isinstance(reply, Exception):
                if type(reply).__name__ == "NoScriptError":
                    self.noscript = True
                elif kind in ("hlen", "values"):
                    self.hash_error = str(reply)
                else:
                    self.error = str(reply)
                continue
            if kind == "zcard":
                self.size = int(reply)
            elif kind == "hlen":
                self.hash_size = int(reply)
            elif kind == "values":
                tags = [t for t in self.found if t not in self.values][: len(reply)]
                for tag, value in zip(tags, reply, strict=True):
                    self.values[tag] = value or b""
            elif self.sha is not None:
                self._feed_script(reply)
            else:
                flat = (
                    [x for pair in reply for x in pair]
                    if reply and isinstance(reply[0], list | tuple)
                    else list(reply)
                )
                for i in range(0, len(flat) - 1, 2):
                    self.found[flat[i]] = _score(flat[i + 1])

    def _feed_script(self, reply: list[Any]) -> None:
        if reply and reply[0] in (-1, -2):
            text = reply[1].decode(errors="replace") if len(reply) > 1 else "error"
            if reply[0] == -1:
                self.error = text
            else:
                self.hash_error = text
            return
        self.size, self.hash_size = int(reply[0]), int(reply[1])
        step = 3 if self.hash_key is not None else 2
        for i in range(2, len(reply) - step + 1, step):
            self.found[reply[i]] = _score(reply[i + 1])
            if step == 3 and reply[i + 2]:
                self.values[reply[i]] = reply[i + 2]


class CursorScan:
    """One ZSCAN / HSCAN / SSCAN iteration over a key, a bounded page per round.

    The result is what SCAN guarantees: every element present for the whole iteration, once
    (duplicates from a rehash are merged); elements added or removed meanwhile may be missing.
    `found` maps a member to its score (ZSCAN, as the server wrote it) or value (HSCAN), or to
    None (SSCAN). A key of another type reads as empty, with `error` set."""

    def __init__(self, command: str, key: str, count: int) -> None:
        self.command = command  # "ZSCAN", "HSCAN" or "SSCAN"
        self.key = key
        self.count = max(10, count)
        self.cursor = b"0"
        self.pages = 0
        self.done = False
        self.error: str | None = None
        self.found: dict[bytes, Any] = {}

    def call(self) -> tuple[Any, ...]:
        """The next page's command, for a round's pipeline."""
        return (self.command, self.key, self.cursor, "COUNT", self.count)

    def feed(self, reply: Any) -> None:
        self.pages += 1
        if isinstance(reply, Exception):
            self.error = str(reply)
            self.found = {}
            self.done = True
            return
        cursor, data = reply
        if self.command == "SSCAN":
            self.found.update(dict.fromkeys(data))
        else:  # member, score / field, value, flat
            it = iter(data)
            self.found.update(zip(it, it, strict=True))
        self.cursor = cursor
        self.done = cursor in (b"0", 0, "0")
