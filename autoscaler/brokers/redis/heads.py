"""The messages at a list's head examined in Python: Celery's `eta` header (scheduled or due),
the producer's publish stamp, and the longest wait among the due ones. The script in
`redis_pieces` does the same on the server; the pipeline mode and the unacked hash use these."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from autoscaler.brokers.base import PUBLISHED_AT_HEADER, _as_float


def parse_eta(value: Any) -> float | None:
    """Epoch seconds of Celery's `eta` header (ISO 8601; naive means UTC), None if absent."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


class Item(NamedTuple):
    """One message near the head of a list: its id as the script returned it ("sha1:<hex>" for
    a message without a usable id, "" when no window needs it), stamped publish time and ETA."""

    ident: str
    stamp: float | None
    eta: float | None


class KeyRead(NamedTuple):
    """One non-empty priority key: depth, future-ETA messages among the `scanned` oldest, the
    earliest of their ETAs, and the items from the head the script returned."""

    depth: int
    scheduled: int
    next_due: float | None
    scanned: int
    items: tuple[Item, ...] = ()

    def wants_window(self) -> bool:
        """An unstamped message comes at or before the first due message without an ETA: its
        age needs first sightings of the window."""
        for it in self.items:
            if it.stamp is None:
                return True
            if it.eta is None:
                return False
        return False


def wants_window(items: Sequence[Item]) -> bool:
    """An unstamped message comes at or before the first due message without an ETA: its age
    needs first sightings of the window."""
    for it in items:
        if it.stamp is None:
            return True
        if it.eta is None:
            return False
    return False


def head_age(items: Sequence[Item], now: float, first_seen: Sequence[float] | None) -> float | None:
    """The longest wait among due items, walking from the head to the first due item without
    an ETA (FIFO: every later one without an ETA is younger). A job with an ETA waits from its
    ETA. An unstamped item was published before its first sighting and before any later item's
    stamp, so its wait is at least now - max(that, its ETA)."""
    if not items:
        return None
    head = items[0]
    if head.eta is None:  # the head is due and has no ETA: its wait alone counts
        if head.stamp is not None:
            return max(0.0, now - head.stamp)
        stamps = [it.stamp for it in items[1:] if it.stamp is not None]
        bound = min(stamps) if stamps else None
        if first_seen:
            bound = first_seen[0] if bound is None else min(bound, first_seen[0])
        return None if bound is None else max(0.0, now - bound)
    later_stamp: list[float | None] = [None] * len(items)
    best: float | None = None
    for i in range(len(items) - 1, -1, -1):
        later_stamp[i] = best
        s = items[i].stamp
        if s is not None:
            best = s if best is None else min(best, s)
    ages: list[float] = []
    for i, it in enumerate(items):
        if it.eta is not None and it.eta > now:
            continue  # scheduled: not waiting yet
        if it.stamp is not None:
            published: float | None = it.stamp
        else:
            bounds = [b for b in (later_stamp[i],) if b is not None]
            if first_seen is not None and i < len(first_seen):
                bounds.append(first_seen[i])
            published = min(bounds) if bounds else None
        if published is not None:
            since = published if it.eta is None else max(published, it.eta)
            ages.append(max(0.0, now - since))
        if it.eta is None:
            break
    return max(ages) if ages else None


def from_window(depth: int, window: Sequence[bytes], now: float) -> KeyRead:
    """The pipeline mode's reading of one key from its oldest messages (oldest first)."""
    items: list[Item] = []
    sched, next_due = 0, None
    for raw in window:
        ident, stamp, eta = _envelope(raw)
        if eta is not None and eta > now:
            sched += 1
            next_due = eta if next_due is None else min(next_due, eta)
        items.append(Item(ident, stamp, eta))
    read = KeyRead(depth, sched, next_due, len(window), tuple(items))
    if read.wants_window():
        return read
    cut = next((i for i, it in enumerate(items) if it.eta is None), len(items) - 1)
    return KeyRead(depth, sched, next_due, len(window), tuple(items[: cut + 1]))


def _envelope(raw: bytes) -> tuple[str, float | None, float | None]:
    """(id, stamp, eta) of one kombu/Celery JSON envelope, as the script reads it: the id when
    it is plain ASCII text, else "sha1:" and the hash of the whole message."""
    raw_hash = "sha1:" + hashlib.sha1(raw).hexdigest()
    try:
        env = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        env = None
    headers = env.get("headers") if isinstance(env, dict) else None
    if not isinstance(headers, dict):
        return raw_hash, None, None
    msg_id = headers.get("id")
    plain = (
        isinstance(msg_id, str)
        and msg_id.isascii()
        and msg_id.isprintable()
        and '"' not in msg_id
        and "\\" not in msg_id
        and msg_id != ""
    )
    ident = str(msg_id) if plain else raw_hash
    return ident, _as_float(headers.get(PUBLISHED_AT_HEADER)), parse_eta(headers.get("eta"))
