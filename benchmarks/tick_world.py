"""The world `tick.py` measures and its instruments: the bench config, the seeded machine rows
and Redis jobs, the SQL statement counter (`Counter_`), the metrics-source failure count
(`FAILURES`) and an outbox that sends nothing.

Apart from `tick.py` because `reconcile.py` builds the same world, and the runs in this process
and in the shard workers (`tick_runs`, `tick_shards`) share the instruments.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis
from sqlalchemy import event

from autoscaler.brokers.base import PUBLISHED_AT_HEADER
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from autoscaler.config.models import Config
from autoscaler.control.outbox import StepName
from autoscaler.lifecycle import InstanceState

PROVIDER = "bench-mock"
S = InstanceState


# --------------------------------------------------------------------------- the world


def config_document(n: int, instances: int, redis_url: str, prefix: str) -> dict[str, Any]:
    per_queue = instances // max(1, n - n // 10) + 1
    metrics = {"source": "celery", "url": redis_url, "global_keyprefix": prefix}
    queues: dict[str, Any] = {}
    for i in range(n):
        kind = i % 5
        up: list[dict[str, Any]]
        down: list[dict[str, Any]] = [{"trigger": "idle", "timeout": ["5m", "10m", "15m"][i % 3]}]
        if kind == 0:
            up = [{"trigger": "no_workers"}]
        elif kind == 1:
            up = [{"trigger": "no_workers"}, {"trigger": "queue_depth", "threshold": 20}]
        elif kind == 2:
            up = [{"trigger": "queue_depth", "target_per_worker": 4}]
        elif kind == 3:
            up = [{"trigger": "no_workers"}, {"trigger": "latency", "max_latency": "2m"}]
            down.append({"trigger": "schedule", "cron": "0 22 * * *", "timezone": "Europe/Paris"})
        else:
            up = [
                {"trigger": "no_workers"},
                {
                    "trigger": "schedule",
                    "cron": "0 8 * * 1-5",
                    "timezone": "America/New_York",
                    "workers": 1,
                    "duration": "2h",
                },
            ]
        queues[qname(i)] = {
            "metrics": metrics,
            "autoscale": {
                "provider": PROVIDER,
                "min_workers": 1 if i % 7 == 0 else 0,
                "max_workers": per_queue + 10,
                "priority": i % 3,
                "scale_up": up,
                "scale_down": down,
                "instance": {"gpu": "RTX 4090", "max_price_per_hour": 0.6},
            },
        }
    doc = {
        "poll_interval": "30s",
        "limits": {"max_machines": instances * 4, "max_price_per_hour": instances * 2.0},
        "providers": {PROVIDER: {"kind": "mock", "boot_delay": "60s", "price_per_hour": 0.4}},
        "queues": queues,
    }
    return Config.model_validate(doc).model_dump(mode="json")


def qname(i: int) -> str:
    return f"bench-q{i:04d}"


def instance_rows(n: int, count: int, installation: str, now: datetime) -> list[dict[str, Any]]:
    """`count` machines over the queues that have any (every tenth queue has none): 75% ready
    (60% of them busy, 25% idle a few minutes, 15% idle for long), 15% booting, 10% draining."""
    rng = random.Random(7)
    with_machines = [i for i in range(n) if i % 10 != 5]
    rows = []
    for k in range(count):
        q = qname(with_machines[k % len(with_machines)])
        launch = uuid.UUID(int=rng.getrandbits(128)).hex
        created = now - timedelta(seconds=rng.uniform(600, 36000))
        row: dict[str, Any] = {
            "launch_id": launch,
            "queue": q,
            "provider": PROVIDER,
            "provider_instance_id": f"mock-{k + 1}",
            "host_id": f"host-{k}",
            "gpu": "RTX 4090",
            "price_per_hour": 0.4,
            "attempts": 1,
            "drain_requested": False,
            "pending_at": created,
            "creating_at": created + timedelta(seconds=1),
            "booting_at": created + timedelta(seconds=3),
            "created_at": created,
            "updated_at": now,
            "running_tasks": 0,
            "worker_name": f"asg-{installation}-{launch}@host-{k}",
        }
        roll = rng.random()
        if roll < 0.75:
            ready = created + timedelta(seconds=rng.uniform(60, 300))
            row.update(
                state=S.READY,
                ready_at=ready,
                state_reason="worker answered",
                last_heartbeat_at=now - timedelta(seconds=rng.uniform(0, 30)),
            )
            kind = rng.random()
            if kind < 0.60:
                row.update(
                    running_tasks=1, last_task_at=now - timedelta(seconds=rng.uniform(0, 30))
                )
            elif kind < 0.85:
                row["last_task_at"] = now - timedelta(seconds=rng.uniform(30, 240))
            else:
                row["last_task_at"] = max(ready, now - timedelta(seconds=rng.uniform(1200, 7200)))
        elif roll < 0.90:
            created = now - timedelta(seconds=rng.uniform(5, 240))
            row.update(
                state=S.BOOTING,
                state_reason="rented",
                created_at=created,
                pending_at=created,
                creating_at=created + timedelta(seconds=1),
                booting_at=created + timedelta(seconds=3),
                worker_name=None,
            )
        else:
            ready = created + timedelta(seconds=rng.uniform(60, 300))
            row.update(
                state=S.DRAINING,
                state_reason="idle",
                ready_at=ready,
                draining_at=now - timedelta(seconds=rng.uniform(5, 600)),
                last_task_at=now - timedelta(seconds=rng.uniform(0, 600)),
                running_tasks=rng.choice((0, 1)),
                last_heartbeat_at=now - timedelta(seconds=rng.uniform(0, 30)),
            )
        rows.append(row)
    return rows


def message(queue: str, stamped: bool) -> bytes:
    headers: dict[str, Any] = {"task": "app.tasks.infer", "id": str(uuid.uuid4()), "retries": 0}
    if stamped:
        headers[PUBLISHED_AT_HEADER] = time.time() - 20
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


def pending_queues(n: int) -> list[int]:
    """A fifth of the queues hold jobs, the queues without machines among them."""
    return [i for i in range(n) if i % 5 == 0 or i % 10 == 5]


def fill_redis(r: redis.Redis, layout: CeleryRedisLayout, n: int) -> int:
    pipe = r.pipeline(transaction=False)
    total = 0
    for i in pending_queues(n):
        for _ in range(1 + (i * 7) % 30):
            pipe.lpush(layout.keys(qname(i))[0], message(qname(i), stamped=i % 2 == 0))
            total += 1
    pipe.execute()
    return total


def move_heads(r: redis.Redis, layout: CeleryRedisLayout, n: int) -> None:
    """A worker took the oldest job of every non-empty queue and a producer added one."""
    pipe = r.pipeline(transaction=False)
    for i in pending_queues(n):
        key = layout.keys(qname(i))[0]
        pipe.rpop(key)
        pipe.lpush(key, message(qname(i), stamped=i % 2 == 0))
    pipe.execute()


# --------------------------------------------------------------------------- counting


def statement_kind(sql: str) -> str:
    s = " ".join(sql.split())
    for pat, verb in (
        (r"^INSERT INTO (\w+)", "INSERT"),
        (r"^UPDATE (\w+)", "UPDATE"),
        (r"^DELETE FROM (\w+)", "DELETE"),
    ):
        m = re.match(pat, s, re.I)
        if m:
            return f"{verb} {m.group(1)}"
    m = re.search(r"\bFROM (\w+)", s, re.I)
    return f"SELECT {m.group(1)}" if m else s[:40]


@dataclass
class Counter_:
    on: bool = False
    phase: str = "-"
    statements: list[tuple[str, str]] = field(default_factory=list)
    checkouts: int = 0
    commits: int = 0

    def attach(self, engine: Any) -> None:
        @event.listens_for(engine, "before_cursor_execute")
        def _stmt(
            conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
        ) -> None:
            if self.on:
                self.statements.append((self.phase, statement_kind(statement)))

        @event.listens_for(engine.pool, "checkout")
        def _checkout(*_: Any) -> None:
            if self.on:
                self.checkouts += 1

        @event.listens_for(engine, "commit")
        def _commit(*_: Any) -> None:
            if self.on:
                self.commits += 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.statements, self.checkouts, self.commits, self.on = [], 0, 0, True
        try:
            yield
        finally:
            self.on = False


class SourceFailures(logging.Handler):
    """Counts "metrics source failed" warnings: such a run read no fresh numbers (e.g. Redis
    restarted under us) and is left out of the figures."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


FAILURES = SourceFailures()
logging.getLogger("autoscaler.brokers").addHandler(FAILURES)
logging.getLogger("autoscaler.brokers").propagate = False


class Discard:
    """An outbox that sends nothing (the steps' tasks are not part of the tick's time)."""

    def step(self, step: StepName, launch_id: str, *, after: float | None = None) -> None:
        return None

    def evaluate(self, queue: str) -> None:
        return None

    def shard(self, number: int) -> None:
        return None


noop = Discard()
