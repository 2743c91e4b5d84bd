"""asynq queues (the Go task queue runqy is built on), so Go workers are scaled like Celery ones.

asynq's layout (its enqueue script): the task hash `asynq:{q}:t:<id>` holds `msg`, `state` and
`pending_since` (unix nanoseconds, written at enqueue), and the id is LPUSHed onto
`asynq:{q}:pending`; a worker moves it with RPOPLPUSH onto `asynq:{q}:active` (unless the queue
is paused: `asynq:{q}:paused` exists). Tasks to run later wait in the sorted sets
`asynq:{q}:scheduled` and `asynq:{q}:retry` (score: unix seconds when due) until asynq's
forwarder moves them to pending, every few seconds. So:

- pending   = LLEN asynq:{q}:pending, plus tasks of the scheduled and retry sets already due
              (the forwarder is about to move them);
- scheduled = tasks of those sets not due yet; `next_due_at` the smallest score;
- oldest    = now - pending_since of the id at LINDEX pending -1 (exact, stamped by asynq), or
              since the due time of a due task still in a set, whichever waited longer;
- in flight = running = LLEN asynq:{q}:active (asynq's workers keep exactly their running tasks
              there);
- paused    = asynq:{q}:paused exists: asynq serves none of the pending tasks.

One script call reads every queue (the task-hash lookup depends on the head id, so a plain
pipeline would need a second round trip). Keys share the `{q}` hash tag, as asynq's own do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from autoscaler.brokers.base import (
    Clock,
    ReaderBuild,
    Secrets,
    SourceError,
    failed_metrics,
    safe_error,
    utc_now,
)
from autoscaler.brokers.redis_client import open_redis, redis_identity
from autoscaler.config.metrics_sources import AsynqSource
from autoscaler.policy.snapshot import QueueMetrics

_ASYNQ_LUA = r"""
local now = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  local q = ARGV[i]
  local base = 'asynq:{' .. q .. '}:'
  local n = redis.pcall('LLEN', base .. 'pending')
  local active = redis.pcall('LLEN', base .. 'active')
  local bad = nil
  if type(n) == 'table' then bad = n elseif type(active) == 'table' then bad = active end
  local later, due, first_due, next_due = 0, 0, nil, nil
  if not bad then
    for _, set in ipairs({'scheduled', 'retry'}) do
      local total = redis.pcall('ZCARD', base .. set)
      if type(total) == 'table' then bad = total break end
      if total > 0 then
        local d = redis.call('ZCOUNT', base .. set, '-inf', now)
        due = due + d
        later = later + total - d
        if d > 0 then
          local s = tonumber(redis.call('ZRANGE', base .. set, 0, 0, 'WITHSCORES')[2])
          if first_due == nil or s < first_due then first_due = s end
        end
        if total > d then
          local s = redis.call('ZRANGEBYSCORE', base .. set, '(' .. now, '+inf', 'WITHSCORES',
                               'LIMIT', 0, 1)[2]
          s = tonumber(s)
          if next_due == nil or s < next_due then next_due = s end
        end
      end
    end
  end
  if bad then
    out[#out + 1] = '-1\t' .. (string.gsub(tostring(bad['err']), '[\t\n]', ' '))
  else
    local since = ''
    if n > 0 then
      local head = redis.call('LINDEX', base .. 'pending', -1)
      since = redis.pcall('HGET', base .. 't:' .. head, 'pending_since')
      if type(since) ~= 'string' then since = '' end
    end
    local paused = redis.call('EXISTS', base .. 'paused')
    out[#out + 1] = n .. '\t' .. active .. '\t' .. since .. '\t' .. due .. '\t'
      .. (first_due or '') .. '\t' .. later .. '\t' .. (next_due or '') .. '\t' .. paused
  end
end
return table.concat(out, '\n')
"""


class AsynqReader:
    """`MetricsReader` for asynq (`source: asynq`)."""

    def __init__(self, url: str, *, clock: Clock = utc_now, timeout: float = 5.0) -> None:
        self._secrets = Secrets.from_urls(url)
        self._client = open_redis(url, timeout)
        self._script: Any = self._client.register_script(_ASYNQ_LUA)
        self._clock = clock
        self.source_id = f"asynq:{redis_identity(url)}"

    def read(self, queues: Sequence[str]) -> dict[str, QueueMetrics]:
        now = self._clock()
        now_ts = now.timestamp()
        queues = list(dict.fromkeys(queues))
        if not queues:
            return {}
        try:
            raw = self._script(keys=[], args=[repr(now_ts), *queues])
        except redis.RedisError as exc:
            raise SourceError(safe_error(exc, self._secrets, self.source_id)) from None
        lines = raw.split(b"\n") if raw else []
        if len(lines) != len(queues):
            raise SourceError(f"{self.source_id}: unexpected script answer")
        out: dict[str, QueueMetrics] = {}
        for q, line in zip(queues, lines, strict=True):
            fields = line.split(b"\t")
            if fields[0] == b"-1":
                out[q] = failed_metrics(
                    q,
                    now,
                    self._secrets.scrub(f"queue {q!r}: {fields[1].decode(errors='replace')}"),
                )
                continue
            n, active, since, due, first_due, later, next_due, paused = (fields + [b""] * 8)[:8]
            ages = []
            if since and since.isdigit():
                ages.append(max(0.0, now_ts - int(since) / 1e9))
            if first_due:
                ages.append(max(0.0, now_ts - float(first_due)))
            running = int(active)
            out[q] = QueueMetrics(
                queue=q,
                pending=int(n) + int(due or 0),
                oldest_pending_age=max(ages) if ages else None,
                in_flight=running,
                read_at=now,
                scheduled=int(later or 0),
                next_due_at=float(next_due) if next_due else None,
                running=running,
                paused=paused == b"1",
            )
        return out

    def close(self) -> None:
        self._client.close()


def build(source: AsynqSource, ctx: ReaderBuild) -> AsynqReader:
    """The `asynq` source's reader (`brokers.registry.READERS`)."""
    return AsynqReader(ctx.url, clock=ctx.clock, timeout=ctx.timeout)
