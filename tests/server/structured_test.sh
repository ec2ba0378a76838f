#!/usr/bin/env bash
# Structured outputs end to end (run by ctest as server_structured_test):
# starts `bonsai serve` with every Qwen3 fixture in ../shared/fixtures (random
# weights, the real 151k-token vocabulary) and stories260K, installs the
# test-only npm packages (openai, ajv, ajv-formats, zod) and runs
# structured/structured_test.mjs: the schema corpus at temperature 0 and 1 on
# every model (finish "stop" within 512 tokens, valid by ajv), llama.cpp's
# grammar / json_schema fields, the 400s, forced tool calls (valid, streamed ==
# non-streamed) and the SDK's zodResponseFormat + parse (zod 3 with openai 4;
# zod 4's formats and number checks with openai 6, 20 runs each).
# Usage: structured_test.sh BONSAI_BINARY SHARED_DIR [full|quick]
#   quick (sanitizer builds): one temperature and fewer seeds.
# Exit 77 (ctest: skipped) when a fixture is missing, unless CI=true.
set -euo pipefail

BIN="$1"
SHARED="$2"
MODE="${3:-full}"
HERE="$(cd "$(dirname "$0")" && pwd)"
BUILD="$(cd "$(dirname "$BIN")/../.." && pwd)"
STORIES="$SHARED/models/stories260K/stories260K.gguf"
QWENS=(qwen3-tiny-q1_0 qwen3-tiny-f16 qwen3-tiny-q2_0 qwen3-tiny-q2_0-paired-g64
       qwen3-tiny-q2_0-paired-g128-d-first qwen3-tiny-q2_0-paired-g128-qs-first)

for f in "$STORIES" "${QWENS[@]/#/$SHARED/fixtures/}"; do
  case "$f" in *.gguf) ;; *) f="$f.gguf" ;; esac
  if [ ! -f "$f" ]; then
    if [ "${CI:-}" = "true" ]; then echo "FAIL: missing fixture $f"; exit 1; fi
    echo "SKIP: missing fixture $f"; exit 77
  fi
done
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "FAIL: '$tool' is not installed (scripts/setup.sh installs it)"; exit 1; }
done

WORK="$(mktemp -d /tmp/bonsai_structured.XXXXXX)"
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then kill -KILL "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

MODELS=("stories=$STORIES")
NAMES=(stories)
for q in "${QWENS[@]}"; do
  MODELS+=("$q=$SHARED/fixtures/$q.gguf")
  NAMES+=("$q")
done
{
  printf 'model = ['
  sep=""
  for m in "${MODELS[@]}"; do printf '%s"%s"' "$sep" "$m"; sep=", "; done
  printf ']\n'
  printf 'pool-size = 4\nctx-size = 2048\nmodels-max = %d\nthreads = 2\n' "${#MODELS[@]}"
  printf "[router]\npreload = [%s]\n" "$(printf "\"%s\", " "${NAMES[@]}" | sed "s/, $//")"
} >"$WORK/serve.toml"

NODE_DIR="$BUILD/tests/server/structured_node"
mkdir -p "$NODE_DIR"
cp "$HERE/structured/package.json" "$HERE/structured/structured_test.mjs" "$HERE/structured/schemas.json" "$NODE_DIR/"
if [ ! -f "$NODE_DIR/node_modules/ajv-formats/package.json" ] || [ ! -d "$NODE_DIR/node_modules/zod/v4" ] ||
   [ ! -f "$NODE_DIR/node_modules/openai-v6/package.json" ]; then
  (cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error >"$WORK/npm.log" 2>&1) || {
    echo "FAIL: 'npm install' of openai/openai-v6/ajv/ajv-formats/zod failed (is the npm registry reachable?):"; cat "$WORK/npm.log"; exit 1; }
fi

"$BIN" serve --config "$WORK/serve.toml" --port 0 >"$WORK/out" 2>"$WORK/err" &
SERVER_PID=$!
URL=""
for _ in $(seq 1 300); do
  URL="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$WORK/out" 2>/dev/null | head -1 || true)"
  [ -n "$URL" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$URL" ]; then echo "FAIL: the server did not start"; cat "$WORK/err"; exit 1; fi
echo "server at $URL (mode $MODE)"

START=$(date +%s)
RC=0
(cd "$NODE_DIR" && node structured_test.mjs "$URL" "$MODE" "${NAMES[@]}") || RC=$?
echo "structured_test.mjs: exit $RC after $(( $(date +%s) - START )) s"
kill -TERM "$SERVER_PID" 2>/dev/null || true
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=""
if [ "$RC" -ne 0 ]; then echo "--- server stderr (tail)"; tail -20 "$WORK/err"; fi
exit "$RC"
