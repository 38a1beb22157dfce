-- Entry point of the decision script: decides a batch of checks in one atomic call.
--
-- The other files in this directory are prepended to this one to form a single script (see
-- src/store/redis/script.rs), so it can call their functions.
--
-- ARGV[1] is empty in production, and Redis's clock (TIME) is used; tests that pin time put
-- microseconds there. ARGV[2] says which checks are charged (store::Charging): '' every one;
-- 'stop' (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) only those that would go over, when any
-- would, the others being only looked at; 'look' none. Then follow the checks, ARGS_PER_CHECK
-- arguments each: the algorithm name, the hits, that algorithm's four arguments (unused ones
-- are empty), and '1' when refused hits are to be charged too (record_refused_hits) or ''.
-- Check i uses KEYS[i]. The reply is four integers per check: admitted (0/1), remaining, reset
-- in milliseconds, and what the algorithm counts as used.

-- Needed on Redis 3.2-4.x to write after reading TIME; a no-op from Redis 5 on.
if redis.replicate_commands then redis.replicate_commands() end

-- All three mirrored in src/store/redis/script.rs (a test checks they agree).
local LEADING_ARGS = 2
local ARGS_PER_CHECK = 7
local REPLY_PER_CHECK = 4

local now_us = script_now()
local charging = ARGV[2]

-- Runs check `check` with `hits` (a decimal string).
local function run_check(check, hits)
  local arg = LEADING_ARGS + 1 + (check - 1) * ARGS_PER_CHECK
  return run_rule(KEYS[check], now_us, ARGV[arg], hits, ARGV[arg + 2], ARGV[arg + 3],
    ARGV[arg + 4], ARGV[arg + 5], ARGV[arg + 6] == '1')
end

local function hits_of(check)
  return ARGV[LEADING_ARGS + 2 + (check - 1) * ARGS_PER_CHECK]
end

local hits = {}
for check = 1, #KEYS do
  if charging == 'look' then hits[check] = '0' else hits[check] = hits_of(check) end
end
if charging == 'stop' then
  -- Try every check without writing (dry_run, common.lua): which would go over if charged?
  dry_run = true
  local over = {}
  local any_over = false
  for check = 1, #KEYS do
    over[check] = run_check(check, hits[check]) == 0
    any_over = any_over or over[check]
  end
  dry_run = false
  if any_over then
    for check = 1, #KEYS do
      if not over[check] then hits[check] = '0' end
    end
  end
end

local reply = {}
for check = 1, #KEYS do
  local at = (check - 1) * REPLY_PER_CHECK
  reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] = run_check(check, hits[check])
end
return reply
