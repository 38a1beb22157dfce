-- Sliding-window log: a sorted set of (time, running total) entries. Admitted iff the hits fit in
-- what the trailing window (now - window, now] leaves. Twin of sliding_window_log in
-- src/store/algorithms.rs (its `Log` type says the same in Rust).
--
-- One member per call that logs hits, not per hit (issue #27: a member per hit let one call of
-- cost 100 000 hold Redis for 200-350 ms and leave 100 000 members for the whole window), so a
-- call costs O(log entries) whatever its hits. A member is scored by its time (microseconds) and
-- named '<total>+<n>': the running total of hits logged after it, and its own n hits. Totals
-- strictly increase, so names are unique; a call at the same time as the newest entry adds to
-- it. The window's count is the newest total minus the total before its oldest entry, and the
-- time of its k-th hit is a binary search on the totals. Only admitted hits are logged (and
-- refused ones when recorded, up to the limit), so a log holds at most `limit` hits and at most
-- as many entries as calls that logged; it expires when its newest entry leaves the window.
--
-- Logs written by earlier versions hold one member per hit, named '<time>:<position>', which no
-- entry's name matches: such a log is rewritten as entries the first time it is used (one pass
-- over its distinct times, once), so no hit it counted is forgotten by an upgrade.

-- The running total and hits of an entry's name; nil for a member of the old layout.
local function log_entry(member)
  local total, n = string.match(member, '^(%d+)%+(%d+)$')
  if total then return tonumber(total), tonumber(n) end
end

local function log_name(total, n)
  return string.format('%.0f+%.0f', total, n)
end

-- Rewrites a log of the old layout (a member per hit, scored by its time) as entries, one per
-- distinct time, keeping its TTL. Walks distinct scores (ZCOUNT per time), not members.
local function log_upgrade(key)
  local ttl = call('PTTL', key)
  local entries, total, from = {}, 0, '-inf'
  while true do
    local next_time = call('ZRANGEBYSCORE', key, from, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if not next_time[2] then break end
    local t = next_time[2]
    local n = call('ZCOUNT', key, t, t)
    total = total + n
    entries[#entries + 1] = t
    entries[#entries + 1] = log_name(total, n)
    from = '(' .. t
  end
  call('DEL', key)
  for first = 1, #entries, 1000 do
    call('ZADD', key, unpack(entries, first, math.min(#entries, first + 999)))
  end
  if ttl > 0 then call('PEXPIRE', key, ttl) end
end

-- Logs n hits at now: a new entry, or the newest one grown when it has the same time. `count`
-- is what the window holds, `newest` the newest entry (member and score), `last` and `last_n`
-- its running total and hits. (Top-level functions, not closures in sliding_window_log, so a
-- call defines no function.)
local function log_hits(key, now, n, count, newest, last, last_n)
  if n <= 0 then return end
  local own = n
  if count > 0 and tonumber(newest[2]) == now then
    write('ZREM', key, newest[1])
    own = n + last_n
  end
  write('ZADD', key, string.format('%.0f', now), log_name(last + n, own))
end

-- Until the log is empty, after `logged` hits were added at now.
local function log_until_empty(logged, count, newest, window, now)
  if logged > 0 then return window end
  if count > 0 then return tonumber(newest[2]) + window - now end
  return 0
end

local function sliding_window_log(key, now, hits, record, limit, window)
  hits, limit, window = tonumber(hits), tonumber(limit), tonumber(window)
  local newest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  -- Changes no answer, so it runs in a dry run too (as the pruning below does).
  if newest[1] and not log_entry(newest[1]) then
    log_upgrade(key)
    newest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  end
  -- A clock that steps back must not reorder the log.
  if newest[2] and tonumber(newest[2]) > now then now = tonumber(newest[2]) end
  call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now - window))
  -- The running total before the window's oldest entry, and after its newest.
  local base, last, last_n = 0, 0, 0
  local oldest = call('ZRANGE', key, 0, 0)
  if oldest[1] then
    local total, n = log_entry(oldest[1])
    base = total - n
    last, last_n = log_entry(newest[1])
  end
  local count = last - base
  -- A zero-cost check is decided as a one-hit request and counts nothing.
  local probe = math.max(hits, 1)
  if probe <= limit and count + probe <= limit then
    log_hits(key, now, hits, count, newest, last, last_n)
    local ttl = log_until_empty(hits, count, newest, window, now)
    if ttl > 0 then write('PEXPIRE', key, micros_to_ms(ttl)) end
    return 1, limit - count - hits, micros_to_ms(ttl), count + hits
  end
  -- A trial (common.lua) cannot charge refused hits; its outcome is used only where they are
  -- not charged (decide.lua).
  local logged = 0
  if record and hits > 0 and count < limit and not dry_run then
    -- Refused, still charged: up to what fills the log to the limit.
    logged = math.min(hits, limit - count)
    log_hits(key, now, logged, count, newest, last, last_n)
    write('PEXPIRE', key, micros_to_ms(log_until_empty(logged, count, newest, window, now)))
  end
  local held = count + logged
  local wait
  if probe > limit then
    wait = log_until_empty(logged, count, newest, window, now)
  else
    -- The (held + probe - limit)-th oldest hit must leave the window first: the first entry
    -- whose running total passes base + index. (The log may hold more than the limit after
    -- UPDATE_KEEP_STATE lowered it.)
    local index = held + probe - limit - 1
    if index >= count then
      wait = window
    else
      -- Entries logged just now (a new one, or the newest grown) end above base + index, and
      -- the one holding that hit keeps its time: searching every entry finds it.
      local lo, hi = 0, call('ZCARD', key) - 1
      -- Most refusals wait for the oldest entry (a full log asked for a few more hits): it is
      -- looked at first. (Its name may be stale if it was also the newest and just grew; the
      -- entry at rank 0 is still the one.)
      if log_entry(oldest[1]) > base + index then hi = 0 end
      while lo < hi do
        local mid = floor((lo + hi) / 2)
        local total = log_entry(call('ZRANGE', key, mid, mid)[1])
        if total <= base + index then lo = mid + 1 else hi = mid end
      end
      local entry = call('ZRANGE', key, lo, lo, 'WITHSCORES')
      wait = tonumber(entry[2]) + window - now
    end
  end
  local remaining = limit - held
  if remaining < 0 then remaining = 0 end
  return 0, remaining, micros_to_ms(wait), held
end
