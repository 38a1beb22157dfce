-- A refund (the admin API): gives back up to ARGV[3] hits to the counter KEYS[1], never past
-- empty or a full bucket. ARGV[1]: the pinned clock or ''; ARGV[2]: 'count' (fixed window: the
-- window's count, less what is given back, at least 0) or 'tat' (GCRA, token and leaky bucket:
-- the theoretical arrival time moved back ARGV[4] microseconds per hit, at most to now, when
-- the bucket is full and the key goes). Returns the hits given back. Twin of
-- MemoryStore::refund_one in src/store/memory/mod.rs.
local key, hits = KEYS[1], tonumber(ARGV[3])
if ARGV[2] == 'count' then
  local count = tonumber(call('GET', key) or '0') or 0
  local back = math.min(count, hits)
  if back > 0 then call('DECRBY', key, back) end
  return back
end
local stored = call('GET', key)
if not stored then return 0 end
local now, interval = script_now(), tonumber(ARGV[4])
local tat = tonumber(stored)
if tat <= now then return 0 end
local back = math.min(hits, ceil((tat - now) / interval))
local new_tat = tat - back * interval
if new_tat <= now then
  call('DEL', key)
else
  call('SET', key, string.format('%.0f', new_tat), 'PX', micros_to_ms(new_tat - now))
end
return back
