-- Entry point of the lean decision scripts of the algorithms other than the fixed window (whose
-- common request takes plain commands, or fixed_window_lean.lua): a call whose checks all use
-- one algorithm and are each charged on their own (store::Charging::Each, no group of limits).
-- There is one such script per algorithm: common.lua, that algorithm's file, calls.lua, one line
-- that src/store/redis/script.rs writes, `local decide_one, ALGORITHM_ARGS = <function>, <n>`,
-- and this file. So a call defines only the functions it runs, and parses no charging mode, flags,
-- algorithm names or unused arguments; decide.lua, which has the trial pass, takes the rest.
--
-- ARGV[1] is empty in production, and Redis's clock (TIME) is used; tests that pin time put
-- microseconds there. ARGV[2] says which calls the call carries (calls.lua). Then follow the
-- checks, ALGORITHM_ARGS + 2 arguments each: the hits, the algorithm's own arguments, and '1' when
-- refused hits are to be charged too (record_refused_hits) or ''. Check i uses KEYS[i]. A call's
-- reply is decide.lua's: four integers per check, admitted (0/1), remaining, reset in
-- milliseconds, and what the algorithm counts as used.

-- Needed on Redis 3.2-4.x to write after reading TIME; a no-op from Redis 5 on.
if redis.replicate_commands then redis.replicate_commands() end

-- Mirrored in src/store/redis/script.rs (a test checks they agree).
local REPLY_PER_CHECK = 4

local args_per_check = ALGORITHM_ARGS + 2
local now_us = script_now()

-- Decides check `check`: its four numbers.
local function decide_check(check)
  local at = 3 + (check - 1) * args_per_check
  local final = at + ALGORITHM_ARGS
  -- Every algorithm but the fixed window takes (key, now_us, hits, record, its arguments...):
  -- see dispatch.lua.
  return decide_one(KEYS[check], now_us, ARGV[at], ARGV[final + 1] == '1',
    unpack(ARGV, at + 1, final))
end

-- Decides checks first..last: their reply, as one call of them gets it. A call of one check,
-- the common one and every call of a merge at one descriptor a request, gets its reply built
-- whole: a table filled a slot at a time is resized as it grows, which was 5 % of the GCRA
-- script's instructions inside Redis (docs/BENCHMARKS.md, "the two targets left").
local function decide_checks(first, last)
  if first == last then return { decide_check(first) } end
  local reply = {}
  for check = first, last do
    local base = (check - first) * REPLY_PER_CHECK
    reply[base + 1], reply[base + 2], reply[base + 3], reply[base + 4] = decide_check(check)
  end
  return reply
end

return answer_calls(decide_checks)
