"""The one place that opens a client of a watched Redis, for every source and tool on Redis
(Celery on Redis, asynq, plain lists and streams, the key-layout check, per-machine users, the
hand-back): short timeouts, one immediate retry (a pooled connection the server dropped), TLS
from a `rediss://` URL, and no URL in any error text.
"""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from autoscaler.brokers.base import Secrets, SourceError, safe_error
from autoscaler.settings import redact_url


def open_redis(url: str, timeout: float = 5.0) -> redis.Redis:
    """A client for a watched Redis; raises SourceError (redacted) on a malformed URL."""
    try:
        return redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 1),
            decode_responses=False,
        )
    except (ValueError, redis.RedisError) as exc:
        raise SourceError(safe_error(exc, Secrets.from_urls(url), "bad Redis URL")) from None


def redis_identity(url: str) -> str:
    """host:port/db of a Redis URL, without user or password (stable across password changes)."""
    try:
        kwargs = redis.connection.parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError:
        return redact_url(url)
    host = kwargs.get("host") or kwargs.get("path") or "localhost"
    return f"{host}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
