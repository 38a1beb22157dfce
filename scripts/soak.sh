#!/usr/bin/env bash
# Soak run: steady closed-loop load on one store for MINUTES, with the server's RSS sampled every
# second and throughput and latency measured second by second, to see whether memory stays flat
# and p99 stable. Descriptor values come from KEYS distinct values (default 2 000 000, twice the
# memory store's default bound, so the memory store runs full and evicting the whole time).
#
#   scripts/soak.sh memory 10
#   scripts/soak.sh redis 10
#
# Writes docs/soak/<store>.json (sluice-bench's line for the whole run), <store>-seconds.jsonl
# (one line per second), <store>-rss.txt (unix second, RSS KiB, Redis used_memory bytes) and
# prints a Markdown table by minute; scripts/plot_soak.py draws docs/soak/soak.svg from them.
# Needs redis-server (for redis) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
store="${1:-memory}"
minutes="${2:-10}"
keys="${KEYS:-2000000}"
concurrency="${CONCURRENCY:-16}"
case "$store" in memory | redis) ;; *) echo "soak.sh: store is memory or redis" >&2; exit 2 ;; esac

cargo build --release --workspace --bins --quiet
bin=target/release
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

mkdir -p "$work/config" docs/soak
"$bin/sluice-bench" --print-config > "$work/config/bench.yaml"
grpc=$(free_port)
http=$(free_port)
env_vars=(GRPC_HOST=127.0.0.1 "GRPC_PORT=$grpc" HOST=127.0.0.1 "PORT=$http" LOG_LEVEL=warn)
redis_args=()
if [ "$store" = redis ]; then
  rport=$(free_port)
  redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
    --logfile "$work/redis.log" &
  pids+=($!)
  env_vars+=(BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp "REDIS_URL=127.0.0.1:$rport" REDIS_TIMEOUT=1s)
  redis_args=(--redis-url "redis://127.0.0.1:$rport")
  sleep 0.5
fi
env "${env_vars[@]}" "$bin/sluice" serve --config-dir "$work/config" > "$work/sluice.log" 2>&1 &
server=$!
pids+=("$server")
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$http") 2>/dev/null && break
  sleep 0.1
done

rss="docs/soak/$store-rss.txt"
: > "$rss"
# Each second: unix second, the server's RSS in KiB, and Redis's used_memory in bytes (redis only).
(while kill -0 "$server" 2>/dev/null; do
  redis_used=""
  if [ "$store" = redis ]; then
    redis_used=$(redis-cli -p "$rport" INFO memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}')
  fi
  echo "$(date +%s) $(awk '/^VmRSS/ {print $2}' "/proc/$server/status") $redis_used"
  sleep 1
done >> "$rss") &
pids+=($!)

# One run for the whole soak, so there is no gap or reconnect between minutes; latency is also
# kept second by second.
seconds="docs/soak/$store-seconds.jsonl"
"$bin/sluice-bench" --target "127.0.0.1:$grpc" --server-pid "$server" "${redis_args[@]}" \
  --keys "$keys" --concurrency "$concurrency" --duration $((minutes * 60)) --warmup 0 \
  --per-second "$seconds" --json > "docs/soak/$store.json"
kill -0 "$server" || { echo "soak: the server died" >&2; exit 1; }

python3 scripts/plot_soak.py --table "$store"
