-- Entry point of the lean decision script, for the common request: every check a plain fixed
-- window, every check charged (store::Charging::Each). It only counts: per check it runs
-- fixed_window_count (common.lua, fixed_window.lua and calls.lua are prepended, so the INCRBY, the PEXPIRE
-- on a new key and the TTL repair are the full script's code) and returns the count; Rust judges
-- it (admitted, remaining, reset) with the memory store's arithmetic,
-- store::algorithms::fixed_window_outcome, against the time this script read. So per check
-- Redis parses two arguments and writes one integer, where the full script (decide.lua) takes
-- seven and returns four; and no charging mode, algorithm names, tables of hits or other
-- algorithms' functions. src/store/redis/script.rs says when it is used.
--
-- ARGV[1] is empty in production, and Redis's clock (TIME) is used; tests that pin time put
-- microseconds there. ARGV[2] says which calls the call carries (calls.lua). Then follow the
-- checks, ARGS_PER_CHECK arguments each: hits and ttl_ms (fixed_window_count's). Check i uses
-- KEYS[i]. A call's reply is LEADING_REPLY integers, the time read in microseconds, then
-- REPLY_PER_CHECK per check, its count after its hits.

-- Needed on Redis 3.2-4.x to write after reading TIME; a no-op from Redis 5 on.
if redis.replicate_commands then redis.replicate_commands() end

-- All three mirrored in src/store/redis/script.rs (a test checks they agree).
local ARGS_PER_CHECK = 2
local LEADING_REPLY = 1
local REPLY_PER_CHECK = 1

local now_us = script_now()

-- Counts checks first..last: their reply, as one call of them gets it.
local function count_checks(first, last)
  local reply = { now_us }
  for check = first, last do
    local arg = 3 + (check - 1) * ARGS_PER_CHECK
    reply[LEADING_REPLY + (check - first + 1) * REPLY_PER_CHECK] = fixed_window_count(KEYS[check],
      ARGV[arg], ARGV[arg + 1])
  end
  return reply
end

return answer_calls(count_checks)
