-- Entry point of the decision script: decides a batch of checks in one atomic call.
--
-- The other files in this directory are prepended to this one to form a single script (see
-- src/store/script.rs), so it can call their functions.
--
-- ARGV[1] is empty in production, and Redis's clock (TIME) is used. Tests that pin time put
-- microseconds there. Then follow the checks, ARGS_PER_CHECK arguments each: the algorithm name
-- and that algorithm's arguments (unused ones are empty). Each check uses the next key in KEYS.
-- The reply is four integers per check: admitted (0/1), remaining, reset in milliseconds, and
-- what the algorithm counts as used.

-- Needed on Redis 3.2-4.x to write after reading TIME; a no-op from Redis 5 on.
if redis.replicate_commands then redis.replicate_commands() end

local ARGS_PER_CHECK = 6

local now_us
if ARGV[1] ~= '' then
  now_us = tonumber(ARGV[1])
else
  local time = redis.call('TIME')
  now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

local reply = {}
local key_index = 0
for arg = 2, #ARGV, ARGS_PER_CHECK do
  local algorithm = ARGV[arg]
  local a, b, c, d, e = ARGV[arg + 1], ARGV[arg + 2], ARGV[arg + 3], ARGV[arg + 4], ARGV[arg + 5]
  key_index = key_index + 1
  local key = KEYS[key_index]
  local admitted, remaining, reset_ms, used
  if algorithm == 'fixed_window' then
    admitted, remaining, reset_ms, used = fixed_window(key, math.floor(now_us / 1000), a, b, c, d, e)
  elseif algorithm == 'sliding_window_log' then
    admitted, remaining, reset_ms, used = sliding_window_log(key, now_us, a, b, c)
  elseif algorithm == 'sliding_window_counter' then
    admitted, remaining, reset_ms, used = sliding_window_counter(key, now_us, a, b, c)
  elseif algorithm == 'gcra' then
    admitted, remaining, reset_ms, used = gcra(key, now_us, a, b, c)
  elseif algorithm == 'warm_up' then
    admitted, remaining, reset_ms, used = warm_up(key, now_us, a, b, c, d, e)
  else
    return redis.error_reply('sluice: unknown algorithm ' .. tostring(algorithm))
  end
  reply[#reply + 1] = admitted
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset_ms
  reply[#reply + 1] = used
end
return reply
