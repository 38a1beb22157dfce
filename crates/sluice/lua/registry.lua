-- Entry point of the registry of named limiters (native API): one sorted set, KEYS[1], whose
-- members are limiter names scored with the time (ms, Redis's clock) until which each is kept
-- while nobody uses it. It bounds how many limiters exist and lets idle ones be removed; the
-- limiters' own keys are under other hash tags, so the service deletes those itself (see
-- src/limiters.rs).
--
-- ARGV[1] is the pinned time or '', ARGV[2] the operation:
--   touch NAME IDLE_MS MAX  -> 1 registered (or kept IDLE_MS longer), 0 refused: MAX names live
--   expired AT_MOST         -> the names (at most AT_MOST) whose time has passed, removed
--   remove NAME             -> 1

local registry, op = KEYS[1], ARGV[2]
local now_ms = floor(script_now() / 1000)

if op == 'touch' then
  local name, idle, max = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
  local keep_until = string.format('%.0f', now_ms + idle)
  if call('ZSCORE', registry, name) then
    call('ZADD', registry, keep_until, name)
    return 1
  end
  -- Names whose time has passed but that the service has not removed yet do not count.
  if max > 0 and call('ZCOUNT', registry, '(' .. string.format('%.0f', now_ms), '+inf') >= max then
    return 0
  end
  call('ZADD', registry, keep_until, name)
  return 1
elseif op == 'expired' then
  local gone = call('ZRANGEBYSCORE', registry, '-inf', string.format('%.0f', now_ms),
    'LIMIT', 0, tonumber(ARGV[3]))
  if #gone > 0 then call('ZREM', registry, unpack(gone)) end
  return gone
elseif op == 'remove' then
  call('ZREM', registry, ARGV[3])
  return 1
end
return redis.error_reply('sluice: unknown registry operation ' .. tostring(op))
