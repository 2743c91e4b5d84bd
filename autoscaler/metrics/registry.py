"""From a queue's `metrics:` config block to the reader that measures it.

`build_reader` picks the implementation from `source` and, for `celery`, from the URL scheme
(redis/rediss -> Redis, amqp/amqps/pyamqp -> RabbitMQ, sqla+... -> kombu's SQLAlchemy
transport). `group_queues` puts the queues that share one source together, so each source is
read once per tick for all its queues. `build_source` wraps the reader in the fallback.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass

from autoscaler.config.isolation import WATCH_BROKER_ENV
from autoscaler.config.models import CelerySource, MetricsSource, MetricTrigger, Queue
from autoscaler.metrics.asynq import AsynqReader
from autoscaler.metrics.base import Clock, MetricsReader, Sightings, utc_now
from autoscaler.metrics.celery_rabbitmq import CeleryRabbitMQReader
from autoscaler.metrics.celery_redis import CeleryRedisLayout, CeleryRedisReader
from autoscaler.metrics.celery_sqla import CelerySqlaReader
from autoscaler.metrics.fallback import FallbackReader, LastReadings
from autoscaler.metrics.prometheus import PrometheusReader
from autoscaler.metrics.redis_list import RedisListReader, RedisStreamReader
from autoscaler.urls import UrlError, parse_url, transport


class MetricsConfigError(ValueError):
    """The source cannot be built; the message names the fix and holds no secret."""


def source_url(source: MetricsSource, env: Mapping[str, str] | None = None) -> str:
    e = os.environ if env is None else env
    if source.url:
        return source.url
    name = source.url_env or WATCH_BROKER_ENV
    url = e.get(name)
    if not url:
        raise MetricsConfigError(
            f"no broker URL for this queue's metrics: set the environment variable {name}"
            + ("" if source.url_env else " or give 'url' / 'url_env' in the queue's metrics block")
        )
    return url


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


def redis_layout(source: CelerySource) -> CeleryRedisLayout:
    """kombu's Redis key layout a `metrics:` block describes."""
    return CeleryRedisLayout(
        global_keyprefix=source.global_keyprefix,
        sep=source.sep,
        priority_steps=source.priority_steps,
    )


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
    kind = transport(url)
    if source.source == "asynq":
        return AsynqReader(url, clock=clock, timeout=timeout)
    if source.source == "redis-list":
        return RedisListReader(
            url,
            key_prefix=source.global_keyprefix,
            pop_side=source.pop_side,
            sightings=sightings,
            clock=clock,
            timeout=timeout,
        )
    if source.source == "redis-stream":
        return RedisStreamReader(
            url,
            group=source.group,
            key_prefix=source.global_keyprefix,
            clock=clock,
            timeout=timeout,
        )
    if kind == "redis":
        layout = redis_layout(source)
        return CeleryRedisReader(
            url,
            layout=layout,
            sightings=sightings,
            clock=clock,
            timeout=timeout,
            piece_budget=source.piece_budget,
        )
    if kind == "amqp":
        return CeleryRabbitMQReader(
            url,
            management_url=source.management_url,
            sightings=sightings,
            clock=clock,
            timeout=timeout,
        )
    if kind == "sqla":
        return CelerySqlaReader(url, sightings=sightings, clock=clock, timeout=timeout)
    scheme = url.split("://", 1)[0] if "://" in url else "scheme-less"
    raise MetricsConfigError(
        f"celery metrics cannot read a {scheme!r} broker URL; use redis://, "
        "rediss://, amqp:// or sqla+<database URL>"
    )


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
