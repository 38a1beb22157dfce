-- Concurrency: leases held at once. A hash {<expiry in microseconds> = leases}: an acquisition's
-- leases expire at now + lease rounded up to a step of lease / 64 (at least 1 ms), and those
-- rounding to one step share one field, so a key holds at most 65 fields whatever the limit and
-- the hits. A release (release == '1') gives back up to `hits` leases, soonest-expiring first,
-- and is admitted when it found them all. Twin of concurrency in src/store/concurrency.rs.
-- When leases taken at `now` expire: now + lease rounded up to the step. Twin of expiry_of in
-- src/store/concurrency.rs; the named-limiter script puts it in a lease id.
local function lease_expiry(now, lease)
  local step = floor(lease / 64)
  if step < 1000 then step = 1000 end
  local at = now + lease
  local r = math.fmod(at, step)
  if r ~= 0 then at = at + step - r end
  return at
end

-- A native API release (lua/limiter.lua): gives back up to `permits` of the leases that expire
-- at `at`, the step the lease id names, and none from any other step; nothing when that step
-- has expired or holds none. Returns what it gave back and the leases still held.
local function concurrency_release_at(key, now, at, permits)
  local fields = call('HGETALL', key)
  local held, found = 0, nil
  for i = 1, #fields, 2 do
    local t, n = tonumber(fields[i]), tonumber(fields[i + 1])
    if t > now then
      held = held + n
      if t == at then found = { fields[i], n } end
    end
  end
  if not found then return 0, held end
  local taken = math.min(permits, found[2])
  if taken == found[2] then write('HDEL', key, found[1]) else write('HINCRBY', key, found[1], -taken) end
  return taken, held - taken
end

local function concurrency(key, now, hits, record, limit, lease, release)
  hits, limit, lease = tonumber(hits), tonumber(limit), tonumber(lease)
  local fields = call('HGETALL', key)
  local live, expired, held = {}, {}, 0
  for i = 1, #fields, 2 do
    local at, n = tonumber(fields[i]), tonumber(fields[i + 1])
    if at <= now then
      expired[#expired + 1] = fields[i]
    else
      live[#live + 1] = { at, n, fields[i] }
      held = held + n
    end
  end
  if #expired > 0 then write('HDEL', key, unpack(expired)) end
  table.sort(live, function(x, y) return x[1] < y[1] end)
  local admitted, changed
  if release == '1' then
    local left = hits
    for _, e in ipairs(live) do
      if left == 0 then break end
      local taken = math.min(left, e[2])
      left = left - taken
      e[2] = e[2] - taken
      if e[2] == 0 then write('HDEL', key, e[3]) else write('HINCRBY', key, e[3], -taken) end
    end
    held = held - (hits - left)
    admitted, changed = left == 0, hits > 0
  else
    local probe = math.max(hits, 1)
    admitted = probe <= limit and held + probe <= limit
    changed = admitted and hits > 0
    if changed then
      local at = lease_expiry(now, lease)
      write('HINCRBY', key, string.format('%.0f', at), hits)
      live[#live + 1] = { at, hits }
      held = held + hits
    end
  end
  -- The last expiry among the leases still held.
  local last
  for _, e in ipairs(live) do
    if e[2] > 0 and (last == nil or e[1] > last) then last = e[1] end
  end
  local reset = 1
  if last ~= nil then
    if admitted or release == '1' then
      reset = micros_to_ms(last - now)
    elseif math.max(hits, 1) > limit then
      reset = micros_to_ms(lease)
    else
      -- When enough leases will have expired for this request to fit.
      local over = held + math.max(hits, 1) - limit
      for _, e in ipairs(live) do
        if e[2] > 0 then
          if e[2] >= over then reset = micros_to_ms(e[1] - now) break end
          over = over - e[2]
        end
      end
    end
    if changed then write('PEXPIRE', key, micros_to_ms(last - now)) end
  end
  local remaining = limit - held
  if remaining < 0 then remaining = 0 end
  return admitted and 1 or 0, remaining, reset, held
end
