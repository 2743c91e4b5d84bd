"""In-flight accounting: kombu's `unacked` hash read through its index, routed to queues.

What can move between two pieces, and why no job is counted twice: kombu moves a job from a list
to `unacked` (BRPOP, then one MULTI writing the hash and `{prefix}unacked_index`, scored by the
delivery time) or back (a restore: one MULTI removing both and pushing the job onto its list).
A read takes a first view of the index before any list is counted and a second one after every
list is; a job counts as delivered only if both views show it with the same delivery time, i.e.
a worker held it the whole time, so it was in no list when its list was counted. Every other job
counts at most in the one list that held it when that list's depth was read. A job moving
during the read is therefore counted once or - popped before its list was counted and delivered
after the first view - not at all for this tick; the jobs delivered during the read (in the
second view, not the first) are reported apart as `delivered_during_read`, which keeps machines
from idle drains and rents nothing. Within a list, ETA classification continues
across pieces behind the last message examined (found again by its SHA-1 if the head moved) and
never beyond the depth counted, so scheduled <= depth. A hash without kombu's index (other
writers) is counted as read, without that guarantee.

The two views of the index are `index_scans.IndexView`s; the unacked entries they hold are
routed to queues as kombu's Redis transport routes them (the anonymous exchange by queue name,
any other through its binding table `{prefix}_kombu.binding.{exchange}`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from autoscaler.brokers.redis.heads import parse_eta
from autoscaler.brokers.redis.index_scans import CursorScan, IndexView
from autoscaler.brokers.redis.keys import DEFAULT_SEP, CeleryRedisLayout
from autoscaler.brokers.redis.rounds import MAX_ROUNDS, RoundTrips, resp


def count_unacked(values: Sequence[bytes]) -> Counter[str]:
    """Unacked messages per *routing key* (not per queue: see `resolve_unacked`)."""
    counts: Counter[str] = Counter()
    for raw in values:
        try:
            entry = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(entry, list) and len(entry) >= 3 and isinstance(entry[2], str):
            counts[entry[2]] += 1
    return counts


Binding = tuple[str, str, str]  # routing key, pattern (topic exchanges), queue


def parse_bindings(members: Sequence[bytes], sep: str) -> list[Binding]:
    out: list[Binding] = []
    for raw in members:
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        parts = text.split(sep)
        if len(parts) != 3 and sep != DEFAULT_SEP:
            parts = text.split(DEFAULT_SEP)
        if len(parts) == 3:
            out.append((parts[0], parts[1], parts[2]))
    return out


_PATTERNS: dict[str, re.Pattern[str] | None] = {}


def _topic_match(pattern: str, routing_key: str) -> bool:
    if pattern not in _PATTERNS:
        if len(_PATTERNS) > 10_000:
            _PATTERNS.clear()
        try:
            _PATTERNS[pattern] = re.compile(pattern)
        except re.error:
            _PATTERNS[pattern] = None
    compiled = _PATTERNS[pattern]
    return bool(compiled is not None and compiled.match(routing_key))


def route(exchange: str, routing_key: str, bindings: Mapping[str, list[Binding]]) -> list[str]:
    """The queues kombu delivers (exchange, routing key) to, as its Redis transport does."""
    if not exchange:
        return [routing_key]
    table = bindings.get(exchange)
    if not table:
        return [routing_key]  # no table known: the queue named like the key, as before
    found = [
        q
        for rk, pattern, q in table
        if (pattern and _topic_match(pattern, routing_key)) or (not pattern and rk == routing_key)
    ]
    return list(dict.fromkeys(found)) or [routing_key]


@dataclass
class Unacked:
    """What the unacked hash holds for one queue."""

    due: int = 0
    scheduled: int = 0
    next_due: float | None = None


def resolve_unacked(
    values: Sequence[bytes], bindings: Mapping[str, list[Binding]], now: float
) -> tuple[dict[str, Unacked], set[str]]:
    """Unacked messages per queue (due, and ETA-held), and the exchanges they were sent to."""
    out: dict[str, Unacked] = {}
    exchanges: set[str] = set()
    for raw in values:
        try:
            entry = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            continue
        if not (isinstance(entry, list) and len(entry) >= 3):
            continue
        msg, exchange, rk = entry[0], entry[1], entry[2]
        if not isinstance(rk, str) or not isinstance(exchange, str):
            continue
        if exchange:
            exchanges.add(exchange)
        headers = msg.get("headers") if isinstance(msg, dict) else None
        eta = parse_eta(headers.get("eta")) if isinstance(headers, dict) else None
        for q in route(exchange, rk, bindings):
            u = out.setdefault(q, Unacked())
            if eta is not None and eta > now:
                u.scheduled += 1
                u.next_due = eta if u.next_due is None else min(u.next_due, eta)
            else:
                u.due += 1
    return out, exchanges


class UnackedReads(RoundTrips):
    """The reader's views of the unacked index, the entries it counts, the binding tables."""

    layout: CeleryRedisLayout
    piece_budget: int
    mode: Literal["script", "pipeline"]
    _sha: str
    _index_size: int
    _count_in_flight: bool
    _exchanges: set[str]

    def _views(self, expected: int | None = None) -> tuple[IndexView, IndexView]:
        """The two views of the unacked index one read takes, each with its entries' values
        (the second's name the queues of jobs delivered during the read)."""
        lay, budget = self.layout, self.piece_budget
        size = self._index_size if expected is None else expected
        sha = self._sha if self.mode == "script" else None
        # a slice's commands and entries (with a value each in the first) within the budget
        margin = IndexView.MARGIN
        per = (budget - 4) // 2 - margin
        return (
            IndexView(lay.unacked_index, lay.unacked, per, size, sha),
            IndexView(lay.unacked_index, lay.unacked, per, size, sha),
        )

    def _held(self, first: IndexView, last: IndexView, legacy: CursorScan | None) -> list[bytes]:
        """The unacked entries to count: those both views of the index saw with the same
        delivery time (held by a worker for the whole read). Without an index (a hash kombu
        did not write) the hash as read; a foreign key named like the hash counts nothing."""
        if not self._count_in_flight or first.hash_error is not None:
            return []
        if legacy is not None:
            return [] if legacy.error is not None else list(legacy.found.values())
        out = []
        for tag, delivered in first.found.items():
            if delivered is not None and last.found.get(tag) == delivered:
                value = first.values.get(tag)
                if value:
                    out.append(value)
        return out

    def _delivered(
        self, first: IndexView, last: IndexView, legacy: CursorScan | None
    ) -> list[bytes]:
        """The unacked entries the second view holds and the first did not (delivered during
        the read): each counts in its list, or - taken from the list before the list was
        counted - nowhere. They are not counted as load (no machine is rented for them), only
        as `QueueMetrics.delivered_during_read`: a machine that may hold one is not idle."""
        if not self._count_in_flight or legacy is not None or last.hash_error is not None:
            return []
        return [
            value
            for tag, delivered in last.found.items()
            if delivered is not None
            and first.found.get(tag) != delivered
            and (value := last.values.get(tag))
        ]

    def _bindings_for(self, exchanges: set[str]) -> dict[str, list[Binding]]:
        """Binding tables of exchanges seen for the first time (one more round trip, once)."""
        new = sorted(exchanges - self._exchanges)[:1000]
        if not new:
            return {}
        tables = {
            ex: CursorScan("SSCAN", self.layout.binding_key(ex), self.piece_budget) for ex in new
        }
        for _ in range(MAX_ROUNDS):
            todo = [t for t in tables.values() if not t.done]
            if not todo:
                break
            for t, reply in zip(todo, self._round([resp(t.call()) for t in todo]), strict=True):
                t.feed(reply)
        if len(self._exchanges) < 10_000:
            self._exchanges.update(new)
        return {
            ex: parse_bindings(list(t.found), self.layout.sep)
            for ex, t in tables.items()
            if t.error is None
        }
