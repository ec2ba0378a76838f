#!/usr/bin/env bash
# Builds the GGUF reader's libFuzzer target (tests/gguf/gguf_fuzz.cpp) under
# ASan + UBSan into its own build dir and runs it for a bounded time.
# Exits non-zero if the fuzzer finds a crash, leak, over-read or UB.
#
#   scripts/fuzz.sh [SECONDS]      (default 60; env FUZZ_SECONDS also works)
#   env FUZZ_BUILD_DIR (default build-fuzz)
#
# Toolchain note: the code base needs C++23 <expected>, which Debian 12's
# clang 14 cannot compile against libstdc++ 12, so the target is compiled by
# g++ with -fsanitize-coverage=trace-pc,trace-cmp and linked with clang 14's
# libFuzzer runtime (libclang_rt.fuzzer). libFuzzer 14 refuses GCC's trace-pc
# hook, so the hook is renamed in the objects to tests/gguf/fuzz_coverage.cpp's
# bonsai_fuzz_trace_pc, which feeds libFuzzer's extra-counters section.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN="${1:-${FUZZ_SECONDS:-60}}"
OUT="${FUZZ_BUILD_DIR:-build-fuzz}"
CXX="${CXX_FUZZ:-g++}"

FUZZER_LIB="$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null | sort -V | tail -1 || true)"
if [ -z "$FUZZER_LIB" ]; then
  echo "fuzz: libclang_rt.fuzzer-x86_64.a not found (apt-get install clang / libclang-rt-dev)" >&2
  exit 1
fi

mkdir -p "$OUT/obj" "$OUT/corpus" "$OUT/artifacts"
SAN=(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
FLAGS=(-std=c++23 -O1 -g -Isrc "${SAN[@]}")
SRCS=(src/gguf/gguf.cpp src/core/ggml_types.cpp src/core/mapped_file.cpp src/core/error.cpp tests/gguf/gguf_fuzz.cpp)
objs=()
for s in "${SRCS[@]}"; do
  o="$OUT/obj/$(echo "$s" | tr '/' '_').o"
  if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ src/gguf/gguf.h -nt "$o" ]; then
    "$CXX" "${FLAGS[@]}" -fsanitize-coverage=trace-pc,trace-cmp -c "$s" -o "$o"
    objcopy --redefine-sym __sanitizer_cov_trace_pc=bonsai_fuzz_trace_pc "$o"
  fi
  objs+=("$o")
done
"$CXX" "${FLAGS[@]}" -c tests/gguf/fuzz_coverage.cpp -o "$OUT/obj/fuzz_coverage.o"
"$CXX" "${SAN[@]}" "${objs[@]}" "$OUT/obj/fuzz_coverage.o" "$FUZZER_LIB" -lpthread -o "$OUT/gguf_fuzz"

# Seeds: the first 4 KiB of every shared .gguf (header + part of the
# metadata), plus the tiny generated files the hostile test writes.
SHARED="${BONSAI_SHARED:-../shared}"
for f in "$SHARED"/fixtures/*.gguf "$SHARED"/models/*/*.gguf; do
  [ -f "$f" ] && head -c 4096 "$f" > "$OUT/corpus/seed-$(basename "$f")"
done
# A complete small valid file: header, one kv, two tensors (F32 [8], Q2_0 [128,64] g128 d-first).
python3 - "$OUT/corpus/seed-small.gguf" <<'PY'
import struct, sys
def s(x): b = x.encode(); return struct.pack("<Q", len(b)) + b
h = b"GGUF" + struct.pack("<IQQ", 3, 2, 2)
h += s("general.architecture") + struct.pack("<I", 8) + s("qwen3")
h += s("a.arr") + struct.pack("<IIQ", 9, 8, 2) + s("x") + s("yz")
h += s("t0") + struct.pack("<I", 1) + struct.pack("<q", 8) + struct.pack("<IQ", 0, 0)
h += s("t1") + struct.pack("<I", 2) + struct.pack("<qq", 128, 64) + struct.pack("<IQ", 42, 32)
h += b"\0" * (-len(h) % 32)
data = struct.pack("<8f", *range(8)) + (b"\x00\x3c" + b"\x00" * 32) * 64
open(sys.argv[1], "wb").write(h + data)
PY

echo "fuzz: running $OUT/gguf_fuzz for ${SECONDS_TO_RUN}s"
set +e
"$OUT/gguf_fuzz" -max_total_time="$SECONDS_TO_RUN" -max_len=16384 -use_value_profile=1 -timeout=10 \
  -rss_limit_mb=2048 -artifact_prefix="$OUT/artifacts/" -print_final_stats=1 \
  "$OUT/corpus" > "$OUT/fuzz.log" 2>&1
rc=$?
set -e
tail -n 12 "$OUT/fuzz.log"
if [ $rc -ne 0 ]; then
  echo "fuzz: FAILED (exit $rc); crashing input in $OUT/artifacts/, log $OUT/fuzz.log" >&2
  exit 1
fi
echo "fuzz: no crash in ${SECONDS_TO_RUN}s"
