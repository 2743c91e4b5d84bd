"""Age bounds for jobs whose producer stamped no publish time, kept between reads as small marks.

Without a stamp, a job's age can only be bounded from below: "it was already waiting when we
looked at time t". Looking at the head alone resets that bound on every pop (the next head was
seen only now), so under a steady drain the bound stays near one job's runtime. The marks here
remember more than the head, in a few bytes per queue key (one row of `queue_head_sightings`):

Window marks (Redis lists, FIFO): each read sees the ids of the oldest N messages of a key (the
window). A mark (b, t) says "message b was in the window at time t". If b is still in the window
now, every message older than b (closer to the head) was in the queue at t as well - it was
pushed before b and has not been popped - so its age is at least now - t. A mark whose message
is gone (popped) says nothing any more and is dropped. Each read adds one mark (the newest id of
the window, at now) when the window holds ids no mark covers; marks are thinned to `MAX_GROUPS`
by merging the two closest in time into the later one, which only ever makes a bound smaller.

Delivery marks (RabbitMQ, no ids without consuming): a mark (t, D, C) says "at t, D messages
were ready and C had been delivered so far". While fewer than D messages have been delivered
since (C_now - C < D), at least one message that was ready at t is still ready, and the oldest
ready message is at least now - t old. D is recorded minus the deliveries of the last interval
(the management API samples the depth and the counters at slightly different instants, so that
many deliveries may be counted on the wrong side). Blind spots: counters that lag the depth keep
a mark alive up to one statistics interval too long; messages removed without a delivery (a
purge, a TTL expiry) keep it alive until as many deliveries happened; an empty queue resets all.

Everything here is pure; the readers persist the encoded text through `Sightings.update_marks`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

MAX_GROUPS = 8
"""Marks kept per key: the encoding of 8 fits the store's 200-character column."""

WINDOW_PREFIX = "w1|"
DELIVERY_PREFIX = "d1|"
ID_HASH_CHARS = 10
MAX_TEXT = 200
"""The store keeps at most this many characters of marks per key."""


def id_hash(message_id: str) -> str:
    """The short form a window keeps of a message id (collisions within a window of 64 ids
    are negligible at 40 bits; a collision can only make a bound smaller or drop it)."""
    return hashlib.sha1(message_id.encode("utf-8", "surrogateescape")).hexdigest()[:ID_HASH_CHARS]


# --------------------------------------------------------------------------- window marks


@dataclass(frozen=True)
class WindowMarks:
    """(message id hash, epoch seconds) oldest first."""

    groups: tuple[tuple[str, float], ...] = ()

    def encode(self) -> tuple[str, datetime] | None:
        if not self.groups:
            return None
        base = self.groups[0][1]
        body = ";".join(f"{h}:{round((t - base) * 1000)}" for h, t in self.groups)
        return WINDOW_PREFIX + body, datetime.fromtimestamp(base, UTC)

    @classmethod
    def decode(cls, text: str | None, at: datetime | None) -> WindowMarks:
        """Marks from a stored row; a row written by the head-only tracker (a plain message id)
        becomes one mark, so an upgrade keeps the age it had."""
        if not text or at is None:
            return cls()
        base = at.timestamp()
        if not text.startswith(WINDOW_PREFIX):
            # the head-only tracker stored the id, or "sha1:<hash of the message>" without one
            old = text[5 : 5 + ID_HASH_CHARS] if text.startswith("sha1:") else id_hash(text)
            return cls(((old, base),))
        groups: list[tuple[str, float]] = []
        for part in text[len(WINDOW_PREFIX) :].split(";"):
            h, _, ms = part.partition(":")
            try:
                groups.append((h, base + int(ms) / 1000.0))
            except ValueError:
                return cls()  # unreadable: no bound (never a wrong one)
        return cls(tuple(groups))


def advance_window(
    marks: WindowMarks, window: Sequence[str], now: float, max_groups: int = MAX_GROUPS
) -> tuple[WindowMarks, list[float]]:
    """New marks after seeing `window` (id hashes, oldest first) at `now`, and for each id in
    the window the earliest time it is known to have been waiting (now if no mark covers it)."""
    if not window:
        return WindowMarks(), []
    pos: dict[str, int] = {}
    for i, h in enumerate(window):
        pos.setdefault(h, i)
    kept: list[tuple[str, float, int]] = []
    for h, t in sorted(marks.groups, key=lambda g: g[1]):
        j = pos.get(h)
        if j is None or t > now:
            continue  # popped (or a clock gone backwards): this mark says nothing any more
        if kept and j <= kept[-1][2]:
            continue  # covered by an earlier mark further back in the window
        kept.append((h, t, j))
    first_seen: list[float] = []
    k = 0
    for i in range(len(window)):
        while k < len(kept) and kept[k][2] < i:
            k += 1
        first_seen.append(kept[k][1] if k < len(kept) else now)
    if not kept or kept[-1][2] < len(window) - 1:
        kept.append((window[-1], now, len(window) - 1))
    groups = [(h, t) for h, t, _ in kept]
    while len(groups) > max_groups:
        # merge the two marks closest in time into the later one (its bound is smaller: safe)
        k = min(range(len(groups) - 1), key=lambda i: groups[i + 1][1] - groups[i][1])
        del groups[k]
    return WindowMarks(tuple(groups)), first_seen


# --------------------------------------------------------------------------- delivery marks


@dataclass(frozen=True)
class DeliveryMarks:
    """(epoch seconds, ready depth, cumulative deliveries) oldest first, plus the last reading's
    cumulative deliveries (to know how many were delivered in the last interval)."""

    marks: tuple[tuple[float, int, int], ...] = ()
    last_delivered: int | None = None

    def encode(self) -> tuple[str, datetime] | None:
        if not self.marks and self.last_delivered is None:
            return None
        marks = list(self.marks)
        while True:
            base = marks[0][0] if marks else 0.0
            body = ";".join(f"{round((t - base) * 1000)},{d},{c}" for t, d, c in marks)
            last = "" if self.last_delivered is None else str(self.last_delivered)
            text = f"{DELIVERY_PREFIX}{last}|{body}"
            if len(text) <= MAX_TEXT or not marks:
                return text, datetime.fromtimestamp(base, UTC)
            del marks[len(marks) // 2 if len(marks) > 1 else 0]  # fewer marks: smaller bounds

    @classmethod
    def decode(cls, text: str | None, at: datetime | None) -> DeliveryMarks:
        if not text or at is None or not text.startswith(DELIVERY_PREFIX):
            return cls()
        last, _, body = text[len(DELIVERY_PREFIX) :].partition("|")
        base = at.timestamp()
        marks = []
        try:
            for part in body.split(";") if body else ():
                ms, d, c = part.split(",")
                marks.append((base + int(ms) / 1000.0, int(d), int(c)))
            return cls(tuple(marks), int(last) if last else None)
        except ValueError:
            return cls()


def advance_deliveries(
    marks: DeliveryMarks,
    ready: int,
    delivered: int,
    now: float,
    margin: int = 0,
    max_marks: int = 5,
) -> tuple[DeliveryMarks, float | None]:
    """New marks after a reading of (ready depth, cumulative deliveries) at `now`, and the
    earliest time the oldest ready message is known to have been waiting (None: no bound).

    `margin`: deliveries that may fall between the depth's and the counter's samples (at least
    the deliveries since the last reading are assumed to)."""
    if delivered < (marks.last_delivered or 0) or ready <= 0:
        # counters went backwards (queue deleted and declared again) or the queue is empty:
        # every message that was ready is gone
        return DeliveryMarks((), delivered), None
    alive = [(t, d, c) for t, d, c in marks.marks if delivered - c < d and t <= now]
    recent = delivered - marks.last_delivered if marks.last_delivered is not None else delivered
    sure = ready - max(0, recent, margin)
    if sure > 0 and not any(d - (delivered - c) >= sure for _, d, c in alive):
        alive.append((now, sure, delivered))
    since = alive[0][0] if alive else None
    while len(alive) > max_marks:
        k = min(range(len(alive) - 1), key=lambda i: alive[i + 1][0] - alive[i][0])
        del alive[k]
    return DeliveryMarks(tuple(alive), delivered), since
