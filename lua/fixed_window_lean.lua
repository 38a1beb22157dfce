-- Entry point of the lean decision script, for the common request: every check a plain fixed
-- window, every check charged (store::Charging::Each). It decides exactly what decide.lua would
-- (common.lua and fixed_window.lua are prepended, so the counting, the TTL repair and the reply
-- are the same code), without the general script's per-call work: no charging mode, no
-- algorithm names to route on, no tables of hits, and only this chunk's few functions to define
-- (decide.lua's defines every algorithm's on every call). src/store/redis/script.rs says when it
-- is used.
--
-- ARGV[1] is empty in production, and Redis's clock (TIME) is used; tests that pin time put
-- microseconds there. Then follow the checks, ARGS_PER_CHECK arguments each: fixed_window's own
-- (hits, limit, window_ms, window_end_ms, ttl_ms). Check i uses KEYS[i]. The reply is decide.lua's:
-- four integers per check (admitted, remaining, reset in milliseconds, count).

-- Needed on Redis 3.2-4.x to write after reading TIME; a no-op from Redis 5 on.
if redis.replicate_commands then redis.replicate_commands() end

-- Both mirrored in src/store/redis/script.rs (a test checks they agree).
local ARGS_PER_CHECK = 5
local REPLY_PER_CHECK = 4

local now_ms = floor(script_now() / 1000)

local reply = {}
for check = 1, #KEYS do
  local arg = 2 + (check - 1) * ARGS_PER_CHECK
  local at = (check - 1) * REPLY_PER_CHECK
  reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] = fixed_window(KEYS[check], now_ms,
    ARGV[arg], ARGV[arg + 1], ARGV[arg + 2], ARGV[arg + 3], ARGV[arg + 4])
end
return reply
