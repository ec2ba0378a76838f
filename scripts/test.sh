#!/usr/bin/env bash
# Runs the whole test suite: builds (via setup.sh), then ctest. Fixtures are
# read from ../shared (override with BONSAI_SHARED); under CI=true a missing
# fixture fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Test-only packages: headless Chromium for the web chat page's browser test,
# iproute2's `ss` (the listen-backlog test), nginx (the scale-out test runs
# /usr/sbin/nginx with its own configuration; the package's service is not used).
if ! command -v chromium >/dev/null 2>&1 || ! command -v ss >/dev/null 2>&1 || [ ! -x /usr/sbin/nginx ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "test: installing chromium iproute2 nginx (test-only)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium iproute2 nginx >/dev/null
fi
BUILD_DIR="${BUILD_DIR:-build}"
./scripts/fuzz.sh "${FUZZ_SECONDS:-60}"  # GGUF reader under libFuzzer+ASan/UBSan; fails on any crash
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
