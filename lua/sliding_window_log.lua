-- Sliding-window log: a sorted set of admission times (microseconds). Admitted iff the hits fit
-- in what the trailing window (now - window, now] leaves. Only admitted hits are logged, so the
-- set never holds more than `limit` members; it expires when its newest member leaves the window.
-- Twin of sliding_window_log in src/store/algorithms.rs.
local function sliding_window_log(key, now, hits, limit, window, record)
  hits, limit, window = tonumber(hits), tonumber(limit), tonumber(window)
  local newest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  -- A clock that steps back must not reorder the log (and keeps member names unique).
  if newest[2] and tonumber(newest[2]) > now then now = tonumber(newest[2]) end
  call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now - window))
  local count = call('ZCARD', key)
  local function until_empty()
    local last = call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if last[2] then return tonumber(last[2]) + window - now end
    return 0
  end
  -- Logs n hits at now. Member names are time and position: unique, since time never goes back
  -- here and the count only grows within one microsecond. Added in slices to stay within Lua's
  -- stack.
  local function log_hits(n)
    local score = string.format('%.0f', now)
    for first = 1, n, 500 do
      local args = {}
      for i = first, math.min(n, first + 499) do
        args[#args + 1] = score
        args[#args + 1] = score .. ':' .. (count + i)
      end
      write('ZADD', key, unpack(args))
    end
  end
  -- A zero-cost check is decided as a one-hit request and counts nothing.
  local probe = math.max(hits, 1)
  if probe <= limit and count + probe <= limit then
    log_hits(hits)
    local ttl = until_empty()
    if ttl > 0 then write('PEXPIRE', key, micros_to_ms(ttl)) end
    return 1, limit - count - hits, micros_to_ms(ttl), count + hits
  end
  -- A trial (common.lua) cannot charge refused hits (it would read members it did not add);
  -- its outcome is used only where they are not charged (decide.lua).
  if record and hits > 0 and count < limit and not dry_run then
    -- Refused, still charged: up to what fills the log to the limit.
    local n = math.min(hits, limit - count)
    log_hits(n)
    count = count + n
    write('PEXPIRE', key, micros_to_ms(until_empty()))
  end
  local wait
  if probe > limit then
    wait = until_empty()
  else
    -- The (count + probe - limit)-th oldest member must leave the window first.
    local index = count + probe - limit - 1
    local entry = call('ZRANGE', key, index, index, 'WITHSCORES')
    wait = tonumber(entry[2]) + window - now
  end
  local remaining = limit - count
  if remaining < 0 then remaining = 0 end
  return 0, remaining, micros_to_ms(wait), count
end
