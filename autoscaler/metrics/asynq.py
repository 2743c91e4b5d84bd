"""asynq queues (the Go task queue runqy is built on), so Go workers are scaled like Celery ones.

asynq's layout (its enqueue script): the task hash `asynq:{q}:t:<id>` holds `msg`, `state` and
`pending_since` (unix nanoseconds, written at enqueue), and the id is LPUSHed onto
`asynq:{q}:pending`; a worker moves it with RPOPLPUSH onto `asynq:{q}:active`. So:

- pending   = LLEN asynq:{q}:pending (scheduled and retry sets are not due yet: not demand);
- oldest    = now - pending_since of the id at LINDEX pending -1 (exact, stamped by asynq);
- in flight = LLEN asynq:{q}:active.

One script call reads every queue (the task-hash lookup depends on the head id, so a plain
pipeline would need a second round trip). Keys share the `{q}` hash tag, as asynq's own do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from autoscaler.metrics.base import Clock, Secrets, SourceError, safe_error, utc_now
from autoscaler.metrics.redis_list import failed_metrics, open_redis, redis_identity
from autoscaler.policy.snapshot import QueueMetrics

_ASYNQ_LUA = r"""
local out = {}
for i, q in ipairs(ARGV) do
  local base = 'asynq:{' .. q .. '}:'
  local n = redis.pcall('LLEN', base .. 'pending')
  local active = redis.pcall('LLEN', base .. 'active')
  if type(n) == 'table' or type(active) == 'table' then
    local e = tostring((type(n) == 'table' and n or active)['err'])
    out[i] = '-1\t' .. (string.gsub(e, '[\t\n]', ' '))
  else
    local since = ''
    if n > 0 then
      local head = redis.call('LINDEX', base .. 'pending', -1)
      since = redis.pcall('HGET', base .. 't:' .. head, 'pending_since')
      if type(since) ~= 'string' then since = '' end
    end
    out[i] = n .. '\t' .. active .. '\t' .. since
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
        queues = list(dict.fromkeys(queues))
        if not queues:
            return {}
        try:
            raw = self._script(keys=[], args=queues)
        except redis.RedisError as exc:
            raise SourceError(safe_error(exc, self._secrets, self.source_id)) from None
        lines = raw.split(b"\n") if raw else []
        if len(lines) != len(queues):
            raise SourceError(f"{self.source_id}: unexpected script answer")
        out: dict[str, QueueMetrics] = {}
        for q, line in zip(queues, lines, strict=True):
            fields = line.split(b"\t")
            if fields[0] == b"-1":
                out[q] = failed_metrics(q, now, self._secrets.scrub(
                    f"queue {q!r}: {fields[1].decode(errors='replace')}"))
                continue
            age = None
            if fields[2]:
                try:
                    age = max(0.0, now.timestamp() - int(fields[2]) / 1e9)
                except ValueError:
                    age = None
            out[q] = QueueMetrics(queue=q, pending=int(fields[0]), oldest_pending_age=age,
                                  in_flight=int(fields[1]), read_at=now)
        return out

    def close(self) -> None:
        self._client.close()
