#!/usr/bin/env bash
# Runs Sluice's benchmark matrix: builds the release binaries (sluice, sluice-bench), runs
# `sluice-bench matrix` (null server, memory store, Redis, Redis Cluster; see docs/BENCHMARKS.md) and plots
# the concurrency sweep. Owns nothing but this sequence; the figures land in docs/bench/.
#
#   scripts/bench.sh            # full matrix, 10 s per run: docs/bench/latest.{jsonl,md},
#                               # docs/bench/throughput.svg
#   scripts/bench.sh --quick    # smoke test, 2 s per run: docs/bench/quick.{jsonl,md},
#                               # docs/bench/throughput-quick.svg
#
# Then `sluice-bench redis-cost` (the decision script's time inside Redis, Redis CPU and batch
# depth per workload, driving the Redis store directly): docs/bench/NAME-redis-cost.{jsonl,md}.
#
# Any other arguments go to `sluice-bench matrix` (see `sluice-bench matrix --help`).
# Needs redis-server and python3. Honours CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in redis-server python3; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "bench.sh: $tool is needed (Debian: apt-get install redis-server python3)" >&2
    exit 1
  fi
done

cargo build --release --workspace --bins
target_dir="${CARGO_TARGET_DIR:-target}"

name=latest
svg=docs/bench/throughput.svg
quick=()
for arg in "$@"; do
  if [ "$arg" = "--quick" ]; then
    name=quick
    svg=docs/bench/throughput-quick.svg
    quick=(--quick)
  fi
done

"$target_dir/release/sluice-bench" matrix "$@"
python3 scripts/plot_bench.py "docs/bench/$name.jsonl" "$svg"
"$target_dir/release/sluice-bench" redis-cost "${quick[@]}" \
  --json "docs/bench/$name-redis-cost.jsonl" > "docs/bench/$name-redis-cost.md"
cat "docs/bench/$name-redis-cost.md"
