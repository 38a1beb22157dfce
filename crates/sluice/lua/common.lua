-- Helpers shared by the algorithm files and the entry points (each script is a concatenation; see
-- src/store/redis/script.rs).

-- Locals for the globals the algorithms use per check: a local is a register, a global a table
-- lookup, and a decision runs these once per descriptor.
local call, tonumber, floor, ceil = redis.call, tonumber, math.floor, math.ceil

-- While true, the algorithms decide without writing anything (decide.lua's trial pass for
-- STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT): `write` skips the call, and the fixed window reads
-- its count instead of incrementing it. Only the sliding-window log still drops members that
-- left its window, which changes no answer.
local dry_run = false

-- A call that changes a key, skipped in a dry run.
local function write(...)
  if not dry_run then return call(...) end
end

-- Whole milliseconds, rounded up and at least 1: a reset is never reported as zero.
local function micros_to_ms(us)
  local ms = ceil(us / 1000)
  if ms < 1 then ms = 1 end
  return ms
end

-- The current time in microseconds: Redis's clock, or the time pinned by a test in ARGV[1].
local function script_now()
  if ARGV[1] ~= '' then return tonumber(ARGV[1]) end
  local time = call('TIME')
  return tonumber(time[1]) * 1000000 + tonumber(time[2])
end
