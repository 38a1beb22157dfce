#!/usr/bin/env bash
# The container image as the test command builds it, without a registry (none is reachable on
# the CI machines): podman builds deploy/docker/Dockerfile's `runtime-prebuilt` stage around a
# binary cargo already built, on a Debian base made here by debootstrap.
#
#   scripts/image.sh setup               installs podman, runc and debootstrap when missing, and
#                                        makes the base images once (kept in podman's store)
#   scripts/image.sh build BINARY        builds the image of BINARY (stripped on the way in)
#                                        and prints its name
#
# `setup` is what scripts/test.sh runs; the tests (crates/sluice-test-kit/src/container.rs) run `build` with
# the binary they were built with, so the image they start is never stale. Both print what
# each part took, for the CI time budget. Why the debug binary, and how users build the image
# instead: deploy/README.md ("The image in the tests").
set -euo pipefail
cd "$(dirname "$0")/.."

# The base every image here starts from: Debian bookworm, minbase variant (what the
# Dockerfile's default `debian:bookworm-slim` is, give or take documentation and locales).
BASE=localhost/sluice-base:bookworm
# The base plus Debian's redis-server, for the test that runs Redis in its own container.
REDIS=localhost/sluice-redis:bookworm
# Where the tests' images go, one tag per binary.
TEST_IMAGES=localhost/sluice-test
# crun, podman's default runtime, cannot run on these hosts (hybrid cgroups, rlimits it may
# not raise): /work/shared/reference/containers.md.
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/tests/containers/containers.conf}"

timed() {
  local what=$1 start=$SECONDS
  shift
  "$@"
  echo "image.sh: $what took $((SECONDS - start)) s" >&2
}

install_tools() {
  echo "installing podman runc debootstrap (needed by the image tests)" >&2
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq podman runc debootstrap >/dev/null
}

make_base() {
  local rootfs
  rootfs=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$rootfs" >/dev/null
  # What debian:bookworm-slim leaves out too: the downloaded packages and the package lists.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --quiet - "$BASE" >/dev/null
  rm -rf "$rootfs"
}

make_redis() {
  podman build --quiet --isolation chroot --build-arg "BASE_IMAGE=$BASE" -t "$REDIS" \
    -f tests/containers/redis.Containerfile tests/containers >/dev/null
}

setup() {
  if ! command -v podman >/dev/null || ! command -v runc >/dev/null \
    || ! command -v debootstrap >/dev/null; then
    timed "installing podman" install_tools
  fi
  podman image exists "$BASE" || timed "making $BASE (debootstrap)" make_base
  podman image exists "$REDIS" || timed "making $REDIS" make_redis
}

# The build context holds only the binary and the default config, so nothing else is sent.
# The tag is the stripped binary's digest: a run from another checkout building another binary
# never replaces an image in use. Test images over a day old are removed on the way (one in use
# by a container is refused by podman, and kept).
build() {
  local binary=$1 context tag
  context=$(mktemp -d)
  strip -o "$context/sluice" "$binary"
  cp -r examples/config "$context/config"
  tag="$TEST_IMAGES:$(sha256sum "$context/sluice" | cut -c1-16)"
  if ! podman image exists "$tag"; then
    # Docker's format: the OCI format has no HEALTHCHECK, and podman would drop it.
    podman build --quiet --isolation chroot --format docker --target runtime-prebuilt \
      --build-arg "BASE_IMAGE=$BASE" --ignorefile /dev/null \
      -f deploy/docker/Dockerfile -t "$tag" "$context" >/dev/null
  fi
  rm -rf "$context"
  podman images --quiet --filter "reference=$TEST_IMAGES" --filter until=24h \
    | xargs -r podman rmi >/dev/null 2>&1 || true
  echo "$tag"
}

case "${1:-}" in
  setup) setup ;;
  build) [ $# -eq 2 ] || { echo "usage: $0 build BINARY" >&2; exit 2; }
         podman image exists "$BASE" || { echo "no $BASE: run $0 setup" >&2; exit 1; }
         timed "building the image of $2" build "$2" ;;
  *) echo "usage: $0 setup | build BINARY" >&2; exit 2 ;;
esac
