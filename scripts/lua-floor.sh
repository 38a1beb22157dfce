#!/usr/bin/env bash
# The floor under every decision script: what reading and writing one key from Lua costs Redis,
# against the fixed window's plain commands (INCRBY + PEXPIRE .. NX, crates/sluice/src/store/redis/plain.rs).
#
# Issue #30 asks that no algorithm cost Redis more than 2x the fixed window per decision. GCRA,
# the sliding windows and warm-up must read a key, compute and write it back in one atomic step,
# which only a script gives; this measures such a script with no logic at all, so that the gap
# between it and the plain commands is known to be Redis's (docs/BENCHMARKS.md, "Issue #30: the
# two targets left").
#
# Each figure is Redis's own CPU (INFO cpu, user + sys) over redis-benchmark's run divided by the
# checks it made. The plain commands go 64 to a pipeline and the scripts 40 keys to a call, about
# how deep Sluice's batches and merged calls run at 64 callers, so the per-read cost of the
# socket is spread as it is there.
#
# Usage: [CALLS=N] scripts/lua-floor.sh [ROUNDS]   (N plain commands per figure, 200 000 by
# default; needs redis-server and redis-benchmark on the PATH)
set -euo pipefail
rounds=${1:-3}
calls=${CALLS:-200000}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize yes \
  --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
trap 'kill "$(cat "$dir/redis.pid")" 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping > /dev/null 2>&1 && break; sleep 0.1; done

cpu_seconds() {
  redis-cli -p "$port" info cpu | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%.6f", s }'
}

# measure CHECKS_PER_CALL PIPELINE COMMAND...: prints Redis CPU microseconds per check.
measure() {
  local per_call=$1 pipeline=$2 n=$calls before after
  shift 2
  # A script call does per_call checks: a tenth as many calls (4x the checks of a plain figure)
  # keeps each figure a few seconds long.
  ((per_call > 1)) && n=$((calls / per_call * 4))
  before=$(cpu_seconds)
  redis-benchmark -p "$port" -c 16 -P "$pipeline" -n "$n" -r 10000 "$@" > /dev/null 2>&1
  after=$(cpu_seconds)
  python3 -c "print('%.3f' % (($after - $before) * 1e6 / $n / $per_call))"
}

load() { redis-cli -p "$port" script load "$1"; }
get_only=$(load "for i = 1, #KEYS do redis.call('GET', KEYS[i]) end return 1")
get_set=$(load "redis.call('TIME')
for i = 1, #KEYS do
  redis.call('GET', KEYS[i])
  redis.call('SET', KEYS[i], '1800000000000000', 'PX', 60000)
end
return 1")
keys=()
for _ in $(seq 40); do keys+=("k:__rand_int__"); done

echo "Redis CPU µs per check ($(redis-server --version | grep -o 'v=[0-9.]*'), $calls calls per figure)"
printf '%-6s %8s %8s %10s %14s %16s %16s\n' round INCRBY PEXPIRE 'plain pair' 'Lua GET (40)' 'Lua GET+SET (40)' 'GET+SET / pair'
for round in $(seq "$rounds"); do
  # INCRBY creates the 10 000 keys that the others then find, as a busy limiter's keys are found.
  redis-cli -p "$port" flushall > /dev/null
  incr=$(measure 1 64 INCRBY k:__rand_int__ 1)
  expire=$(measure 1 64 PEXPIRE k:__rand_int__ 60000 NX)
  get=$(measure 40 4 EVALSHA "$get_only" 40 "${keys[@]}")
  both=$(measure 40 4 EVALSHA "$get_set" 40 "${keys[@]}")
  python3 -c "
pair = $incr + $expire
print('%-6s %8.3f %8.3f %10.3f %14.3f %16.3f %16.2f' % ($round, $incr, $expire, pair, $get, $both, $both / pair))"
done
