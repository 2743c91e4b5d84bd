"""The read cut into pieces (`brokers.redis.redis_pieces`) where the server is not as expected:
an unacked hash without kombu's index, scripting refused, the script flushed between rounds."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis

from autoscaler.brokers.redis.celery_redis import CeleryRedisReader
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from tests.brokers.helpers import envelope
from tests.brokers.pieceskit import Clock, Stepping, deliver, redis_server


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


# --------------------------------------------------------------------------- fallbacks


def test_a_hash_without_kombus_index_is_counted_as_read(r, server):
    lay = CeleryRedisLayout(global_keyprefix=f"h{uuid.uuid4().hex[:6]}:")
    r.hset(lay.unacked, "tag", json.dumps([json.loads(envelope("a")), "", "a"]))
    assert CeleryRedisReader(server, layout=lay).read(["a"])["a"].in_flight == 1
    deliver(r, lay, "a", envelope("a"))  # once kombu's index exists, only indexed jobs count
    assert CeleryRedisReader(server, layout=lay).read(["a"])["a"].in_flight == 1


def test_scripting_refused_falls_back_to_the_pipeline_read():
    for url in redis_server("--rename-command", "EVALSHA", "", "--rename-command", "EVAL", ""):
        client = redis.Redis.from_url(url)
        client.lpush("q", envelope("q", stamp=time.time() - 10))
        deliver(client, CeleryRedisLayout(), "q", envelope("q"))
        reader = CeleryRedisReader(url)
        got = reader.read(["q", "other"])
        assert reader.mode == "pipeline"
        assert (got["q"].pending, got["q"].in_flight, got["other"].pending) == (1, 1, 0)
        assert got["q"].oldest_pending_age is not None and got["q"].oldest_pending_age >= 9


def test_the_script_flushed_between_rounds_is_loaded_again(r, server):
    lay = CeleryRedisLayout(global_keyprefix=f"f{uuid.uuid4().hex[:6]}:")
    now = datetime.now(UTC)
    r.lpush(lay.keys("q")[0], *[envelope("q", eta=now + timedelta(hours=1)) for _ in range(900)])

    def hook(_done: int, round_no: int, n: int) -> None:
        if n == 1 and round_no == 2:
            r.script_flush()

    got = Stepping(server, layout=lay, piece_budget=300, hook=hook, clock=Clock(now)).read(["q"])[
        "q"
    ]
    assert (got.pending, got.scheduled) == (0, 900)
