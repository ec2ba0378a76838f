#!/usr/bin/env bash
# A Node client library's test against `bonsai serve` (run by ctest as
# server_NAME_node_test): starts the server on 127.0.0.1 (any free port) with
# stories260K ("stories") and the Qwen3 fixture ("qwen") behind an API key,
# installs SRC_DIR/package.json's packages into the build tree (npm, once per
# build tree, checked by MARKER_MODULE; the npm cache serves them offline),
# and runs `node SCRIPT URL KEY stories qwen` there.
#   the OpenAI SDK's Responses API:  NAME responses,  SRC_DIR node,           SCRIPT responses_test.mjs
#   the `ollama` client:             NAME ollama,     SRC_DIR node,           SCRIPT ollama_test.mjs
#   @anthropic-ai/sdk:               NAME anthropic,  SRC_DIR anthropic_node, SCRIPT anthropic_test.mjs
#   the AI SDK and LangChain:        NAME aisdk,      SRC_DIR aisdk_node,     SCRIPT aisdk_test.mjs
# Usage: node_client_test.sh BONSAI_BINARY SHARED_DIR NAME SRC_DIR SCRIPT MARKER_MODULE
# Exit 77 (ctest: skipped) when a fixture is missing, unless CI=true.
set -euo pipefail

BIN="$1"
SHARED="$2"
NAME="$3"
SRC_DIR="$4"
SCRIPT="$5"
MARKER="$6"
HERE="$(cd "$(dirname "$0")" && pwd)"
BUILD="$(cd "$(dirname "$BIN")/../.." && pwd)"
STORIES="$SHARED/models/stories260K/stories260K.gguf"
QWEN="$SHARED/fixtures/qwen3-tiny-q1_0.gguf"

for f in "$STORIES" "$QWEN"; do
  if [ ! -f "$f" ]; then
    if [ "${CI:-}" = "true" ]; then echo "FAIL: missing fixture $f"; exit 1; fi
    echo "SKIP: missing fixture $f"; exit 77
  fi
done
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "FAIL: '$tool' is not installed (scripts/setup.sh installs it)"; exit 1; }
done

WORK="$(mktemp -d "/tmp/bonsai_${NAME}.XXXXXX")"
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then kill -KILL "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

NODE_DIR="$BUILD/tests/server/${NAME}_node"
mkdir -p "$NODE_DIR"
cp "$HERE/$SRC_DIR/package.json" "$HERE/$SRC_DIR/$SCRIPT" "$NODE_DIR/"
if [ ! -f "$NODE_DIR/node_modules/$MARKER/package.json" ]; then
  (cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error >"$WORK/npm.log" 2>&1) || {
    echo "FAIL: 'npm install' of $SRC_DIR/package.json's packages failed (is the npm registry reachable?):"; cat "$WORK/npm.log"; exit 1; }
fi

KEY="testkey"
"$BIN" serve -m "stories=$STORIES" -m "qwen=$QWEN" --ctx-size 1024 --threads 2 --api-key "$KEY" --port 0 \
  >"$WORK/out" 2>"$WORK/err" &
SERVER_PID=$!
URL=""
for _ in $(seq 1 300); do
  URL="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$WORK/out" 2>/dev/null | head -1 || true)"
  [ -n "$URL" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$URL" ]; then
  echo "FAIL: the server did not start"; cat "$WORK/out" "$WORK/err"; exit 1
fi
echo "# server at $URL"
RC=0
(cd "$NODE_DIR" && AI_SDK_LOG_WARNINGS=false node "$SCRIPT" "$URL" "$KEY" stories qwen) || RC=$?
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || true
SERVER_PID=""
if [ "$RC" -ne 0 ]; then echo "--- server stderr"; tail -n 30 "$WORK/err"; fi
exit "$RC"
