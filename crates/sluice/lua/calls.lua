-- The calls one call of a lean script carries (fixed_window_lean.lua, decide_each.lua): one
-- caller's, or several callers' merged into one by src/store/redis/merge.rs, so that Redis pays a
-- script call's fixed cost (the call, the script's top level, TIME) once for them all.
--
-- ARGV[2] is empty for one caller's call; for merged calls it lists how many checks each has, in
-- order ('2,1,3'), their keys and arguments following one another. The entry point hands
-- answer_calls a function deciding checks first..last, which returns their reply as one call of
-- them gets it. One caller's call gets that reply; merged calls get one entry per call, its reply
-- or the error that ended it, so each caller gets what its call alone would have got: the calls
-- run in order, each within pcall, and an error ends its own call only (its later checks not
-- run, as alone).

local function answer_calls(decide_checks)
  if ARGV[2] == '' then
    return decide_checks(1, #KEYS)
  end
  -- The text of an error that ended a merged call, as the error reply a call of its own would
  -- have ended with: Redis 7 raises redis.call's errors as tables, 6.2 as strings that start
  -- with the error code; Lua's own errors have no code and get ERR, as Redis gives them. (Defined
  -- here, so that one caller's call does not pay for defining it.)
  local function error_text(e)
    if type(e) == 'table' then
      e = e.err or 'ERR an error without text'
    end
    e = tostring(e)
    if not string.find(e, '^[A-Z]+ ') then
      e = 'ERR ' .. e
    end
    return e
  end
  local replies, first = {}, 1
  for checks in string.gmatch(ARGV[2], '%d+') do
    local last = first + tonumber(checks) - 1
    local ok, reply = pcall(decide_checks, first, last)
    if not ok then
      reply = { err = error_text(reply) }
    end
    replies[#replies + 1] = reply
    first = last + 1
  end
  return replies
end
