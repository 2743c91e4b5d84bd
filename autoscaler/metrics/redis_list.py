"""Plain Redis lists and streams, for any producer that is not Celery or asynq.

Also home of `open_redis`, the one place that opens a Redis client for every Redis source:
short timeouts, one immediate retry (a pooled connection the server dropped), TLS from a
`rediss://` URL, and no URL in any error text.

List: pending = LLEN; the head (next to pop) is index -1 for LPUSH/RPOP producers
(`pop_side="right"`, Celery, asynq) or index 0 for RPUSH/LPOP producers (`pop_side="left"`).
No publish time exists in a raw list, so the oldest age is bounded from when the head value was
first seen there (persisted through `Sightings`). In flight is unknown to a list: 0.

Stream with a consumer group: pending = the group's `lag` (entries not yet delivered), in
flight = the group's pending entries list (delivered, not acked), oldest age = now - the
millisecond time in the id of the first undelivered entry, exact because stream ids are times.
Without a group, every entry counts as pending and the oldest is the first entry.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from autoscaler.metrics.base import (
    Clock,
    Secrets,
    SightingsMemo,
    SourceError,
    age_from,
    safe_error,
    utc_now,
)
from autoscaler.metrics.base import Sightings as SightingsPort
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.settings import redact_url

log = logging.getLogger(__name__)


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


def value_id(raw: bytes) -> str:
    """An identity for a head value that carries no id of its own."""
    return "sha1:" + hashlib.sha1(raw).hexdigest()


class RedisListReader:
    """`MetricsReader` for plain Redis lists (`source: redis-list`); one pipeline per tick."""

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "",
        pop_side: Literal["right", "left"] = "right",
        sightings: SightingsPort | None = None,
        clock: Clock = utc_now,
        timeout: float = 5.0,
    ) -> None:
        self._secrets = Secrets.from_urls(url)
        self._client = open_redis(url, timeout)
        self._prefix = key_prefix
        self._head_index = -1 if pop_side == "right" else 0
        self._sightings: SightingsPort = sightings or SightingsMemo()
        self._clock = clock
        self.source_id = f"redis-list:{redis_identity(url)}:{key_prefix}"

    def read(self, queues: Sequence[str]) -> dict[str, QueueMetrics]:
        now = self._clock()
        pipe = self._client.pipeline(transaction=False)
        for q in queues:
            pipe.llen(self._prefix + q)
            pipe.lindex(self._prefix + q, self._head_index)
        try:
            res = pipe.execute(raise_on_error=False)
        except redis.RedisError as exc:
            raise SourceError(safe_error(exc, self._secrets, self.source_id)) from None
        out: dict[str, QueueMetrics] = {}
        heads: dict[str, str | None] = {}
        errors: dict[str, str] = {}
        for i, q in enumerate(queues):
            n, head = res[2 * i], res[2 * i + 1]
            if isinstance(n, Exception) or isinstance(head, Exception):
                bad = n if isinstance(n, Exception) else head
                assert isinstance(bad, Exception)
                errors[q] = safe_error(bad, self._secrets, f"key {q!r}")
                continue
            heads[q] = value_id(head) if isinstance(head, bytes) else None
        seen = observe_safely(self._sightings, self.source_id, heads, now)
        for i, q in enumerate(queues):
            if q in errors:
                out[q] = failed_metrics(q, now, errors[q])
                continue
            out[q] = QueueMetrics(
                queue=q,
                pending=int(res[2 * i]),
                oldest_pending_age=age_from(seen[q].timestamp(), now) if q in seen else None,
                in_flight=0,
                read_at=now,
            )
        return out

    def close(self) -> None:
        self._client.close()


def failed_metrics(queue: str, now: datetime, error: str) -> QueueMetrics:
    return QueueMetrics(
        queue=queue,
        pending=0,
        oldest_pending_age=None,
        in_flight=0,
        read_at=now,
        stale=True,
        error=error,
    )


def observe_safely(
    sightings: SightingsPort, source: str, heads: dict[str, str | None], now: datetime
) -> dict[str, datetime]:
    """Sightings are best effort: a store failure loses the age bound, never the reading."""
    try:
        return sightings.observe(source, heads, now)
    except Exception as exc:  # the store is down: report ages as unknown, keep the counts
        log.warning("head sightings of %s unavailable: %s", source, type(exc).__name__)
        return {}


_STREAM_LUA = """
local out = {}
for i, key in ipairs(KEYS) do
  local group = ARGV[i]
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' then
    out[i] = {0, 0, false}
  elseif t ~= 'stream' then
    out[i] = {-1, 0, t}
  elseif group == '' then
    local first = redis.call('XRANGE', key, '-', '+', 'COUNT', 1)[1]
    out[i] = {redis.call('XLEN', key), 0, first and first[1] or false}
  else
    local found = false
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
      local f = {}
      for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
      if f['name'] == group then
        found = true
        local nxt = redis.call('XRANGE', key, '(' .. f['last-delivered-id'], '+', 'COUNT', 1)[1]
        local lag = f['lag']
        if type(lag) ~= 'number' then
          -- lag unknown (entries deleted): count what is left, at most 100000
          lag = #redis.call('XRANGE', key, '(' .. f['last-delivered-id'], '+', 'COUNT', 100000)
        end
        out[i] = {lag, f['pending'], nxt and nxt[1] or false}
      end
    end
    if not found then
      local first = redis.call('XRANGE', key, '-', '+', 'COUNT', 1)[1]
      out[i] = {redis.call('XLEN', key), 0, first and first[1] or false}
    end
  end
end
return out
"""


class RedisStreamReader:
    """`MetricsReader` for Redis streams (`source: redis-stream`): one script call per tick."""

    def __init__(
        self,
        url: str,
        *,
        group: str | None = None,
        key_prefix: str = "",
        clock: Clock = utc_now,
        timeout: float = 5.0,
    ) -> None:
        self._secrets = Secrets.from_urls(url)
        self._client = open_redis(url, timeout)
        self._script: Any = self._client.register_script(_STREAM_LUA)
        self._group = group or ""
        self._prefix = key_prefix
        self._clock = clock
        self.source_id = f"redis-stream:{redis_identity(url)}:{key_prefix}"

    def read(self, queues: Sequence[str]) -> dict[str, QueueMetrics]:
        now = self._clock()
        if not queues:
            return {}
        try:
            res = self._script(
                keys=[self._prefix + q for q in queues], args=[self._group] * len(queues)
            )
        except redis.RedisError as exc:
            raise SourceError(safe_error(exc, self._secrets, self.source_id)) from None
        out: dict[str, QueueMetrics] = {}
        for q, (pending, in_flight, head) in zip(queues, res, strict=True):
            if pending == -1:
                out[q] = failed_metrics(q, now, f"key {q!r} is a {head.decode()}, not a stream")
                continue
            age = None
            if head:
                age = age_from(int(head.split(b"-", 1)[0]) / 1000.0, now)
            out[q] = QueueMetrics(
                queue=q,
                pending=int(pending),
                oldest_pending_age=age,
                in_flight=int(in_flight),
                read_at=now,
            )
        return out

    def close(self) -> None:
        self._client.close()
