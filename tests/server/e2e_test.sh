#!/usr/bin/env bash
# End-to-end test of `bonsai serve` (run by ctest as server_e2e_test):
#   - starts the server on 127.0.0.1, any free port, from a TOML config
#     (two models, one preloaded, pool size 1, queue factor 1, an API key);
#   - curl: every error case (400 malformed / wrong type / missing field,
#     401, 404 model and route, 413, 400 context_length_exceeded, 503 +
#     Retry-After on overload), admin list/load/unload, on-demand loading,
#     a disconnect mid-stream followed by a normal request that succeeds,
#     /health, /metrics through `promtool check metrics`;
#   - the official OpenAI Node SDK (tests/server/node/sdk_test.mjs);
#   - SIGTERM: graceful shutdown, exit 0.
# Usage: e2e_test.sh BONSAI_BINARY SHARED_DIR
# Exit 77 (ctest: skipped) when the fixture is missing, unless CI=true.
set -euo pipefail

BIN="$1"
SHARED="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
BUILD="$(cd "$(dirname "$BIN")/../.." && pwd)"
STORIES="$SHARED/models/stories260K/stories260K.gguf"
LLAMA="$SHARED/models/llama-2-tiny-random/llama-2-tiny-random.gguf"
QWEN="$SHARED/fixtures/qwen3-tiny-q1_0.gguf"
KEY="testkey"

for f in "$STORIES" "$LLAMA" "$QWEN"; do
  if [ ! -f "$f" ]; then
    if [ "${CI:-}" = "true" ]; then echo "FAIL: missing fixture $f"; exit 1; fi
    echo "SKIP: missing fixture $f"; exit 77
  fi
done
for tool in curl node npm promtool; do
  command -v "$tool" >/dev/null || { echo "FAIL: '$tool' is not installed (scripts/setup.sh installs it)"; exit 1; }
done

WORK="$(mktemp -d /tmp/bonsai_e2e.XXXXXX)"
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then kill -KILL "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

FAILS=0
ok() { echo "ok - $1"; }
bad() { echo "not ok - $1"; FAILS=$((FAILS + 1)); }
check() { # NAME WANT GOT
  if [ "$2" = "$3" ]; then ok "$1"; else bad "$1 (want '$2', got '$3')"; fi
}
# jget FILE EXPR: evaluates a JS expression on the JSON in FILE (as `j`).
jget() { node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")); const v=eval(process.argv[2]); console.log(typeof v==="object"?JSON.stringify(v):v)' "$1" "$2"; }

cat >"$WORK/serve.toml" <<EOF
model = ["stories=$STORIES", "llama=$LLAMA"]
pool-size = 1
ctx-size = 2048
models-max = 4
queue-factor = 1
parallel = 1
api-key = "$KEY"
threads = 2
[models]
qwen = "$QWEN"
[router]
preload = ["stories"]
EOF

# start_server CONFIG: starts `bonsai serve --config CONFIG --port 0`, sets SERVER_PID and URL.
start_server() {
  # Empty the output first: the child truncates it only once it runs, and a
  # slow start would otherwise let the loop below read the previous server's URL.
  : >"$WORK/out"
  : >"$WORK/err"
  "$BIN" serve --config "$1" --port 0 >"$WORK/out" 2>"$WORK/err" &
  SERVER_PID=$!
  URL=""
  for _ in $(seq 1 200); do
    URL="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$WORK/out" 2>/dev/null | head -1 || true)"
    [ -n "$URL" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$URL" ]; then
    echo "FAIL: the server did not start"; cat "$WORK/out" "$WORK/err"; exit 1
  fi
}
# stop_server: SIGTERM, then the exit code must be 0 and the stop clean.
stop_server() {
  kill -TERM "$SERVER_PID"
  local rc=""
  for _ in $(seq 1 300); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then wait "$SERVER_PID" && rc=0 || rc=$?; break; fi
    sleep 0.1
  done
  check "SIGTERM: exit code" 0 "$rc"
  grep -q "bonsai serve: stopped" "$WORK/err" && ok "SIGTERM: stopped cleanly" || bad "no clean stop message"
  SERVER_PID=""
}

start_server "$WORK/serve.toml"
echo "# server at $URL"
grep -q "try: curl $URL/v1/chat/completions" "$WORK/out" && ok "start-up prints the URL and a curl example" || bad "start-up banner"
# The printed example works as printed (with KEY set, as the banner says).
TRY="$(sed -n 's/^try: //p' "$WORK/out" | head -1)"
TRY_OUT="$(KEY="$KEY" bash -c "$TRY -s -o /dev/null -w '%{http_code}'" 2>/dev/null || true)"
check "the banner's curl example succeeds" "200" "$TRY_OUT"

# req METHOD PATH [BODY] [extra curl args...]: status on stdout, body in $WORK/body, headers in $WORK/hdr.
req() {
  local method="$1" path="$2" body="${3-}"
  shift 3 || shift $#
  local args=(-s -o "$WORK/body" -D "$WORK/hdr" -w '%{http_code}' -X "$method" "$URL$path"
    -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' --max-time 60)
  [ -n "$body" ] && args+=(--data-binary "$body")
  curl "${args[@]}" "$@" || true
}

# ---- health, models ----
check "GET /health" 200 "$(curl -s -o "$WORK/body" -w '%{http_code}' "$URL/health")"
check "/health status" ok "$(jget "$WORK/body" j.status)"
check "GET /v1/models" 200 "$(req GET /v1/models)"
check "/v1/models lists all three" '["llama","qwen","stories"]' "$(jget "$WORK/body" 'j.data.map(m=>m.id).sort()')"
check "GET /v1/models/stories" 200 "$(req GET /v1/models/stories)"
check "GET /admin/models: only the preloaded model is loaded" '["stories"]' "$(req GET /admin/models >/dev/null; jget "$WORK/body" 'j.data.filter(m=>m.state==="loaded").map(m=>m.id)')"

# ---- error cases ----
check "401 without a key" 401 "$(curl -s -o "$WORK/body" -w '%{http_code}' "$URL/v1/models")"
check "401 code" invalid_api_key "$(jget "$WORK/body" j.error.code)"
check "401 with a wrong key" 401 "$(curl -s -o "$WORK/body" -w '%{http_code}' -H 'Authorization: Bearer nope' "$URL/v1/models")"
check "400 malformed JSON" 400 "$(req POST /v1/chat/completions '{"model": "stories", "messages": [')"
check "400 malformed JSON: error shape" 'invalid_request_error invalid_json' "$(jget "$WORK/body" '[j.error.type, j.error.code].join(" ")')"
check "400 wrong type" 400 "$(req POST /v1/chat/completions '{"model":"stories","messages":[{"role":"user","content":"hi"}],"temperature":"hot"}')"
check "400 wrong type names the param" temperature "$(jget "$WORK/body" j.error.param)"
check "400 wrong type in completions" 400 "$(req POST /v1/completions '{"model":"stories","prompt":"x","max_tokens":"ten"}')"
check "400 missing messages" 400 "$(req POST /v1/chat/completions '{"model":"stories"}')"
check "400 missing messages names the param" messages "$(jget "$WORK/body" j.error.param)"
check "404 unknown model" 404 "$(req POST /v1/chat/completions '{"model":"nope","messages":[{"role":"user","content":"hi"}]}')"
check "404 code" model_not_found "$(jget "$WORK/body" j.error.code)"
check "404 GET /v1/models/nope" 404 "$(req GET /v1/models/nope)"
check "404 unknown route" 404 "$(req GET /v1/nothing-here)"
check "404 unknown route has an error object" unknown_url "$(jget "$WORK/body" j.error.code)"
head -c $((5 * 1024 * 1024)) /dev/zero | tr '\0' 'a' >"$WORK/big"
check "413 body over 4 MiB" 413 "$(curl -s -o "$WORK/body" -w '%{http_code}' -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' --data-binary @"$WORK/big" "$URL/v1/completions" || true)"
check "413 code" request_too_large "$(jget "$WORK/body" j.error.code 2>/dev/null || echo none)"
check "400 context_length_exceeded" 400 "$(req POST /v1/completions '{"model":"stories","prompt":"Once","max_tokens":5000}')"
check "context_length_exceeded code" context_length_exceeded "$(jget "$WORK/body" j.error.code)"

# ---- a normal request, and on-demand loading of the second model ----
check "POST /v1/completions" 200 "$(req POST /v1/completions '{"model":"stories","prompt":"Once upon a time","max_tokens":20,"temperature":0}')"
check "greedy text (the model's published story)" true "$(jget "$WORK/body" 'j.choices[0].text.startsWith(", there was a little girl named Lily. She loved to play")')"
check "logit_bias forcing one token" 200 "$(req POST /v1/completions '{"model":"stories","prompt":"Once","max_tokens":3,"temperature":0,"logit_bias":{"400":100}}')"
check "logit_bias: the forced piece three times" true "$(jget "$WORK/body" 'const t=j.choices[0].text, p=t.slice(0,t.length/3); t.length>0 && p.repeat(3)===t')"
check "logit_bias with a token outside the vocabulary: 400" 400 "$(req POST /v1/completions '{"model":"stories","prompt":"Once","logit_bias":{"999999":1}}')"
check "on-demand load of 'llama'" 200 "$(req POST /v1/chat/completions '{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":4}')"
check "llama answered 4 tokens" 4 "$(jget "$WORK/body" j.usage.completion_tokens)"

# ---- admin ----
check "unload llama" 200 "$(req POST /admin/models/unload '{"id":"llama"}')"
check "unload llama again: 404" 404 "$(req POST /admin/models/unload '{"id":"llama"}')"
check "unload without id: 400" 400 "$(req POST /admin/models/unload '{}')"
check "load without path for an unknown id: 400" 400 "$(req POST /admin/models/load '{"id":"ghost"}')"
check "load a missing file: 400" 400 "$(req POST /admin/models/load '{"id":"ghost","path":"/nonexistent/x.gguf"}')"
check "background load: 202" 202 "$(req POST /admin/models/load "{\"id\":\"llama2\",\"path\":\"$LLAMA\",\"pool_size\":1}")"
state=""
for _ in $(seq 1 100); do
  req GET /admin/models >/dev/null
  state="$(jget "$WORK/body" '(j.data.find(m=>m.id==="llama2")||{}).state')"
  [ "$state" = loaded ] && break
  sleep 0.1
done
check "background load finishes" loaded "$state"
check "load it again: 409" 409 "$(req POST /admin/models/load "{\"id\":\"llama2\",\"path\":\"$LLAMA\"}")"
check "request to the background-loaded model" 200 "$(req POST /v1/completions '{"model":"llama2","prompt":"hello","max_tokens":3}')"

# ---- overload: parallel 1, queue factor 1 -> at most 1 running + 1 waiting ----
LONG='{"model":"stories","prompt":"Once upon a time","max_tokens":700,"ignore_eos":true,"stream":true}'
for i in 1 2 3 4 5; do
  curl -s -o "$WORK/ov$i.body" -D "$WORK/ov$i.hdr" -w '%{http_code}' --max-time 60 -H "Authorization: Bearer $KEY" \
    -H 'Content-Type: application/json' --data-binary "$LONG" "$URL/v1/completions" >"$WORK/ov$i.code" &
done
wait_pids=$(jobs -p | grep -v "^$SERVER_PID\$" || true)
for p in $wait_pids; do wait "$p" || true; done
n200=0; n503=0; retry=""
for i in 1 2 3 4 5; do
  c="$(cat "$WORK/ov$i.code")"
  [ "$c" = 200 ] && n200=$((n200 + 1))
  if [ "$c" = 503 ]; then n503=$((n503 + 1)); retry="$(grep -i '^retry-after:' "$WORK/ov$i.hdr" | tr -d '\r' | awk '{print $2}')"; fi
done
[ "$n503" -ge 1 ] && ok "overload: $n503 of 5 got 503 at once" || bad "overload: no 503 (codes: $(cat "$WORK"/ov*.code))"
[ "$n200" -ge 2 ] && ok "overload: $n200 of 5 served" || bad "overload: only $n200 served"
[ -n "$retry" ] && ok "503 carries Retry-After: $retry" || bad "503 without Retry-After"
for i in 1 2 3 4 5; do
  if [ "$(cat "$WORK/ov$i.code")" = 200 ]; then
    tail -c 20 "$WORK/ov$i.body" | grep -q 'data: \[DONE\]' && ok "served stream $i ends with [DONE]" || bad "stream $i has no [DONE]"
  fi
done

# ---- disconnect mid-stream: the generation stops and the replica is freed ----
# metric NAME_AND_LABELS: the sample's value from /metrics (0 if absent).
metric() { curl -s "$URL/metrics" | awk -v k="$1" 'index($0, k " ") == 1 {print $2; f=1} END {if (!f) print 0}'; }
cancel_before="$(metric 'bonsai_generations_cancelled_total{reason="client_gone"}')"
tokens_before="$(metric 'bonsai_completion_tokens_total{model="stories"}')"
curl -sN -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
  --data-binary '{"model":"stories","prompt":"Once upon a time","max_tokens":1900,"ignore_eos":true,"stream":true}' \
  "$URL/v1/completions" 2>/dev/null | head -c 3000 >"$WORK/partial" || true
grep -q '^data: {' "$WORK/partial" && ok "got part of the stream before disconnecting" || bad "no stream data before the disconnect"
t0=$(date +%s%N)
check "request after the disconnect (pool size 1)" 200 "$(req POST /v1/completions '{"model":"stories","prompt":"One day","max_tokens":8}')"
echo "# the next request took $((($(date +%s%N) - t0) / 1000000)) ms"
cancel_after="$(metric 'bonsai_generations_cancelled_total{reason="client_gone"}')"
tokens_after="$(metric 'bonsai_completion_tokens_total{model="stories"}')"
[ "$cancel_after" -gt "$cancel_before" ] && ok "cancellation counted (client_gone $cancel_before -> $cancel_after)" || bad "client_gone counter did not grow ($cancel_before -> $cancel_after)"
# Had the abandoned request run on, it would have generated 1900 tokens before the next one ran.
spent=$((tokens_after - tokens_before - 8))
[ "$spent" -lt 500 ] && ok "the abandoned generation stopped after $spent of 1900 tokens" || bad "the abandoned generation ran $spent tokens"
check "no replica busy afterwards" 0 "$(metric 'bonsai_pool_busy{model="stories"}')"

# ---- /metrics ----
curl -s "$URL/metrics" >"$WORK/metrics.txt"
# The vllm:* series (vLLM's names, which routers read) contain ':', which
# promtool's linter reserves for recording rules: checked apart.
grep -q '^vllm:num_requests_running{' "$WORK/metrics.txt" && ok "vllm:num_requests_running exposed" || bad "no vllm:num_requests_running"
if grep -v -E '^(# (HELP|TYPE) )?vllm:' "$WORK/metrics.txt" | promtool check metrics >"$WORK/promtool.out" 2>&1; then ok "promtool check metrics"; else bad "promtool check metrics: $(cat "$WORK/promtool.out")"; fi
for m in bonsai_http_requests_total bonsai_prompt_tokens_total bonsai_completion_tokens_total \
  bonsai_time_to_first_token_seconds_bucket bonsai_inter_token_latency_seconds_bucket bonsai_queue_wait_seconds_bucket \
  bonsai_pool_size bonsai_pool_busy bonsai_models_loaded bonsai_memory_bytes bonsai_model_bytes; do
  grep -q "^$m" "$WORK/metrics.txt" && ok "metric $m" || bad "metric $m missing"
done
grep -q '^bonsai_http_requests_total{route="/v1/chat/completions",status="404"}' "$WORK/metrics.txt" && ok "requests counted by route and status" || bad "no 404 sample for chat"

# ---- the official OpenAI Node SDK ----
NODE_DIR="$BUILD/tests/server/node_sdk"
mkdir -p "$NODE_DIR"
cp "$HERE/node/package.json" "$HERE/node/sdk_test.mjs" "$NODE_DIR/"
if [ ! -f "$NODE_DIR/node_modules/openai/package.json" ]; then
  (cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error >"$WORK/npm.log" 2>&1) || {
    echo "FAIL: 'npm install' of the openai package failed (is the npm registry reachable?):"; cat "$WORK/npm.log"; exit 1; }
fi
if (cd "$NODE_DIR" && node sdk_test.mjs "$URL" "$KEY" stories qwen); then ok "OpenAI Node SDK tests"; else bad "OpenAI Node SDK tests"; fi

# ---- the port is not shared: a second server on it fails clearly ----
PORT="${URL##*:}"
if timeout 10 "$BIN" serve -m "stories=$STORIES" --port "$PORT" >"$WORK/out2" 2>"$WORK/err2"; then
  bad "a second server bound port $PORT"
else
  grep -q "cannot listen on 127.0.0.1:$PORT" "$WORK/err2" && ok "a second server on port $PORT is refused" || bad "second server: $(cat "$WORK/err2")"
fi

# ---- graceful shutdown with a stream in flight: SIGTERM drains, the stream finishes ----
curl -sN -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' --max-time 60 \
  --data-binary '{"model":"stories","prompt":"Once upon a time","max_tokens":1900,"ignore_eos":true,"stream":true}' \
  "$URL/v1/completions" >"$WORK/inflight" 2>/dev/null &
INFLIGHT=$!
for _ in $(seq 1 100); do grep -q '^data: {' "$WORK/inflight" 2>/dev/null && break; sleep 0.05; done
stop_server
wait "$INFLIGHT" || true
tail -c 20 "$WORK/inflight" | grep -q '^data: \[DONE\]' && ok "SIGTERM: the in-flight stream finished (drain)" || bad "SIGTERM: in-flight stream: $(tail -c 300 "$WORK/inflight")"

# ---- a second server: nothing preloaded, a 0.1 s request timeout ----
cat >"$WORK/serve2.toml" <<EOF
model = ["stories=$STORIES"]
pool-size = 1
ctx-size = 2048
timeout = 0.1
api-key = "$KEY"
[router]
preload = []
EOF
start_server "$WORK/serve2.toml"
check "/health with no model loaded: 503" 503 "$(curl -s -o "$WORK/body" -w '%{http_code}' "$URL/health")"
check "/health says why" unavailable "$(jget "$WORK/body" j.status)"
metric() { curl -s "$URL/metrics" | awk -v k="$1" 'index($0, k " ") == 1 {print $2; f=1} END {if (!f) print 0}'; }
check "a short request loads the model on demand" 200 "$(req POST /v1/completions '{"model":"stories","prompt":"Once","max_tokens":1}')"
check "/health after the on-demand load: 200" 200 "$(curl -s -o "$WORK/body" -w '%{http_code}' "$URL/health")"
# A request that times out while generating answers with what it produced,
# finish_reason "length" (only one still queued at its deadline gets 503).
check "timeout: a long request gets 200 with what was produced" 200 "$(req POST /v1/completions '{"model":"stories","prompt":"Once upon a time","max_tokens":1900,"ignore_eos":true}')"
check "timeout: finish_reason" length "$(jget "$WORK/body" 'j.choices[0].finish_reason')"
spent="$(metric 'bonsai_completion_tokens_total{model="stories"}')"
spent=$((spent - 1))
[ "$spent" -lt 1900 ] && ok "timeout: the generation stopped after $spent of 1900 tokens" || bad "timeout: ran $spent tokens"
check "timeout counted" 1 "$(metric 'bonsai_generations_cancelled_total{reason="timeout"}')"
check "timeout while streaming: 200" 200 "$(req POST /v1/completions '{"model":"stories","prompt":"Once upon a time","max_tokens":1900,"ignore_eos":true,"stream":true}')"
grep -q '"finish_reason":"length"' "$WORK/body" && grep -q 'data: \[DONE\]' "$WORK/body" && ok "timeout: the stream ends with finish_reason length and [DONE]" || bad "timeout: the stream did not end with length: $(tail -c 300 "$WORK/body")"
# The "length" a --timeout gives carries "timed_out": true on its choice
# (streamed: on the finish chunk), for completions and chat; a max_tokens
# "length" does not (issue 33 item 7).
grep '"finish_reason":"length"' "$WORK/body" | grep -q '"timed_out":true' && ok "timeout: the streamed finish chunk says timed_out" || bad "timeout: no timed_out in the stream: $(tail -c 300 "$WORK/body")"
LONG_CHAT='{"model":"stories","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":1900,"ignore_eos":true'
check "timeout: completions marker" true "$(req POST /v1/completions '{"model":"stories","prompt":"Once upon a time","max_tokens":1900,"ignore_eos":true}' >/dev/null; jget "$WORK/body" 'j.choices[0].timed_out')"
check "timeout: chat finish_reason" length "$(req POST /v1/chat/completions "$LONG_CHAT}" >/dev/null; jget "$WORK/body" 'j.choices[0].finish_reason')"
check "timeout: chat marker" true "$(jget "$WORK/body" 'j.choices[0].timed_out')"
check "timeout: streamed chat: 200" 200 "$(req POST /v1/chat/completions "$LONG_CHAT,\"stream\":true}")"
fin=$(grep '"finish_reason":"length"' "$WORK/body" | head -1)
[[ "$fin" == *'"timed_out":true'* ]] && grep -q 'data: \[DONE\]' "$WORK/body" && ok "timeout: the streamed chat finish chunk says timed_out" || bad "timeout: streamed chat: $(tail -c 300 "$WORK/body")"
check "max_tokens: finish_reason length" length "$(req POST /v1/completions '{"model":"stories","prompt":"Once","max_tokens":2,"ignore_eos":true}' >/dev/null; jget "$WORK/body" 'j.choices[0].finish_reason')"
check "max_tokens: no timed_out" false "$(jget "$WORK/body" '"timed_out" in j.choices[0]')"
check "max_tokens streamed: 200" 200 "$(req POST /v1/chat/completions '{"model":"stories","messages":[{"role":"user","content":"Once"}],"max_tokens":2,"ignore_eos":true,"stream":true}')"
grep -q '"finish_reason":"length"' "$WORK/body" && ! grep -q 'timed_out' "$WORK/body" && ok "max_tokens: the stream has no timed_out" || bad "max_tokens stream: $(tail -c 300 "$WORK/body")"
stop_server

# ---- a model that cannot fit the memory budget even alone is refused clearly ----
if "$BIN" serve -m "stories=$STORIES" --mem-budget 1 --port 0 >"$WORK/out" 2>"$WORK/err"; then
  bad "--mem-budget 1: the server started"
else
  grep -q "cannot be loaded even alone" "$WORK/err" && ok "--mem-budget 1: refused ($(grep -o 'needs [0-9]* MiB' "$WORK/err" | head -1))" || bad "--mem-budget 1: unclear error: $(cat "$WORK/err")"
fi

if [ "$FAILS" -ne 0 ]; then
  echo "FAILED: $FAILS checks"; echo "--- server stderr ---"; tail -20 "$WORK/err"; exit 1
fi
echo "PASSED"
