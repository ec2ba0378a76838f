#!/usr/bin/env bash
# Bounded load test of `bonsai serve` (a bench script, not a ctest):
# CLIENTS concurrent streaming clients for DURATION seconds against two
# fixture models with pool size 2 each. Passes when there is no 5xx other
# than deliberate overload 503s, every completed answer equals its solo
# answer, and RSS is stable (end of run within 10% + 8 MiB of the first
# sample under load). Figures go to stdout and to bench/results/load-*.txt.
#
# Usage: bench/load/load_test.sh [BONSAI_BINARY] [SHARED_DIR]
#   env: CLIENTS (32), DURATION (30 s), MAX_TOKENS (48), POOL_SIZE (2),
#        THREADS (nproc), M1 / M2 (the two models as ID=PATH; default
#        stories260K and llama-2-tiny-random from SHARED_DIR/models),
#        OUT (bench/results/load-ID1-ID2.txt)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="${1:-$ROOT/build/apps/bonsai/bonsai}"
SHARED="${2:-$ROOT/../shared}"
CLIENTS="${CLIENTS:-32}"
DURATION="${DURATION:-30}"
MAX_TOKENS="${MAX_TOKENS:-48}"
POOL_SIZE="${POOL_SIZE:-2}"
THREADS="${THREADS:-$(nproc)}"
M1="${M1:-stories=$SHARED/models/stories260K/stories260K.gguf}"
M2="${M2:-llama=$SHARED/models/llama-2-tiny-random/llama-2-tiny-random.gguf}"
ID1="${M1%%=*}" ID2="${M2%%=*}"
OUT="${OUT:-$ROOT/bench/results/load-$ID1-$ID2.txt}"
for f in "$BIN" "${M1#*=}" "${M2#*=}"; do [ -e "$f" ] || { echo "load_test: missing $f"; exit 1; }; done
command -v node >/dev/null || { echo "load_test: node is required"; exit 1; }

WORK="$(mktemp -d /tmp/bonsai_load.XXXXXX)"
PID=""
cleanup() {
  [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null && kill -KILL "$PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN" serve -m "$M1" -m "$M2" --pool-size "$POOL_SIZE" -c 512 -t "$THREADS" --port 0 \
  >"$WORK/out" 2>"$WORK/err" &
PID=$!
URL=""
for _ in $(seq 1 200); do
  URL="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$WORK/out" 2>/dev/null | head -1 || true)"
  [ -n "$URL" ] && break
  sleep 0.1
done
[ -n "$URL" ] || { echo "load_test: server did not start"; cat "$WORK/err"; exit 1; }

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$PID/status"; }
rss_start="$(rss_kib)"
# RSS sampler: one sample per second, bounded by the run time.
( for _ in $(seq 1 $((DURATION + 60))); do
    kill -0 "$PID" 2>/dev/null || break
    echo "$(date +%s) $(awk '/^VmRSS:/ {print $2}' "/proc/$PID/status")"
    sleep 1
  done ) >"$WORK/rss" &
SAMPLER=$!

node "$ROOT/bench/load/load_client.mjs" "$URL" "$CLIENTS" "$DURATION" "$MAX_TOKENS" "$ID1" "$ID2" >"$WORK/result.json"
kill "$SAMPLER" 2>/dev/null || true
wait "$SAMPLER" 2>/dev/null || true
curl -s "$URL/metrics" >"$WORK/metrics"
rss_end="$(rss_kib)"
kill -TERM "$PID"
for _ in $(seq 1 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
PID=""

# Figures. The first RSS samples cover the solo phase and warm-up; "under
# load" starts 5 s in.
read -r rss_first_load rss_max < <(awk 'NR==6 {f=$2} {if ($2>m) m=$2} END {if (!f) f=$2; print f, m}' "$WORK/rss")
# Every fifth sample (KiB), to show whether RSS levels off.
rss_series="$(awk 'NR % 5 == 1 {printf "%s%d", (n++ ? " " : ""), $2}' "$WORK/rss")"
tokens="$(awk '/^bonsai_completion_tokens_total/ {s+=$2} END {print s+0}' "$WORK/metrics")"
rejected="$(awk '/^bonsai_admission_rejected_total/ {s+=$2} END {print s+0}' "$WORK/metrics")"
five_xx="$(awk '/^bonsai_http_requests_total/ && /status="5/ && !/status="503"/ {s+=$2} END {print s+0}' "$WORK/metrics")"
verdict="$(node -e '
  const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  const [first, end, fivexx] = process.argv.slice(2).map(Number);
  const problems = [];
  if (r.mismatches) problems.push(r.mismatches + " answers differ from solo");
  if (r.other_errors || r.stream_errors || r.missing_done) problems.push("errors: " + JSON.stringify(r.statuses));
  if (fivexx) problems.push(fivexx + " 5xx other than 503");
  if (r.completed === 0) problems.push("nothing completed");
  if (end > first * 1.10 + 8192) problems.push("RSS grew from " + first + " to " + end + " KiB");
  console.log(problems.length ? "FAIL: " + problems.join("; ") : "PASS");
' "$WORK/result.json" "$rss_first_load" "$rss_end" "$five_xx")"

{
  echo "# bonsai serve load test ($(date -u +%Y-%m-%dT%H:%MZ))"
  echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), git $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "setup: 2 models ($ID1=$(basename "${M1#*=}"), $ID2=$(basename "${M2#*=}")), --pool-size $POOL_SIZE -c 512 -t $THREADS,"
  echo "       queue factor 4 (8 waiting per model), $CLIENTS streaming clients for ${DURATION}s, max_tokens $MAX_TOKENS, temperature 0.8, seeded"
  echo "client: $(cat "$WORK/result.json")"
  echo "server: completion tokens $tokens ($(awk -v t="$tokens" -v d="$DURATION" 'BEGIN {printf "%.0f", t/d}') tokens/s), admission 503s $rejected, 5xx other than 503: $five_xx"
  echo "rss_kib: start $rss_start, first under load $rss_first_load, max $rss_max, end $rss_end"
  echo "rss_kib every 5 s: $rss_series"
  echo "verdict: $verdict"
} | tee "$OUT"
[ "${verdict%%:*}" = PASS ]
