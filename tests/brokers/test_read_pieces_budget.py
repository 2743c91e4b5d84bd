"""The read cut into pieces (`brokers.redis.redis_pieces`): every server call within its
budget, whatever the number of queues or the depth of a list, the unacked index in slices of it
in one round, and the configured budget the one the reader uses.

The counts per call come from MONITOR on a throwaway server (the commands a script runs are
shown after its EVALSHA): never from wall time."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from autoscaler.brokers.redis.celery_redis import CeleryRedisReader
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from autoscaler.brokers.redis.redis_pieces import PIECE_BUDGET, SEARCH_RADIUS
from tests.brokers.helpers import envelope
from tests.brokers.pieceskit import deliver, redis_server


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


# --------------------------------------------------------------------------- budget per call


def monitored(url: str, action: Callable[[], object]) -> list[tuple[str, list[str]]]:
    """(client type, command words) of every command the server ran during `action`."""
    seen: list[tuple[str, list[str]]] = []
    ready = threading.Event()
    marker = f"end-{uuid.uuid4().hex}"

    def listen() -> None:
        client = redis.Redis.from_url(url)
        with client.monitor() as m:
            ready.set()
            for cmd in m.listen():
                # redis-py joins the arguments with spaces (none of ours has one)
                words = cmd["command"].split(" ")
                if words and words[0].upper() == "ECHO" and words[-1] == marker:
                    break
                seen.append((cmd.get("client_type", ""), words))
        client.close()

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    ready.wait(5)
    time.sleep(0.2)
    action()
    redis.Redis.from_url(url).echo(marker)
    t.join(30)
    return seen


def units_per_call(
    seen: list[tuple[str, list[str]]], lengths: dict[str, int]
) -> list[tuple[str, int]]:
    """Units each script call spent, counted from the commands it ran (every command: 1; an
    LRANGE or ZRANGE: 1 more per entry it returned, from the keys' sizes - they do not change
    here; an HMGET: 1 more per field) and the COUNT of each SCAN-style page: (command,
    units)."""
    calls: list[tuple[str, int]] = []
    for client, words in seen:
        name = words[0].upper() if words else ""
        if client != "lua":
            if name == "EVALSHA":
                calls.append((f"EVALSHA {words[3]}", 0))
            elif name in ("HSCAN", "ZSCAN", "SSCAN"):
                calls.append((name, int(words[words.index("COUNT") + 1])))
            elif name not in ("MONITOR", "ECHO", "PING", "CLIENT", "HELLO", "SELECT"):
                calls.append((name, 1))
            continue
        units = 1
        if name in ("LRANGE", "ZRANGE"):
            n = lengths.get(_unescape(words[1]), 0)
            start, stop = int(words[2]), int(words[3])
            start, stop = (
                max(n + start if start < 0 else start, 0),
                min(n + stop if stop < 0 else stop, n - 1),
            )
            units += max(0, stop - start + 1)
        elif name == "HMGET":
            units += len(words) - 2
        kind, spent = calls[-1]
        calls[-1] = (kind, spent + units)
    return calls


def _unescape(word: str) -> str:
    """A key as MONITOR shows it (non-printable bytes as \\xNN) back to the key."""
    return word.encode("latin-1").decode("unicode_escape")


def lengths_of(r: redis.Redis, prefix: str) -> dict[str, int]:
    sizes = {b"list": r.llen, b"zset": r.zcard}
    return {
        k.decode(): int(sizes[kind](k))
        for k in r.scan_iter(match=f"{prefix}*", count=1000)
        if (kind := r.type(k)) in sizes
    }


def fill(r: redis.Redis, lay: CeleryRedisLayout, queues: int, deep: int) -> None:
    now = datetime.now(UTC)
    pipe = r.pipeline(transaction=False)
    for i in range(queues):
        q = f"q{i}"
        keys = lay.keys(q)
        for _ in range(i % 6):
            pipe.lpush(keys[0], envelope(q, stamp=time.time() if i % 2 else None))
        if i % 7 == 0:
            pipe.lpush(keys[2], envelope(q, eta=now + timedelta(minutes=5)))
    for start in range(0, deep, 500):
        pipe.lpush(
            lay.keys("q1")[0],
            *[
                envelope("q1", stamp=time.time(), eta=now + timedelta(hours=1))
                for _ in range(min(500, deep - start))
            ],
        )
    pipe.execute()
    for i in range(0, queues, 5):
        deliver(r, lay, f"q{i}", envelope(f"q{i}"))


@pytest.mark.parametrize("budget", [300, 1000])
def test_every_server_call_stays_within_its_budget(r, server, budget):
    """600 queues (2,400 priority keys) and a list of 3,000 ETA jobs: every script call looks
    at no more keys and messages than its budget (counted from the commands it runs), every
    SCAN page asks for fewer, and the read is still a few round trips."""
    lay = CeleryRedisLayout(global_keyprefix="b:")
    fill(r, lay, 600, 3000)
    reader = CeleryRedisReader(server, layout=lay, piece_budget=budget)
    reader.read(["q0"])  # the script loaded, the connection open
    queues = [f"q{i}" for i in range(600)]
    got: dict[str, Any] = {}
    seen = monitored(server, lambda: got.update(reader.read(queues)))
    calls = units_per_call(seen, lengths_of(r, "b:"))
    scripts = [u for kind, u in calls if kind.startswith("EVALSHA")]
    assert len(scripts) > 600 * 4 / budget  # really cut into pieces
    assert max(scripts) <= budget, sorted(scripts)[-5:]
    assert all(u <= budget for kind, u in calls if not kind.startswith("EVALSHA"))
    assert {kind for kind, _ in calls} == {"EVALSHA q", "EVALSHA c", "EVALSHA u"}
    # one round for every queue, the unacked index and hash; the deep list continues in one more
    assert reader.rounds == 2
    assert got["q1"].scheduled == 3000 and got["q1"].pending == 1
    assert sum(m.pending + m.scheduled + m.in_flight for m in got.values()) == (
        sum(i % 6 for i in range(600)) + len(range(0, 600, 7)) + 3000 + len(range(0, 600, 5))
    )


def test_a_deep_scan_is_bounded_by_the_budget_not_the_list(r, server):
    """ETAs deep in a list are found in pieces: the longest call does not grow with the list."""
    lay = CeleryRedisLayout(global_keyprefix="d:")
    fill(r, lay, 1, 9000)
    reader = CeleryRedisReader(server, layout=lay, piece_budget=500)
    reader.read(["q1"])
    seen = monitored(server, lambda: reader.read(["q1"]))
    scripts = [
        u for kind, u in units_per_call(seen, lengths_of(r, "d:")) if kind.startswith("EVALSHA")
    ]
    assert max(scripts) <= 500 and len(scripts) >= 9000 // 500


def test_a_big_unacked_index_is_read_in_slices_in_one_round(r, server):
    """3,000 delivered jobs: the index and their values come in slices of the budget. The
    first read learns the size (its first pass goes again behind the rest of the index); from
    then on all slices go in the one round trip, before and after the lists."""
    lay = CeleryRedisLayout(global_keyprefix=f"u{uuid.uuid4().hex[:6]}:")
    r.lpush(lay.keys("a")[0], envelope("a"))
    for i in range(3000):
        deliver(r, lay, "a" if i % 2 else "b", envelope("a" if i % 2 else "b"))
    reader = CeleryRedisReader(server, layout=lay, piece_budget=300)
    rounds = []
    for _ in range(3):
        got = reader.read(["a", "b"])
        assert (got["a"].pending, got["a"].in_flight, got["b"].in_flight) == (1, 1500, 1500)
        rounds.append(reader.rounds)
    assert rounds[0] > 1 and rounds[1:] == [1, 1]
    for _ in range(1000):  # grown past the slices sent: more of them, the pass again
        deliver(r, lay, "b", envelope("b"))
    got = reader.read(["a", "b"])
    assert (got["a"].in_flight, got["b"].in_flight, reader.rounds) == (1500, 2500, 2)


def test_the_setting_and_the_reader_agree_on_the_budget():
    from autoscaler.brokers.redis.redis_pieces import MAX_PIECE_BUDGET, MIN_PIECE_BUDGET
    from autoscaler.config.metrics_sources import CelerySource

    field = CelerySource.model_fields["piece_budget"]
    assert field.default == PIECE_BUDGET
    bounds = {type(m).__name__: m for m in field.metadata}
    assert bounds["Ge"].ge == MIN_PIECE_BUDGET and bounds["Le"].le == MAX_PIECE_BUDGET
    assert MIN_PIECE_BUDGET >= 5 + 4 * SEARCH_RADIUS  # a piece's first task can always search
    reader = CeleryRedisReader("redis://127.0.0.1:1/0", piece_budget=10)
    assert reader.piece_budget == MIN_PIECE_BUDGET


def test_the_configured_piece_budget_reaches_the_reader():
    """A queue's `metrics:` block with `piece_budget: 700` (not the default): the reader the
    registry builds for it - inside the fallback the tick uses - works in pieces of 700."""
    from autoscaler.brokers.registry import build_source
    from autoscaler.config.metrics_sources import CelerySource
    from autoscaler.config.models import Queue

    queue = Queue.model_validate(
        {
            "metrics": {
                "source": "celery",
                "url": "redis://127.0.0.1:1/0",
                "piece_budget": 700,
            }
        }
    )
    assert isinstance(queue.metrics, CelerySource)
    assert queue.metrics.piece_budget == 700 != PIECE_BUDGET
    source = build_source(queue.metrics)
    try:
        assert isinstance(source.reader, CeleryRedisReader)
        assert source.reader.piece_budget == 700
    finally:
        source.reader.close()
