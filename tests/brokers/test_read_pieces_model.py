"""The read cut into pieces (`brokers.redis.redis_pieces`) against a model: the numbers a
plain-Python model of the spec computes from the same keys (hypothesis over queues, priorities,
stamps, ETAs, deep lists, unacked jobs and piece budgets)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.brokers.base import PUBLISHED_AT_HEADER
from autoscaler.brokers.redis.celery_redis import SCAN_BUDGET, CeleryRedisReader
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from tests.brokers.helpers import envelope
from tests.brokers.pieceskit import Clock, deliver, redis_server


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A throwaway redis-server of this module's own (no other client's commands in MONITOR)."""
    yield from redis_server()


@pytest.fixture
def r(server) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server)
    client.flushall()
    yield client
    client.close()


# --------------------------------------------------------------------------- the model


class Job(NamedTuple):
    """One message as the spec sees it: its publish stamp (None when unstamped or not an
    envelope at all) and its due time (Celery's `eta` header, epoch seconds; None: due now)."""

    stamp: float | None
    eta: float | None

    def scheduled(self, now: float) -> bool:
        return self.eta is not None and self.eta > now


def _epoch(value: Any) -> float | None:
    """Celery's `eta` header (ISO 8601, naive meaning UTC) in epoch seconds."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def job(env: Any) -> Job:
    """The stamp and due time of a decoded envelope (anything else: unstamped, due now)."""
    headers = env.get("headers") if isinstance(env, dict) else None
    if not isinstance(headers, dict):
        return Job(None, None)
    stamp = headers.get(PUBLISHED_AT_HEADER)
    if isinstance(stamp, bool) or not isinstance(stamp, int | float | str):
        stamp = None
    try:
        published = None if stamp is None else float(stamp)
    except ValueError:
        published = None
    return Job(published, _epoch(headers.get("eta")))


def decoded(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None


def longest_wait(head: list[Job], now: float) -> float | None:
    """The longest wait among the due jobs of a list's oldest messages (`head`, oldest first),
    or None when none of them is due. A job waits since it was published, or since its ETA if
    that is later. Unstamped, it was published before it was first seen (here: now, on a read
    that is the first to see it) and before every later job of the head that carries a stamp
    (FIFO): the earliest of those times bounds its publish time."""
    waits = []
    for i, it in enumerate(head):
        if it.scheduled(now):
            continue
        published = it.stamp
        if published is None:
            published = min(
                [now, *(later.stamp for later in head[i + 1 :] if later.stamp is not None)]
            )
        since = published if it.eta is None else max(published, it.eta)
        waits.append(max(0.0, now - since))
    return max(waits, default=None)


def delivered(client: redis.Redis, lay: CeleryRedisLayout) -> dict[str, list[Job]]:
    """The jobs kombu's unacked hash holds, per queue: every entry in the hash whose tag is in
    the index (the whole hash when there is no index). Only the anonymous exchange is used
    here: it routes by queue name, i.e. the entry's routing key."""
    index = set(client.zrange(lay.unacked_index, 0, -1))
    out: dict[str, list[Job]] = {}
    for tag, value in client.hgetall(lay.unacked).items():
        if index and tag not in index:
            continue
        envelope_, exchange, routing_key = json.loads(value)[:3]
        assert exchange == ""
        out.setdefault(routing_key, []).append(job(envelope_))
    return out


def model(
    client: redis.Redis,
    lay: CeleryRedisLayout,
    queues: list[str],
    now: float,
    *,
    window: int,
    scan_limit: int,
    scan_budget: int,
) -> dict[str, tuple[Any, ...] | None]:
    """What a first read at `now` must report per queue - (pending, scheduled, next due time,
    in flight, scheduled held, oldest age), None for a queue with a key of another type - from
    the spec in `celery_redis`'s docstring, with plain commands (TYPE, LRANGE of each priority
    key, HGETALL and ZRANGE of the unacked hash and index) while nothing moves:

    - each key's oldest messages are examined for ETAs: its first `window`, then up to
      `scan_limit` while the read's `scan_budget` lasts (keys in the order read: queue by
      queue, highest priority first); a message with a future ETA among them is scheduled,
      every other one pending, and the earliest such ETA is the next due time;
    - unacked entries: due ones are in flight, the others scheduled (and held), their ETAs
      next due times too;
    - the oldest age is the longest wait among the due jobs of each key's first `window`
      messages (`longest_wait`; the reader looks no further: `redis_pieces`'s "due stamped
      messages seen at the head").

    Everything here is compared exactly. The reader walks a head only up to its first due job
    without an ETA (every later job waits less, when stamps grow along the list - equal stamps
    in the worlds here) and takes unstamped ages from the first sightings it stores: on a first
    read at a fixed clock (and a second one with the same clock) every sighting is `now`,
    which `longest_wait` assumes. Later reads, whose sightings lie in the past, are left to the
    first-sighting tests (`test_celery_redis`, `test_head_sightings`)."""
    assert scan_limit >= window  # (the reader examines its window whatever the scan limit)
    held = delivered(client, lay)
    left = scan_budget
    out: dict[str, tuple[Any, ...] | None] = {}
    for q in queues:
        pending = scheduled = 0
        etas: list[float] = []
        ages: list[float] = []
        failed = False
        for key in lay.keys(q):
            kind = client.type(key)
            if kind != b"list":
                failed = failed or kind != b"none"
                continue
            jobs = [job(decoded(raw)) for raw in reversed(client.lrange(key, 0, -1))]
            examined = min(len(jobs), window)
            if len(jobs) > window:
                extra = min(min(len(jobs), scan_limit) - window, left)
                examined, left = examined + extra, left - extra
            future = [j.eta for j in jobs[:examined] if j.scheduled(now) and j.eta is not None]
            scheduled += len(future)
            pending += len(jobs) - len(future)
            etas += future
            wait = longest_wait(jobs[:window], now)
            if wait is not None:
                ages.append(wait)
        if failed:
            out[q] = None
            continue
        jobs = held.get(q, [])
        later = [j.eta for j in jobs if j.scheduled(now) and j.eta is not None]
        out[q] = (
            pending,
            scheduled + len(later),
            min(etas + later, default=None),
            len(jobs) - len(later),
            len(later),
            max(ages, default=None),
        )
    return out


def summary(got: dict[str, Any]) -> dict[str, tuple[Any, ...] | None]:
    return {
        q: None
        if m.stale
        else (
            m.pending,
            m.scheduled,
            m.next_due_at,
            m.in_flight,
            m.scheduled_held,
            m.oldest_pending_age,
        )
        for q, m in got.items()
    }


def close(a: tuple[Any, ...] | None, b: tuple[Any, ...] | None) -> bool:
    if a is None or b is None:
        return a is b
    return all(
        x == y or (isinstance(x, float) and isinstance(y, float) and abs(x - y) < 1e-3)
        for x, y in zip(a, b, strict=True)
    )


ETAS = st.one_of(st.none(), st.sampled_from([-300.0, -5.0, 60.0, 3600.0]))
MESSAGE = st.tuples(st.booleans(), ETAS)  # stamped, ETA offset from now
KEY = st.one_of(
    st.lists(MESSAGE, max_size=12),
    # a deep list, built from one repeated pattern (cheap to generate)
    st.tuples(st.integers(60, 400), st.lists(MESSAGE, min_size=1, max_size=4)).map(
        lambda t: [t[1][i % len(t[1])] for i in range(t[0])]
    ),
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.sampled_from([(0, 3, 6, 9), (0,), (0, 5), (2, 7)]),
    sep=st.sampled_from(["\x06\x16", ":"]),
    lists=st.dictionaries(
        st.tuples(st.sampled_from("abcdef"), st.integers(0, 3)), KEY, max_size=10
    ),
    unacked=st.lists(st.tuples(st.sampled_from("abcdefg"), ETAS), max_size=8),
    noise=st.sampled_from([None, b"not json", b'{"headers": 3}']),
    foreign=st.booleans(),
    budget=st.sampled_from([300, 450, 900, 5000]),
    window=st.sampled_from([3, 8, 64]),
    limit=st.sampled_from([64, 150, 10_000]),
    scan_budget=st.sampled_from([SCAN_BUDGET, 500, 0]),
)
def test_pieces_read_what_the_model_says(
    r, server, steps, sep, lists, unacked, noise, foreign, budget, window, limit, scan_budget
):
    """Random queues, priorities, stamps, ETAs, deep lists, unacked jobs and a key of the wrong
    type: pending, scheduled, next due time, in flight, held and oldest age are what the model
    of the spec computes from plain reads of the same keys, whatever the piece budget (down to
    pieces of a few messages, lists continued over several rounds) and the scan budgets."""
    lay = CeleryRedisLayout(
        global_keyprefix=f"p{uuid.uuid4().hex[:6]}:", sep=sep, priority_steps=steps
    )
    now = datetime.now(UTC)
    ts = now.timestamp()
    pipe = r.pipeline(transaction=False)
    for (q, step), msgs in lists.items():
        key = lay.keys(q)[step % len(lay.steps)]
        for stamped, eta in msgs:
            pipe.lpush(
                key,
                envelope(
                    q,
                    stamp=ts - 40 if stamped else None,
                    eta=None if eta is None else now + timedelta(seconds=eta),
                ),
            )
    if noise is not None:
        pipe.lpush(lay.keys("c")[0], noise)
    if foreign:  # another writer's set named like one of g's priority keys
        pipe.sadd(lay.keys("g")[-1], "x")
    pipe.execute()
    for q, eta in unacked:
        deliver(r, lay, q, envelope(q, eta=None if eta is None else now + timedelta(seconds=eta)))
    queues = list("abcdefg")
    want = model(r, lay, queues, ts, window=window, scan_limit=limit, scan_budget=scan_budget)
    reader = CeleryRedisReader(
        server,
        layout=lay,
        clock=Clock(now),
        piece_budget=budget,
        window=window,
        scan_limit=limit,
        scan_budget=scan_budget,
    )
    got = summary(reader.read(queues))
    assert all(close(got[q], want[q]) for q in queues), (got, want)
    again = summary(reader.read(queues))  # a second read (cached heads, known windows)
    assert all(close(again[q], want[q]) for q in queues), (again, want)
