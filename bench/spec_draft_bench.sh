#!/usr/bin/env bash
# Speculative decoding with a draft model (issue 29): `bonsai run` at
# temperature 0 with `-md DRAFT` against `--spec-type none`, alternating,
# PAIRS pairs in one run (the shared VMs drift: only the paired ratios mean
# something). Prints each pair's generation tokens/s, the ratio, the draft /
# accepted counts and whether the two texts are identical; then the median.
#
# Usage: bench/spec_draft_bench.sh MODEL DRAFT [BONSAI_BIN] [PAIRS] [N_PREDICT] [THREADS]
#   BONSAI_BIN  default build/apps/bonsai/bonsai
#   PAIRS       default 5
#   N_PREDICT   default 96
#   THREADS     default 2
# A draft that agrees little with MODEL (e.g. `bonsai synth --preset tiny
# --n-vocab 151669 --seed 3` beside a `--preset 1.7b` model) measures what
# the adaptive rule saves: it must stay >= 0.95x. Env SPEC_PROMPT replaces the prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:?usage: bench/spec_draft_bench.sh MODEL DRAFT [BONSAI_BIN] [PAIRS] [N_PREDICT] [THREADS]}"
DRAFT="${2:?usage: bench/spec_draft_bench.sh MODEL DRAFT [BONSAI_BIN] [PAIRS] [N_PREDICT] [THREADS]}"
BIN="${3:-build/apps/bonsai/bonsai}"
PAIRS="${4:-5}"
N="${5:-96}"
THREADS="${6:-2}"
PROMPT="${SPEC_PROMPT:-Once upon a time there was a tree. Once upon a time there was a tree. Once upon a}"
TMP="$(mktemp -d /tmp/spec_draft_bench.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

run() {  # $1: output file, rest: speculation flags
  local out="$1"
  shift
  "$BIN" run -m "$MODEL" -t "$THREADS" --temp 0 -n "$N" --ignore-eos --json "$@" -p "$PROMPT" >"$out" 2>/dev/null
}

echo "model $MODEL, draft $DRAFT, -n $N, -t $THREADS, $PAIRS pairs (draft then none, alternating)"
echo "pair  draft_tok/s   none_tok/s   ratio  draft_n  accepted  same_text"
ratios=()
for i in $(seq 1 "$PAIRS"); do
  run "$TMP/a.json" -md "$DRAFT"
  run "$TMP/b.json" --spec-type none
  line="$(python3 - "$TMP/a.json" "$TMP/b.json" "$i" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
ta, tb = a["timings"], b["timings"]
r = ta["predicted_per_second"] / tb["predicted_per_second"]
print(f'{int(sys.argv[3]):4d}  {ta["predicted_per_second"]:11.2f}  {tb["predicted_per_second"]:11.2f}  {r:6.3f}  '
      f'{ta["draft_n"]:7d}  {ta["draft_n_accepted"]:8d}  {a["text"] == b["text"]}')
PY
)"
  echo "$line"
  ratios+=("$(echo "$line" | awk '{print $4}')")
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print "median ratio (draft / none): " a[int((NR+1)/2)]}'
