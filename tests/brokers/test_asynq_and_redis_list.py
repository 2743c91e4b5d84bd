"""asynq (keys written by asynq's own enqueue script) and plain Redis lists and streams."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis

from autoscaler.brokers.asynq.asynq import AsynqReader
from autoscaler.brokers.base import SourceError
from autoscaler.brokers.lists.redis_list import RedisListReader, RedisStreamReader
from autoscaler.brokers.registry import build_reader
from autoscaler.config.metrics_sources import RedisStreamSource
from tests.brokers.conftest import SECRET
from tests.conftest import REDIS_URL

# asynq's enqueueCmd, verbatim in behaviour (KEYS: task key, pending list; ARGV: msg, id, nsec)
ENQUEUE = """
if redis.call("EXISTS", KEYS[1]) == 1 then return 0 end
redis.call("HSET", KEYS[1], "msg", ARGV[1], "state", "pending", "pending_since", ARGV[3])
redis.call("LPUSH", KEYS[2], ARGV[2])
return 1
"""


@pytest.fixture
def asynq_queue(rclient):
    """A unique asynq queue name; its keys are deleted afterwards."""
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    keys = list(rclient.scan_iter(match=f"asynq:{{{name}}}:*", count=1000))
    if keys:
        rclient.delete(*keys)


# asynq's scheduleCmd (KEYS: task key, scheduled set; ARGV: msg, process_at unix s, id)
SCHEDULE = """
if redis.call("EXISTS", KEYS[1]) == 1 then return 0 end
redis.call("HSET", KEYS[1], "msg", ARGV[1], "state", "scheduled")
redis.call("ZADD", KEYS[2], ARGV[2], ARGV[3])
return 1
"""

# asynq's dequeueCmd (KEYS: pending, paused, active, lease; ARGV: lease expiry, task key prefix)
DEQUEUE = """
if redis.call("EXISTS", KEYS[2]) == 0 then
  local id = redis.call("RPOPLPUSH", KEYS[1], KEYS[3])
  if id then
    local key = ARGV[2] .. id
    redis.call("HSET", key, "state", "active")
    redis.call("HDEL", key, "pending_since")
    redis.call("ZADD", KEYS[4], ARGV[1], id)
    return id
  end
end
return nil
"""

# asynq's forwardCmd (KEYS: scheduled or retry set, pending; ARGV: now s, task key prefix, now ns)
FORWARD = """
local ids = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1], "LIMIT", 0, 100)
for _, id in ipairs(ids) do
  redis.call("LPUSH", KEYS[2], id)
  redis.call("ZREM", KEYS[1], id)
  redis.call("HSET", ARGV[2] .. id, "state", "pending", "pending_since", ARGV[3])
end
return table.getn(ids)
"""


def schedule(r: redis.Redis, q: str, at: float) -> str:
    task_id = str(uuid.uuid4())
    r.eval(
        SCHEDULE,
        2,
        f"asynq:{{{q}}}:t:{task_id}",
        f"asynq:{{{q}}}:scheduled",
        b"\x0a\x03foo",
        str(int(at)),
        task_id,
    )
    return task_id


def dequeue(r: redis.Redis, q: str) -> bytes | None:
    return r.eval(
        DEQUEUE,
        4,
        f"asynq:{{{q}}}:pending",
        f"asynq:{{{q}}}:paused",
        f"asynq:{{{q}}}:active",
        f"asynq:{{{q}}}:lease",
        str(int(time.time()) + 30),
        f"asynq:{{{q}}}:t:",
    )


def enqueue(r: redis.Redis, q: str, at: float) -> str:
    task_id = str(uuid.uuid4())
    r.eval(
        ENQUEUE,
        2,
        f"asynq:{{{q}}}:t:{task_id}",
        f"asynq:{{{q}}}:pending",
        b"\x0a\x03foo",
        task_id,
        str(int(at * 1e9)),
    )
    return task_id


def test_asynq_pending_oldest_and_active(asynq_queue, rclient):
    q = asynq_queue
    now = time.time()
    enqueue(rclient, q, now - 300)  # oldest: dequeued first
    enqueue(rclient, q, now - 100)
    enqueue(rclient, q, now - 10)
    # a worker dequeues like asynq: RPOPLPUSH pending -> active
    rclient.rpoplpush(f"asynq:{{{q}}}:pending", f"asynq:{{{q}}}:active")
    clock = datetime.fromtimestamp(now, UTC)
    got = AsynqReader(REDIS_URL, clock=lambda: clock).read([q, f"{q}-missing"])
    m = got[q]
    assert (m.pending, m.in_flight) == (2, 1)
    assert m.oldest_pending_age is not None and abs(m.oldest_pending_age - 100) < 0.01
    empty = got[f"{q}-missing"]
    assert (empty.pending, empty.in_flight, empty.oldest_pending_age, empty.stale) == (
        0,
        0,
        None,
        False,
    )


def test_asynq_paused_queue_and_tasks_scheduled_for_later(asynq_queue, rclient):
    """asynq's own scripts: a paused queue keeps its pending tasks (its dequeue serves none),
    tasks scheduled for later are counted apart until due, and a due one not yet forwarded is
    pending since its due time."""
    q = asynq_queue
    now = time.time()
    enqueue(rclient, q, now - 40)
    enqueue(rclient, q, now - 20)
    schedule(rclient, q, now + 600)
    schedule(rclient, q, now + 900)
    schedule(rclient, q, now - 120)  # due two minutes ago; asynq's forwarder has not run yet
    clock = datetime.fromtimestamp(now, UTC)
    reader = AsynqReader(REDIS_URL, clock=lambda: clock)
    m = reader.read([q])[q]
    assert (m.pending, m.scheduled, m.in_flight, m.running, m.paused) == (3, 2, 0, 0, False)
    assert m.next_due_at == pytest.approx(int(now + 600))
    assert m.oldest_pending_age == pytest.approx(120, abs=1)
    # asynq pauses the queue (its Pause: SETNX paused <unix time>): nothing is dequeued
    rclient.setnx(f"asynq:{{{q}}}:paused", int(now))
    assert dequeue(rclient, q) is None
    m = reader.read([q])[q]
    assert m.paused and m.pending == 3
    # resumed: a worker takes one, the forwarder moves the due one
    rclient.delete(f"asynq:{{{q}}}:paused")
    assert dequeue(rclient, q) is not None
    rclient.eval(
        FORWARD,
        2,
        f"asynq:{{{q}}}:scheduled",
        f"asynq:{{{q}}}:pending",
        str(int(now)),
        f"asynq:{{{q}}}:t:",
        str(int(now * 1e9)),
    )
    m = reader.read([q])[q]
    assert (m.pending, m.scheduled, m.running, m.paused) == (2, 2, 1, False)


def test_asynq_wrong_type_fails_one_queue(asynq_queue, rclient):
    rclient.set(f"asynq:{{{asynq_queue}}}:pending", "x")
    got = AsynqReader(REDIS_URL).read([asynq_queue])[asynq_queue]
    assert got.stale and "WRONGTYPE" in (got.error or "")


def test_redis_list_head_side_and_sighting_bound(prefix, rclient):
    rclient.rpush(f"{prefix}jobs", b"first", b"second", b"third")  # RPUSH producer, LPOP worker
    now = datetime.now(UTC)
    clock = [now]
    left = RedisListReader(REDIS_URL, key_prefix=prefix, pop_side="left", clock=lambda: clock[0])
    assert left.read(["jobs"])["jobs"].oldest_pending_age == 0.0
    clock[0] = now + timedelta(seconds=30)
    assert left.read(["jobs"])["jobs"].oldest_pending_age == 30.0
    rclient.lpop(f"{prefix}jobs")  # the head was taken: new head, new bound
    got = left.read(["jobs", "nothing"])
    assert (got["jobs"].pending, got["jobs"].oldest_pending_age) == (2, 0.0)
    assert (got["nothing"].pending, got["nothing"].oldest_pending_age) == (0, None)
    # the right-hand head is another value: taking the left one does not reset it
    right = RedisListReader(REDIS_URL, key_prefix=prefix, clock=lambda: clock[0])
    right.read(["jobs"])
    rclient.lpop(f"{prefix}jobs")
    clock[0] += timedelta(seconds=7)
    assert right.read(["jobs"])["jobs"].oldest_pending_age == 7.0


def test_redis_stream_with_and_without_a_group(prefix, rclient):
    key = f"{prefix}events"
    t0 = int(time.time() * 1000) - 60_000
    for i in range(5):
        rclient.xadd(key, {"n": i}, id=f"{t0 + i * 1000}-0")
    rclient.xgroup_create(key, "workers", id="0")
    rclient.xreadgroup("workers", "c1", {key: ">"}, count=2)  # 2 delivered, not acked
    rclient.xack(key, "workers", f"{t0}-0")  # 1 of them acked
    now = datetime.fromtimestamp((t0 + 60_000) / 1000, UTC)
    grouped = RedisStreamReader(REDIS_URL, group="workers", key_prefix=prefix, clock=lambda: now)
    m = grouped.read(["events"])["events"]
    from_config = build_reader(
        RedisStreamSource(url=REDIS_URL, group="workers", global_keyprefix=prefix),
        clock=lambda: now,
    )
    assert from_config.read(["events"])["events"] == m
    assert (m.pending, m.in_flight) == (3, 1)
    assert m.oldest_pending_age == pytest.approx(58.0)  # first undelivered entry: t0 + 2 s
    plain = RedisStreamReader(REDIS_URL, key_prefix=prefix, clock=lambda: now)
    m = plain.read(["events", "none"])
    assert (m["events"].pending, m["events"].oldest_pending_age) == (5, pytest.approx(60.0))
    assert (m["none"].pending, m["none"].stale) == (0, False)
    rclient.set(f"{prefix}str", "x")
    assert plain.read(["str"])["str"].stale


def test_list_and_stream_errors_are_redacted(private_redis):
    bad = f"redis://:{SECRET}nope@127.0.0.1:{private_redis.port}/0"
    for reader in (RedisListReader(bad), RedisStreamReader(bad), AsynqReader(bad)):
        with pytest.raises(SourceError) as err:
            reader.read(["q"])
        assert SECRET not in str(err.value)
        assert SECRET not in reader.source_id
