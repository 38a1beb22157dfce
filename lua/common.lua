-- Helpers shared by the algorithm files (the script is their concatenation; see decide.lua).

-- Locals for the globals the algorithms use per check: a local is a register, a global a table
-- lookup, and a decision runs these once per descriptor.
local call, tonumber, floor, ceil = redis.call, tonumber, math.floor, math.ceil

-- Whole milliseconds, rounded up and at least 1: a reset is never reported as zero.
local function micros_to_ms(us)
  local ms = ceil(us / 1000)
  if ms < 1 then ms = 1 end
  return ms
end
