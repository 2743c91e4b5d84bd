"""Reading many Redis lists (and kombu's unacked hash) in short server calls.

The watched Redis is the user's production broker: while one of our commands runs, none of
their producers or workers is served. So no command we send may keep it busy longer than a few
milliseconds, whatever the number of queues or the depth of a list:

- **Pieces.** The server-side script (`PIECES_LUA`) runs once per *piece*: a slice of the
  queues, or parts of lists the first pieces did not finish. Each call spends at most `budget`
  units: one per command it runs (LLEN, one EXISTS over a queue's other priority keys, LRANGE),
  one per message it fetches plus one per full KiB of it (copying a message into the script is
  most of its cost), two per message it hashes. `PIECE_BUDGET` (500) is sized by
  `benchmarks/metrics.py`: on a loaded 2-core machine with SLOWLOG recording every command a
  call then takes 0.7 ms (median), under 5 ms at the 99th percentile - the slowest ones waited
  for a core. Messages are fetched in batches of at most `BATCH`, sized to the units left, so
  only messages over 1 KiB can make a call overshoot, by at most one batch.
- **Pipelined.** All pieces of a round go in one pipeline and their answers are parsed as they
  arrive: 10,000 queues are ~200 calls but one round trip. What the first round could not
  finish - lists deeper than the window whose ETAs must be scanned, a window cut by the budget -
  is done in the next: a list's remaining range is cut into segments of about a piece each,
  all in that one round.
- **Anchored.** Between two calls the list may move: workers pop its head, kombu restores jobs
  onto it. Positions behind a message never change though (kombu only pushes and pops at the
  ends), so every later call finds the last message examined (the anchor, by its SHA-1, within
  `SEARCH_RADIUS` of where it was) and counts its segment's positions from there: every message
  is examined at most once. An anchor popped meanwhile sends that list back to its head, once
  (its counts restart); after that the rest counts as due - as messages beyond the scan limits
  always did.
- **Never beyond the depth.** A key's depth is its LLEN in the first round; later calls examine
  no position beyond it, so a message pushed later is never classified, and scheduled <= depth
  (pending = depth - scheduled >= 0).

kombu's unacked index is read in rank slices of the budget, each tag's value from the hash in
the same call (`IndexView`); other sets and hashes by SSCAN / HSCAN pages of COUNT <= the budget
(`CursorScan`). How the reader orders them around the lists, and why that counts no job twice,
is in `celery_redis`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

PIECE_BUDGET = 500
"""Units of work one server call may spend (commands, messages fetched, +1 per KiB)."""
MIN_PIECE_BUDGET = 300
"""Room for the first task of a piece to check and search its anchor (5 + 4 * SEARCH_RADIUS)."""
MAX_PIECE_BUDGET = 100_000
SEARCH_RADIUS = 64
"""How far a continuation looks for the message its list stopped at (jobs popped or pushed at
the head between two rounds)."""
BATCH = 32
"""Messages fetched per LRANGE inside a piece."""
MAX_RESTARTS = 1
"""Times a list whose anchor was lost is scanned again from its head within one read."""


# Per call: ARGV[1] mode ('q': queues read from scratch, 'c': continuations, 'u': a slice of
# kombu's unacked index, see there), [2] the stamp
# header as a quoted JSON key, [3] now (epoch seconds), [4] window, [5] budget in units,
# [6] search radius.
# 'q': [7] key prefix, [8] sep, [9] priority steps "0,3,6,9", [10] the scan stop (messages
# examined for ETAs per key in this round), [11] flat index of the piece's first key, then the
# queue names. For each queue: LLEN of its first priority key and one EXISTS over the others
# (their LLENs only when one exists); then each non-empty key is scanned from the head while
# units remain.
# 'c': 9 arguments per task: task number, key, depth, first position to examine, the position
# right behind the anchor, where that was physically when last seen, flags ('s' settled, 'w'
# wants the window), the position to stop at, the anchor's SHA-1 (one list may have several
# tasks in one round, all behind the same anchor).
# One line per non-empty key ('q') or task ('c'):
#   index TAB depth TAB status TAB scheduled TAB next_due TAB oldest TAB items
# and, where messages are left, where to go on: TAB next position TAB the position right behind
# the anchor TAB where that is physically TAB flags TAB the anchor's SHA-1 (the last message
# examined, or the task's own anchor if it examined none). status D done, M more to do, L
# anchor lost; "index TAB E TAB message" for a key of the wrong type. oldest: the earliest
# publish stamp (or ETA, if later) of the due stamped messages seen at the head. items, only
# when an unstamped message needs the window's ids or the window is still being read:
# "id,stamp,eta" separated by spaces, from the head up to the first due message without an ETA
# - or the whole window when an unstamped one comes first.
# (Keys are not declared in KEYS, so this needs a standalone Redis, not Redis Cluster.)
PIECES_LUA = r"""
local mode, stamp_key = ARGV[1], ARGV[2]
local now, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local budget, radius = tonumber(ARGV[5]), tonumber(ARGV[6])
local full = budget
local batch_max = 32  -- BATCH
local find, match, format, floor = string.find, string.match, string.format, math.floor
local rcall, rpcall, sha1 = redis.call, redis.pcall, redis.sha1hex
local out = {}
local function clean(s)
  return (string.gsub(s, '[\t\n]', ' '))
end
local function days(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = floor(y / 400)
  local yoe = y - era * 400
  local doy = floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  return era * 146097 + yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy - 719468
end
local function eta_of(raw)
  local at = find(raw, '"eta"', 1, true)
  if not at then return nil end
  local y, mo, d, h, mi, s, rest = match(raw,
    '^%s*:%s*"(%d%d%d%d)%-(%d%d)%-(%d%d)[T ](%d%d):(%d%d):(%d%d%.?%d*)([^"]*)"', at + 5)
  if not y then return nil end
  local t = days(tonumber(y), tonumber(mo), tonumber(d)) * 86400 + tonumber(h) * 3600
    + tonumber(mi) * 60 + tonumber(s)
  local sign, oh, om = match(rest, '^([%+%-])(%d%d):?(%d%d)$')
  if sign == '+' then t = t - tonumber(oh) * 3600 - tonumber(om) * 60 end
  if sign == '-' then t = t + tonumber(oh) * 3600 + tonumber(om) * 60 end
  return t
end
-- kombu envelopes are JSON whose body is base64: a quoted key can only be an envelope key, so
-- pattern matches replace a full JSON decode (3x cheaper on the server)
local function stamp_of(raw)
  local at = find(raw, stamp_key, 1, true)
  if at then return match(raw, '^%s*:%s*"?([%d%.eE%+%-]+)', at + #stamp_key) or '' end
  return ''
end
-- the id as it is (hashed by the reader); hashed here when it has no id or would not fit the
-- answer's separators ("sha1:" + the hash of the message, or of the id)
local function id_of(raw)
  local id = nil
  local at = find(raw, '"id"', 1, true)
  if not at then return 'sha1:' .. sha1(raw) end
  id = match(raw, '^%s*:%s*"([^"\\%s,]+)"', at + 4)
  if id ~= nil then return id end
  id = match(raw, '^%s*:%s*"([^"\\]+)"', at + 4)
  if id == nil then return 'sha1:' .. sha1(raw) end
  return 'sha1:' .. sha1(id)
end
local function line(idx, n, status, sched, next_due, oldest, items)
  out[#out + 1] = idx .. '\t' .. n .. '\t' .. status .. '\t' .. sched .. '\t'
    .. (next_due and format('%.6f', next_due) or '') .. '\t'
    .. (oldest and format('%.6f', oldest) or '') .. '\t' .. items
end
local function state(pos, after, phys, settled, want, anchor)
  out[#out] = out[#out] .. '\t' .. pos .. '\t' .. after .. '\t' .. phys .. '\t'
    .. (settled and 's' or '') .. (want and 'w' or '') .. '\t' .. anchor
end
-- examine key from logical position pos up to stop, never beyond depth n. Logical positions
-- count from the head as it was when the key was counted; the message whose SHA-1 is fp (the
-- anchor) is followed by logical position `after`, physically at phys when last seen: jobs
-- popped or pushed at the head since move it, never the order behind it
local function scan(idx, key, n, pos, after, phys, settled, want, stop, fp, pre)
  if after > 0 then
    -- find the anchor: still at phys - 1, or moved by pops / pushes at the head (a search
    -- that might not fit what is left waits for the next round, unless nothing was spent yet)
    if budget < 4 then
      line(idx, n, 'M', 0, nil, nil, '')
      state(pos, after, phys, settled, want, fp)
      return
    end
    local at = rcall('LRANGE', key, -phys, -phys)
    budget = budget - 2
    if at[1] == nil or sha1(at[1]) ~= fp then
      if budget < 1 + 4 * radius + 2 and budget < full - 2 then
        line(idx, n, 'M', 0, nil, nil, '')
        state(pos, after, phys, settled, want, fp)
        return
      end
      local lo = phys - 1 - radius
      if lo < 0 then lo = 0 end
      local got = rcall('LRANGE', key, -(phys + radius), -(lo + 1))
      budget = budget - 1
      local best = nil
      for j = 1, #got do
        budget = budget - 2 - floor(#got[j] / 1024)
        if sha1(got[j]) == fp then
          local p = lo + #got - j
          if best == nil or math.abs(p - phys + 1) < math.abs(best - phys + 1) then best = p end
        end
      end
      if best == nil then
        line(idx, n, 'L', 0, nil, nil, '')
        state(pos, after, phys, settled, want, '')
        return
      end
      phys = best + 1
    end
  end
  local aphys = phys
  phys = aphys + pos - after
  local status = 'D'
  local sched, next_due, oldest = 0, nil, nil
  local items = {}  -- raw, stamp, eta of each message collected
  local last = nil
  local per = 1
  while pos < n do
    local collecting = pos < window and (not settled or want)
    if pos >= stop and not collecting then break end
    if budget < 2 then  -- not even one more LRANGE of one message
      status = 'M'
      break
    end
    local lim = stop
    if collecting and window > lim then lim = window end
    if lim > n then lim = n end
    local cnt = lim - pos
    if cnt > batch_max then cnt = batch_max end
    local afford = floor((budget - 1) / per)
    if afford < 1 then afford = 1 end  -- (a message over 1 KiB may overshoot)
    if cnt > afford then cnt = afford end
    local got = pre
    local spent = 0
    if got == nil then
      got = rcall('LRANGE', key, -(phys + cnt), -(phys + 1))
      spent = 1 + #got
    end
    pre = nil
    if #got == 0 then break end
    for j = #got, 1, -1 do
      local raw = got[j]
      if #raw >= 1024 and spent > 0 then spent = spent + floor(#raw / 1024) end
      local eta = eta_of(raw)
      if eta ~= nil and eta > now then
        sched = sched + 1
        if next_due == nil or eta < next_due then next_due = eta end
      end
      if pos < window and (not settled or want) then
        local stamp = stamp_of(raw)
        local k = #items
        items[k + 1], items[k + 2], items[k + 3] = raw, stamp, eta or false
        if stamp ~= '' and (eta == nil or eta <= now) then
          -- a due stamped message has waited since it was published, or since its ETA
          local since = tonumber(stamp)
          if since ~= nil then
            if eta ~= nil and eta > since then since = eta end
            if oldest == nil or since < oldest then oldest = since end
          end
        end
        if not settled then
          if stamp == '' then want = true end
          if eta == nil then settled = true end
        end
      end
      pos = pos + 1
      phys = phys + 1
      last = raw
    end
    budget = budget - spent
    if spent > 0 then per = (spent - 1) / #got end
  end
  -- the items only when an unstamped message needs the window's ids, or the key goes on
  local text = ''
  if want or not settled then
    local parts = {}
    for k = 1, #items, 3 do
      parts[#parts + 1] = id_of(items[k]) .. ',' .. items[k + 1] .. ','
        .. (items[k + 2] and format('%.6f', items[k + 2]) or '')
    end
    text = table.concat(parts, ' ')
  end
  line(idx, n, status, sched, next_due, oldest, text)
  if pos < n then
    if last ~= nil then
      state(pos, pos, phys, settled, want, sha1(last))
    else
      state(pos, after, aphys, settled, want, fp)
    end
  end
end
if mode == 'u' then
  -- ranks ARGV[9]..ARGV[10] of kombu's unacked index (tag, delivery time), with each tag's
  -- value in the unacked hash when ARGV[8] names it; the index's and the hash's sizes first
  local index, hash = ARGV[7], ARGV[8]
  local got = rpcall('ZRANGE', index, tonumber(ARGV[9]), tonumber(ARGV[10]), 'WITHSCORES')
  if got['err'] then return {-1, clean(tostring(got['err']))} end
  local res = {rcall('ZCARD', index), 0}
  if hash == '' then
    for i = 1, #got do res[i + 2] = got[i] end
    return res
  end
  local size = rpcall('HLEN', hash)
  if type(size) == 'table' then return {-2, clean(tostring(size['err']))} end
  res[2] = size
  if #got == 0 then return res end
  local tags = {}
  for i = 1, #got, 2 do tags[#tags + 1] = got[i] end
  local values = rcall('HMGET', hash, unpack(tags))
  for i = 1, #tags do
    res[#res + 1] = tags[i]
    res[#res + 1] = got[2 * i]
    res[#res + 1] = values[i] or ''
  end
  return res
end
if mode == 'q' then
  local prefix, sep = ARGV[7], ARGV[8]
  local stop, idx = tonumber(ARGV[10]), tonumber(ARGV[11])
  local suffixes = {}
  for step in string.gmatch(ARGV[9], '%d+') do
    suffixes[#suffixes + 1] = (tonumber(step) ~= 0) and (sep .. step) or ''
  end
  local nsteps = #suffixes
  local qcost = nsteps > 1 and nsteps + 1 or 1
  -- a key is first looked at with LRANGE of its head (its depth when shorter than that, and
  -- the first messages the scan needs) while the units left cover every later key's LLEN
  local probe = math.min(8, window, math.max(stop, 1))
  local found = {}
  local keys = {}
  local function look(s, rest)
    local key = keys[s]
    if budget - rest > probe + 1 then
      local got = rpcall('LRANGE', key, -probe, -1)
      if got['err'] then
        out[#out + 1] = (idx + s - 1) .. '\tE\t' .. clean(tostring(got['err']))
        budget = budget - 1
        return
      end
      local k = #got
      budget = budget - 1 - k
      for j = 1, k do
        if #got[j] >= 1024 then budget = budget - floor(#got[j] / 1024) end
      end
      if k == 0 then return end
      local n = k
      if k == probe then
        n = rcall('LLEN', key)
        budget = budget - 1
      end
      found[#found + 1] = {idx + s - 1, key, n, got}
      return
    end
    local n = rpcall('LLEN', key)
    budget = budget - 1
    if type(n) == 'table' then
      out[#out + 1] = (idx + s - 1) .. '\tE\t' .. clean(tostring(n['err'] or 'error'))
    elseif n > 0 then
      found[#found + 1] = {idx + s - 1, key, n, nil}
    end
  end
  for a = 12, #ARGV do
    local base = prefix .. ARGV[a]
    for s = 1, nsteps do keys[s] = base .. suffixes[s] end
    local rest = (#ARGV - a) * qcost
    look(1, rest + nsteps)
    if nsteps > 1 then
      budget = budget - 1
      if rcall('EXISTS', unpack(keys, 2, nsteps)) > 0 then
        for s = 2, nsteps do look(s, rest + nsteps - s + 1) end
      end
    end
    idx = idx + nsteps
  end
  for _, f in ipairs(found) do
    scan(f[1], f[2], f[3], 0, 0, 0, false, false, stop, '', f[4])
  end
else
  for a = 7, #ARGV - 8, 9 do
    local flags = ARGV[a + 6]
    scan(tonumber(ARGV[a]), ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
      tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), find(flags, 's', 1, true) ~= nil,
      find(flags, 'w', 1, true) ~= nil, tonumber(ARGV[a + 7]), ARGV[a + 8], nil)
  end
end
return table.concat(out, '\n')
"""


def queue_cost(nsteps: int) -> int:
    """Units the LLEN / EXISTS pass of one queue may spend at most."""
    return 1 if nsteps <= 1 else nsteps + 1


def queues_per_piece(nsteps: int, budget: int) -> int:
    """Queues in one first-round piece: their keys take at most half the budget, the rest
    scans their heads."""
    return max(1, (budget // 2) // queue_cost(nsteps))


Items = tuple[tuple[str, float | None, float | None], ...]
"""(id, stamp, eta) of messages from a list's head, as the script returned them."""


def parse_float(raw: bytes) -> float | None:
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def parse_items(raw: bytes) -> Items:
    out = []
    for part in raw.split(b" "):
        ident, _, rest = part.partition(b",")
        stamp, _, eta = rest.partition(b",")
        out.append((ident.decode(errors="replace"), parse_float(stamp), parse_float(eta)))
    return tuple(out)


@dataclass(slots=True)
class Range:
    """Messages [lo, hi) of a list still to examine (logical positions: from the head as it
    was when the list was counted), behind the anchor: the message whose SHA-1 is `anchor`,
    followed by position `after`, physically at `phys` when last seen ('' and 0 at the head).
    `settled` / `want`: the state of the head's items (see the script)."""

    lo: int
    hi: int
    after: int = 0
    phys: int = 0
    anchor: str = ""
    settled: bool = False
    want: bool = False

    def collecting(self, window: int) -> bool:
        return self.lo < window and (not self.settled or self.want)


@dataclass(slots=True)
class ListScan:
    """One non-empty priority key whose scan goes on over several pieces."""

    index: int
    key: str
    depth: int
    stop: int = 0  # messages to examine for ETAs this read
    scheduled: int = 0
    next_due: float | None = None
    oldest: float | None = None
    items: list[bytes] = field(default_factory=list)
    ranges: list[Range] = field(default_factory=list)
    restarts: int = 0

    def fold(self, fields: Sequence[bytes]) -> Range | None:
        """Add one answer line's counts; where to go on (hi still to be set), if anywhere."""
        self.scheduled += int(fields[3])
        nd = parse_float(fields[4])
        if nd is not None:
            self.next_due = nd if self.next_due is None else min(self.next_due, nd)
        old = parse_float(fields[5])
        if old is not None:
            self.oldest = old if self.oldest is None else min(self.oldest, old)
        if fields[6]:
            self.items.append(fields[6])
        if len(fields) < 12:
            return None
        return Range(
            int(fields[7]),
            0,
            int(fields[8]),
            int(fields[9]),
            fields[11].decode(),
            b"s" in fields[10],
            b"w" in fields[10],
        )

    def target(self, rng: Range, window: int) -> int:
        """Where a range starting at rng.lo ends: the scan stop, or the window's end while the
        head's items are still being collected."""
        hi = max(self.stop, window) if rng.collecting(window) else self.stop
        return min(self.depth, hi)

    def restart(self, window: int) -> None:
        """Scan again from the head (an anchor was lost): the counts of this key restart."""
        self.restarts += 1
        self.scheduled, self.next_due, self.oldest, self.items = 0, None, None, []
        head = Range(0, 0)
        head.hi = self.target(head, window)
        self.ranges = [head]

    def joined_items(self) -> bytes:
        return b" ".join(self.items)


Task = tuple[ListScan, Range, int, int]
"""One piece of work: the list, the range it belongs to, and the positions [lo, hi) to examine."""


def tasks_of(scans: Iterable[ListScan], budget: int, window: int) -> list[Task]:
    """This round's work: a range still collecting the head's items goes on from where it
    stopped (its pieces are sequential); any other range is cut into segments of about a
    piece each, every one found behind the range's anchor - all examined in one round."""
    seg = max(1, (budget - 6) * BATCH // (BATCH + 1))  # an anchor check, an LRANGE per batch
    out: list[Task] = []
    for s in scans:
        for r in s.ranges:
            if r.collecting(window):
                out.append((s, r, r.lo, r.hi))
                continue
            for lo in range(r.lo, r.hi, seg):
                out.append((s, r, lo, min(r.hi, lo + seg)))
    return out


def task_args(number: int, task: Task) -> list[str | int]:
    s, r, lo, hi = task
    flags = ("s" if r.settled else "") + ("w" if r.want else "")
    return [number, s.key, s.depth, lo, r.after, r.phys, flags, hi, r.anchor]


def pack(tasks: Sequence[Task], budget: int, window: int) -> list[list[int]]:
    """Task numbers grouped into pieces of about `budget` units."""
    pieces: list[list[int]] = []
    current: list[int] = []
    used = 0
    for number, (_, _, lo, hi) in enumerate(tasks):
        est = min(budget, 3 + hi - lo + -(-(hi - lo) // BATCH))
        if current and used + est > budget:
            pieces.append(current)
            current, used = [], 0
        current.append(number)
        used += est
    if current:
        pieces.append(current)
    return pieces


def _score(raw: Any) -> float | None:
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


class IndexView:
    """kombu's unacked index (delivery tag -> delivery time) as one pass over it saw it, read
    in slices of ranks (overlapping by `MARGIN`: an entry removed meanwhile shifts the ranks
    behind it), all sent in one round when the index is no bigger than `expected` (the last
    read's size, +25%); more slices follow if it grew. With `hash_key`, each tag's value in the
    unacked hash comes along. A script call per slice (`sha`), or ZCARD / HLEN / ZRANGE and
    HMGET where scripting is refused. An entry present the whole time is seen unless more
    than MARGIN entries before it went between two slices; no entry is made up."""

    MARGIN = 32

    def __init__(
        self, index_key: str, hash_key: str | None, per: int, expected: int, sha: str | None
    ) -> None:
        self.index_key, self.hash_key = index_key, hash_key
        self.per, self.expected, self.sha = max(10, per), expected, sha
        self.size: int | None = None  # ZCARD, as the last slice saw it
        self.hash_size = 0
        self.requested = 0  # ranks below this were asked for
        self.found: dict[bytes, float | None] = {}
        self.values: dict[bytes, bytes] = {}
        self.error: str | None = None
        self.hash_error: str | None = None
        self.noscript = False  # a slice found the script gone (a restarted or flushed server)
        self._sent: list[str] = []

    @property
    def done(self) -> bool:
        return self.error is not None or (self.size is not None and self.requested >= self.size)

    def needs_values(self) -> bool:
        """Values still to fetch (HMGET, without scripting)."""
        return (
            self.sha is None
            and self.hash_key is not None
            and self.done
            and self.hash_error is None
            and any(t not in self.values for t in self.found)
        )

    def calls(self) -> list[tuple[Any, ...]]:
        """This round's commands for the view."""
        out: list[tuple[Any, ...]] = []
        self._sent = []
        if self.sha is None and self.size is None:
            out.append(("ZCARD", self.index_key))
            self._sent.append("zcard")
            if self.hash_key is not None:
                out.append(("HLEN", self.hash_key))
                self._sent.append("hlen")
        end = max(self.expected + self.expected // 4, self.size or 0) + self.MARGIN
        start = self.requested
        while True:
            lo = max(0, start - (self.MARGIN if start else 0))
            hi = start + self.per - 1
            if self.sha is not None:
                out.append(
                    (
                        "EVALSHA",
                        self.sha,
                        0,
                        "u",
                        "",
                        0,
                        0,
                        0,
                        0,
                        self.index_key,
                        self.hash_key or "",
                        lo,
                        hi,
                    )
                )
            else:
                out.append(("ZRANGE", self.index_key, lo, hi, "WITHSCORES"))
            self._sent.append("slice")
            start = hi + 1
            if start >= end:
                break
        self.requested = start
        return out

    def value_calls(self) -> list[tuple[Any, ...]]:
        missing = [t for t in self.found if t not in self.values]
        self._sent = ["values"] * -(-len(missing) // self.per)
        return [
            ("HMGET", self.hash_key, *missing[i : i + self.per])
            for i in range(0, len(missing), self.per)
        ]

    def feed(self, replies: Iterator[Any]) -> None:
        """Take this round's replies, in the order of `calls` / `value_calls`."""
        for kind in self._sent:
            reply = next(replies)
            if self.error is not None:
                continue
            if isinstance(reply, Exception):
                if type(reply).__name__ == "NoScriptError":
                    self.noscript = True
                elif kind in ("hlen", "values"):
                    self.hash_error = str(reply)
                else:
                    self.error = str(reply)
                continue
            if kind == "zcard":
                self.size = int(reply)
            elif kind == "hlen":
                self.hash_size = int(reply)
            elif kind == "values":
                tags = [t for t in self.found if t not in self.values][: len(reply)]
                for tag, value in zip(tags, reply, strict=True):
                    self.values[tag] = value or b""
            elif self.sha is not None:
                self._feed_script(reply)
            else:
                flat = (
                    [x for pair in reply for x in pair]
                    if reply and isinstance(reply[0], list | tuple)
                    else list(reply)
                )
                for i in range(0, len(flat) - 1, 2):
                    self.found[flat[i]] = _score(flat[i + 1])

    def _feed_script(self, reply: list[Any]) -> None:
        if reply and reply[0] in (-1, -2):
            text = reply[1].decode(errors="replace") if len(reply) > 1 else "error"
            if reply[0] == -1:
                self.error = text
            else:
                self.hash_error = text
            return
        self.size, self.hash_size = int(reply[0]), int(reply[1])
        step = 3 if self.hash_key is not None else 2
        for i in range(2, len(reply) - step + 1, step):
            self.found[reply[i]] = _score(reply[i + 1])
            if step == 3 and reply[i + 2]:
                self.values[reply[i]] = reply[i + 2]


class CursorScan:
    """One ZSCAN / HSCAN / SSCAN iteration over a key, a bounded page per round.

    The result is what SCAN guarantees: every element present for the whole iteration, once
    (duplicates from a rehash are merged); elements added or removed meanwhile may be missing.
    `found` maps a member to its score (ZSCAN, as the server wrote it) or value (HSCAN), or to
    None (SSCAN). A key of another type reads as empty, with `error` set."""

    def __init__(self, command: str, key: str, count: int) -> None:
        self.command = command  # "ZSCAN", "HSCAN" or "SSCAN"
        self.key = key
        self.count = max(10, count)
        self.cursor = b"0"
        self.pages = 0
        self.done = False
        self.error: str | None = None
        self.found: dict[bytes, Any] = {}

    def call(self) -> tuple[Any, ...]:
        """The next page's command, for a round's pipeline."""
        return (self.command, self.key, self.cursor, "COUNT", self.count)

    def feed(self, reply: Any) -> None:
        self.pages += 1
        if isinstance(reply, Exception):
            self.error = str(reply)
            self.found = {}
            self.done = True
            return
        cursor, data = reply
        if self.command == "SSCAN":
            self.found.update(dict.fromkeys(data))
        else:  # member, score / field, value, flat
            it = iter(data)
            self.found.update(zip(it, it, strict=True))
        self.cursor = cursor
        self.done = cursor in (b"0", 0, "0")


def parse_piece(reply: bytes | None) -> Iterator[tuple[int, list[bytes]]]:
    """(flat key index, fields) per line of one piece's answer (fields[1] is b"E" for a key
    of the wrong type, the error text after it)."""
    if not reply:
        return
    for line in reply.split(b"\n"):
        fields = line.split(b"\t")
        if len(fields) >= 3:
            yield int(fields[0]), fields
