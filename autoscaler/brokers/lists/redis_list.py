"""Plain Redis lists and streams, for any producer that is not Celery or asynq.

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
from collections.abc import Sequence
from typing import Any, Literal

import redis

from autoscaler.brokers.base import (
    Clock,
    ReaderBuild,
    Secrets,
    SightingsMemo,
    SourceError,
    age_from,
    failed_metrics,
    observe_safely,
    safe_error,
    utc_now,
)
from autoscaler.brokers.base import Sightings as SightingsPort
from autoscaler.brokers.redis_client import open_redis, redis_identity
from autoscaler.config.metrics_sources import RedisListSource, RedisStreamSource
from autoscaler.policy.snapshot import QueueMetrics


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


def build_list(source: RedisListSource, ctx: ReaderBuild) -> RedisListReader:
    """The `redis-list` source's reader (`brokers.registry.READERS`)."""
    return RedisListReader(
        ctx.url,
        key_prefix=source.global_keyprefix,
        pop_side=source.pop_side,
        sightings=ctx.sightings,
        clock=ctx.clock,
        timeout=ctx.timeout,
    )


def build_stream(source: RedisStreamSource, ctx: ReaderBuild) -> RedisStreamReader:
    """The `redis-stream` source's reader (`brokers.registry.READERS`)."""
    return RedisStreamReader(
        ctx.url,
        group=source.group,
        key_prefix=source.global_keyprefix,
        clock=ctx.clock,
        timeout=ctx.timeout,
    )
