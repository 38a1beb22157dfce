-- GCRA: one number per key, the theoretical arrival time (TAT, microseconds). Also the token
-- bucket (capacity `burst`, one token per `interval`) and the leaky bucket as a meter: with
-- tokens = burst - (TAT - now) / interval the three admission rules are the same inequality.
-- The key expires when the bucket would be full again. Twin of gcra in src/store/algorithms.rs.
local function gcra(key, now, hits, interval, burst, record)
  hits, interval, burst = tonumber(hits), tonumber(interval), tonumber(burst)
  local tat = now
  local stored = call('GET', key)
  -- A TAT in the future is kept when the clock steps back: no tokens are minted.
  if stored and tonumber(stored) > now then tat = tonumber(stored) end
  local capacity = burst * interval
  local function tokens(t)
    local backlog = t - now
    if backlog > capacity then backlog = capacity end
    return floor((capacity - backlog) / interval)
  end
  -- Refused, still charged: the hits are taken in full, past empty into a debt of at most one
  -- bucket, which the refill pays back before anything is admitted again.
  local function charge()
    local charged = math.min(tat + math.min(hits * interval, capacity), now + 2 * capacity)
    if charged > tat then
      tat = charged
      write('SET', key, string.format('%.0f', tat), 'PX', micros_to_ms(tat - now))
    end
  end
  if hits > burst then
    if record then charge() end
    local remaining = tokens(tat)
    return 0, remaining, micros_to_ms(tat - now), burst - remaining
  end
  -- A zero-cost check is decided as a one-hit request and counts nothing.
  local probe_tat = tat + math.max(hits, 1) * interval
  if probe_tat - now <= capacity then
    local new_tat = tat + hits * interval
    local remaining = tokens(new_tat)
    if hits > 0 and new_tat > now then
      write('SET', key, string.format('%.0f', new_tat), 'PX', micros_to_ms(new_tat - now))
    end
    return 1, remaining, micros_to_ms(new_tat - now), burst - remaining
  end
  if record and hits > 0 then charge() end
  local remaining = tokens(tat)
  return 0, remaining, micros_to_ms(tat + math.max(hits, 1) * interval - now - capacity),
    burst - remaining
end
