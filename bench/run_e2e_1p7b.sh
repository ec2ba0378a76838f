#!/usr/bin/env bash
# End-to-end prompt/decode speed on a Bonsai-1.7B-shaped Q1_0 model written by
# `bonsai synth` (same shapes as ../shared/tools' make_qwen3_gguf.py 1.7B file
# that llama.cpp's figures in ../shared/tools/README.md were taken on).
# Usage: bench/run_e2e_1p7b.sh [BUILD_DIR]   (default build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/${1:-build}/apps/bonsai/bonsai"
model="${TMPDIR:-/tmp}/bonsai-1.7b-synth-q1_0.gguf"
[ -f "$model" ] || "$bin" synth -o "$model" --preset 1.7b --type q1_0
prompt="$(python3 -c "print('The quick brown fox jumps over the lazy dog. '*12)")"
echo "# date $(date -u '+%F %T UTC'), commit $(git -C "$root" rev-parse --short HEAD), cpu $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for t in 2 1; do
  echo "\$ bonsai run -m $model -p <350-token prompt> -n 64 --ignore-eos --temp 0 -t $t"
  "$bin" run -m "$model" -p "$prompt" -n 64 --ignore-eos --temp 0 -t "$t" 2>&1 >/dev/null | grep -E "prompt:|generation:"
done
