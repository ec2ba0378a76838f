#!/usr/bin/env bash
# `bonsai bench` on the Bonsai-1.7B shape (Q1_0 and Q2_0 written by `bonsai
# synth`, reused when present): pp512 / tg128 at 1 and 2 threads, then tg at
# depth 4096 (2 threads), with the machine described (CPU model and flags,
# load) and the commands, ready for bench/results/.
# Usage: bench/run_e2e_bench.sh [BUILD_DIR] [REPS]   (default build-cli, 3)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/${1:-build-cli}/apps/bonsai/bonsai"
reps="${2:-3}"
q1="${TMPDIR:-/tmp}/b17.gguf"
q2="${TMPDIR:-/tmp}/b17q2.gguf"
[ -f "$q1" ] || "$bin" synth --preset 1.7b -o "$q1"
[ -f "$q2" ] || "$bin" synth --preset 1.7b --type q2_0 -o "$q2"
echo "# date $(date -u '+%F %T UTC'), commit $(git -C "$root" rev-parse --short HEAD)"
echo "# cpu $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) cores"
echo "# flags $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512[a-z_0-9]*|avx_vnni|amx[a-z_0-9]*)$' | tr '\n' ' ')"
echo "# load before $(cut -d' ' -f1-3 /proc/loadavg)"
run() {
  echo
  echo "\$ bonsai $*"
  "$bin" "$@"
}
run bench -m "$q1,$q2" -p 512 -n 128 -t 1,2 -r "$reps"
run bench -m "$q1" -p 0 -n 32 -d 4096 -t 2 -r 2
echo
echo "# load after $(cut -d' ' -f1-3 /proc/loadavg)"
