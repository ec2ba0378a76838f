#!/usr/bin/env bash
# Cross-builds bonsai and its tests for aarch64 (arm64) Linux on an x86-64
# Debian 12 host, into ${BUILD_DIR:-build-arm64} (Release; no benchmarks).
# Installs what it needs once (skipped when everything is there): the cross
# compiler, qemu-user (runs the binaries: scripts/test-arm64.sh) and the
# arm64 builds of the -dev packages of setup.sh's PKGS (multiarch: dpkg
# --add-architecture arm64). Header-only packages (Architecture: all) serve
# both architectures from setup.sh's install. Extra cmake arguments are
# passed through (e.g. -DBONSAI_BUILD_TESTS=OFF); TARGETS="a b" builds only those.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# setup.sh's native packages first (cmake, ninja, ccache, header-only -dev).
if ! installed cmake || ! installed ninja-build || ! installed nlohmann-json3-dev || ! installed libcli11-dev; then
  ./scripts/setup.sh >/dev/null  # (also builds ./build; CI runs it anyway)
fi

# The arm64 libraries the build links (setup.sh's PKGS that ship a library
# or arch-specific headers); libboost-dev: Beast/Asio headers (arch any);
# libc6 / libstdc++6: the runtime qemu-aarch64 loads the binaries with.
ARM_PKGS=(libc6 libstdc++6 libgtest-dev libgmock-dev libcpp-httplib-dev libboost-dev libtomlplusplus-dev
          libspdlog-dev libfmt-dev libpcre2-dev libutf8proc-dev libcurl4-openssl-dev libssl-dev)
HOST_PKGS=(g++-aarch64-linux-gnu qemu-user-static)
missing=()
for p in "${HOST_PKGS[@]}"; do installed "$p" || missing+=("$p"); done
for p in "${ARM_PKGS[@]}"; do installed "$p:arm64" || missing+=("$p:arm64"); done
if ((${#missing[@]})); then
  echo "cross-arm64: installing ${missing[*]}"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

BUILD_DIR="${BUILD_DIR:-build-arm64}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchain-aarch64.cmake" -DBONSAI_BUILD_BENCH=OFF "$@" >/dev/null
if [ -n "${TARGETS:-}" ]; then
  # shellcheck disable=SC2086  # TARGETS is a list of target names
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target $TARGETS
else
  cmake --build "$BUILD_DIR" -j "$(nproc)"
fi
echo "cross-arm64: built $BUILD_DIR/apps/bonsai/bonsai (aarch64)"
