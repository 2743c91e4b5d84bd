"""Celery queues on Redis, read the way Flower reads them, all queues in one round trip.

Per queue `q` kombu keeps one list per priority step: `{prefix}q` for step 0 and
`{prefix}q{sep}{step}` for the others (`global_keyprefix`, `sep`, `priority_steps` from
`broker_transport_options`). Producers LPUSH and workers BRPOP, so each list's oldest message is
`LINDEX key -1`.

- pending  = sum of LLEN over every priority key (a missing key is an empty list);
- oldest   = max over priority keys of the head's age: from the `x-autoscaler-published-at`
             header when the producer is stamped (`metrics.stamp`), otherwise a lower bound from
             when that head id was first seen (persisted through `Sightings`, restart-proof);
- in flight = messages in the `{prefix}unacked` hash whose routing key is the queue name
             (delivered, prefetched or ETA-held, not acked).

One pipeline per tick carries LLEN + LINDEX for every key of every queue plus one HVALS of the
unacked hash. We never run a Celery app on the watched Redis (it would requeue the watched app's
unacked messages), only plain redis-py reads.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis

from autoscaler.metrics.base import (
    PUBLISHED_AT_HEADER,
    Clock,
    Secrets,
    SightingsMemo,
    SourceError,
    parse_celery_envelope,
    safe_error,
    utc_now,
)
from autoscaler.metrics.base import Sightings as SightingsPort
from autoscaler.metrics.redis_list import (
    failed_metrics,
    observe_safely,
    open_redis,
    redis_identity,
    value_id,
)
from autoscaler.policy.snapshot import QueueMetrics

DEFAULT_SEP = "\x06\x16"
DEFAULT_PRIORITY_STEPS = (0, 3, 6, 9)


@dataclass(frozen=True)
class CeleryRedisLayout:
    """kombu's Redis key layout for one broker (its transport options)."""

    global_keyprefix: str = ""
    sep: str = DEFAULT_SEP
    priority_steps: tuple[int, ...] = DEFAULT_PRIORITY_STEPS
    unacked_key: str = "unacked"

    @property
    def steps(self) -> list[int]:
        return sorted(set(self.priority_steps)) or [0]

    def keys(self, queue: str) -> list[str]:
        """Every list kombu may push `queue`'s messages to, highest priority first."""
        base = self.global_keyprefix + queue
        return [base + suffix for suffix in self.suffixes]

    @property
    def suffixes(self) -> list[str]:
        return [f"{self.sep}{step}" if step else "" for step in self.steps]

    @property
    def unacked(self) -> str:
        return f"{self.global_keyprefix}{self.unacked_key}"


def count_unacked(values: Sequence[bytes]) -> Counter[str]:
    """In-flight messages per routing key from the values of kombu's `unacked` hash."""
    counts: Counter[str] = Counter()
    for raw in values:
        try:
            entry = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(entry, list) and len(entry) >= 3 and isinstance(entry[2], str):
            counts[entry[2]] += 1
    return counts


# One call for every priority key of every queue: LLEN, and for a non-empty list the head's id
# and stamp, decoded server-side so only a few bytes per key come back (the head message itself
# can be kilobytes). The keys are built here from (prefix, sep, steps, queue names) and the answer
# is one string, a line per non-empty key "index<TAB>depth<TAB>id<TAB>stamp" ("index<TAB>-1<TAB>
# error" for a key of the wrong type): 4,000 keys cost one small request and one short reply.
# (Keys are not declared in KEYS, so this needs a standalone Redis, not Redis Cluster.)
_HEADS_LUA = r"""
local stamp_key, prefix, sep = ARGV[1], ARGV[2], ARGV[3]
local steps = cjson.decode(ARGV[4])
local out = {}
local i = 0
local function clean(s)
  if string.find(s, '[\t\n]') then return 'sha1:' .. redis.sha1hex(s) end
  return s
end
for a = 5, #ARGV do
  for _, step in ipairs(steps) do
    local key = prefix .. ARGV[a]
    if step ~= 0 then key = key .. sep .. step end
    i = i + 1
    local n = redis.pcall('LLEN', key)
    if type(n) == 'table' then
      out[#out + 1] = i .. '\t-1\t' .. clean(tostring(n['err'] or 'error'))
    elseif n > 0 then
      local raw = redis.call('LINDEX', key, -1)
      -- kombu envelopes are JSON whose body is base64: a quoted key can only be an envelope
      -- key, so two pattern matches replace a full JSON decode (3x cheaper on the server)
      local stamp, id = '', nil
      local at = string.find(raw, stamp_key, 1, true)
      if at then stamp = string.match(raw, '^%s*:%s*"?([%d%.eE%+%-]+)', at + #stamp_key) or '' end
      at = string.find(raw, '"id"', 1, true)
      if at then id = string.match(raw, '^%s*:%s*"([^"\\]+)"', at + 4) end
      if not id then id = 'sha1:' .. redis.sha1hex(raw) end
      out[#out + 1] = i .. '\t' .. n .. '\t' .. clean(id) .. '\t' .. clean(stamp)
    end
  end
end
return table.concat(out, '\n')
"""

KeyHead = tuple[int, str | None, float | None]  # depth, unstamped head id, stamp
_EMPTY: KeyHead = (0, None, None)


class CeleryRedisReader:
    """`MetricsReader` for Celery on Redis (`source: celery` with a redis:// or rediss:// URL).

    `mode="script"` (default) reads every key in one server-side script call; `mode="pipeline"`
    sends LLEN + LINDEX per key in one pipeline (for servers where scripting is disabled; the
    script mode falls back to it by itself when EVAL is refused). Both are one round trip.
    """

    def __init__(
        self,
        url: str,
        *,
        layout: CeleryRedisLayout | None = None,
        sightings: SightingsPort | None = None,
        clock: Clock = utc_now,
        timeout: float = 5.0,
        count_in_flight: bool = True,
        mode: Literal["script", "pipeline"] = "script",
    ) -> None:
        self._secrets = Secrets.from_urls(url)
        self._client = open_redis(url, timeout)
        self._script: Any = self._client.register_script(_HEADS_LUA)
        self.mode = mode
        self.layout = layout or CeleryRedisLayout()
        self._sightings: SightingsPort = sightings or SightingsMemo()
        self._clock = clock
        self._count_in_flight = count_in_flight
        self._sighted: dict[str, str] = {}  # priority key -> queue, sighted on the last read
        self.source_id = f"celery-redis:{redis_identity(url)}:{self.layout.global_keyprefix}"

    def _fetch(
        self, queues: Sequence[str], _retry: bool = False
    ) -> tuple[dict[int, KeyHead | str], list[bytes]]:
        """Non-empty keys only, by flat key index: (depth, unstamped id, stamp) or an error
        text; plus the values of the unacked hash. One round trip either way."""
        pipe = self._client.pipeline(transaction=False)
        lay = self.layout
        if self.mode == "script":
            steps = json.dumps(lay.steps)
            args = [f'"{PUBLISHED_AT_HEADER}"', lay.global_keyprefix, lay.sep, steps, *queues]
            # EVALSHA straight into the pipeline: redis-py's own script-in-pipeline support
            # sends SCRIPT EXISTS first, a second round trip on every tick
            pipe.evalsha(self._script.sha, 0, *args)
        else:
            for q in queues:
                for key in lay.keys(q):
                    pipe.llen(key)
                    pipe.lindex(key, -1)
        if self._count_in_flight:
            pipe.hvals(lay.unacked)
        res = pipe.execute(raise_on_error=False)
        unacked = res.pop() if self._count_in_flight else []
        if isinstance(unacked, Exception):  # a foreign key named `unacked`: count nothing
            unacked = []
        heads: dict[int, KeyHead | str] = {}
        if self.mode == "script":
            if isinstance(res[0], redis.exceptions.NoScriptError) and not _retry:
                self._client.script_load(_HEADS_LUA)  # a restarted or flushed server
                return self._fetch(queues, _retry=True)
            if isinstance(res[0], redis.ResponseError) and _scripting_refused(res[0]):
                self.mode = "pipeline"
                return self._fetch(queues)
            if isinstance(res[0], Exception):
                raise res[0]
            for line in res[0].split(b"\n") if res[0] else ():
                index, _, rest = line.partition(b"\t")
                heads[int(index) - 1] = _from_script(rest)
            return heads, unacked
        for i in range(0, len(res), 2):
            n, head = res[i], res[i + 1]
            if isinstance(n, Exception) or isinstance(head, Exception):
                heads[i // 2] = str(n if isinstance(n, Exception) else head)
            elif head is not None:
                info = parse_celery_envelope(head)
                heads[i // 2] = (int(n), None if info.published_at is not None else (
                    info.message_id or value_id(head)), info.published_at)
        return heads, unacked

    def read(self, queues: Sequence[str]) -> dict[str, QueueMetrics]:
        now = self._clock()
        now_ts = now.timestamp()
        queues = list(dict.fromkeys(queues))
        if not queues:
            return {}
        try:
            fetched, unacked = self._fetch(queues)
        except redis.RedisError as exc:
            raise SourceError(safe_error(exc, self._secrets, self.source_id)) from None
        in_flight = count_unacked(unacked)
        per_queue = len(self.layout.steps)
        suffixes = self.layout.suffixes

        depth = [0] * len(queues)
        ages: dict[int, list[float]] = {}
        errors: dict[int, str] = {}
        ids: dict[str, str | None] = {}  # priority key -> its unstamped head id
        owner: dict[str, int] = {}  # priority key -> queue index
        for index, got in fetched.items():
            qi, si = divmod(index, per_queue)
            if isinstance(got, str):
                key = self.layout.global_keyprefix + queues[qi] + suffixes[si]
                errors.setdefault(qi, self._secrets.scrub(f"key {key!r}: {got}"))
                continue
            n, head_id, stamp = got
            depth[qi] += n
            if stamp is not None:
                ages.setdefault(qi, []).append(max(0.0, now_ts - stamp))
            elif head_id is not None:
                key = self.layout.global_keyprefix + queues[qi] + suffixes[si]
                ids[key] = head_id
                owner[key] = qi

        if ids or self._sighted:
            # keys sighted last time that are empty or stamped now: forget their sightings
            read_now = set(queues)
            for key, q in list(self._sighted.items()):
                if key not in ids and q in read_now:
                    ids[key] = None
                    del self._sighted[key]
            seen = observe_safely(self._sightings, self.source_id, ids, now)
            for key, first in seen.items():
                self._sighted[key] = queues[owner[key]]
                ages.setdefault(owner[key], []).append(max(0.0, now_ts - first.timestamp()))

        out: dict[str, QueueMetrics] = {}
        for qi, q in enumerate(queues):
            if qi in errors:
                out[q] = failed_metrics(q, now, errors[qi])
                continue
            qa = ages.get(qi)
            out[q] = QueueMetrics(
                queue=q, pending=depth[qi], oldest_pending_age=max(qa) if qa else None,
                in_flight=in_flight.get(q, 0), read_at=now,
            )
        return out

    def close(self) -> None:
        self._client.close()


def _scripting_refused(exc: redis.ResponseError) -> bool:
    text = str(exc).lower()
    return "unknown command" in text or "noperm" in text or "not allowed" in text


def _from_script(line: bytes) -> KeyHead | str:
    n, head_id, *rest = line.split(b"\t")
    if n == b"-1":
        return head_id.decode(errors="replace")
    published = None
    if rest and rest[0]:
        try:
            published = float(rest[0])
        except ValueError:
            published = None
    sid = head_id.decode(errors="replace") if head_id and published is None else None
    return int(n), sid, published
