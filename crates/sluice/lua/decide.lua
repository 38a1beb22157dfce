-- Entry point of the decision script: decides a batch of checks in one atomic call.
--
-- The other files in this directory are prepended to this one to form a single script (see
-- src/store/redis/script.rs), so it can call their functions.
--
-- ARGV[1] is empty in production, and Redis's clock (TIME) is used; tests that pin time put
-- microseconds there. ARGV[2] says which checks are charged (store::Charging): '' every one;
-- 'stop' (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) only those that would go over, when any
-- would, the others being only looked at; 'look' none. Then follow the checks, ARGS_PER_CHECK
-- arguments each: the algorithm name, the hits, that algorithm's four arguments (unused ones
-- are empty), and '1' when refused hits are to be charged too (record_refused_hits) or '',
-- prefixed with '<group>:' for a check of a group (the limits of one descriptor's rate_limits,
-- all or nothing). Check i uses KEYS[i]. The reply is four integers per check: admitted (0/1),
-- remaining, reset in milliseconds, and what the algorithm counts as used.
--
-- Which checks are charged is store::charged_hits's rule (src/store/mod.rs), mirrored here: a
-- group in which any check would go over is charged nothing (a check of it with
-- record_refused_hits that goes over itself excepted); otherwise as the charging mode says. A
-- check that would go over and is charged nothing is answered with its trial outcome.

-- Needed on Redis 3.2-4.x to write after reading TIME; a no-op from Redis 5 on.
if redis.replicate_commands then redis.replicate_commands() end

-- All three mirrored in src/store/redis/script.rs (a test checks they agree).
local LEADING_ARGS = 2
local ARGS_PER_CHECK = 7
local REPLY_PER_CHECK = 4

local now_us = script_now()
local charging = ARGV[2]

-- Per check: its group (nil on its own) and whether refused hits are charged.
local group, record = {}, {}
local any_group = false
for check = 1, #KEYS do
  local flags = ARGV[LEADING_ARGS + ARGS_PER_CHECK + (check - 1) * ARGS_PER_CHECK]
  -- A check on its own ('' or '1') costs two comparisons; only a group's needs the pattern.
  if flags == '' or flags == '1' then
    record[check] = flags == '1'
  else
    local g, r = string.match(flags, '^(%d+):(.*)$')
    if not g then error('sluice: bad check flags ' .. flags) end
    group[check], record[check], any_group = g, r == '1', true
  end
end

-- Runs check `check` with `hits` (a decimal string).
local function run_check(check, hits)
  local arg = LEADING_ARGS + 1 + (check - 1) * ARGS_PER_CHECK
  return run_rule(KEYS[check], now_us, ARGV[arg], hits, ARGV[arg + 2], ARGV[arg + 3],
    ARGV[arg + 4], ARGV[arg + 5], record[check])
end

local function hits_of(check)
  return ARGV[LEADING_ARGS + 2 + (check - 1) * ARGS_PER_CHECK]
end

local hits = {}
for check = 1, #KEYS do
  if charging == 'look' then hits[check] = '0' else hits[check] = hits_of(check) end
end
local over, tried = {}, {}
if charging == 'stop' or (charging ~= 'look' and any_group) then
  -- Try every check without writing (dry_run, common.lua): which would go over if charged? As
  -- store::trial (src/store/mod.rs) says, a unit at a time (a group, or a check on its own, in
  -- the order of its first check), each check tried with its hits plus those the units before
  -- it will charge to the same key, so a descriptor that comes twice in one request is judged
  -- as the second copy, not as if it came alone.
  dry_run = true
  local pending, done = {}, {}
  local any_over = false
  local group_over = {}
  for first = 1, #KEYS do
    if not done[first] then
      local unit = { first }
      local g = group[first]
      if g then
        for check = first + 1, #KEYS do
          if group[check] == g then unit[#unit + 1] = check end
        end
      end
      for _, check in ipairs(unit) do
        local h = hits[check]
        local before = pending[KEYS[check]]
        if before then h = string.format('%.0f', before + tonumber(h)) end
        local admitted, remaining, reset, used = run_check(check, h)
        over[check] = admitted == 0
        tried[check] = { admitted, remaining, reset, used }
        any_over = any_over or over[check]
        if over[check] and g then group_over[g] = true end
        done[check] = true
      end
      for _, check in ipairs(unit) do
        local charged
        if g and group_over[g] then
          charged = over[check] and record[check]
        else
          charged = (not over[check]) or record[check]
            or ARGV[LEADING_ARGS + 1 + (check - 1) * ARGS_PER_CHECK] == 'fixed_window'
        end
        local n = tonumber(hits[check])
        if charged and n > 0 then pending[KEYS[check]] = (pending[KEYS[check]] or 0) + n end
      end
    end
  end
  dry_run = false
  for check = 1, #KEYS do
    if group[check] and group_over[group[check]] then
      if not (over[check] and record[check]) then hits[check] = '0' end
    elseif charging == 'stop' and any_over and not over[check] then
      hits[check] = '0'
    end
  end
end

local reply = {}
for check = 1, #KEYS do
  local at = (check - 1) * REPLY_PER_CHECK
  if over[check] and hits[check] == '0' then
    local t = tried[check]
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] = t[1], t[2], t[3], t[4]
  else
    local admitted, remaining, reset, used = run_check(check, hits[check])
    if over[check] and admitted == 1 then
      -- Refused in the trial, which counted what the checks before it charge: it fits now only
      -- because fewer were charged than assumed (STOP_...), and the decision stays the trial's.
      local t = tried[check]
      admitted, remaining, reset, used = t[1], t[2], t[3], t[4]
    end
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] = admitted, remaining, reset, used
  end
end
return reply
