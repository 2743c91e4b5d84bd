"""First sightings of queue head message ids: the age bound for unstamped producers.

A message seen at the head of a queue at time t was published before t, so `now - t` is a lower
bound on its age. The sighting is persisted so that a restart of the control plane does not
reset every age to zero. One row per (source, key): `key` is the watched list/priority key.

The same rows hold the richer marks of `metrics.marks` (a few sightings deeper than the head, or
RabbitMQ delivery counters) as an opaque text of at most 200 characters: `update_marks`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.store.db import upsert
from autoscaler.store.models import QueueHeadSighting

# The readers' `Sightings` port keeps these; they live here, beneath brokers/, because the store
# implements the port (brokers.base imports them from here).
Mark = tuple[str, datetime]
"""What a reader keeps between reads about one queue key: a short text and a time (one row)."""

MarksUpdate = Callable[[dict[str, Mark]], dict[str, "Mark | None"]]
"""Given the stored marks of some keys, the marks to store (None: forget the key)."""

_MAX = 200  # column width of queue and message_id


def _fit(value: str, limit: int = _MAX) -> str:
    if len(value) <= limit:
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()


def observe_heads(
    session: Session, source: str, heads: Mapping[str, str | None], now: datetime
) -> dict[str, datetime]:
    """Record the current head id of each key and return when each head was first seen.

    A key whose head is None (empty) loses its row; a key whose head changed gets `now`.
    Concurrent ticks are safe: inserts ignore a conflicting row, updates are conditional on
    the id they replace, and the answer is read back after writing.
    """
    source = _fit(source, 300)
    wanted = {_fit(k): (k, None if v is None else _fit(v)) for k, v in heads.items()}
    existing = {
        row.queue: row
        for row in session.scalars(
            select(QueueHeadSighting).where(QueueHeadSighting.source == source)
        )
    }
    gone = [q for q, (_, mid) in wanted.items() if mid is None and q in existing]
    if gone:
        session.execute(
            delete(QueueHeadSighting).where(
                QueueHeadSighting.source == source, QueueHeadSighting.queue.in_(gone)
            )
        )
    # New heads and changed heads in one upsert: a row keeps its first sighting while its head
    # id stays the same (a concurrent tick that saw the same head changes nothing).
    upserts = [
        {"source": source, "queue": q, "message_id": mid, "first_seen_at": now}
        for q, (_, mid) in wanted.items()
        if mid is not None and (q not in existing or existing[q].message_id != mid)
    ]
    _save(session, upserts, only_new_heads=True)
    session.expire_all()
    out: dict[str, datetime] = {}
    if any(mid is not None for _, mid in wanted.values()):
        rows = session.execute(
            select(
                QueueHeadSighting.queue,
                QueueHeadSighting.message_id,
                QueueHeadSighting.first_seen_at,
            ).where(QueueHeadSighting.source == source)
        ).all()
        by_key = {q: (mid, at) for q, mid, at in rows}
        for q, (orig, mid) in wanted.items():
            got = by_key.get(q)
            # a concurrent tick saw a different head: the bound is still `now` for ours
            if mid is not None:
                out[orig] = got[1] if got is not None and got[0] == mid else now
    return out


def update_marks(session: Session, source: str, keys: Sequence[str], update: MarksUpdate) -> None:
    """Marks of `keys` read, passed to `update`, and what it returns written back: one SELECT,
    at most one DELETE and one upsert, whatever the number of keys."""
    src = _fit(source, 300)
    fitted = {_fit(k): k for k in keys}
    prior: dict[str, Mark] = {}
    if fitted:
        for q, mid, at in session.execute(
            select(
                QueueHeadSighting.queue,
                QueueHeadSighting.message_id,
                QueueHeadSighting.first_seen_at,
            ).where(QueueHeadSighting.source == src, QueueHeadSighting.queue.in_(list(fitted)))
        ).all():
            if q in fitted:
                prior[fitted[q]] = (mid, at)
    new = update(prior)
    gone = [_fit(k) for k, mark in new.items() if mark is None and k in prior]
    if gone:
        session.execute(
            delete(QueueHeadSighting).where(
                QueueHeadSighting.source == src, QueueHeadSighting.queue.in_(gone)
            )
        )
    rows = [
        {"source": src, "queue": _fit(k), "message_id": _fit(mark[0]), "first_seen_at": mark[1]}
        for k, mark in new.items()
        if mark is not None and prior.get(k) != mark
    ]
    _save(session, rows)


def _save(session: Session, rows: list[dict[str, Any]], only_new_heads: bool = False) -> None:
    """Upsert sightings by (source, queue); `only_new_heads`: a row whose head id is unchanged
    keeps its first sighting."""
    upsert(
        session,
        QueueHeadSighting,
        rows,
        key=("source", "queue"),
        update=("message_id", "first_seen_at"),
        where=(lambda new: QueueHeadSighting.message_id != new.message_id)
        if only_new_heads
        else None,
    )


class StoredSightings:
    """`metrics.base.Sightings` backed by the state store: survives restarts."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self._factory = factory

    def observe(
        self, source: str, heads: dict[str, str | None], now: datetime
    ) -> dict[str, datetime]:
        with self._factory() as session, session.begin():
            return observe_heads(session, source, heads, now)

    def update_marks(self, source: str, keys: Sequence[str], update: MarksUpdate) -> None:
        with self._factory() as session, session.begin():
            update_marks(session, source, keys, update)
