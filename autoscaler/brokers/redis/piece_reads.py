"""The reader's per-key piece reads: the first pass over every queue's priority keys (a script
call per piece of queues, or LLEN + LRANGE per key in pipeline mode), the continuations of
lists deeper than a piece scans, their answers folded as they arrive, and the queues settled
from them (`redis_pieces` has the script, `list_scans` the tasks and pieces)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import redis

from autoscaler.brokers.base import PUBLISHED_AT_HEADER
from autoscaler.brokers.redis.found import Found, queue_metrics
from autoscaler.brokers.redis.heads import Item, from_window, head_age, wants_window
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from autoscaler.brokers.redis.list_scans import (
    ListScan,
    Task,
    pack,
    parse_items,
    queues_per_piece,
    task_args,
)
from autoscaler.brokers.redis.redis_pieces import MAX_RESTARTS, PIECES_LUA, SEARCH_RADIUS
from autoscaler.brokers.redis.rounds import resp, resp_args


class PieceReads:
    """The lists' side of the reader: the calls of each round, and their answers folded."""

    layout: CeleryRedisLayout
    mode: Literal["script", "pipeline"]
    piece_budget: int
    window: int
    scan_limit: int
    scan_budget: int
    _client: redis.Redis
    _sha: str
    _windows: dict[str, tuple[tuple[str, ...], list[float]]]
    _items: dict[int, tuple[bytes, tuple[Item, ...], tuple[str, ...]]]
    _chunks: tuple[tuple[list[str], int], list[tuple[int, bytes]]] | None

    def _parsed(self, index: int, raw: bytes) -> tuple[tuple[Item, ...], tuple[str, ...]]:
        cached = self._items.get(index)
        if cached is not None and cached[0] == raw:
            return cached[1], cached[2]
        items = tuple(Item(*it) for it in parse_items(raw))
        idents = tuple(it.ident for it in items)
        if len(self._items) > 200_000:
            self._items.clear()
        self._items[index] = (raw, items, idents)
        return items, idents

    def _first_pass(self, queues: Sequence[str], now: float) -> list[bytes]:
        """Every key's depth, and in script mode its head scanned while the piece's units
        last: one script call per piece of queues, or LLEN + LRANGE per key."""
        lay = self.layout
        nsteps = len(lay.suffixes)
        if self.mode == "script":
            per = queues_per_piece(nsteps, self.piece_budget)
            common = resp_args(
                [
                    "EVALSHA",
                    self._sha,
                    0,
                    "q",
                    f'"{PUBLISHED_AT_HEADER}"',
                    repr(now),
                    self.window,
                    self.piece_budget,
                    SEARCH_RADIUS,
                    lay.global_keyprefix,
                    lay.sep,
                    ",".join(str(s) for s in lay.steps),
                    min(self.scan_limit, self.window),
                ]
            )
            # EVALSHA straight into the pipeline (redis-py's own script-in-pipeline support
            # sends SCRIPT EXISTS first, a second round trip on every tick); the queue names
            # are encoded once for as long as the same queues are read
            if self._chunks is None or self._chunks[0] != (queues, per):
                self._chunks = (
                    (list(queues), per),
                    [
                        (len(queues[i : i + per]), resp_args([i * nsteps, *queues[i : i + per]]))
                        for i in range(0, len(queues), per)
                    ],
                )
            return [b"*%d\r\n%s%s" % (14 + count, common, tail) for count, tail in self._chunks[1]]
        calls: list[bytes] = []
        for q in queues:
            for key in lay.keys(q):
                calls.append(resp(("LLEN", key)))
                calls.append(resp(("LRANGE", key, -self.window, -1)))
        return calls

    def _continuations(self, tasks: Sequence[Task], now: float) -> list[bytes]:
        common: list[str | int] = [
            "c",
            f'"{PUBLISHED_AT_HEADER}"',
            repr(now),
            self.window,
            self.piece_budget,
            SEARCH_RADIUS,
        ]
        calls: list[bytes] = []
        for piece in pack(tasks, self.piece_budget, self.window):
            args: list[str | int] = ["EVALSHA", self._sha, 0, *common]
            for number in piece:
                args.extend(task_args(number, tasks[number]))
            calls.append(resp(args))
        return calls

    def _take_tasks(self, tasks: Sequence[Task], results: Mapping[int, list[bytes]]) -> None:
        """Fold a round's task answers into their lists and set what is left to do. A lost
        anchor scans that list again from its head (once); after that, or for a key that
        changed type, the rest of the range counts as due."""
        by_scan: dict[int, list[tuple[Task, list[bytes] | None]]] = {}
        for number, task in enumerate(tasks):
            by_scan.setdefault(task[0].index, []).append((task, results.get(number)))
        for group in by_scan.values():
            scan = group[0][0][0]
            scan.ranges = []
            if any(f is not None and f[1] != b"E" and f[2] == b"L" for _, f in group) and (
                scan.restarts < MAX_RESTARTS
            ):
                scan.restart(self.window)
                continue
            for (_, _, _, hi), f in group:
                if f is None or f[1] == b"E" or f[2] == b"L":
                    continue
                rest = scan.fold(f)
                if f[2] == b"M" and rest is not None:
                    # the rest of this task's segment only (the next segment is another task's)
                    rest.hi = min(hi, scan.target(rest, self.window))
                    if rest.lo < rest.hi:
                        scan.ranges.append(rest)

    def _take_pass(
        self,
        replies: Iterator[Any],
        count: int,
        queues: Sequence[str],
        read_at: datetime,
        valid: bool,
    ) -> tuple[Found, dict[int, ListScan]] | Exception | None:
        """Fold the first pass's replies, settling each piece's queues as it arrives; None
        when they do not count (read before the index's first scan completed); the error when
        a piece failed."""
        now = read_at.timestamp()
        nsteps = len(self.layout.suffixes)
        found = Found(len(queues))
        scans: dict[int, ListScan] = {}
        trouble: Exception | None = None
        if self.mode != "script":
            heads: list[tuple[int, tuple[Item, ...], tuple[str, ...]]] = []
            for index in range(count // 2):
                n, window = next(replies), next(replies)
                if not valid:
                    continue
                if isinstance(n, Exception) or isinstance(window, Exception):
                    found.errors[index] = str(n if isinstance(n, Exception) else window)
                    found.open.add(index // nsteps)
                elif n:
                    got = from_window(int(n), list(reversed(window)), now)
                    found.add(index // nsteps, got.depth, got.scheduled, got.next_due)
                    heads.append((index, got.items, tuple(it.ident for it in got.items)))
            if valid:
                self._settle(found, heads, 0, len(queues), queues, read_at)
            return (found, scans) if valid else None
        per = queues_per_piece(nsteps, self.piece_budget)
        for piece in range(count):
            reply = next(replies)
            if isinstance(reply, Exception):
                trouble = trouble or reply
            if trouble is not None or not valid:
                continue
            heads = []
            for line in reply.split(b"\n") if reply else ():
                f = line.split(b"\t")
                index = int(f[0])
                if f[1] == b"E":
                    found.errors[index] = b"\t".join(f[2:]).decode(errors="replace")
                    found.open.add(index // nsteps)
                elif len(f) == 7:  # done in this piece: the common case, folded at once
                    qi = index // nsteps
                    found.add(qi, int(f[1]), int(f[3]), float(f[4]) if f[4] else None)
                    if f[5]:
                        found.aged(qi, max(0.0, now - float(f[5])))
                    if f[6]:
                        heads.append((index, *self._parsed(index, f[6])))
                else:
                    s = ListScan(index, "", int(f[1]))
                    rest = s.fold(f)
                    if rest is not None:
                        s.ranges.append(rest)
                    scans[index] = s
                    found.open.add(index // nsteps)
            self._settle(
                found, heads, piece * per, min(len(queues), (piece + 1) * per), queues, read_at
            )
        if trouble is not None:
            return trouble
        return (found, scans) if valid else None

    def _settle(
        self,
        found: Found,
        heads: Sequence[tuple[int, tuple[Item, ...], tuple[str, ...]]],
        lo: int,
        hi: int,
        queues: Sequence[str],
        read_at: datetime,
    ) -> None:
        """Ages from the heads of queues lo..hi (a window seen unchanged since the last read
        keeps its first sightings; a new one leaves its queue open), then the reading of every
        queue among them that nothing else waits for."""
        now = read_at.timestamp()
        nsteps = len(self.layout.suffixes)
        prefix, suffixes = self.layout.global_keyprefix, self.layout.suffixes
        for index, items, idents in heads:
            qi = index // nsteps
            if not wants_window(items):
                found.aged(qi, head_age(items, now, None))
                continue
            key = prefix + queues[qi] + suffixes[index % nsteps]
            found.windows[key] = (qi, items, idents)
            cached = self._windows.get(key)
            if cached is not None and cached[0] == idents:
                found.aged(qi, head_age(items, now, cached[1]))
            else:
                found.open.add(qi)
        for qi in range(lo, hi):
            if qi not in found.open:
                found.metrics[qi] = queue_metrics(
                    queues[qi],
                    found.pending[qi],
                    found.ages[qi],
                    0,
                    read_at,
                    found.scheduled[qi],
                    found.next_due[qi],
                    0,
                )

    def _deep_stops(self, scans: Mapping[int, ListScan]) -> None:
        """How far each list is scanned for ETAs this read: its first `window` messages, and
        beyond them up to `scan_limit` while the read's `scan_budget` lasts (keys in order)."""
        left = self.scan_budget
        first = min(self.scan_limit, self.window)
        for index in sorted(scans):
            s = scans[index]
            s.stop = first
            if s.depth > self.window and self.scan_limit > self.window and left > 0:
                extra = min(min(s.depth, self.scan_limit) - self.window, left)
                s.stop, left = self.window + extra, left - extra
            for r in s.ranges:
                r.hi = s.target(r, self.window)
            s.ranges = [r for r in s.ranges if r.lo < r.hi]

    def _trouble(self, error: Exception, reloaded: bool) -> bool:
        """After a piece failed: True when the script was loaded into a restarted or flushed
        server (the pieces go again); False when scripting is refused (the read goes on in
        pipeline mode). Any other error fails the read."""
        if isinstance(error, redis.exceptions.NoScriptError) and not reloaded:
            self._client.script_load(PIECES_LUA)
            return True
        if isinstance(error, redis.ResponseError) and _scripting_refused(error):
            self.mode = "pipeline"
            return False
        raise error


def _scripting_refused(exc: redis.ResponseError) -> bool:
    text = str(exc).lower()
    return "unknown command" in text or "noperm" in text or "not allowed" in text
