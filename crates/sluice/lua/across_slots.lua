-- Prepended to a decision entry point (decide.lua, fixed_window_lean.lua) to make its twin for a
-- Redis Cluster master: one call deciding checks whose keys are in several slots that this
-- master serves (src/store/redis/script.rs says when it is used).
--
-- The keys come in ARGV, not KEYS: Redis refuses (CROSSSLOT) a call whose declared keys are in
-- different slots, even when one node serves them all, and it checks a key that a script touches
-- without declaring only when the script touches it. A key this node does not serve (its slot
-- moved; migrating and the key not here; importing and no ASKING) would then fail the script
-- halfway, after the checks before it were counted. So every key is read once (EXISTS, through
-- redis.pcall) before anything is written, and any refusal ends the call with the status reply
-- 'ELSEWHERE <Redis's error>' and nothing written: the caller then decides those checks one slot
-- at a time, which follows MOVED and ASK. A script runs atomically, so what the reads found
-- still holds for the writes.
--
-- ARGV[1] is the number of keys n, ARGV[2]..ARGV[n + 1] the keys in check order, and the rest
-- is the entry point's own ARGV. The locals below stand for KEYS and ARGV in the rest of the
-- chunk, so the entry point and the library read them as in a call with declared keys.
local KEYS, ARGV = {}, ARGV
do
  local n = tonumber(ARGV[1])
  for i = 1, n do
    local key = ARGV[1 + i]
    local found = redis.pcall('EXISTS', key)
    if type(found) == 'table' and found.err then
      return redis.status_reply('ELSEWHERE ' .. found.err)
    end
    KEYS[i] = key
  end
  local rest = {}
  for i = n + 2, #ARGV do rest[i - n - 1] = ARGV[i] end
  ARGV = rest
end
