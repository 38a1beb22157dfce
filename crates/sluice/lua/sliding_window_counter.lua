-- Sliding-window counter: a hash {s = window start, c = current count, p = previous count}, with
-- windows aligned to the epoch on Redis's clock. The estimate weights the previous window by the
-- share of the trailing window that still overlaps it. Twin of sliding_window_counter in
-- src/store/algorithms.rs; the float expressions are written in the same order so both round
-- alike.
local function sliding_window_counter(key, now, hits, record, limit, window)
  hits, limit, window = tonumber(hits), tonumber(limit), tonumber(window)
  local state = call('HMGET', key, 's', 'c', 'p')
  local start = tonumber(state[1]) or 0
  local current = tonumber(state[2]) or 0
  local previous = tonumber(state[3]) or 0
  -- A clock that steps back stays in the newest window seen.
  if now < start then now = start end
  local aligned = now - (now % window)
  if aligned == start + window then
    previous = current
    current = 0
  elseif aligned ~= start then
    previous = 0
    current = 0
  end
  start = aligned
  local elapsed = now - start
  local weighted = floor(previous * (window - elapsed) / window)
  local estimate = weighted + current
  -- A zero-cost check is decided as a one-hit request and counts nothing.
  local probe = math.max(hits, 1)
  local admitted = probe <= limit and estimate + probe <= limit
  local recorded = not admitted and record and hits > 0
  if admitted then
    current = current + hits
  elseif recorded then
    -- Refused, still charged: this window's count grows up to the limit.
    current = math.min(current + math.min(hits, limit), limit)
    estimate = weighted + current
  end
  local ttl = start + 2 * window - now
  local until_empty = 0
  if current > 0 then
    until_empty = ttl
  elseif previous > 0 then
    until_empty = start + window - now
  end
  local wait
  if admitted or probe > limit then
    wait = until_empty
  elseif current + probe <= limit then
    local room = limit - current - probe
    local at = floor(window - (room + 1) * window / previous) + 1
    at = math.min(math.max(at, elapsed + 1), window)
    wait = at - elapsed
  else
    local room = limit - probe
    local at = floor(window - (room + 1) * window / current) + 1
    wait = window - elapsed + math.max(at, 0)
  end
  -- A reset never exceeds the window (see the twin).
  if wait > window then wait = window end
  if ((admitted and hits > 0) or recorded) and (current > 0 or previous > 0) then
    write('HSET', key, 's', string.format('%.0f', start), 'c', current, 'p', previous)
    write('PEXPIRE', key, micros_to_ms(ttl))
  end
  local used = estimate
  if admitted then used = estimate + hits end
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  return admitted and 1 or 0, remaining, micros_to_ms(wait), used
end
