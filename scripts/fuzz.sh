#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/gguf/gguf_fuzz.cpp: the GGUF reader and its split sets;
# tests/server/http_fuzz.cpp: OpenAI request parsing + chat rendering) under
# ASan + UBSan into their own build dir and runs each for a bounded time.
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

mkdir -p "$OUT/obj" "$OUT/corpus" "$OUT/http-corpus" "$OUT/artifacts"
SAN=(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
FLAGS=(-std=c++23 -O1 -g -Isrc "${SAN[@]}")
"$CXX" "${FLAGS[@]}" -c tests/gguf/fuzz_coverage.cpp -o "$OUT/obj/fuzz_coverage.o"

# build_target NAME HEADER SOURCES...: compiles the sources with coverage
# (rebuilding an object when its source or HEADER is newer) and links NAME.
build_target() {
  local name="$1" header="$2"
  shift 2
  local objs=() s o
  for s in "$@"; do
    o="$OUT/obj/$(echo "$s" | tr '/' '_').o"
    if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ "$header" -nt "$o" ]; then
      "$CXX" "${FLAGS[@]}" -fsanitize-coverage=trace-pc,trace-cmp -c "$s" -o "$o"
      objcopy --redefine-sym __sanitizer_cov_trace_pc=bonsai_fuzz_trace_pc "$o"
    fi
    objs+=("$o")
  done
  "$CXX" "${SAN[@]}" "${objs[@]}" "$OUT/obj/fuzz_coverage.o" "$FUZZER_LIB" -lpthread -lutf8proc -o "$OUT/$name"
}

build_target gguf_fuzz src/gguf/gguf.h \
  src/gguf/gguf.cpp src/gguf/split.cpp src/core/ggml_types.cpp src/core/mapped_file.cpp src/core/error.cpp tests/gguf/gguf_fuzz.cpp
# The HTTP request path: OpenAI request parsing/validation, chat rendering,
# the response builders (logprobs: tokenizer/unicode's sanitize_utf8, so
# utf8proc is linked), and the structured-output fields (response_format / json_schema / grammar /
# tool_choice -> JSON Schema -> GBNF -> compiled grammar) that parsing calls
# (with engine/chat_output's schema_resolves_to_string, which the XML tool-call
# grammar shares with the parser).
build_target http_fuzz src/server/openai.h \
  src/server/openai.cpp src/server/structured_output.cpp src/structured/grammar.cpp src/structured/json_schema.cpp src/structured/regular.cpp \
  src/engine/chat_output.cpp src/tokenizer/chat_template.cpp src/tokenizer/jinja.cpp src/tokenizer/unicode.cpp src/core/error.cpp \
  tests/server/http_fuzz.cpp

# Seeds: the first 4 KiB of every shared .gguf (header + part of the
# metadata), plus the tiny generated files the hostile test writes.
SHARED="${BONSAI_SHARED:-../shared}"
for f in "$SHARED"/fixtures/*.gguf "$SHARED"/models/*/*.gguf; do
  [ -f "$f" ] && head -c 4096 "$f" > "$OUT/corpus/seed-$(basename "$f")"
done
# A complete small valid file: header, two kvs (string, string array), two tensors
# (F32 [8] and a g128 d-first Q2_0 [128,2]), 324 bytes.
printf '\x47\x47\x55\x46\x03\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00\x00\x00\x67\x65\x6e\x65\x72\x61\x6c\x2e\x61\x72\x63\x68\x69\x74\x65\x63\x74\x75\x72\x65\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x71\x77\x65\x6e\x33\x05\x00\x00\x00\x00\x00\x00\x00\x61\x2e\x61\x72\x72\x09\x00\x00\x00\x08\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x78\x02\x00\x00\x00\x00\x00\x00\x00\x79\x7a\x02\x00\x00\x00\x00\x00\x00\x00\x74\x30\x01\x00\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x74\x31\x02\x00\x00\x00\x80\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x2a\x00\x00\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40\x00\x00\x80\x40\x00\x00\xa0\x40\x00\x00\xc0\x40\x00\x00\xe0\x40\x00\x3c\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x3c\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00' > "$OUT/corpus/seed-small.gguf"

cp tests/server/fuzz_corpus/* "$OUT/http-corpus/"

# run_target NAME SECONDS CORPUS MAX_LEN: runs one fuzzer; fails the script on a finding.
run_target() {
  local name="$1" secs="$2" corpus="$3" max_len="$4" rc
  echo "fuzz: running $OUT/$name for ${secs}s"
  set +e
  "$OUT/$name" -max_total_time="$secs" -max_len="$max_len" -use_value_profile=1 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$OUT/artifacts/$name-" -print_final_stats=1 \
    "$corpus" > "$OUT/$name.log" 2>&1
  rc=$?
  set -e
  tail -n 12 "$OUT/$name.log"
  if [ $rc -ne 0 ]; then
    echo "fuzz: $name FAILED (exit $rc); crashing input in $OUT/artifacts/, log $OUT/$name.log" >&2
    exit 1
  fi
  echo "fuzz: $name: no crash in ${secs}s"
}

run_target gguf_fuzz "$SECONDS_TO_RUN" "$OUT/corpus" 16384
run_target http_fuzz "$SECONDS_TO_RUN" "$OUT/http-corpus" 8192
