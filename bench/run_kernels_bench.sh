#!/usr/bin/env bash
# Runs bonsai_bench_kernels and prints a self-describing report: the machine
# (CPU model, the ISA flags the kernels care about, cores, memory, load), the
# exact command, then the benchmark output and its summary.
#
# Usage: bench/run_kernels_bench.sh [BUILD_DIR] [extra benchmark flags...]
#   BUILD_DIR defaults to build-kernels (relative to the repository root).
# Save a result:  bench/run_kernels_bench.sh build-kernels | tee bench/results/kernels-$(date +%F).txt
# Issue 8 figures (medians of 3 repetitions, 1 and 2 threads, N = 1..512):
#   bench/run_kernels_bench.sh build-kern --benchmark_min_time=0.1 \
#     --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-build-kernels}"
shift || true
bin="$root/$build/bench/bonsai_bench_kernels"
if [[ ! -x "$bin" ]]; then
  echo "missing $bin: build it with cmake --build $build --target bonsai_bench_kernels" >&2
  exit 1
fi
echo "# bonsai_bench_kernels report"
echo "date:        $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "commit:      $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "cpu:         $(lscpu | sed -n 's/^Model name: *//p')"
echo "cores:       $(nproc) online; $(lscpu | sed -n 's/^Thread(s) per core: *//p') thread(s)/core; $(lscpu | sed -n 's/^Core(s) per socket: *//p') core(s)/socket"
echo "caches:      L2 $(lscpu | sed -n 's/^L2 cache: *//p'); L3 $(lscpu | sed -n 's/^L3 cache: *//p')"
echo "isa flags:   $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx512vbmi|gfni|avx_vnni|amx_tile|amx_int8|amx_bf16)$' | tr '\n' ' ')"
echo "all flags:   $(grep -m1 '^flags' /proc/cpuinfo | sed 's/^flags[[:space:]]*: //')"
echo "memory:      $(free -g | awk '/^Mem:/ {print $2 " GiB total"}')"
echo "hypervisor:  $(lscpu | sed -n 's/^Hypervisor vendor: *//p')"
echo "load avg:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min; the machine is shared, other jobs run concurrently)"
echo "kernel tier: ${BONSAI_KERNEL:-best supported}"
echo "command:     $build/bench/bonsai_bench_kernels $*"
echo
"$bin" "$@"
