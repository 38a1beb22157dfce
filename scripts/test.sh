#!/usr/bin/env bash
# Runs the whole test suite: unit tests, and integration tests that start their own redis-server
# processes on free ports and the real sluice binary. Installs redis-server/redis-cli (Debian
# package redis-server) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "installing redis-server (needed by the integration tests)" >&2
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq redis-server >/dev/null
  fi
fi

cargo test --locked "$@"
