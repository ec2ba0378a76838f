#!/usr/bin/env bash
# Speculative decoding (prompt lookup, issue 29) A/B on one stream: `bonsai run`
# at temperature 0 on stories260K with a prompt that the answer partly repeats,
# --spec-type ngram against --spec-type none, alternating, PAIRS pairs in one
# run (the shared VMs drift: only the paired ratios mean something). Prints
# each pair's generation tokens/s, the ratio, the draft / accepted counts and
# whether the two texts are identical; then the median ratio.
#
# Usage: bench/spec_bench.sh [BONSAI_BIN] [PAIRS] [N_PREDICT] [THREADS]
#   BONSAI_BIN  default build/apps/bonsai/bonsai
#   PAIRS       default 7
#   N_PREDICT   default 256
#   THREADS     default 1
# The model is $BONSAI_SHARED/models/stories260K/stories260K.gguf
# (BONSAI_SHARED defaults to ../shared from the repository root); env SPEC_PROMPT replaces the prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-build/apps/bonsai/bonsai}"
PAIRS="${2:-7}"
N="${3:-256}"
THREADS="${4:-1}"
SHARED="${BONSAI_SHARED:-../shared}"
MODEL="$SHARED/models/stories260K/stories260K.gguf"
[ -f "$MODEL" ] || { echo "spec_bench: no model at $MODEL" >&2; exit 1; }
PROMPT="${SPEC_PROMPT:-Once upon a time, there was a little girl named Lily. She liked to play with her ball in the park. \
One day, Lily saw a big dog in the park. The dog was brown and it wanted to play with the ball. \
Once upon a time, there was a little girl named Lily. She liked to play with her ball in the park. One day,}"
TMP="$(mktemp -d /tmp/spec_bench.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

run() {  # $1: spec type, $2: output file
  "$BIN" run -m "$MODEL" -t "$THREADS" --temp 0 -n "$N" --ignore-eos --json --spec-type "$1" -p "$PROMPT" >"$2" 2>/dev/null
}

echo "model $MODEL, -n $N, -t $THREADS, $PAIRS pairs (ngram then none, alternating)"
echo "pair  ngram_tok/s   none_tok/s   ratio  draft_n  accepted  same_text"
ratios=()
for i in $(seq 1 "$PAIRS"); do
  run ngram "$TMP/a.json"
  run none "$TMP/b.json"
  line="$(python3 - "$TMP/a.json" "$TMP/b.json" "$i" <<'EOF'
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
ta, tb = a["timings"], b["timings"]
r = ta["predicted_per_second"] / tb["predicted_per_second"]
print(f'{int(sys.argv[3]):4d}  {ta["predicted_per_second"]:11.1f}  {tb["predicted_per_second"]:11.1f}  {r:6.3f}  '
      f'{ta["draft_n"]:7d}  {ta["draft_n_accepted"]:8d}  {a["text"] == b["text"]}')
EOF
)"
  echo "$line"
  ratios+=("$(echo "$line" | awk '{print $4}')")
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print "median ratio (ngram / none): " a[int((NR+1)/2)]}'
