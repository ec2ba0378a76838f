#!/usr/bin/env bash
# Browser test of the web chat page (run by ctest as server_browser_test):
# starts `bonsai serve` with stories260K on a free 127.0.0.1 port and drives
# GET / in Debian's headless Chromium with playwright-core from npm
# (tests/server/browser/chat_page_test.mjs). Saves the screenshot as
# BUILD/tests/server/web-chat.png (docs/web-chat.png is one such picture).
# Usage: browser_test.sh BONSAI_BINARY SHARED_DIR
# Exit 77 (ctest: skipped) when the fixture or Chromium is missing, unless CI=true.
set -euo pipefail
BIN="$1"
SHARED="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
BUILD="$(cd "$(dirname "$BIN")/../.." && pwd)"
STORIES="$SHARED/models/stories260K/stories260K.gguf"
skip_or_fail() {
  if [ "${CI:-}" = "true" ]; then echo "FAIL: $1"; exit 1; fi
  echo "SKIP: $1"; exit 77
}
[ -f "$STORIES" ] || skip_or_fail "missing fixture $STORIES"
CHROMIUM="$(command -v chromium || true)"
[ -n "$CHROMIUM" ] || skip_or_fail "chromium is not installed (scripts/test.sh installs it)"
command -v npm >/dev/null || skip_or_fail "npm is not installed"

WORK="$(mktemp -d /tmp/bonsai_browser.XXXXXX)"
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then kill -KILL "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN" serve -m "stories=$STORIES" -c 2048 --port 0 -t 1 >"$WORK/out" 2>"$WORK/err" &
SERVER_PID=$!
URL=""
for _ in $(seq 1 200); do
  URL="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$WORK/out" 2>/dev/null | head -1 || true)"
  [ -n "$URL" ] && curl -sf "$URL/health" >/dev/null 2>&1 && break
  URL=""
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "FAIL: server exited"; cat "$WORK/err"; exit 1; }
  sleep 0.1
done
[ -n "$URL" ] || { echo "FAIL: server did not start"; cat "$WORK/err"; exit 1; }

NODE_DIR="$BUILD/tests/server/browser_node"
mkdir -p "$NODE_DIR"
cp "$HERE/browser/package.json" "$HERE/browser/chat_page_test.mjs" "$NODE_DIR/"
if [ ! -f "$NODE_DIR/node_modules/playwright-core/package.json" ]; then
  (cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error >"$WORK/npm.log" 2>&1) || {
    echo "FAIL: 'npm install' of playwright-core failed:"; cat "$WORK/npm.log"; exit 1; }
fi
(cd "$NODE_DIR" && node chat_page_test.mjs "$URL/" "$CHROMIUM" "$BUILD/tests/server/web-chat.png")
echo "browser test passed"
