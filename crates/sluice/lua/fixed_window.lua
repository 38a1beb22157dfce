-- Fixed window: one integer counter per window, named with the window start by the caller, so the
-- keys are the same as envoyproxy/ratelimit's (INCRBY + EXPIRE).
--
-- The expiry is set in the same atomic step as the increment, so no counter of ours is ever left
-- without a TTL, and only when the key is new, so a hot key does not replicate an EXPIRE per hit.
-- Another writer of the same keys (envoyproxy/ratelimit sends INCRBY and EXPIRE separately) can
-- leave one without a TTL; the script repairs that whenever the count passes a multiple of 64.
-- Checking on every hit cost a PTTL per descriptor, about an eighth of the script's time, to fix
-- what is only a leak: a key names its window, so a stale one is never counted again.
--
-- Two parts: fixed_window_count writes (the one place for the INCRBY, the PEXPIRE and the
-- repair) and returns the count; fixed_window judges that count. The lean script
-- (fixed_window_lean.lua) runs only the first and leaves the judging to Rust
-- (store::algorithms::fixed_window_outcome, the same arithmetic as fixed_window's below).

-- Mirrored in Rust as store::redis::TTL_REPAIR_PERIOD (a test checks they agree).
local TTL_REPAIR_PERIOD = 64

-- Counts `hits` (a decimal string; '0' looks without counting) on the counter `key`, giving it
-- a TTL of ttl_ms (the window plus expiry jitter) when new or found without one at a repair
-- point. Returns the count after the hits. In a dry run (common.lua) it writes nothing and
-- returns what the count would be.
local function fixed_window_count(key, hits, ttl_ms)
  if hits == '0' then
    return tonumber(call('GET', key) or '0') or 0
  elseif dry_run then
    return (tonumber(call('GET', key) or '0') or 0) + tonumber(hits)
  end
  -- hits stays a string: INCRBY takes it verbatim, with no float formatting on the way.
  local count = call('INCRBY', key, hits)
  local added = tonumber(hits)
  if count == added or (count % TTL_REPAIR_PERIOD < added and call('PTTL', key) < 0) then
    call('PEXPIRE', key, ttl_ms)
  end
  return count
end

-- The decision on one check: counts as fixed_window_count does, then measures the reset on the
-- script's clock (now_ms) against the end of the window the key names, clamped to
-- [1 ms, window].
--
-- Arguments: hits, limit, window_ms, window_end_ms, ttl_ms. Returns admitted (0/1), remaining,
-- reset_ms, count.
local function fixed_window(key, now_ms, hits, limit, window_ms, window_end_ms, ttl_ms)
  local count = fixed_window_count(key, hits, ttl_ms)
  limit = tonumber(limit)
  window_ms = tonumber(window_ms)
  local reset_ms = tonumber(window_end_ms) - now_ms
  if reset_ms < 1 then reset_ms = 1 end
  if reset_ms > window_ms then reset_ms = window_ms end
  local admitted = 0
  local remaining = 0
  if count <= limit then
    admitted = 1
    remaining = limit - count
  end
  return admitted, remaining, reset_ms, count
end

-- A named limiter's fixed window (native API): a hash {w = end of the window counted (ms),
-- c = count}, so a count is read only in its own window. Unlike upstream's, hits are counted only
-- when they fit (count + hits <= limit): a refused acquisition takes nothing. The hash expires
-- when its window ends. Twin of fixed_window_take in src/store/mod.rs.
--
-- Arguments: hits, limit, window_ms. Returns admitted (0/1), remaining, reset_ms, count.
local function fixed_window_take(key, now_ms, hits, limit, window_ms)
  hits, limit, window_ms = tonumber(hits), tonumber(limit), tonumber(window_ms)
  local window_end = (floor(now_ms / window_ms) + 1) * window_ms
  local reset_ms = window_end - now_ms
  local count = 0
  -- pcall: a state of another shape (a count written by an older Sluice) is read as none.
  local state = redis.pcall('HMGET', key, 'w', 'c')
  if state.err then
    call('DEL', key)
  elseif tonumber(state[1]) == window_end then
    count = tonumber(state[2]) or 0
  end
  if count + hits <= limit then
    count = count + hits
    if hits > 0 then
      call('HSET', key, 'w', string.format('%.0f', window_end), 'c', string.format('%.0f', count))
      call('PEXPIRE', key, reset_ms)
    end
    return 1, limit - count, reset_ms, count
  end
  local remaining = limit - count
  if remaining < 0 then remaining = 0 end
  return 0, remaining, reset_ms, count
end
