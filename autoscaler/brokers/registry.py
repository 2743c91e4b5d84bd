"""From a queue's `metrics:` config block to the reader that measures it.

A source kind is its config model in `config.metrics_sources` (one member of `MetricsSource`,
with its `source` tag), its module here with a `build` function, and its line in `READERS`:
`tests/brokers/test_source_kinds.py` fails when a kind of the union has no entry, or an entry no
kind. `celery` picks its reader from the URL scheme (`CELERY_TRANSPORTS`: redis/rediss ->
Redis, amqp/amqps/pyamqp -> RabbitMQ, sqla+... -> kombu's SQLAlchemy transport, the embedded
broker). `group_queues` puts the queues that share one source together, so each source is read
once per tick for all its queues. `build_source` wraps the reader in the fallback.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autoscaler.brokers.asynq import asynq
from autoscaler.brokers.base import (
    Clock,
    MetricsConfigError,
    MetricsReader,
    ReaderBuild,
    Sightings,
    source_url,
    utc_now,
)
from autoscaler.brokers.embedded import celery_sqla
from autoscaler.brokers.fallback import FallbackReader, LastReadings
from autoscaler.brokers.lists import redis_list
from autoscaler.brokers.prometheus import PrometheusReader
from autoscaler.brokers.rabbitmq import celery_rabbitmq
from autoscaler.brokers.redis import celery_redis
from autoscaler.brokers.redis.keys import redis_layout
from autoscaler.config.metrics_sources import CelerySource, MetricsSource
from autoscaler.config.models import Queue
from autoscaler.config.triggers import MetricTrigger
from autoscaler.urls import Transport, UrlError, parse_url, transport

Builder = Callable[[Any, ReaderBuild], MetricsReader]
"""A source kind's `build`: its config block (the kind's model) and the rest -> its reader."""

CELERY_TRANSPORTS: Mapping[Transport, Builder] = {
    "redis": celery_redis.build,
    "amqp": celery_rabbitmq.build,
    "sqla": celery_sqla.build,
}
"""Celery's reader on each broker, by the transport its URL names (`urls.transport`)."""


def _celery(source: CelerySource, ctx: ReaderBuild) -> MetricsReader:
    """The `celery` source's reader: the one of the broker its URL names."""
    builder = CELERY_TRANSPORTS.get(transport(ctx.url))
    if builder is None:
        scheme = ctx.url.split("://", 1)[0] if "://" in ctx.url else "scheme-less"
        raise MetricsConfigError(
            f"celery metrics cannot read a {scheme!r} broker URL; use redis://, "
            "rediss://, amqp:// or sqla+<database URL>"
        )
    return builder(source, ctx)


READERS: Mapping[str, Builder] = {
    "celery": _celery,
    "asynq": asynq.build,
    "redis-list": redis_list.build_list,
    "redis-stream": redis_list.build_stream,
}
"""Each source kind's reader, by the `source` tag of its config model (`MetricsSource`)."""


def broker_domain(source: MetricsSource, env: Mapping[str, str] | None = None) -> str:
    """Where a source's workers answer remote control: scheme, server, database (or vhost) and
    key prefix, without credentials. A sighting counts only for the queues of the domain that
    answered it: a reply through queue A's broker naming queue B is no worker of B."""
    try:
        url = source_url(source, env)
    except MetricsConfigError:
        return f"{source.source}:unresolved"
    return _domain(source.source, url, source.global_keyprefix or "")


@functools.lru_cache(maxsize=1024)
def _domain(kind: str, url: str, prefix: str) -> str:
    """`broker_domain` of a resolved URL, kept: a tick asks it for every queue, and checking a
    URL character by character cost 0.6 s a tick at 10,000 queues (`benchmarks/tick.py`)."""
    try:
        parts = parse_url(url)
    except UrlError:
        return f"{kind}:unresolved"
    where = f"{parts.scheme}://{parts.hostname or ''}:{parts.port or ''}"
    where += f"/{parts.db}" if parts.db is not None else parts.path
    return f"{where} prefix {prefix!r}"[:300] if prefix else where[:300]


def transport_options(source: CelerySource, url: str) -> dict[str, object]:
    """The `broker_transport_options` a Celery app on the watched broker needs, from the same
    `metrics:` block the reader uses: on Redis the key prefix, separator and priority steps
    (remote-control replies are pushed to priority-step lists like any message, so a probe with
    other steps never sees them); nothing on RabbitMQ."""
    return redis_layout(source).transport_options() if transport(url) == "redis" else {}


def build_reader(
    source: MetricsSource,
    *,
    env: Mapping[str, str] | None = None,
    sightings: Sightings | None = None,
    clock: Clock = utc_now,
    timeout: float | None = None,
) -> MetricsReader:
    """The reader for `source`; `timeout` overrides the source's own (tests use it)."""
    url = source_url(source, env)
    timeout = source.timeout if timeout is None else timeout
    builder = READERS.get(source.source)
    if builder is None:
        raise MetricsConfigError(f"unknown metrics source {source.source!r}")
    return builder(source, ReaderBuild(url, sightings, clock, timeout))


def build_source(
    source: MetricsSource,
    *,
    env: Mapping[str, str] | None = None,
    sightings: Sightings | None = None,
    clock: Clock = utc_now,
    timeout: float | None = None,
    last: LastReadings | None = None,
) -> FallbackReader:
    """The reader the tick uses: never raises on read, stale numbers for `stale_after` s
    (kept in `last`: the store, so that every worker process falls back alike)."""
    reader = build_reader(source, env=env, sightings=sightings, clock=clock, timeout=timeout)
    return FallbackReader(reader, max_age=source.stale_after, clock=clock, last=last)


def build_prometheus(
    trigger: MetricTrigger,
    *,
    env: Mapping[str, str] | None = None,
    max_age: float = 300.0,
    clock: Clock = utc_now,
) -> PrometheusReader:
    e = os.environ if env is None else env
    url = trigger.url or (e.get(trigger.url_env) if trigger.url_env else None)
    if not url:
        raise MetricsConfigError(
            f"no Prometheus address: set the environment variable {trigger.url_env}"
        )
    return PrometheusReader(url, timeout=trigger.timeout, max_age=max_age, clock=clock)


@dataclass(frozen=True)
class ReadGroup:
    """Queues read together: one source (its `queue` cleared), broker queue -> config names."""

    source: MetricsSource
    queues: dict[str, tuple[str, ...]]


def group_queues(queues: Mapping[str, Queue]) -> list[ReadGroup]:
    """One group per distinct source; a queue's broker name is `metrics.queue` or its key."""
    groups: dict[MetricsSource, dict[str, list[str]]] = {}
    for name, q in queues.items():
        src = q.metrics.model_copy(update={"queue": None})
        groups.setdefault(src, {}).setdefault(q.metrics.queue or name, []).append(name)
    return [
        ReadGroup(src, {bq: tuple(names) for bq, names in qs.items()}) for src, qs in groups.items()
    ]
