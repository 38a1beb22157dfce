#!/usr/bin/env bash
# Measures how long Envoy's call to Sluice takes on this machine: the shipped envoy.yaml in front
# of Sluice on Redis, 500 requests/s, once quiet and once with one core kept busy by a shell
# loop. Prints p50/p99/max of Envoy's own histogram of its calls to the `sluice` cluster and of
# the client's round trip through Envoy. The figures in deploy/envoy/README.md (timeout) and
# docs/reliability.md come from it; run it where you deploy before you change the timeouts.
#
#   scripts/envoy-latency.sh                              # 3000 requests per run
#   SLUICE_LATENCY_REQUESTS=10000 scripts/envoy-latency.sh
#   scripts/envoy-latency.sh --release                    # an optimised Sluice (slower to build)
#
# Needs Envoy (SLUICE_TEST_ENVOY, or the virtualenv scripts/test.sh installs) and redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SLUICE_TEST_ENVOY:-}" ]; then
  SLUICE_TEST_ENVOY="${SLUICE_TEST_TOOLS:-$HOME/.cache/sluice-test}/envoy-venv/bin/envoy"
  export SLUICE_TEST_ENVOY
fi
cargo test --quiet "$@" --test it envoy_filter::measure_ratelimit_call_latency \
  -- --ignored --nocapture --test-threads 1 2>&1 | grep -E '^\||requests per row'
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
