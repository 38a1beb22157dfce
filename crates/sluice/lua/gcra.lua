-- GCRA: one number per key, the theoretical arrival time (TAT, microseconds). Also the token
-- bucket (capacity `burst`, one token per `interval`) and the leaky bucket as a meter: with
-- tokens = burst - (TAT - now) / interval the three admission rules are the same inequality.
-- A recorded refusal (record_refused_hits) can put the bucket in debt, of one bucket at most (the
-- TAT at most two bucket times from now). The key expires when the bucket would be full again.
-- Twin of gcra in src/store/algorithms.rs.
-- Whole tokens left when the TAT is `tat`: the backlog beyond now, at most a full bucket, taken
-- from the capacity (burst * interval, microseconds).
local function gcra_tokens(tat, now, interval, capacity)
  local backlog = tat - now
  if backlog > capacity then backlog = capacity end
  return floor((capacity - backlog) / interval)
end

-- Refused, still charged: the hits are taken in full, past empty into a debt of at most one
-- bucket, which the refill pays back before anything is admitted again. Returns the new TAT.
-- Exact in doubles: a bucket spans at most 2^51 microseconds (config::check_numbers), so the
-- ceiling now + 2 * capacity stays below 2^53 until the clock passes 2^52 (the year 2112). A
-- product hits * interval beyond 2^53 (hits go up to 2^32) may round, but is then above the
-- ceiling, which the minimum picks.
local function gcra_charge(key, now, hits, interval, capacity, tat)
  local charged = math.min(tat + hits * interval, now + 2 * capacity)
  if charged > tat then
    write('SET', key, string.format('%.0f', charged), 'PX', micros_to_ms(charged - now))
    return charged
  end
  return tat
end

-- The helpers above are top-level functions rather than closures inside gcra so that a call
-- creates no function: a script's top level runs on every call anyway.
local function gcra(key, now, hits, record, interval, burst)
  hits, interval, burst = tonumber(hits), tonumber(interval), tonumber(burst)
  local tat = now
  local stored = call('GET', key)
  -- A TAT in the future is kept when the clock steps back: no tokens are minted.
  if stored and tonumber(stored) > now then tat = tonumber(stored) end
  local capacity = burst * interval
  if hits > burst then
    if record then tat = gcra_charge(key, now, hits, interval, capacity, tat) end
    local remaining = gcra_tokens(tat, now, interval, capacity)
    return 0, remaining, micros_to_ms(tat - now), burst - remaining
  end
  -- A zero-cost check is decided as a one-hit request and counts nothing.
  local probe_tat = tat + math.max(hits, 1) * interval
  if probe_tat - now <= capacity then
    local new_tat = tat + hits * interval
    local remaining = gcra_tokens(new_tat, now, interval, capacity)
    if hits > 0 and new_tat > now then
      write('SET', key, string.format('%.0f', new_tat), 'PX', micros_to_ms(new_tat - now))
    end
    return 1, remaining, micros_to_ms(new_tat - now), burst - remaining
  end
  if record and hits > 0 then tat = gcra_charge(key, now, hits, interval, capacity, tat) end
  local remaining = gcra_tokens(tat, now, interval, capacity)
  return 0, remaining, micros_to_ms(tat + math.max(hits, 1) * interval - now - capacity),
    burst - remaining
end
