-- Helpers shared by the algorithm files (the script is their concatenation; see decide.lua).

-- Whole milliseconds, rounded up and at least 1: a reset is never reported as zero.
local function micros_to_ms(us)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  return ms
end
