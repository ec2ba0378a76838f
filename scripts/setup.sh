#!/usr/bin/env bash
# Installs the build dependencies (Debian 12 packages) and builds bonsai into
# ./build (Release). Safe to re-run: apt is skipped when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(cmake ninja-build g++ clang libclang-rt-14-dev pkg-config ccache git  # libclang-rt: libFuzzer (scripts/fuzz.sh)
      libgtest-dev libgmock-dev libbenchmark-dev
      nlohmann-json3-dev libcpp-httplib-dev libboost-dev libcli11-dev libtomlplusplus-dev
      libspdlog-dev libfmt-dev libpcre2-dev libutf8proc-dev
      libcurl4-openssl-dev libssl-dev  # src/hub: -hf downloads (HTTPS, ranges) and their sha256 (OpenSSL EVP)
      curl nodejs prometheus  # server e2e test: curl, the OpenAI Node SDK, promtool
      python3-numpy)  # ../shared/tools/qwen35_ref.py (the float64 qwen35 reference the synth test runs)
# libboost-dev: Boost.Beast/Asio (header-only), the server's HTTP transport; libcpp-httplib-dev: tests' client.
# npm ships inside some nodejs builds (NodeSource); Debian packages it apart.
command -v npm >/dev/null 2>&1 || PKGS+=(npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "setup: built $BUILD_DIR/apps/bonsai/bonsai"
