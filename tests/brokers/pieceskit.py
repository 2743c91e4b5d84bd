"""What the tests of the read in pieces share: a throwaway redis-server of a test module's own
(no other client's commands in MONITOR), kombu's delivery and restore as it writes them, a fixed
clock, and a reader that sends each command of a round on its own (`Stepping`)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import redis

from autoscaler.brokers.redis.celery_redis import CeleryRedisReader
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from autoscaler.brokers.redis.redis_pieces import PIECES_LUA


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server(*extra: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        yield url
    finally:
        proc.kill()
        proc.wait(10)


def deliver(r: redis.Redis, lay: CeleryRedisLayout, queue: str, raw: bytes) -> str:
    """What kombu's QoS.append writes for a delivered message (index and hash in one MULTI)."""
    tag = json.loads(raw)["properties"]["delivery_tag"]
    pipe = r.pipeline(transaction=True)
    pipe.zadd(lay.unacked_index, {tag: time.time()})
    pipe.hset(lay.unacked, tag, json.dumps([json.loads(raw), "", queue]))
    pipe.execute()
    return str(tag)


def restore(r: redis.Redis, lay: CeleryRedisLayout, tag: str, key: str) -> None:
    """kombu's restore_by_tag (leftmost=False): off the index and the hash, back at the head,
    marked redelivered, in one MULTI."""
    entry = json.loads(r.hget(lay.unacked, tag) or b"null")
    msg = entry[0]
    msg["headers"]["redelivered"] = True
    pipe = r.pipeline(transaction=True)
    pipe.zrem(lay.unacked_index, tag)
    pipe.hdel(lay.unacked, tag)
    pipe.rpush(key, json.dumps(msg))
    pipe.execute()


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class Stepping(CeleryRedisReader):
    """Sends each command of a round on its own and calls `hook(commands done, round, commands
    done in this round)` after each: other clients' commands land exactly between two of ours.

    The script is loaded first: on a fresh server the read's first round would meet NOSCRIPT
    and go again, and a hook meant for "the round after the counting one" would run inside the
    counting round itself (the failure CI saw when this test ran first on its worker)."""

    def __init__(self, *args: Any, hook: Callable[[int, int, int], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client.script_load(PIECES_LUA)
        self.hook = hook
        self.done = 0
        self.round_no = 0

    def _round(self, calls):  # type: ignore[no-untyped-def]
        self.round_no += 1
        for number, call in enumerate(calls, 1):
            yield from super()._round([call])
            self.done += 1
            self.hook(self.done, self.round_no, number)
