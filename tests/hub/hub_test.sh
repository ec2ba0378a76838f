#!/usr/bin/env bash
# `-hf` / `bonsai pull` / `bonsai list` against a local mock of the Hugging
# Face Hub (tests/hub/mock_hub.py on loopback, reached through HF_ENDPOINT;
# nothing here touches the internet). Run by ctest as hub_test. Checks:
#   - a connection dropped mid-file is resumed with a Range request, and the
#     cache then has huggingface_hub's layout (read back by path): refs/main
#     = the commit, snapshots/COMMIT/FILE -> ../../blobs/SHA256, no .incomplete;
#   - an .incomplete left by an earlier process is never loaded or listed,
#     and the next download resumes it;
#   - a second run and HF_HUB_OFFLINE=1 use the cache with the hub stopped;
#   - quant tags: the right file (Q2_0 is not PQ2_0), ambiguity and a missing
#     tag listed; -hff; a split model (gguf-split parts) fetched whole and run
#     as one model, generating what the unsplit file does;
#     the mmproj file noted;
#   - a wrong sha256 is refused and nothing is left in blobs/ or snapshots/;
#     so is a file larger than the free disk (checked before downloading);
#   - 401 without / with a wrong token, the token sent to the hub and never to
#     the CDN it redirects to, never printed; 404 repository; no network;
#   - run -hf generates, serve -hf answers a completion.
# Usage: hub_test.sh BONSAI_BINARY GGUF_SPLIT_TOOL (tests/gguf/gguf_split_tool.cpp)
set -euo pipefail

BIN="$1"
SPLIT_TOOL="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
command -v python3 >/dev/null || { echo "FAIL: python3 is not installed"; exit 1; }
command -v curl >/dev/null || { echo "FAIL: curl is not installed (scripts/setup.sh installs it)"; exit 1; }

WORK="$(mktemp -d /tmp/bonsai_hub_test.XXXXXX)"
MOCK_PID=""
SERVER_PID=""
stop_mock() {
  if [ -n "$MOCK_PID" ]; then kill "$MOCK_PID" 2>/dev/null || true; wait "$MOCK_PID" 2>/dev/null || true; fi
  MOCK_PID=""
}
cleanup() {
  stop_mock
  if [ -n "$SERVER_PID" ]; then kill -KILL "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

FAILS=0
ok() { echo "ok - $1"; }
bad() { echo "not ok - $1"; FAILS=$((FAILS + 1)); }
check() { if [ "$2" = "$3" ]; then ok "$1"; else bad "$1 (want '$2', got '$3')"; fi; }
has() { if grep -q -- "$2" "$3"; then ok "$1"; else bad "$1: no '$2' in: $(cat "$3")"; fi; }

# start_mock [SWITCHES...]: a fresh mock with an empty request log; sets HF_ENDPOINT.
start_mock() {
  stop_mock
  rm -f "$WORK/ports" "$WORK/log"
  python3 "$HERE/mock_hub.py" --root "$WORK/repos" --port-file "$WORK/ports" --log "$WORK/log" "$@" &
  MOCK_PID=$!
  for _ in $(seq 100); do [ -f "$WORK/ports" ] && break; sleep 0.05; done
  [ -f "$WORK/ports" ] || { echo "FAIL: the mock hub did not start"; exit 1; }
  read -r HUB_PORT CDN_PORT <"$WORK/ports"
  export HF_ENDPOINT="http://127.0.0.1:$HUB_PORT"
}
# fresh_cache NAME: an empty HF_HOME for one scenario.
fresh_cache() { export HF_HOME="$WORK/home-$1"; CACHE="$HF_HOME/hub"; }
unset HF_TOKEN HF_HUB_OFFLINE HF_HUB_CACHE HF_TOKEN_PATH
export BONSAI_PROGRESS=0

# ---- the repositories ----
R="$WORK/repos/prism-test"
mkdir -p "$R/Tiny-gguf" "$R/Split-gguf" "$R/Ternary-gguf"
"$BIN" synth -o "$R/Tiny-gguf/Tiny-Q1_0.gguf" --preset tiny --type q1_0 >/dev/null
"$BIN" synth -o "$R/Tiny-gguf/Tiny-Q2_0.gguf" --preset tiny --type q2_0 --seed 2 >/dev/null
"$BIN" synth -o "$R/Tiny-gguf/Tiny-PQ2_0.gguf" --arch qwen35 --preset tiny --type pq2_0 >/dev/null
printf 'projector' >"$R/Tiny-gguf/mmproj-Tiny-F16.gguf"
printf '# Tiny\n' >"$R/Tiny-gguf/README.md"
cp "$R/Tiny-gguf/Tiny-Q1_0.gguf" "$R/Ternary-gguf/Ternary-Q1_0.gguf"
"$SPLIT_TOOL" 2 "$R/Tiny-gguf/Tiny-Q1_0.gguf" "$R/Split-gguf/Split-Q1_0" >/dev/null
SPLIT_SHAS="$(cat "$R/Split-gguf/Split-Q1_0-0000"[12]"-of-00002.gguf" | sha256sum | cut -d' ' -f1)"
Q1_SHA="$(sha256sum "$R/Tiny-gguf/Tiny-Q1_0.gguf" | cut -d' ' -f1)"
Q1_SIZE="$(stat -c %s "$R/Tiny-gguf/Tiny-Q1_0.gguf")"

# ---- a dropped connection is resumed; the cache layout ----
fresh_cache resume
start_mock --drop-after 50000
if "$BIN" pull prism-test/Tiny-gguf:Q1_0 >"$WORK/out" 2>"$WORK/err"; then ok "pull after a dropped connection"; else bad "pull: $(cat "$WORK/err")"; fi
check "a Range request resumed at the dropped byte" "1" \
  "$(grep -c '"port": "cdn", "method": "GET", "path": "/blob/'"$Q1_SHA"'", "range": "bytes=50000-"' "$WORK/log")"
COMMIT="$(cat "$CACHE/models--prism-test--Tiny-gguf/refs/main" 2>/dev/null || true)"
check "refs/main holds the commit (40 hex)" "40" "${#COMMIT}"
SNAP="$CACHE/models--prism-test--Tiny-gguf/snapshots/$COMMIT/Tiny-Q1_0.gguf"
check "pull prints the snapshot path" "$SNAP" "$(cat "$WORK/out")"
check "the snapshot entry is a relative link to the blob" "../../blobs/$Q1_SHA" "$(readlink "$SNAP" || true)"
check "the blob is the file (sha256)" "$Q1_SHA" "$(sha256sum "$CACHE/models--prism-test--Tiny-gguf/blobs/$Q1_SHA" | cut -d' ' -f1)"
check "no .incomplete left" "0" "$(find "$CACHE" -name '*.incomplete' | wc -l)"
check "only the Q1_0 file fetched (one blob)" "1" "$(find "$CACHE/models--prism-test--Tiny-gguf/blobs" -type f | wc -l)"
has "the mmproj file is noted" "vision projector mmproj-Tiny-F16.gguf" "$WORK/err"
# As huggingface_hub reads it: refs/<rev> -> snapshots/<commit>/<file> resolving to a complete file.
python3 - "$CACHE" "$Q1_SIZE" >"$WORK/py" 2>&1 <<'EOF' && ok "the cache reads back by path (python)" || bad "python read-back: $(cat "$WORK/py")"
import os, sys
cache, size = sys.argv[1], int(sys.argv[2])
repo = os.path.join(cache, "models--prism-test--Tiny-gguf")
commit = open(os.path.join(repo, "refs", "main")).read().strip()
p = os.path.join(repo, "snapshots", commit, "Tiny-Q1_0.gguf")
assert os.path.islink(p) and not os.path.isabs(os.readlink(p)), p
real = os.path.realpath(p)
assert os.path.dirname(real) == os.path.realpath(os.path.join(repo, "blobs")), real
assert os.path.getsize(real) == size and open(real, "rb").read(4) == b"GGUF"
EOF

# ---- an .incomplete left by an earlier process: never used, resumed ----
fresh_cache partial
start_mock
PBLOBS="$CACHE/models--prism-test--Tiny-gguf/blobs"
mkdir -p "$PBLOBS"
head -c 1000 "$R/Tiny-gguf/Tiny-Q1_0.gguf" >"$PBLOBS/$Q1_SHA.incomplete"
if HF_HUB_OFFLINE=1 "$BIN" run -hf prism-test/Tiny-gguf:Q1_0 -n 1 >"$WORK/out" 2>"$WORK/err"; then bad "a partial download was loaded"; else
  has "a partial download is not in the cache" "not in the cache" "$WORK/err"
fi
check "list does not show a partial download" "[]" "$(HF_HUB_OFFLINE=1 "$BIN" list --json | tr -d ' \n')"
: >"$WORK/log"
"$BIN" pull prism-test/Tiny-gguf:Q1_0 >"$WORK/out" 2>"$WORK/err" || bad "pull over a partial download: $(cat "$WORK/err")"
check "the next process resumes it at its size" "1" \
  "$(grep -c '"port": "cdn", "method": "GET", "path": "/blob/'"$Q1_SHA"'", "range": "bytes=1000-"' "$WORK/log")"
check "the resumed file is whole" "$Q1_SHA" "$(sha256sum "$PBLOBS/$Q1_SHA" | cut -d' ' -f1)"

# ---- the second run does not touch the network ----
stop_mock
if "$BIN" run -hf prism-test/Tiny-gguf:Q1_0 -p "hello" -n 4 --temp 0 >"$WORK/out" 2>"$WORK/err"; then
  ok "run -hf with the hub stopped (from the cache)"
else
  bad "run -hf from the cache: $(cat "$WORK/err")"
fi
check "run -hf generated text" "1" "$([ -s "$WORK/out" ] && echo 1 || echo 0)"
if HF_HUB_OFFLINE=1 "$BIN" info -hf prism-test/Tiny-gguf:q1_0 --json >"$WORK/out" 2>"$WORK/err"; then
  ok "info -hf offline (tag case-insensitive)"
else
  bad "info -hf offline: $(cat "$WORK/err")"
fi
if HF_HUB_OFFLINE=1 "$BIN" pull prism-test/Tiny-gguf:Q2_0 >"$WORK/out" 2>"$WORK/err"; then bad "offline pull of an uncached file"; else
  has "offline: a file not in the cache is named as such" "not in the cache (HF_HUB_OFFLINE=1)" "$WORK/err"
fi
if HF_HUB_OFFLINE=1 "$BIN" pull prism-test/Other-gguf >"$WORK/out" 2>"$WORK/err"; then bad "offline pull of an uncached repo"; else
  has "offline: an uncached repository" "prism-test/Other-gguf: not in the cache" "$WORK/err"
fi
"$BIN" list >"$WORK/out" 2>"$WORK/err"
has "list shows the pulled model as REPO:FILE" "^prism-test/Tiny-gguf:Tiny-Q1_0.gguf " "$WORK/out"
"$BIN" list --json >"$WORK/out"
check "list --json" "prism-test/Tiny-gguf Tiny-Q1_0.gguf $Q1_SIZE true" \
  "$(python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))[0]; print(e["repo"], e["file"], e["size"], str(e["current"]).lower())' "$WORK/out")"

# ---- quant tags ----
start_mock
"$BIN" pull prism-test/Tiny-gguf:Q2_0 >"$WORK/out" 2>"$WORK/err" || true
check "tag Q2_0 picks Tiny-Q2_0.gguf (not PQ2_0)" "Tiny-Q2_0.gguf" "$(basename "$(cat "$WORK/out")")"
"$BIN" pull prism-test/Tiny-gguf:PQ2_0 >"$WORK/out" 2>"$WORK/err" || true
check "tag PQ2_0 picks Tiny-PQ2_0.gguf" "Tiny-PQ2_0.gguf" "$(basename "$(cat "$WORK/out")")"
if "$BIN" pull prism-test/Tiny-gguf >"$WORK/out" 2>"$WORK/err"; then bad "no tag with three models"; else
  has "no tag: the three models are listed" "3 models match (Tiny-PQ2_0.gguf, Tiny-Q1_0.gguf, Tiny-Q2_0.gguf); name one with :QUANT or -hff FILE" "$WORK/err"
fi
if "$BIN" run -hf prism-test/Tiny-gguf:PTQ1_0 -n 1 >"$WORK/out" 2>"$WORK/err"; then bad "a missing tag"; else
  has "a missing tag lists what the repository has" "no model with quant tag 'PTQ1_0' (prism-test/Tiny-gguf has: Tiny-PQ2_0.gguf, Tiny-Q1_0.gguf, Tiny-Q2_0.gguf)" "$WORK/err"
fi
"$BIN" pull prism-test/Tiny-gguf -hff Tiny-Q1_0.gguf >"$WORK/out" 2>"$WORK/err" || true
check "-hff names the file" "Tiny-Q1_0.gguf" "$(basename "$(cat "$WORK/out")")"
"$BIN" pull prism-test/Ternary-gguf >"$WORK/out" 2>"$WORK/err" || true
check "no tag, one model: taken" "Ternary-Q1_0.gguf" "$(basename "$(cat "$WORK/out")")"
check "the same bytes in two repositories are two caches" "$Q1_SHA" \
  "$(basename "$(readlink "$(cat "$WORK/out")")")"

# ---- split files ----
"$BIN" pull prism-test/Split-gguf:Q1_0 >"$WORK/out" 2>"$WORK/err" || bad "pull split: $(cat "$WORK/err")"
check "split: both parts fetched, in order" "Split-Q1_0-00001-of-00002.gguf Split-Q1_0-00002-of-00002.gguf" \
  "$(xargs -n1 basename <"$WORK/out" | tr '\n' ' ' | sed 's/ $//')"
check "split: the parts are the repository's files" "$SPLIT_SHAS" "$(xargs cat <"$WORK/out" | sha256sum | cut -d' ' -f1)"
GEN=(-p "hello" -n 12 --temp 0 --ignore-eos)
if "$BIN" run -hf prism-test/Split-gguf:Q1_0 "${GEN[@]}" >"$WORK/out2" 2>"$WORK/err"; then
  ok "split: run -hf loads the parts as one model"
else
  bad "split: run -hf on a split model: $(cat "$WORK/err")"
fi
"$BIN" run -m "$R/Tiny-gguf/Tiny-Q1_0.gguf" "${GEN[@]}" >"$WORK/out3" 2>/dev/null || bad "run on the unsplit file"
check "split: the same text as the unsplit file" "$(cat "$WORK/out3")" "$(cat "$WORK/out2")"
check "split: some text was generated" "1" "$([ -s "$WORK/out2" ] && echo 1 || echo 0)"
"$BIN" info -hf prism-test/Split-gguf:Q1_0 --json >"$WORK/out2" 2>"$WORK/err" || bad "info -hf split: $(cat "$WORK/err")"
check "split: info -hf shows both parts and their total size" "2 $(($(stat -L -c %s "$R"/Split-gguf/*-00001-of-00002.gguf) + $(stat -L -c %s "$R"/Split-gguf/*-00002-of-00002.gguf)))" \
  "$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(len(j["parts"]), j["size"])' "$WORK/out2")"
SPLIT_BYTES=$(($(stat -L -c %s "$R"/Split-gguf/*-00001-of-00002.gguf) + $(stat -L -c %s "$R"/Split-gguf/*-00002-of-00002.gguf)))
"$BIN" list --json >"$WORK/out2" 2>"$WORK/err" || bad "list with a split model: $(cat "$WORK/err")"
check "split: list shows one model (its first part, both parts' bytes)" \
  "1 Split-Q1_0-00001-of-00002.gguf $SPLIT_BYTES 2 2" \
  "$(python3 -c 'import json,sys; e=[x for x in json.load(open(sys.argv[1])) if x["repo"]=="prism-test/Split-gguf"]; print(len(e), e[0]["file"], e[0]["size"], e[0]["parts"], e[0]["parts_present"])' "$WORK/out2")"
rm "$R/Split-gguf/Split-Q1_0-00002-of-00002.gguf"
fresh_cache split2
if "$BIN" pull prism-test/Split-gguf:Q1_0 >"$WORK/out" 2>"$WORK/err"; then bad "a split with a part missing"; else
  has "split: a missing part is named" "lacks part(s) 2 of 2" "$WORK/err"
fi

# ---- a wrong checksum is refused, nothing is left ----
fresh_cache badsha
start_mock --wrong-sha
if "$BIN" pull prism-test/Tiny-gguf:Q1_0 >"$WORK/out" 2>"$WORK/err"; then bad "a wrong sha256 was accepted"; else
  has "checksum mismatch refused" "prism-test/Tiny-gguf: Tiny-Q1_0.gguf: checksum mismatch" "$WORK/err"
fi
check "nothing in blobs/ after a mismatch" "0" "$(find "$CACHE" -path '*blobs*' -type f | wc -l)"
check "no snapshot entry after a mismatch" "0" "$(find "$CACHE" -path '*snapshots*' \( -type f -o -type l \) | wc -l)"

# ---- a file larger than the free disk is refused before a byte is written ----
fresh_cache disk
start_mock --claim-size 1152921504606846976
if "$BIN" pull prism-test/Tiny-gguf:Q1_0 >"$WORK/out" 2>"$WORK/err"; then bad "a file larger than the disk"; else
  has "disk full: named with what to do" "prism-test/Tiny-gguf: Tiny-Q1_0.gguf: needs 1073741824.00 GiB more, .* free in .*; free some space or set HF_HOME to a larger disk" "$WORK/err"
fi
check "disk full: nothing in blobs/" "0" "$(find "$CACHE" -path '*blobs*' -type f | wc -l)"

# ---- tokens ----
fresh_cache token
start_mock --token s3cret-token
if "$BIN" pull prism-test/Tiny-gguf:Q1_0 >"$WORK/out" 2>"$WORK/err"; then bad "401 without a token"; else
  has "401 without a token says to set HF_TOKEN" "Tiny-gguf: the file list: 401 Unauthorized: .*set HF_TOKEN" "$WORK/err"
fi
if HF_TOKEN=wr0ng-token "$BIN" pull prism-test/Tiny-gguf:Q1_0 >"$WORK/out" 2>"$WORK/err"; then bad "401 with a wrong token"; else
  has "a refused token is named" "HF_TOKEN was refused" "$WORK/err"
  check "the token is never printed" "0" "$(grep -c wr0ng "$WORK/err" || true)"
fi
: >"$WORK/log"
if HF_TOKEN=s3cret-token "$BIN" pull prism-test/Tiny-gguf:Q1_0 >"$WORK/out" 2>"$WORK/err"; then ok "pull with the token"; else bad "pull with the token: $(cat "$WORK/err")"; fi
check "every hub request carried the token" "0" "$(grep '"port": "hub"' "$WORK/log" | grep -c '"auth": false' || true)"
check "the CDN got requests" "1" "$(grep -c '"port": "cdn"' "$WORK/log")"
check "the CDN never saw the token" "0" "$(grep '"port": "cdn"' "$WORK/log" | grep -c '"auth": true' || true)"
# The file `huggingface-cli login` writes is read when HF_TOKEN is unset.
fresh_cache tokenfile
mkdir -p "$HF_HOME" && echo s3cret-token >"$HF_HOME/token"
"$BIN" pull prism-test/Tiny-gguf:Q1_0 >"$WORK/out" 2>"$WORK/err" && ok "the token from \$HF_HOME/token" || bad "token file: $(cat "$WORK/err")"

# ---- 404s and no network ----
start_mock
if "$BIN" pull prism-test/Nope-gguf >"$WORK/out" 2>"$WORK/err"; then bad "404 repository"; else
  has "404: no such repository" "prism-test/Nope-gguf: the file list: 404: no repository prism-test/Nope-gguf" "$WORK/err"
fi
if "$BIN" pull prism-test/Tiny-gguf -hff Nope.gguf >"$WORK/out" 2>"$WORK/err"; then bad "missing file"; else
  has "a missing file lists the repository's models" "prism-test/Tiny-gguf: no file 'Nope.gguf' (prism-test/Tiny-gguf has: " "$WORK/err"
fi
if "$BIN" pull 'not a repo' >"$WORK/out" 2>"$WORK/err"; then bad "bad repo syntax"; else
  has "a malformed name" "expected a Hugging Face repository OWNER/NAME" "$WORK/err"
fi
fresh_cache nonet
if HF_ENDPOINT="http://127.0.0.1:1" "$BIN" pull prism-test/Tiny-gguf:Q1_0 >"$WORK/out" 2>"$WORK/err"; then bad "no network"; else
  has "no network is one line naming the endpoint" "prism-test/Tiny-gguf: the file list: cannot reach http://127.0.0.1:1" "$WORK/err"
  check "one line" "1" "$(wc -l <"$WORK/err")"
fi

# ---- serve -hf ----
fresh_cache resume  # the cache of the first scenario, with the hub up
"$BIN" serve -hf tiny=prism-test/Tiny-gguf:Q1_0 --port 0 -t 1 -np 1 --pool-size 1 >"$WORK/sout" 2>"$WORK/serr" &
SERVER_PID=$!
URL=""
for _ in $(seq 300); do
  URL="$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$WORK/sout" 2>/dev/null | head -1)"
  [ -n "$URL" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
if [ -n "$URL" ]; then
  code="$(curl -s -o "$WORK/resp" -w '%{http_code}' "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"tiny","prompt":"hi","max_tokens":3}')"
  check "serve -hf answers a completion" "200" "$code"
  has "the completion has text" '"text"' "$WORK/resp"
else
  bad "serve -hf did not start: $(cat "$WORK/serr")"
fi
kill -TERM "$SERVER_PID" 2>/dev/null || true
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=""

echo "hub_test: $FAILS failure(s)"
[ "$FAILS" -eq 0 ]
