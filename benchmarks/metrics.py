"""How long reading Celery queues on Redis takes, and how long it blocks the server.

    python benchmarks/metrics.py [--queues 1000,10000] [--rounds 15] [--deep 0]

Starts its own throwaway `redis-server` (no persistence, `slowlog-log-slower-than 0` so SLOWLOG
records every command, `slowlog-max-len` large enough for a whole run), fills it with a
realistic layout (most queues hold a few messages in the default priority key, one in ten one
more in another priority key, half of the heads stamped, one queue in twenty a message unacked,
written as kombu writes it: the `unacked` hash and the `unacked_index` sorted set), and for each
size prints:

- the read (`CeleryRedisReader.read`): median and p90 wall time, client and server CPU time
  per read (the server's from /proc: steadier than wall time on a busy machine), round trips,
  commands sent;
- the longest single command it caused on the server (from SLOWLOG: while a command runs, the
  user's producers and workers wait), the median over reads of each read's longest, the p99 of
  all its commands and how many took over 5 ms;
- the call-per-key loop in the same run: LLEN and LINDEX per priority key, one call each, then
  one HVALS of the unacked hash (what a Flower-style poll does), with its own longest command.

`--deep N` adds one list of N countdown messages (ETA in an hour) to show that a deep ETA scan is
cut into pieces too.

Measured on the 2-core machine this repository is developed on, other test suites running (load
average 3.6-4.2), 15 reads per size. "longest" is the longest single command of all the reads,
"typical" the median over the reads of each read's longest command:

    before: one script over every key, one HVALS of the unacked hash
     queues  read median  server CPU  longest command   typical  call-per-key loop (its longest)
      1,000      34.4 ms     18.7 ms  EVALSHA  27.1 ms  17.7 ms     435.7 ms (0.27 ms)
     10,000     437.9 ms    241.3 ms  EVALSHA 331.2 ms 233.3 ms  11,303.6 ms (0.94 ms)

    after: pieces of 500 units (PIECE_BUDGET), one round trip, answers parsed as they arrive
     queues  read median  server CPU  longest command   typical  call-per-key loop (its longest)
      1,000      21.2 ms     16.0 ms  EVALSHA   8.7 ms   1.0 ms     437.8 ms (0.17 ms)
     10,000     265.1 ms    166.7 ms  EVALSHA  13.2 ms   5.0 ms   4,682.7 ms (0.74 ms)

The pieces' own work is ~0.8 ms (median command 0.7 ms, p99 4.9 ms at 10,000 queues): the
longest ones are pieces that waited for a core on the loaded machine (21 of 3,090 over 5 ms;
the loop's single LLENs stretched to 5 ms the same way in other runs). The old and the new
reader reading in turn from one server, 20 reads each (the fairest comparison under a varying
load): 10,000 queues 221 ms vs 436 ms median, longest command 13 ms vs 478 ms; 1,000 queues
27 ms vs 40 ms.
On the idle machine (load average 0.4, 2026-12-02): 1,000 queues 26.7 ms median, longest
command 4.98 ms (typical 1.2 ms); 10,000 queues 304.9 ms, longest 3.46 ms (typical 1.5 ms),
0 of 3,090 commands over 5 ms, the loop 14.3 s.
Again with the second view of unacked carrying values (jobs delivered during the read), idle:
1,000 queues 24.0 ms, longest 5.68 ms (1 of 198 commands over 5 ms; p99 4.0 ms); 10,000 queues
304.7 ms, longest 2.81 ms (0 of 1,872).
With `--deep 20000` (1,000 queues and a list of 20,000 countdown jobs): 53 ms in 2 round trips,
longest command 3.6 ms, where the one script took 77 ms in one command. The goal of 150 ms for
10,000 queues is not reached on this machine: looking at every one of the 31,000 messages for
its ETA costs ~155 ms of server CPU per read here, which pieces do not reduce.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.brokers.base import PUBLISHED_AT_HEADER, parse_celery_envelope
from autoscaler.brokers.redis.celery_redis import CeleryRedisReader
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from autoscaler.brokers.redis.unacked import count_unacked


def message(queue: str, stamped: bool, eta: datetime | None = None) -> bytes:
    headers: dict[str, object] = {
        "task": "app.tasks.infer",
        "id": str(uuid.uuid4()),
        "eta": eta.isoformat() if eta else None,
        "retries": 0,
        "argsrepr": "('x',)",
    }
    if stamped:
        headers[PUBLISHED_AT_HEADER] = time.time() - 30
    return json.dumps(
        {
            "body": "W1siaW1hZ2UucG5nIl0sIHt9LCB7ImNhbGxiYWNrcyI6IG51bGx9XQ==",
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "correlation_id": headers["id"],
                "delivery_tag": str(uuid.uuid4()),
                "priority": 0,
                "body_encoding": "base64",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
            },
        }
    ).encode()


def fill(r: redis.Redis, layout: CeleryRedisLayout, queues: list[str]) -> None:
    pipe = r.pipeline(transaction=False)
    for i, q in enumerate(queues):
        keys = layout.keys(q)
        for _ in range(1 + i % 5):
            pipe.lpush(keys[0], message(q, stamped=i % 2 == 0))
        if i % 10 == 0:
            pipe.lpush(keys[2], message(q, stamped=False))
        if i % 20 == 0:  # as kombu's QoS.append writes a delivery
            tag = str(uuid.uuid4())
            pipe.zadd(layout.unacked_index, {tag: time.time()})
            pipe.hset(layout.unacked, tag, json.dumps([json.loads(message(q, True)), "", q]))
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()


def fill_deep(r: redis.Redis, layout: CeleryRedisLayout, queue: str, n: int) -> None:
    eta = datetime.now(UTC) + timedelta(hours=1)
    key = layout.keys(queue)[0]
    for start in range(0, n, 1000):
        r.lpush(key, *[message(queue, True, eta) for _ in range(min(1000, n - start))])


def per_key_loop(r: redis.Redis, layout: CeleryRedisLayout, queues: list[str]) -> int:
    """One call per priority key (LLEN, LINDEX of the head), then one HVALS: jobs seen."""
    total = 0
    for q in queues:
        for key in layout.keys(q):
            total += int(r.llen(key))
            head = r.lindex(key, -1)
            if head is not None:
                parse_celery_envelope(head)
    return total + sum(count_unacked(r.hvals(layout.unacked)).values())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
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
            "--dir",
            workdir,
            "--slowlog-log-slower-than",
            "0",
            "--slowlog-max-len",
            "10000000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.RedisError:
            time.sleep(0.02)
    proc.kill()
    raise SystemExit("redis-server did not start")


def server_cpu(proc: subprocess.Popen[bytes]) -> float:
    """CPU milliseconds the server process has used (steadier than wall time on a busy box)."""
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def commands_since_reset(r: redis.Redis) -> list[tuple[float, str]]:
    """(ms, name) of every command sent since the last SLOWLOG RESET, which this resets. The
    commands a script runs are logged too (client "?:0"): they are part of their EVALSHA."""
    log = r.slowlog_get(10_000_000)
    r.slowlog_reset()
    return [
        (e["duration"] / 1000, e["command"].split(b" ", 1)[0].decode(errors="replace"))
        for e in log
        if e.get("client_address") != b"?:0"
        and not e["command"].upper().startswith((b"SLOWLOG", b"INFO"))
    ]


def measured(
    r: redis.Redis, proc: subprocess.Popen[bytes], fn: Callable[[], object], rounds: int
) -> dict[str, Any]:
    """Per round: wall ms, client CPU ms, server CPU ms, the commands it caused."""
    wall, cpu, server, longest, commands = [], [], [], [], []
    durations: list[float] = []
    r.slowlog_reset()
    for _ in range(rounds):
        s, t, c = server_cpu(proc), time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
        server.append(server_cpu(proc) - s)
        sent = commands_since_reset(r)
        commands.append(len(sent))
        durations += [ms for ms, _ in sent]
        longest.append(max(sent, default=(0.0, "-")))
    top = max(longest)
    return {
        "median": statistics.median(wall),
        "p90": p90(wall),
        "cpu": statistics.median(cpu),
        "server_cpu": statistics.mean(server),
        "commands": statistics.median(commands),
        "longest": top[0],
        "longest_cmd": top[1],
        "typical_longest": statistics.median(ms for ms, _ in longest),
        "p99_command": statistics.quantiles(durations, n=100)[-1]
        if len(durations) > 1
        else max(durations, default=0.0),
        "over_5ms": sum(ms > 5 for ms in durations),
        "all_commands": len(durations),
    }


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) >= 2 else values[0]


def run(
    r: redis.Redis, url: str, proc: subprocess.Popen[bytes], n: int, rounds: int, deep: int
) -> dict[str, Any]:
    r.flushall()
    layout = CeleryRedisLayout(global_keyprefix="bench:")
    queues = [f"queue-{i}" for i in range(n)]
    fill(r, layout, queues)
    if deep:
        fill_deep(r, layout, queues[1], deep)
    reader = CeleryRedisReader(url, layout=layout)
    got = reader.read(queues)  # warm: script loaded, connection open, sizes known
    seen = sum(m.pending + m.scheduled + m.in_flight for m in got.values())
    assert seen == per_key_loop(r, layout, queues), "pieces and the per-key loop disagree"
    read = measured(r, proc, lambda: reader.read(queues), rounds)
    loop = measured(r, proc, lambda: per_key_loop(r, layout, queues), max(2, rounds // 5))
    reader.close()
    return {
        "keys": n * len(layout.steps),
        "rounds": reader.rounds,
        "pending": sum(m.pending for m in got.values()),
        "scheduled": sum(m.scheduled for m in got.values()),
        "unacked": sum(m.in_flight for m in got.values()),
        "read": read,
        "loop": loop,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", default="1000,10000", help="comma-separated sizes")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument(
        "--deep", type=int, default=0, help="add one list of this many countdown messages"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        proc, url = start_server(workdir)
        r = redis.Redis.from_url(url)
        try:
            print(
                f"redis-server {r.info('server')['redis_version']} (throwaway, SLOWLOG of "
                f"every command), {os.cpu_count()} cores, load average "
                f"{os.getloadavg()[0]:.1f}"
            )
            print(
                f"{'queues':>7} {'read median':>12} {'p90':>9} {'client CPU':>11} "
                f"{'server CPU':>11} {'rounds':>6} {'cmds':>5} {'longest command':>24} "
                f"{'(typical)':>10} {'per-key loop':>13} {'its longest':>12}"
            )
            for n in (int(x) for x in args.queues.split(",")):
                m = run(r, url, proc, n, args.rounds, args.deep)
                rd, lp = m["read"], m["loop"]
                print(
                    f"{n:>7,} {rd['median']:>9.1f} ms {rd['p90']:>6.1f} ms "
                    f"{rd['cpu']:>8.1f} ms {rd['server_cpu']:>8.1f} ms {m['rounds']:>6} "
                    f"{rd['commands']:>5.0f} {rd['longest_cmd']:>12} "
                    f"{rd['longest']:>6.2f} ms {rd['typical_longest']:>7.2f} ms "
                    f"{lp['median']:>10.1f} ms {lp['longest']:>9.2f} ms"
                )
                print(
                    f"{'':>7} ({m['keys']:,} priority keys, {m['pending']:,} pending, "
                    f"{m['scheduled']:,} scheduled, {m['unacked']:,} unacked; the loop is "
                    f"{lp['median'] / rd['median']:.1f}x the read; the read's commands: p99 "
                    f"{rd['p99_command']:.2f} ms, {rd['over_5ms']} of {rd['all_commands']} "
                    f"over 5 ms)"
                )
            print(f"load average at the end {os.getloadavg()[0]:.1f}")
        finally:
            r.close()
            proc.kill()
            proc.wait(10)


if __name__ == "__main__":
    main()
