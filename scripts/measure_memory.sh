#!/usr/bin/env bash
# Measures memory per key (Redis, per algorithm) and per counter (memory store) with a scratch
# redis-server on a free port. Usage: scripts/measure_memory.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize yes \
  --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
trap 'kill "$(cat "$dir/redis.pid")" 2>/dev/null || true; rm -rf "$dir"' EXIT
sleep 0.3
cargo run --release --quiet --example memory_per_key -- "redis://127.0.0.1:$port" "${1:-200000}"
