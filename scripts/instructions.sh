#!/usr/bin/env bash
# Instructions per decision, a paired A/B of commits: the method of docs/BENCHMARKS.md ("Sluice's
# own CPU per decision on the common path"), as one command.
#
#   scripts/instructions.sh OLD NEW            # two rounds, memory:1 memory:16 redis:16
#   ROUNDS=3 CELLS="memory:16" scripts/instructions.sh f555b0c HEAD
#
# Each commit is checked out in a worktree under $WORK (default /tmp/sluice-instructions) and
# built in release there (sluice and sluice-bench of that commit). Per cell (store:callers), the
# server runs under `valgrind --tool=callgrind` with the bench's config; that commit's
# sluice-bench drives it: a 2 s run, zero the counters, a 2 s run and a dump, an 8 s run and a
# dump. Instructions per decision = (long dump - short dump) / (long run's requests - short
# run's), which cancels what a run costs whatever its length. All threads, user space only.
# Counts are repeatable whatever else the machine does (BENCHMARKS.md); rounds alternate the
# commits. Prints a Markdown table. Needs valgrind and redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
work=${WORK:-/tmp/sluice-instructions}
rounds=${ROUNDS:-2}
cells=${CELLS:-memory:1 memory:16 redis:16}
[ $# -ge 1 ] || { echo "usage: $0 REV [REV...]" >&2; exit 2; }
for tool in valgrind callgrind_control redis-server python3; do
  command -v "$tool" >/dev/null || { echo "$0: $tool is needed" >&2; exit 1; }
done
mkdir -p "$work"

# Builds REV in a worktree of its own; prints the directory holding its release binaries.
build() {
  local rev sha dir
  rev=$1
  sha=$(git -C "$repo" rev-parse --short=9 "$rev")
  dir="$work/$sha"
  if [ ! -d "$dir" ]; then
    git -C "$repo" worktree add --detach "$dir" "$sha" >/dev/null 2>&1
  fi
  (cd "$dir" && CARGO_TARGET_DIR="$work/target-$sha" cargo build --quiet --release --workspace --bins) >&2
  echo "$work/target-$sha/release"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Runs one cell against the binaries in $1; prints instructions per decision.
measure() {
  local bin=$1 store=${2%%:*} callers=${2##*:}
  local tmp port redis_pid="" pid
  tmp=$(mktemp -d "$work/run.XXXXXX")
  "$bin/sluice-bench" --print-config >"$tmp/bench.yaml"
  mkdir -p "$tmp/config" && mv "$tmp/bench.yaml" "$tmp/config/"
  port=$(free_port)
  local env=(PATH="$PATH" GRPC_HOST=127.0.0.1 GRPC_PORT="$port" HOST=127.0.0.1 PORT=0
    DEBUG_PORT=0 LOG_FORMAT=json LOG_LEVEL=info LOGNAME=root USER=root)
  if [ "$store" = redis ]; then
    local rport
    rport=$(free_port)
    redis-server --port "$rport" --save '' --appendonly no --daemonize no >"$tmp/redis.log" 2>&1 &
    redis_pid=$!
    env+=(BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$rport"
      REDIS_TIMEOUT=1s REDIS_POOL_SIZE=10)
  else
    env+=(BACKEND_TYPE=memory)
  fi
  env -i "${env[@]}" valgrind --tool=callgrind --vgdb=yes \
    --callgrind-out-file="$tmp/callgrind.out" \
    "$bin/sluice" serve --config-dir "$tmp/config" >"$tmp/sluice.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    grep -q '"sluice is listening"' "$tmp/sluice.log" 2>/dev/null && break
    sleep 0.1
  done
  local run=("$bin/sluice-bench" --target "127.0.0.1:$port" --descriptors 1 --keys 10000
    --concurrency "$callers" --warmup 0 --json)
  "${run[@]}" --duration 2 >/dev/null
  LOGNAME=root HOST=127.0.0.1 callgrind_control --zero "$pid" >/dev/null
  "${run[@]}" --duration 2 >"$tmp/short.json"
  LOGNAME=root HOST=127.0.0.1 callgrind_control --dump=short "$pid" >/dev/null
  "${run[@]}" --duration 8 >"$tmp/long.json"
  LOGNAME=root HOST=127.0.0.1 callgrind_control --dump=long "$pid" >/dev/null
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
  [ -n "$redis_pid" ] && { kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true; }
  python3 - "$tmp" <<'EOF'
import glob, json, sys
tmp = sys.argv[1]
def total(tag):
    [path] = [p for p in glob.glob(f"{tmp}/callgrind.out*") if open(p).read(4096).find(f"Trigger: dump {tag}\n") >= 0]
    for line in open(path):
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
def requests(name):
    r = json.load(open(f"{tmp}/{name}.json"))
    return r["ok"] + r["over_limit"] + r["unknown"] + r["errors"]
print(round((total("long") - total("short")) / (requests("long") - requests("short"))))
EOF
  rm -rf "$tmp"
}

declare -A bins
for rev in "$@"; do
  echo "building $rev" >&2
  bins[$rev]=$(build "$rev")
done
declare -A results
for round in $(seq "$rounds"); do
  for rev in "$@"; do
    for cell in $cells; do
      n=$(measure "${bins[$rev]}" "$cell")
      echo "round $round, $rev, $cell: $n" >&2
      results[$rev,$cell]+="${results[$rev,$cell]:+, }$n"
    done
  done
done
printf '| cell |'; for rev in "$@"; do printf ' %s |' "$rev"; done; echo
printf '|---|'; for _ in "$@"; do printf -- '--:|'; done; echo
for cell in $cells; do
  printf '| %s |' "$cell"
  for rev in "$@"; do printf ' %s |' "${results[$rev,$cell]}"; done
  echo
done
