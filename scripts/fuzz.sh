#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for a bounded time, one after the other (docs/fuzzing.md).
#
#   scripts/fuzz.sh                    # each target 60 s
#   scripts/fuzz.sh 300                # each target 300 s
#   scripts/fuzz.sh 30 request         # only the named target(s)
#   FUZZ_ENGINE=plain scripts/fuzz.sh  # force the stable, uninstrumented runner
#   FUZZ_PROFILE=dev scripts/fuzz.sh   # plain runner built in the dev profile
#   FUZZ_PLAIN=target/debug/plain scripts/fuzz.sh  # a plain runner already built (scripts/test.sh)
#
# Engines: `libfuzzer` (cargo-fuzz, coverage-guided; needs `cargo install cargo-fuzz` and works
# on stable through RUSTC_BOOTSTRAP=1) or `plain` (src/bin/plain.rs in fuzz/: random mutations
# without coverage, stable Rust only; built with the workspace, in FUZZ_PROFILE, default release:
# the test command passes dev, whose build it already has, and fuzzes fewer inputs a second).
# `auto` (the default) picks libfuzzer when cargo-fuzz is installed. Corpora grow in fuzz/corpus/<target> (ignored by git), seeded from fuzz/seeds/<target>;
# crashes land in fuzz/artifacts/<target>. Exit status: 0 when no target found anything.
#
# Environment: FUZZ_SECONDS (default 60), FUZZ_ENGINE (auto|libfuzzer|plain), FUZZ_PLAIN, FUZZ_RSS_MB
# (memory cap per target, default 2048), CARGO_TARGET_DIR (libFuzzer's builds; default
# fuzz/target; the plain runner uses the workspace's target directory), FUZZ_PROFILE, FUZZ_ARGS
# (extra libFuzzer flags, e.g. "-jobs=2").
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
fuzz_dir="$root/fuzz"
seconds="${1:-${FUZZ_SECONDS:-60}}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(config_loader request)
fi
engine="${FUZZ_ENGINE:-auto}"
rss_mb="${FUZZ_RSS_MB:-2048}"
target_dir="${CARGO_TARGET_DIR:-$fuzz_dir/target}"
profile="${FUZZ_PROFILE:-release}"

if [ "$engine" = auto ]; then
    if cargo fuzz --version >/dev/null 2>&1; then engine=libfuzzer; else engine=plain; fi
fi
echo "fuzz: engine $engine, $seconds s per target, targets: ${targets[*]}"

# Each target's inputs are capped by size: configs may be large (deep nesting needs bytes),
# requests are protobuf messages of a few descriptors.
max_len() {
    case "$1" in
        config_loader) echo 65536 ;;
        *) echo 16384 ;;
    esac
}

failed=()
for target in "${targets[@]}"; do
    corpus="$fuzz_dir/corpus/$target"
    seeds="$fuzz_dir/seeds/$target"
    artifacts="$fuzz_dir/artifacts/$target"
    mkdir -p "$corpus" "$artifacts"
    log="$fuzz_dir/artifacts/$target.log"
    echo "fuzz: $target (log: $log)"
    status=0
    case "$engine" in
        libfuzzer)
            # Stable rustc accepts cargo-fuzz's -Z flags only with RUSTC_BOOTSTRAP; a nightly
            # toolchain does not need it and ignores it.
            (cd "$fuzz_dir" && RUSTC_BOOTSTRAP=1 cargo fuzz run --features libfuzzer \
                --target-dir "$target_dir/fuzz" "$target" "$corpus" "$seeds" -- \
                -max_total_time="$seconds" -max_len="$(max_len "$target")" \
                -rss_limit_mb="$rss_mb" -timeout=10 -print_final_stats=1 \
                ${FUZZ_ARGS:-}) >"$log" 2>&1 || status=$?
            grep -E '^(stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb|Done [0-9]+ runs)' "$log" || true
            ;;
        plain)
            plain="${FUZZ_PLAIN:-}"
            if [ -z "$plain" ]; then
                cargo build --quiet --locked --manifest-path "$root/Cargo.toml" \
                    --profile "$profile" -p sluice-fuzz --bin plain || exit 1
                plain="$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" \
                    | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
                plain="$plain/$([ "$profile" = dev ] && echo debug || echo "$profile")/plain"
            fi
            # The worker process is what can run away with memory; ulimit caps it (kB).
            (ulimit -v $((rss_mb * 1024 * 4)) && "$plain" "$target" \
                --seconds "$seconds" --max-len "$(max_len "$target")" \
                --artifacts "$artifacts" "$corpus" "$seeds") >"$log" 2>&1 || status=$?
            grep -E '^plain: ' "$log" || true
            ;;
        *)
            echo "fuzz: unknown FUZZ_ENGINE $engine" >&2
            exit 2
            ;;
    esac
    if [ "$status" -ne 0 ]; then
        echo "fuzz: $target FAILED (exit $status); last lines of $log:"
        tail -n 25 "$log"
        failed+=("$target")
    fi
done

if [ ${#failed[@]} -ne 0 ]; then
    echo "fuzz: findings in: ${failed[*]} (inputs in fuzz/artifacts/)"
    exit 1
fi
echo "fuzz: no findings"
