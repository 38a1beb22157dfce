-- Guava's SmoothWarmingUp as an admission rule: a hash {s = stored permits in millionths,
-- n = next free time}. A request is admitted when the previous one's wait has passed, and pushes
-- the next free time out by its own cost, which is higher while the limiter is cold. A single
-- request may cost at most `permits` (one unit's worth). Twin of warm_up in
-- src/store/algorithms.rs; the float expressions are written in the same order so both round
-- alike.
local function warm_up(key, now, hits, record, permits, window, warmup, cold_factor)
  hits, permits, window = tonumber(hits), tonumber(permits), tonumber(window)
  warmup, cold_factor = tonumber(warmup), tonumber(cold_factor)
  local stable = window / permits
  local cold = stable * cold_factor
  local threshold = 0.5 * warmup / stable
  local max_permits = threshold + 2.0 * warmup / (stable + cold)
  local slope = (cold - stable) / (max_permits - threshold)
  local cool_down = warmup / max_permits
  local state = call('HMGET', key, 's', 'n')
  local stored, next_free
  if state[1] and state[2] then
    stored = tonumber(state[1]) / 1e6
    next_free = tonumber(state[2])
  else
    -- A new limiter starts cold, as Guava's does.
    stored = max_permits
    next_free = now
  end
  if now > next_free then
    stored = math.min(max_permits, stored + (now - next_free) / cool_down)
    next_free = now
  end
  local admitted = hits <= permits and next_free <= now
  if admitted and hits > 0 then
    local spend = math.min(hits, stored)
    -- Time to take `spend` stored permits: the area under the interval curve above threshold.
    local above = stored - threshold
    local take = spend
    local micros = 0
    if above > 0 then
      local used = math.min(above, take)
      local length = stable + above * slope + (stable + (above - used) * slope)
      micros = used * length / 2.0
      take = take - used
    end
    local wait = micros + stable * take + (hits - spend) * stable
    next_free = next_free + floor(wait)
    stored = stored - spend
  end
  local recorded = not admitted and record and hits > 0
  if recorded then
    -- Refused, still charged: the next free time moves by the hits' stable cost, to one window
    -- from now at most (and never back).
    local pushed = next_free + floor(hits * stable)
    if pushed > now + window then pushed = now + window end
    if pushed > next_free then next_free = pushed end
  end
  local free_in = next_free - now
  if free_in < 0 then free_in = 0 end
  local ttl = free_in + ceil((max_permits - stored) * cool_down)
  if ttl < 1 then ttl = 1 end
  if (admitted and hits > 0) or recorded then
    write('HSET', key, 's', string.format('%.0f', floor(stored * 1e6)),
      'n', string.format('%.0f', next_free))
    write('PEXPIRE', key, micros_to_ms(ttl))
  end
  -- Any request up to `permits` is admitted once the next free time has passed.
  local remaining = 0
  if next_free <= now then remaining = permits end
  return admitted and 1 or 0, remaining, micros_to_ms(free_in), permits - remaining
end
