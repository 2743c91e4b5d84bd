"""The read cut into pieces (`brokers.redis.redis_pieces`) while jobs move: a worker taking a
job, kombu restoring one, or a deep list popped and pushed between two commands or two rounds of
the read - no job counted twice, scheduled never beyond the depth counted."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu import Connection

from autoscaler.brokers.redis.celery_redis import CeleryRedisReader
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from autoscaler.brokers.redis.redis_pieces import SEARCH_RADIUS
from tests.brokers.helpers import envelope
from tests.brokers.pieceskit import Clock, Stepping, deliver, redis_server, restore


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


# --------------------------------------------------------------------------- jobs moving


def layout_with_jobs(r: redis.Redis, queues: int) -> tuple[CeleryRedisLayout, list[str], int]:
    """Jobs in two priority keys of each queue and a few delivered (kombu's unacked): the
    layout, the queue names and the number of jobs."""
    lay = CeleryRedisLayout(global_keyprefix=f"m{uuid.uuid4().hex[:6]}:")
    names = [f"q{i}" for i in range(queues)]
    total = 0
    for i, q in enumerate(names):
        keys = lay.keys(q)
        msgs = [envelope(q, stamp=time.time()) for _ in range(1 + i % 3)]
        r.lpush(keys[0], *msgs)
        r.lpush(keys[1], envelope(q))
        total += len(msgs) + 1
        if i % 3 == 0:
            deliver(r, lay, q, envelope(q))
            total += 1
    return lay, names, total


def counted(got: dict[str, Any]) -> int:
    return sum(m.pending + m.scheduled + m.in_flight for m in got.values())


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    move=st.sampled_from(["deliver", "deliver-gap", "restore", "restore-tail"]),
    at=st.integers(1, 5),
    gap=st.integers(0, 10),
    queue=st.integers(0, 89),
    budget=st.sampled_from([300, 700]),
)
def test_a_job_moving_between_pieces_is_never_counted_twice(
    r, server, move, at, gap, queue, budget
):
    """A worker takes a job (BRPOP, then kombu's unacked write - `gap` of our commands later)
    or kombu restores one to its list (head or tail), between any two commands of the read:
    the job counts once, or - taken before its list was counted and delivered after the
    index's first scan - not at all, never twice."""
    lay, names, total = layout_with_jobs(r, 90)
    q = names[queue]
    key = lay.keys(q)[0]
    held = [t.decode() for t in r.zrange(lay.unacked_index, 0, -1)]
    popped: list[bytes] = []

    def hook(done: int, _round: int, _n: int) -> None:
        if move.startswith("deliver"):
            if done == at:
                popped.append(r.rpop(key) or b"")
            if done == at + (gap if move == "deliver-gap" else 0) and popped and popped[0]:
                deliver(r, lay, q, popped[0])
        elif done == at and held:
            tag = held[queue % len(held)]
            entry = json.loads(r.hget(lay.unacked, tag) or b"null")
            if entry is not None:
                target = lay.keys(entry[2])[0]
                if move == "restore":
                    restore(r, lay, tag, target)
                else:  # kombu's visibility-timeout restore pushes at the tail
                    pipe = r.pipeline(transaction=True)
                    pipe.zrem(lay.unacked_index, tag)
                    pipe.hdel(lay.unacked, tag)
                    pipe.lpush(target, json.dumps(entry[0]))
                    pipe.execute()

    reader = Stepping(server, layout=lay, piece_budget=budget, hook=hook)
    got = reader.read(names)
    # the first view, the pieces (2 at 700, 3 at 300), the second view: the move happened
    assert reader.done >= min(at, 4)
    assert total - 1 <= counted(got) <= total
    flagged = sum(m.delivered_during_read for m in got.values())
    assert flagged == got[q].delivered_during_read <= 1  # only the moved job, on its queue
    delivered_in_read = (
        move.startswith("deliver")
        and popped
        and popped[0]
        and (at + (gap if move == "deliver-gap" else 0) < reader.done)
    )
    if delivered_in_read and counted(got) == total - 1:
        assert flagged == 1  # in no count: the delivery during the read says so
    assert counted(got) + flagged <= total + 1
    if (
        move == "deliver-gap"
        and popped
        and popped[0]
        and r.hget(lay.unacked, json.loads(popped[0])["properties"]["delivery_tag"]) is None
    ):
        deliver(r, lay, q, popped[0])  # the worker's unacked write, after the read
    after = CeleryRedisReader(server, layout=lay).read(names)  # nothing moves now: all of them
    assert counted(after) == total


def test_kombus_own_delivery_between_any_two_commands_counts_the_job_at_most_once(r, server):
    """The same with kombu itself taking the job (basic_get: its RPOP and its unacked write)
    after each command of the read in turn."""
    lay, names, total = layout_with_jobs(r, 40)
    n_calls = len(list(_calls(server, lay, names)))
    for at in range(1, n_calls + 1):
        conn = Connection(server, transport_options={"global_keyprefix": lay.global_keyprefix})
        taken: list[Any] = []

        def hook(
            done: int,
            _round: int,
            _n: int,
            at: int = at,
            conn: Connection = conn,
            taken: list[Any] = taken,
        ) -> None:
            if done == at:
                taken.append(conn.channel().basic_get("q5", no_ack=False))

        try:
            got = Stepping(server, layout=lay, hook=hook, piece_budget=300).read(names)
            assert taken and taken[0] is not None
            assert total - 1 <= counted(got) <= total
            taken[0].reject(requeue=True)  # back for the next turn (kombu: to the list's tail)
        finally:
            conn.release()


def _calls(server: str, lay: CeleryRedisLayout, names: list[str]) -> Iterator[int]:
    counter: list[int] = []
    Stepping(
        server, layout=lay, piece_budget=300, hook=lambda done, _r, _n: counter.append(done)
    ).read(names)
    yield from counter


def test_a_deep_list_moving_between_rounds_is_classified_once(r, server):
    """Workers pop and kombu restores at a deep list's head between the rounds of its ETA scan:
    the scan goes on behind the last message it examined, so every job is scheduled once, and
    scheduled + pending is the depth the first round counted."""
    lay = CeleryRedisLayout(global_keyprefix=f"s{uuid.uuid4().hex[:6]}:")
    key = lay.keys("deep")[0]
    now = datetime.now(UTC)
    r.lpush(
        key,
        *[envelope("deep", stamp=time.time(), eta=now + timedelta(hours=1)) for _ in range(2000)],
    )
    for moves in ((3, 0), (0, 5), (10, 4), (SEARCH_RADIUS - 1, 0)):

        def hook(_done: int, round_no: int, n: int, moves: tuple[int, int] = moves) -> None:
            if n == 1 and round_no == 2:  # the first round and one piece of the next have run
                popped, pushed = moves
                for _ in range(popped):
                    r.rpop(key)
                for _ in range(pushed):
                    r.rpush(key, envelope("deep", stamp=time.time(), eta=now + timedelta(hours=1)))

        reader = Stepping(server, layout=lay, piece_budget=300, hook=hook, clock=Clock(now))
        got = reader.read(["deep"])["deep"]
        depth = r.llen(key) + moves[0] - moves[1]  # as the first round counted it
        assert (got.pending, got.scheduled) == (0, depth), moves
        assert reader.rounds >= 2


def test_a_lost_anchor_scans_the_list_again_and_never_overcounts(r, server):
    """More jobs popped between two rounds than the anchor search reaches: the list is scanned
    again from its head; scheduled never exceeds the depth counted."""
    lay = CeleryRedisLayout(global_keyprefix=f"l{uuid.uuid4().hex[:6]}:")
    key = lay.keys("deep")[0]
    now = datetime.now(UTC)
    r.lpush(
        key,
        *[envelope("deep", stamp=time.time(), eta=now + timedelta(hours=1)) for _ in range(1500)],
    )

    def hook(_done: int, round_no: int, n: int) -> None:
        if n == 1 and round_no == 2:
            for _ in range(SEARCH_RADIUS * 3):
                r.rpop(key)

    got = Stepping(server, layout=lay, piece_budget=300, hook=hook, clock=Clock(now)).read(
        ["deep"]
    )["deep"]
    assert got.pending + got.scheduled == 1500  # the depth counted in the first round
    assert got.pending >= 0 and got.scheduled <= 1500
