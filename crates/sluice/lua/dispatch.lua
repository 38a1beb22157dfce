-- Runs one algorithm on one key: the algorithm name and its arguments as src/store/redis/script.rs
-- lays them out. Shared by the full entry points (decide.lua, limiter.lua). `record` (true to
-- charge refused hits too) is nil from the named-limiter script, which never does. Every
-- algorithm but the fixed window takes (key, now_us, hits, record, then its own arguments), the
-- shape that decide_each.lua's lean scripts call them in.
local function run_rule(key, now_us, algorithm, hits, a, b, c, d, record)
  if algorithm == 'fixed_window' then
    return fixed_window(key, floor(now_us / 1000), hits, a, b, c, d)
  elseif algorithm == 'sliding_window_log' then
    return sliding_window_log(key, now_us, hits, record, a, b)
  elseif algorithm == 'sliding_window_counter' then
    return sliding_window_counter(key, now_us, hits, record, a, b)
  elseif algorithm == 'gcra' then
    return gcra(key, now_us, hits, record, a, b)
  elseif algorithm == 'warm_up' then
    return warm_up(key, now_us, hits, record, a, b, c, d)
  elseif algorithm == 'concurrency' then
    return concurrency(key, now_us, hits, record, a, b, c)
  end
  error('sluice: unknown algorithm ' .. tostring(algorithm))
end
