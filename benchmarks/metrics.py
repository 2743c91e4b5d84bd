"""Time to read 1,000 Celery queues on one Redis: one pipelined batch vs one call per queue.

    python benchmarks/metrics.py [--queues 1000] [--rounds 20] [--redis redis://127.0.0.1:6379/0]

Fills a throwaway key prefix with a realistic layout (most queues hold a few messages in the
default priority key, some in several priority keys, half of the heads stamped, some messages
unacked), reads it with `CeleryRedisReader` and with the naive loop (per queue and per priority
key: LLEN, LINDEX, then HVALS of unacked per queue, like a Flower-style poll would), prints the
median and p90 of both and their ratio, measured in the same run. Deletes its keys afterwards.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.metrics.base import PUBLISHED_AT_HEADER, parse_celery_envelope
from autoscaler.metrics.celery_redis import (
    CeleryRedisLayout,
    CeleryRedisReader,
    count_unacked,
)


def message(queue: str, stamped: bool) -> bytes:
    headers: dict[str, object] = {"task": "app.tasks.infer", "id": str(uuid.uuid4()),
                                  "eta": None, "retries": 0, "argsrepr": "('x',)"}
    if stamped:
        headers[PUBLISHED_AT_HEADER] = time.time() - 30
    return json.dumps({
        "body": "W1siaW1hZ2UucG5nIl0sIHt9LCB7ImNhbGxiYWNrcyI6IG51bGx9XQ==",
        "content-encoding": "utf-8", "content-type": "application/json", "headers": headers,
        "properties": {"correlation_id": headers["id"], "delivery_tag": str(uuid.uuid4()),
                       "priority": 0, "body_encoding": "base64", "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": queue}},
    }).encode()


def fill(r: redis.Redis, layout: CeleryRedisLayout, queues: list[str]) -> None:
    pipe = r.pipeline(transaction=False)
    for i, q in enumerate(queues):
        keys = layout.keys(q)
        for _ in range(1 + i % 5):
            pipe.lpush(keys[0], message(q, stamped=i % 2 == 0))
        if i % 10 == 0:
            pipe.lpush(keys[2], message(q, stamped=False))
        if i % 20 == 0:
            pipe.hset(layout.unacked, str(uuid.uuid4()),
                      json.dumps([json.loads(message(q, True)), "", q]))
    pipe.execute()


def naive(r: redis.Redis, layout: CeleryRedisLayout, queues: list[str]) -> dict[str, int]:
    out = {}
    for q in queues:
        depth = 0
        for key in layout.keys(q):
            depth += int(r.llen(key))
            head = r.lindex(key, -1)
            if head is not None:
                parse_celery_envelope(head)
        in_flight = count_unacked(r.hvals(layout.unacked)).get(q, 0)
        out[q] = depth + in_flight
    return out


def per_queue_pipeline(r: redis.Redis, layout: CeleryRedisLayout, queues: list[str]) -> None:
    """One round trip per queue (LLEN + LINDEX per priority key, HVALS unacked)."""
    for q in queues:
        pipe = r.pipeline(transaction=False)
        for key in layout.keys(q):
            pipe.llen(key)
            pipe.lindex(key, -1)
        pipe.hvals(layout.unacked)
        res = pipe.execute()
        for head in res[1:-1:2]:
            if head is not None:
                parse_celery_envelope(head)
        count_unacked(res[-1])


def timed(fn, rounds: int) -> tuple[list[float], list[float]]:
    """Wall and client-CPU milliseconds per round (CPU time is steadier on a busy machine)."""
    wall, cpu = [], []
    for _ in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    return wall, cpu


def server_usec(r: redis.Redis) -> float:
    stats = r.info("commandstats")
    return float(sum(v["usec"] for k, v in stats.items() if "eval" in k))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = ap.parse_args()
    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    layout = CeleryRedisLayout(global_keyprefix=prefix)
    r = redis.Redis.from_url(args.redis)
    queues = [f"queue-{i}" for i in range(args.queues)]
    try:
        fill(r, layout, queues)
        reader = CeleryRedisReader(args.redis, layout=layout)
        got = reader.read(queues)  # warm the connection
        total = sum(m.pending + m.in_flight for m in got.values())
        assert total == sum(naive(r, layout, queues).values()), "batch and naive loop disagree"
        before = server_usec(r)
        batch, batch_cpu = timed(lambda: reader.read(queues), args.rounds)
        script_ms = (server_usec(r) - before) / 1000 / args.rounds
        loop, loop_cpu = timed(lambda: naive(r, layout, queues), max(3, args.rounds // 4))
        perq, perq_cpu = timed(lambda: per_queue_pipeline(r, layout, queues),
                               max(3, args.rounds // 4))
        keys = len(layout.keys("x")) * args.queues
        print(f"{args.queues} queues, {keys} priority keys, {sum(m.pending for m in got.values())}"
              f" pending, {sum(m.in_flight for m in got.values())} unacked")
        for name, t, c in (("one round trip (CeleryRedisReader)", batch, batch_cpu),
                           ("naive loop, one call per key", loop, loop_cpu),
                           ("one pipeline per queue", perq, perq_cpu)):
            p90 = statistics.quantiles(t, n=10)[-1] if len(t) >= 2 else t[0]
            print(f"  {name:36s} median {statistics.median(t):8.1f} ms   p90 {p90:8.1f} ms"
                  f"   client CPU {statistics.median(c):7.1f} ms")
        print(f"  of which server-side script time: {script_ms:.1f} ms per read")
        ratio = statistics.median(loop) / statistics.median(batch)
        ratio_q = statistics.median(perq) / statistics.median(batch)
        print(f"  ratio (median) call-per-key/batch {ratio:.1f}x, pipeline-per-queue/batch "
              f"{ratio_q:.1f}x"
              f"   target: batch under 50 ms -> "
              f"{'met' if statistics.median(batch) < 50 else 'NOT met'}")
    finally:
        keys = list(r.scan_iter(match=f"{prefix}*", count=5000))
        for i in range(0, len(keys), 1000):
            r.delete(*keys[i:i + 1000])
        r.close()


if __name__ == "__main__":
    main()
