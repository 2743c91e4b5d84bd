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
the same call (`index_scans.IndexView`, the script's 'u' mode); other sets and hashes by SSCAN /
HSCAN pages of COUNT <= the budget (`index_scans.CursorScan`). How the reader orders them around
the lists, and why that counts no job twice, is in `unacked`. The lists' tasks and pieces are
cut in `list_scans`, the reader's calls of each round made in `piece_reads`.
"""

from __future__ import annotations

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
