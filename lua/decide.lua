-- Entry point of the decision script: decides a batch of checks in one atomic call.
--
-- The other files in this directory are prepended to this one to form a single script (see
-- src/store/redis/script.rs), so it can call their functions.
--
-- ARGV[1] is empty in production, and Redis's clock (TIME) is used; tests that pin time put
-- microseconds there. Then follow the checks, ARGS_PER_CHECK arguments each: the algorithm name,
-- the hits, that algorithm's four arguments (unused ones are empty), and '1' when refused hits
-- are to be charged too (record_refused_hits) or ''. Check i uses KEYS[i]. The
-- reply is four integers per check: admitted (0/1), remaining, reset in milliseconds, and what
-- the algorithm counts as used.

-- Needed on Redis 3.2-4.x to write after reading TIME; a no-op from Redis 5 on.
if redis.replicate_commands then redis.replicate_commands() end

-- Both mirrored in src/store/redis/script.rs (a test checks they agree).
local ARGS_PER_CHECK = 7
local REPLY_PER_CHECK = 4

local now_us = script_now()
local reply = {}
for check = 1, #KEYS do
  local arg = 2 + (check - 1) * ARGS_PER_CHECK
  local at = (check - 1) * REPLY_PER_CHECK
  reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] = run_rule(KEYS[check], now_us,
    ARGV[arg], ARGV[arg + 1], ARGV[arg + 2], ARGV[arg + 3], ARGV[arg + 4], ARGV[arg + 5],
    ARGV[arg + 6] == '1')
end
return reply
