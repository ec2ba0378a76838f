#!/usr/bin/env bash
# Builds the Debian package of bonsai (CPack's DEB generator, configured in
# packaging/CMakeLists.txt): bonsai_<version>_<arch>.deb with /usr/bin/bonsai,
# its man page, the systemd unit bonsai.service and /etc/bonsai/bonsai.toml.
# Usage: scripts/package-deb.sh [OUT_DIR]   (default: $BUILD_DIR/deb)
# Env BUILD_DIR (default build): the Release build tree to package (configured
# and built here if needed). Prints the .deb's path on the last line.
# Install: dpkg -i bonsai_*.deb; the service: systemctl start bonsai.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
OUT="${1:-$BUILD_DIR/deb}"
[ -f "$BUILD_DIR/CMakeCache.txt" ] || cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" --target bonsai bonsai_man -j "$(nproc)" >/dev/null
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
# -B: CPack's staging and output folder, apart from the build tree (tests run it concurrently).
cpack --config "$BUILD_DIR/CPackConfig.cmake" -B "$OUT" >"$OUT/cpack.log" 2>&1 || { cat "$OUT/cpack.log" >&2; exit 1; }
DEB="$(ls "$OUT"/bonsai_*.deb | head -1)"
echo "$DEB"
