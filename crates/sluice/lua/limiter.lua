-- Entry point of the named-limiter script (native API): one operation on one limiter. Its keys
-- share a hash tag: KEYS[1] the config hash, KEYS[2]/KEYS[3] the shared state and its epoch,
-- KEYS[4]/KEYS[5] the calling client's state and epoch (the shared ones again when the call names
-- no client), KEYS[6] the clients holding a state (a sorted set: client id -> when its state
-- expires, ms on Redis's clock). The epoch says which config generation a state belongs to.
--
-- ARGV[1] is the pinned time or '', ARGV[2] the operation, ARGV[3] 1 when a client was named.
--
-- The config hash holds the rule as src/store/redis/script.rs stores it (rule, a..d), the capacity
-- (cap), per-client mode (pc), the API's encoded config (desc) and the generation (gen). A reset
-- starts a new generation; states of the old one (other clients', which this call cannot name)
-- are dropped the next time they are used, and expire meanwhile. A keep-state update that
-- changes the state's shape (another algorithm, a fixed window's length, or the mode between
-- shared and per client) starts a new generation too, the rule LimiterRecord::keeps_state_of in
-- src/store/mod.rs states for the memory store.
--
-- Replies: 'set' {applied, state_reset, record}; 'acquire' {} (no such limiter), {-1} (a client
-- is needed), {-2, capacity} (more permits than the capacity, nothing read or written), {-3, max}
-- (a new client while `max` clients hold a state: the per-limiter cap, nothing written), or
-- {admitted, remaining, reset_ms, used, capacity, per_client, lease_at}, lease_at the expiry step
-- (microseconds) a concurrency grant counted its leases in, 0 for any other answer. A refused
-- acquisition writes no state. 'release' (ARGV[4] the step, ARGV[5] the permits, as a lease id
-- names them): {} (no such limiter), {-1} (a client is needed), {-4} (not a concurrency
-- limiter), or {given_back, remaining}.

if redis.replicate_commands then redis.replicate_commands() end

local config = KEYS[1]
local op, has_client = ARGV[2], ARGV[3] == '1'
local now_us = script_now()

local function record()
  return call('HMGET', config, 'rule', 'a', 'b', 'c', 'd', 'cap', 'pc', 'desc')
end

if op == 'get' then
  return record()
elseif op == 'set' then
  local mode = ARGV[4]
  local old = call('HMGET', config, 'gen', 'rule', 'b', 'pc')
  -- A hash with a generation but no rule is a deleted limiter's tombstone (see 'delete').
  local gen, exists = old[1], old[2]
  if exists and mode == 'try' then
    return {0, 0, record()}
  end
  -- GCRA's state is also the token bucket's and the leaky bucket's: they share the rule name.
  -- A change between one shared state and one per client keeps nothing either: a new
  -- generation, so neither mode's old states are read again (LimiterRecord::keeps_state_of).
  local fresh = not exists or mode == 'reset' or old[2] ~= ARGV[5]
    or (ARGV[5] == 'fixed_window' and old[3] ~= ARGV[7]) or (old[4] or '0') ~= ARGV[11]
  if not exists and gen then call('PERSIST', config) end
  if fresh then
    -- Time-based, so a limiter deleted and created again never meets its old clients' state
    -- (the tombstone covers a clock that has not moved past the old generation).
    local next_gen = now_us
    if gen and tonumber(gen) >= next_gen then next_gen = tonumber(gen) + 1 end
    gen = string.format('%.0f', next_gen)
    call('DEL', KEYS[2], KEYS[3], KEYS[6])
  end
  call('HSET', config, 'rule', ARGV[5], 'a', ARGV[6], 'b', ARGV[7], 'c', ARGV[8],
    'd', ARGV[9], 'cap', ARGV[10], 'pc', ARGV[11], 'desc', ARGV[12], 'gen', gen)
  return {1, fresh and 1 or 0, record()}
elseif op == 'delete' then
  local gen = call('HGET', config, 'gen')
  local existed = call('HEXISTS', config, 'rule')
  call('DEL', config, KEYS[2], KEYS[3], KEYS[6])
  -- Other clients' states cannot be named here; they are dropped when their epoch no longer
  -- matches. A limiter created again takes a later time as its generation, unless the clock has
  -- not passed this one (the same microsecond, a pinned test clock, a clock stepped back): then
  -- a tombstone keeps the generation, until the clock is a second past it, so the next one is
  -- above it.
  if gen and tonumber(gen) >= now_us then
    call('HSET', config, 'gen', gen)
    call('PEXPIRE', config, floor((tonumber(gen) - now_us) / 1000) + 1000)
  end
  return existed
elseif op == 'acquire' then
  local c = call('HMGET', config, 'rule', 'a', 'b', 'c', 'd', 'cap', 'gen', 'pc')
  if not c[1] then return {} end
  local state, epoch = KEYS[2], KEYS[3]
  local per_client = c[8] == '1'
  if per_client then
    if not has_client then return {-1} end
    state, epoch = KEYS[4], KEYS[5]
  end
  local hits = ARGV[4]
  -- More than the capacity can never be granted: refused before any state is touched (and
  -- before a number no Redis command takes reaches one).
  if tonumber(hits) > tonumber(c[6]) then return {-2, tonumber(c[6])} end
  if call('GET', epoch) ~= c[7] then call('DEL', state) end
  -- The per-limiter cap: a client that holds no live state takes a place only while fewer
  -- than `max` clients hold one. Expired places are dropped first; a live one is never pushed
  -- out, so a flood of fresh ids cannot reset another client's budget. A look takes no place.
  local clients, client_id, max = KEYS[6], ARGV[6], tonumber(ARGV[5])
  local now_ms = floor(now_us / 1000)
  local capped = per_client and max > 0
  if capped and tonumber(hits) > 0 then
    local held_until = call('ZSCORE', clients, client_id)
    if not held_until or tonumber(held_until) <= now_ms then
      call('ZREMRANGEBYSCORE', clients, '-inf', now_ms)
      if call('ZCARD', clients) >= max then return {-3, max} end
    end
  end
  local admitted, remaining, reset_ms, used
  if c[1] == 'fixed_window' then
    -- Stored as limit and window seconds; the window is picked on Redis's clock.
    admitted, remaining, reset_ms, used = fixed_window_take(state, floor(now_us / 1000), hits,
      c[2], tonumber(c[3]) * 1000)
  else
    admitted, remaining, reset_ms, used = run_rule(state, now_us, c[1], hits, c[2], c[3], c[4], c[5])
  end
  -- The epoch lives exactly as long as the state it vouches for.
  local ttl = call('PTTL', state)
  if ttl > 0 then
    call('SET', epoch, c[7], 'PX', ttl)
  else
    call('DEL', epoch)
  end
  if capped then
    -- The client's place lasts as long as its state; the set as long as its latest place.
    if ttl > 0 then
      call('ZADD', clients, now_ms + ttl, client_id)
      if call('PTTL', clients) < ttl then call('PEXPIRE', clients, ttl) end
    else
      call('ZREM', clients, client_id)
    end
  end
  local lease_at = 0
  if c[1] == 'concurrency' and admitted == 1 and tonumber(hits) > 0 then
    lease_at = lease_expiry(now_us, tonumber(c[3]))
  end
  return {admitted, remaining, reset_ms, used, tonumber(c[6]), per_client and 1 or 0, lease_at}
elseif op == 'release' then
  local c = call('HMGET', config, 'rule', 'a', 'gen', 'pc')
  if not c[1] then return {} end
  if c[1] ~= 'concurrency' then return {-4} end
  local state, epoch = KEYS[2], KEYS[3]
  if c[4] == '1' then
    if not has_client then return {-1} end
    state, epoch = KEYS[4], KEYS[5]
  end
  -- A state of another generation holds no lease this config gave: nothing to give back.
  local given, held = 0, 0
  if call('GET', epoch) == c[3] then
    given, held = concurrency_release_at(state, now_us, tonumber(ARGV[4]), tonumber(ARGV[5]))
  end
  local remaining = tonumber(c[2]) - held
  if remaining < 0 then remaining = 0 end
  return {given, remaining}
end
return redis.error_reply('sluice: unknown limiter operation ' .. tostring(op))
