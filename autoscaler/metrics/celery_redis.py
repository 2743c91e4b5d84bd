"""Celery queues on Redis, read the way Flower reads them, all queues in one round trip.

Per queue `q` kombu keeps one list per priority step: `{prefix}q` for step 0 and
`{prefix}q{sep}{step}` for the others (`global_keyprefix`, `sep`, `priority_steps` from
`broker_transport_options`). Producers LPUSH and workers BRPOP, so each list's oldest message is
`LINDEX key -1`.

- pending   = messages in every priority key whose due time has come (a missing key is empty);
- scheduled = messages with an ETA / countdown still in the future (Celery's `eta` header),
              in the lists (no worker has fetched them) or in the `unacked` hash (a worker holds
              them until due); `next_due_at` the earliest. The lists are scanned server-side up
              to `scan_limit` messages per key and `scan_budget` per read; messages beyond count
              as due (a lower bound on scheduled);
- oldest    = the longest wait among due messages (for a job that had an ETA, since its ETA):
              from the `x-autoscaler-published-at` header when the producer is stamped
              (`metrics.stamp`), otherwise a lower bound from first sightings of the oldest
              `window` messages (`metrics.marks`, persisted through `Sightings`, restart-proof),
              so the bound keeps growing while the queue drains;
- in flight = due messages in the `{prefix}unacked` hash (delivered to a worker, not acked)
              whose (exchange, routing key) is routed to the queue: the anonymous exchange
              routes by queue name, any other through kombu's binding table
              `{prefix}_kombu.binding.{exchange}` (direct: equal routing keys; topic: the stored
              pattern). With Celery's default early acks a running job is acked already, so
              in flight is prefetched-not-started jobs, never the running ones (those come from
              the workers: `QueueMetrics.running`).

One pipeline per tick carries the script over every key of every queue, one HVALS of the unacked
hash and the binding tables of the exchanges seen so far (a new exchange costs one more round
trip, once). We never run a Celery app on the watched Redis (it would requeue the watched app's
unacked messages), only plain redis-py reads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

import redis

from autoscaler.metrics.base import (
    PUBLISHED_AT_HEADER,
    Clock,
    Mark,
    Secrets,
    SightingsMemo,
    SourceError,
    _as_float,
    safe_error,
    utc_now,
)
from autoscaler.metrics.base import Sightings as SightingsPort
from autoscaler.metrics.marks import ID_HASH_CHARS, WindowMarks, advance_window, id_hash
from autoscaler.metrics.redis_list import (
    failed_metrics,
    open_redis,
    redis_identity,
)
from autoscaler.policy.snapshot import QueueMetrics

log = logging.getLogger(__name__)

DEFAULT_SEP = "\x06\x16"
DEFAULT_PRIORITY_STEPS = (0, 3, 6, 9)
BINDING_PREFIX = "_kombu.binding."

WINDOW = 64
"""Oldest messages per priority key whose first sightings bound unstamped ages."""
SCAN_LIMIT = 10_000
"""Messages per priority key examined for ETAs on each read."""
SCAN_BUDGET = 50_000
"""Messages examined for ETAs per read over all keys (the script runs atomically on Redis)."""


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

    def binding_key(self, exchange: str) -> str:
        return f"{self.global_keyprefix}{BINDING_PREFIX}{exchange}"

    def transport_options(self) -> dict[str, object]:
        """The `broker_transport_options` a Celery app needs to use this layout."""
        opts: dict[str, object] = {"sep": self.sep, "priority_steps": list(self.steps)}
        if self.global_keyprefix:
            opts["global_keyprefix"] = self.global_keyprefix
        return opts


def count_unacked(values: Sequence[bytes]) -> Counter[str]:
    """Unacked messages per *routing key* (not per queue: see `resolve_unacked`)."""
    counts: Counter[str] = Counter()
    for raw in values:
        try:
            entry = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(entry, list) and len(entry) >= 3 and isinstance(entry[2], str):
            counts[entry[2]] += 1
    return counts


def parse_eta(value: Any) -> float | None:
    """Epoch seconds of Celery's `eta` header (ISO 8601; naive means UTC), None if absent."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


Binding = tuple[str, str, str]  # routing key, pattern (topic exchanges), queue


def parse_bindings(members: Sequence[bytes], sep: str) -> list[Binding]:
    out: list[Binding] = []
    for raw in members:
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        parts = text.split(sep)
        if len(parts) != 3 and sep != DEFAULT_SEP:
            parts = text.split(DEFAULT_SEP)
        if len(parts) == 3:
            out.append((parts[0], parts[1], parts[2]))
    return out


_PATTERNS: dict[str, re.Pattern[str] | None] = {}


def _topic_match(pattern: str, routing_key: str) -> bool:
    if pattern not in _PATTERNS:
        if len(_PATTERNS) > 10_000:
            _PATTERNS.clear()
        try:
            _PATTERNS[pattern] = re.compile(pattern)
        except re.error:
            _PATTERNS[pattern] = None
    compiled = _PATTERNS[pattern]
    return bool(compiled is not None and compiled.match(routing_key))


def route(exchange: str, routing_key: str, bindings: Mapping[str, list[Binding]]) -> list[str]:
    """The queues kombu delivers (exchange, routing key) to, as its Redis transport does."""
    if not exchange:
        return [routing_key]
    table = bindings.get(exchange)
    if not table:
        return [routing_key]  # no table known: the queue named like the key, as before
    found = [
        q for rk, pattern, q in table
        if (pattern and _topic_match(pattern, routing_key)) or (not pattern and rk == routing_key)
    ]
    return list(dict.fromkeys(found)) or [routing_key]


@dataclass
class Unacked:
    """What the unacked hash holds for one queue."""

    due: int = 0
    scheduled: int = 0
    next_due: float | None = None


def resolve_unacked(
    values: Sequence[bytes], bindings: Mapping[str, list[Binding]], now: float
) -> tuple[dict[str, Unacked], set[str]]:
    """Unacked messages per queue (due, and ETA-held), and the exchanges they were sent to."""
    out: dict[str, Unacked] = {}
    exchanges: set[str] = set()
    for raw in values:
        try:
            entry = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            continue
        if not (isinstance(entry, list) and len(entry) >= 3):
            continue
        msg, exchange, rk = entry[0], entry[1], entry[2]
        if not isinstance(rk, str) or not isinstance(exchange, str):
            continue
        if exchange:
            exchanges.add(exchange)
        headers = msg.get("headers") if isinstance(msg, dict) else None
        eta = parse_eta(headers.get("eta")) if isinstance(headers, dict) else None
        for q in route(exchange, rk, bindings):
            u = out.setdefault(q, Unacked())
            if eta is not None and eta > now:
                u.scheduled += 1
                u.next_due = eta if u.next_due is None else min(u.next_due, eta)
            else:
                u.due += 1
    return out, exchanges


# One call for every priority key of every queue. Per non-empty key it returns the depth, the
# number of messages whose ETA is in the future and the earliest such ETA (scanning the list from
# the head, at most ARGV[7] messages per key and ARGV[8] in all), and a few items from the head:
# "hash,stamp,eta" (a 10-hex hash of the message id, the stamp header, the ETA as epoch seconds)
# up to the first due message without an ETA - or the whole window of ARGV[6] messages when an
# unstamped one comes first (their first sightings bound its age). The keys are built here from
# (prefix, sep, steps, queue names); the answer is one string, a line per non-empty key
# "index<TAB>depth<TAB>scheduled<TAB>next_due<TAB>scanned<TAB>items" ("index<TAB>-1<TAB>error"
# for a key of the wrong type): 4,000 keys cost one small request and a short reply.
# (Keys are not declared in KEYS, so this needs a standalone Redis, not Redis Cluster.)
_HEADS_LUA = r"""
local stamp_key, prefix, sep = ARGV[1], ARGV[2], ARGV[3]
local steps = cjson.decode(ARGV[4])
local now = tonumber(ARGV[5])
local window = tonumber(ARGV[6])
local per_key = tonumber(ARGV[7])
local budget = tonumber(ARGV[8])
local out = {}
local i = 0
local function clean(s)
  return (string.gsub(s, '[\t\n]', ' '))
end
local function days(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  return era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
end
local function eta_of(raw)
  local at = string.find(raw, '"eta"', 1, true)
  if not at then return nil end
  local y, mo, d, h, mi, s, rest = string.match(raw,
    '^%s*:%s*"(%d%d%d%d)%-(%d%d)%-(%d%d)[T ](%d%d):(%d%d):(%d%d%.?%d*)([^"]*)"', at + 5)
  if not y then return nil end
  local t = days(tonumber(y), tonumber(mo), tonumber(d)) * 86400 + tonumber(h) * 3600
    + tonumber(mi) * 60 + tonumber(s)
  local sign, oh, om = string.match(rest, '^([%+%-])(%d%d):?(%d%d)$')
  if sign == '+' then t = t - tonumber(oh) * 3600 - tonumber(om) * 60 end
  if sign == '-' then t = t + tonumber(oh) * 3600 + tonumber(om) * 60 end
  return t
end
-- kombu envelopes are JSON whose body is base64: a quoted key can only be an envelope key, so
-- pattern matches replace a full JSON decode (3x cheaper on the server)
local function item(raw, eta)
  local stamp = ''
  local at = string.find(raw, stamp_key, 1, true)
  if at then stamp = string.match(raw, '^%s*:%s*"?([%d%.eE%+%-]+)', at + #stamp_key) or '' end
  local id = nil
  at = string.find(raw, '"id"', 1, true)
  if at then id = string.match(raw, '^%s*:%s*"([^"\\]+)"', at + 4) end
  -- the id as it is (hashed by the reader); hashed here when it has no id or would not fit
  -- the answer's separators ("sha1:" + the hash of the message, or of the id)
  if id == nil then id = 'sha1:' .. redis.sha1hex(raw)
  elseif string.find(id, '[%s,]') then id = 'sha1:' .. redis.sha1hex(id) end
  return id .. ',' .. stamp .. ',' .. (eta and string.format('%.6f', eta) or ''), stamp ~= ''
end
for a = 9, #ARGV do
  for _, step in ipairs(steps) do
    local key = prefix .. ARGV[a]
    if step ~= 0 then key = key .. sep .. step end
    i = i + 1
    local n = redis.pcall('LLEN', key)
    if type(n) == 'table' then
      out[#out + 1] = i .. '\t-1\t' .. clean(tostring(n['err'] or 'error'))
    elseif n > 0 then
      local sched, next_due = 0, nil
      local items = {}
      local settled, want_window = false, false
      local pos = 0
      while pos < n do
        local scanning = pos < per_key and budget > 0
        local collecting = pos < window and (not settled or want_window)
        if not scanning and not collecting then break end
        local stop = pos
        if scanning then stop = math.min(pos + 200, per_key, pos + budget) end
        if collecting then stop = math.max(stop, window) end
        local upto = math.min(n, stop)
        local got = redis.call('LRANGE', key, -upto, -(pos + 1))
        for j = #got, 1, -1 do
          local raw = got[j]
          pos = pos + 1
          budget = budget - 1
          local eta = eta_of(raw)
          local future = eta ~= nil and eta > now
          if future then
            sched = sched + 1
            if next_due == nil or eta < next_due then next_due = eta end
          end
          if pos <= window and (not settled or want_window) then
            local text, stamped = item(raw, eta)
            items[#items + 1] = text
            if not settled then
              if not stamped then want_window = true end
              if eta == nil then settled = true end
            end
          end
        end
      end
      out[#out + 1] = i .. '\t' .. n .. '\t' .. sched .. '\t'
        .. (next_due and string.format('%.6f', next_due) or '') .. '\t' .. pos .. '\t'
        .. table.concat(items, ' ')
    end
  end
end
return table.concat(out, '\n')
"""


class Item(NamedTuple):
    """One message near the head of a list: its id hash, stamped publish time and ETA."""

    hash: str
    stamp: float | None
    eta: float | None


class KeyRead(NamedTuple):
    """One non-empty priority key: depth, future-ETA messages among the `scanned` oldest, the
    earliest of their ETAs, and the items from the head the script returned."""

    depth: int
    scheduled: int
    next_due: float | None
    scanned: int
    items: tuple[Item, ...] = ()

    def wants_window(self) -> bool:
        """An unstamped message comes at or before the first due message without an ETA: its
        age needs first sightings of the window."""
        for it in self.items:
            if it.stamp is None:
                return True
            if it.eta is None:
                return False
        return False


@dataclass
class _Queue:
    depth: int = 0
    scheduled: int = 0
    next_due: float | None = None
    ages: list[float] = field(default_factory=list)
    error: str | None = None


class CeleryRedisReader:
    """`MetricsReader` for Celery on Redis (`source: celery` with a redis:// or rediss:// URL).

    `mode="script"` (default) reads every key in one server-side script call; `mode="pipeline"`
    sends LLEN + LRANGE of the window per key in one pipeline (for servers where scripting is
    disabled; the script mode falls back to it by itself when EVAL is refused: ETAs are then
    only seen within the window). Both are one round trip.
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
        window: int = WINDOW,
        scan_limit: int = SCAN_LIMIT,
        scan_budget: int = SCAN_BUDGET,
    ) -> None:
        self._secrets = Secrets.from_urls(url)
        self._client = open_redis(url, timeout)
        self._script: Any = self._client.register_script(_HEADS_LUA)
        self.mode = mode
        self.layout = layout or CeleryRedisLayout()
        self._sightings: SightingsPort = sightings or SightingsMemo()
        self._clock = clock
        self._count_in_flight = count_in_flight
        self.window = max(1, window)
        self.scan_limit = max(0, scan_limit)
        self.scan_budget = max(0, scan_budget)
        self._marked: dict[str, str] = {}  # priority key -> queue, marked on the last read
        # priority key -> (window ids, their first sightings) as last stored: an unchanged
        # window needs no store round trip
        self._windows: dict[str, tuple[tuple[str, ...], list[float]]] = {}
        self._exchanges: set[str] = set()  # exchanges whose binding tables are read each tick
        self.source_id = f"celery-redis:{redis_identity(url)}:{self.layout.global_keyprefix}"

    # ----------------------------------------------------------------- one round trip

    def _fetch(
        self, queues: Sequence[str], now: float, _retry: bool = False
    ) -> tuple[dict[int, KeyRead | str], list[bytes], dict[str, list[Binding]]]:
        """Non-empty keys only, by flat key index: a `KeyRead` or an error text; the values of
        the unacked hash; the binding tables of the known exchanges. One round trip."""
        pipe = self._client.pipeline(transaction=False)
        lay = self.layout
        if self.mode == "script":
            args: list[str | int] = [
                f'"{PUBLISHED_AT_HEADER}"', lay.global_keyprefix, lay.sep, json.dumps(lay.steps),
                repr(now), self.window, self.scan_limit, self.scan_budget, *queues,
            ]
            # EVALSHA straight into the pipeline: redis-py's own script-in-pipeline support
            # sends SCRIPT EXISTS first, a second round trip on every tick
            pipe.evalsha(self._script.sha, 0, *args)
        else:
            for q in queues:
                for key in lay.keys(q):
                    pipe.llen(key)
                    pipe.lrange(key, -self.window, -1)
        exchanges = sorted(self._exchanges)
        if self._count_in_flight:
            pipe.hvals(lay.unacked)
            for ex in exchanges:
                pipe.smembers(lay.binding_key(ex))
        res = pipe.execute(raise_on_error=False)
        unacked: Any = []
        bindings: dict[str, list[Binding]] = {}
        if self._count_in_flight:
            tables = res[len(res) - len(exchanges):] if exchanges else []
            res = res[: len(res) - len(exchanges)] if exchanges else res
            unacked = res.pop()
            for ex, members in zip(exchanges, tables, strict=True):
                if not isinstance(members, Exception):
                    bindings[ex] = parse_bindings(list(members), lay.sep)
        if isinstance(unacked, Exception):  # a foreign key named `unacked`: count nothing
            unacked = []
        heads: dict[int, KeyRead | str] = {}
        if self.mode == "script":
            if isinstance(res[0], redis.exceptions.NoScriptError) and not _retry:
                self._client.script_load(_HEADS_LUA)  # a restarted or flushed server
                return self._fetch(queues, now, _retry=True)
            if isinstance(res[0], redis.ResponseError) and _scripting_refused(res[0]):
                self.mode = "pipeline"
                return self._fetch(queues, now)
            if isinstance(res[0], Exception):
                raise res[0]
            for line in res[0].split(b"\n") if res[0] else ():
                index, _, rest = line.partition(b"\t")
                heads[int(index) - 1] = _from_script(rest)
            return heads, unacked, bindings
        for i in range(0, len(res), 2):
            n, window = res[i], res[i + 1]
            if isinstance(n, Exception) or isinstance(window, Exception):
                heads[i // 2] = str(n if isinstance(n, Exception) else window)
            elif n:
                heads[i // 2] = _from_window(int(n), list(reversed(window)), now)
        return heads, unacked, bindings

    def _bindings_for(self, exchanges: set[str]) -> dict[str, list[Binding]]:
        """Binding tables of exchanges seen for the first time (one more round trip, once)."""
        new = sorted(exchanges - self._exchanges)[:1000]
        if not new:
            return {}
        pipe = self._client.pipeline(transaction=False)
        for ex in new:
            pipe.smembers(self.layout.binding_key(ex))
        got = pipe.execute(raise_on_error=False)
        if len(self._exchanges) < 10_000:
            self._exchanges.update(new)
        return {
            ex: parse_bindings(list(members), self.layout.sep)
            for ex, members in zip(new, got, strict=True)
            if not isinstance(members, Exception)
        }

    # ----------------------------------------------------------------- read

    def read(self, queues: Sequence[str]) -> dict[str, QueueMetrics]:
        now = self._clock()
        now_ts = now.timestamp()
        queues = list(dict.fromkeys(queues))
        if not queues:
            return {}
        try:
            fetched, raw_unacked, bindings = self._fetch(queues, now_ts)
            unacked, exchanges = resolve_unacked(raw_unacked, bindings, now_ts)
            if exchanges - self._exchanges:
                bindings.update(self._bindings_for(exchanges))
                unacked, _ = resolve_unacked(raw_unacked, bindings, now_ts)
        except redis.RedisError as exc:
            raise SourceError(safe_error(exc, self._secrets, self.source_id)) from None
        per_queue = len(self.layout.steps)
        suffixes = self.layout.suffixes

        state = [_Queue() for _ in queues]
        windows: dict[str, tuple[int, KeyRead]] = {}  # priority key -> (queue index, read)
        prefix = self.layout.global_keyprefix
        for index, got in fetched.items():
            qi, si = divmod(index, per_queue)
            qs = state[qi]
            if isinstance(got, str):
                key = prefix + queues[qi] + suffixes[si]
                qs.error = qs.error or self._secrets.scrub(f"key {key!r}: {got}")
                continue
            qs.depth += got.depth - got.scheduled
            qs.scheduled += got.scheduled
            if got.next_due is not None:
                qs.next_due = min(got.next_due, qs.next_due or got.next_due)
            if got.wants_window():
                windows[prefix + queues[qi] + suffixes[si]] = (qi, got)
            else:
                age = _age(got.items, now_ts, None)
                if age is not None:
                    qs.ages.append(age)

        read_now = set(queues)
        forget = [k for k, q in self._marked.items() if k not in windows and q in read_now]
        seen: dict[str, list[float]] = {}
        changed: dict[str, tuple[int, KeyRead]] = {}
        for key, (qi, got) in windows.items():
            cached = self._windows.get(key)
            if cached is not None and cached[0] == tuple(it.hash for it in got.items):
                seen[key] = cached[1]
            else:
                changed[key] = (qi, got)
        if changed or forget:
            seen.update(self._first_sightings(changed, forget, now_ts))
            for key in forget:
                self._marked.pop(key, None)
                self._windows.pop(key, None)
            for key, (qi, _) in changed.items():
                self._marked[key] = queues[qi]
        for key, (qi, got) in windows.items():
            age = _age(got.items, now_ts, seen.get(key))
            if age is not None:
                state[qi].ages.append(age)

        out: dict[str, QueueMetrics] = {}
        for qi, q in enumerate(queues):
            qs = state[qi]
            if qs.error is not None:
                out[q] = failed_metrics(q, now, qs.error)
                continue
            u = unacked.get(q, Unacked())
            nexts = [t for t in (qs.next_due, u.next_due) if t is not None]
            out[q] = QueueMetrics(
                queue=q, pending=qs.depth, oldest_pending_age=max(qs.ages) if qs.ages else None,
                in_flight=u.due, read_at=now, scheduled=qs.scheduled + u.scheduled,
                next_due_at=min(nexts) if nexts else None, scheduled_held=u.scheduled,
            )
        return out

    def _first_sightings(
        self, windows: Mapping[str, tuple[int, KeyRead]], forget: Sequence[str], now: float
    ) -> dict[str, list[float]]:
        """Advance the marks of every windowed key (and forget keys no longer windowed) in one
        store transaction; the first-sighting time of each item of each window."""
        seen: dict[str, list[float]] = {}

        def update(prior: dict[str, Mark]) -> dict[str, Mark | None]:
            new: dict[str, Mark | None] = {k: None for k in forget}
            for key, (_, got) in windows.items():
                text, at = prior.get(key, (None, None))
                marks, first = advance_window(
                    WindowMarks.decode(text, at), [it.hash for it in got.items], now
                )
                seen[key] = first
                new[key] = marks.encode()
            return new

        try:
            self._sightings.update_marks(self.source_id, [*windows, *forget], update)
        except Exception as exc:  # the store is down: ages unknown, counts kept
            log.warning("head sightings of %s unavailable: %s", self.source_id,
                        type(exc).__name__)
            return {}
        for key, (_, got) in windows.items():
            self._windows[key] = (tuple(it.hash for it in got.items), seen[key])
        return seen

    def close(self) -> None:
        self._client.close()


def _age(items: Sequence[Item], now: float, first_seen: Sequence[float] | None) -> float | None:
    """The longest wait among due items, walking from the head to the first due item without
    an ETA (FIFO: every later one without an ETA is younger). A job with an ETA waits from its
    ETA. An unstamped item was published before its first sighting and before any later item's
    stamp, so its wait is at least now - max(that, its ETA)."""
    later_stamp: list[float | None] = [None] * len(items)
    best: float | None = None
    for i in range(len(items) - 1, -1, -1):
        later_stamp[i] = best
        s = items[i].stamp
        if s is not None:
            best = s if best is None else min(best, s)
    ages: list[float] = []
    for i, it in enumerate(items):
        if it.eta is not None and it.eta > now:
            continue  # scheduled: not waiting yet
        if it.stamp is not None:
            published: float | None = it.stamp
        else:
            bounds = [b for b in (later_stamp[i],) if b is not None]
            if first_seen is not None and i < len(first_seen):
                bounds.append(first_seen[i])
            published = min(bounds) if bounds else None
        if published is not None:
            since = published if it.eta is None else max(published, it.eta)
            ages.append(max(0.0, now - since))
        if it.eta is None:
            break
    return max(ages) if ages else None


def _scripting_refused(exc: redis.ResponseError) -> bool:
    text = str(exc).lower()
    return "unknown command" in text or "noperm" in text or "not allowed" in text


def _from_script(line: bytes) -> KeyRead | str:
    fields = line.split(b"\t")
    if fields[0] == b"-1":
        return fields[1].decode(errors="replace") if len(fields) > 1 else "error"
    n, sched, next_due, scanned, items = (fields + [b""] * 5)[:5]
    parsed = []
    for raw in items.split(b" ") if items else ():
        ident, stamp, eta = [*raw.decode(errors="replace").split(","), "", ""][:3]
        parsed.append(Item(
            _short(ident), _as_float(stamp) if stamp else None, _as_float(eta) if eta else None
        ))
    return KeyRead(
        depth=int(n), scheduled=int(sched or 0),
        next_due=_as_float(next_due.decode()) if next_due else None,
        scanned=int(scanned or 0), items=tuple(parsed),
    )


def _short(ident: str) -> str:
    """The 10-hex hash a window keeps: the script's "sha1:<hash>" cut, an id hashed."""
    return ident[5:5 + ID_HASH_CHARS] if ident.startswith("sha1:") else id_hash(ident)


def _from_window(depth: int, window: Sequence[bytes], now: float) -> KeyRead:
    """The pipeline mode's reading of one key from its oldest messages (oldest first)."""
    items: list[Item] = []
    sched, next_due = 0, None
    for raw in window:
        ident, stamp, eta = _envelope(raw)
        if eta is not None and eta > now:
            sched += 1
            next_due = eta if next_due is None else min(next_due, eta)
        items.append(Item(ident, stamp, eta))
    read = KeyRead(depth, sched, next_due, len(window), tuple(items))
    if read.wants_window():
        return read
    cut = next((i for i, it in enumerate(items) if it.eta is None), len(items) - 1)
    return KeyRead(depth, sched, next_due, len(window), tuple(items[: cut + 1]))


def _envelope(raw: bytes) -> tuple[str, float | None, float | None]:
    """(id hash, stamp, eta) of one kombu/Celery JSON envelope, as the script reads it: the hash
    of the id when it is plain ASCII text, else of the whole message."""
    raw_hash = hashlib.sha1(raw).hexdigest()[:ID_HASH_CHARS]
    try:
        env = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        env = None
    headers = env.get("headers") if isinstance(env, dict) else None
    if not isinstance(headers, dict):
        return raw_hash, None, None
    msg_id = headers.get("id")
    plain = (
        isinstance(msg_id, str) and msg_id.isascii() and msg_id.isprintable()
        and '"' not in msg_id and "\\" not in msg_id and msg_id != ""
    )
    ident = id_hash(str(msg_id)) if plain else raw_hash
    return ident, _as_float(headers.get(PUBLISHED_AT_HEADER)), parse_eta(headers.get("eta"))
