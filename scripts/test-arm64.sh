#!/usr/bin/env bash
# Builds the aarch64 binaries (scripts/cross-arm64.sh, into
# ${BUILD_DIR:-build-arm64}) and runs a chosen part of the suite under
# qemu-aarch64 (user-mode emulation, ~10-50x slower than native), once per
# ARM kernel tier:
#   - CPU "max" (qemu's every extension: dotprod, i8mm, SVE), BONSAI_KERNEL
#     forced to neon-i8mm, neon-dotprod and neon in turn: the Qwen3 Q1_0
#     fixture's golden (model_golden_test), stories260K's 256 greedy tokens
#     from BOS (engine_inference_test) and a server smoke test: `bonsai serve` on
#     loopback answers one /v1/chat/completions, whose greedy text must
#     equal the x86 build's (./build, when there) for the same request;
#     then once the kernel tests, which try every supported tier against
#     the reference on the awkward shapes and batch sizes (invariance with
#     batches up to 17 columns: BONSAI_TEST_EMULATED=1), the NEON Hadamard,
#     delta-rule and attention kernels (model_attention_test, the subset
#     named at ATTN_MAX below), the NEON argmax (engine_sampling_test
#     Argmax.*) and the tokenizer vectors;
#   - CPU "cortex-a53" (ARMv8.0: no dotprod, no i8mm): kernels_test (only
#     the baseline tier offered and chosen), the bit-identity tests, the Q1_0
#     golden and the stories260K tokens with the tier chosen from getauxval,
#     the attention kernel tests (reference and neon tiers), and
#     BONSAI_KERNEL=neon-dotprod refused.
# Left out (too slow under emulation, or no ARM-specific code): the kernel
# tests' two "within bound" tests (Tiers.RandomAwkwardShapesWithinBound,
# LargestBonsaiShapesThreaded), invariance batches of 64 and 512, the
# packing tests of the x86 layouts, the Q2_0 / F16 / qwen35 goldens (the Q2_0
# layouts' products are bit-identical to the reference in the kernel tests),
# the Qwen3 greedy-token golden (> 5 min), the server
# suites (HTTP, OpenAI/Ollama/Anthropic routes, Node clients, browser), the
# tests that start other binaries (cli tests), the qwen35 tests, fuzzing and
# sanitizers; they run natively on x86 (scripts/test.sh).
# Fixtures from ../shared (BONSAI_SHARED overrides); a missing fixture fails
# under CI=true (the tests' own rule). Prints the wall time of each part.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
BUILD_DIR="${BUILD_DIR:-build-arm64}"
export BONSAI_SHARED="${BONSAI_SHARED:-$PWD/../shared}"
KERNEL_TESTS=(kernels_test kernels_formats_test kernels_golden_test kernels_tiers_test kernels_invariance_test
              kernels_packing_test kernels_hadamard_test kernels_delta_rule_test kernels_silu_test
              kernels_ssm_conv_test)
MODEL_TESTS=(model_golden_test engine_inference_test model_attention_test engine_sampling_test)
TOKENIZER_TESTS=(tokenizer_qwen_test tokenizer_decode_test)
TARGETS="bonsai ${KERNEL_TESTS[*]} ${MODEL_TESTS[*]} ${TOKENIZER_TESTS[*]}" ./scripts/cross-arm64.sh
echo "test-arm64: build took $((SECONDS - start)) s"

QEMU="$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)"
[ -n "$QEMU" ] || { echo "test-arm64: no qemu-aarch64 (apt-get install qemu-user-static)"; exit 1; }
# The arm64 loader and libraries are the multiarch ones (libc6:arm64 in
# /lib/aarch64-linux-gnu): no QEMU_LD_PREFIX / -L (see cmake/toolchain-aarch64.cmake).
unset QEMU_LD_PREFIX
export CI="${CI:-}"

failures=()
LOG_DIR="$(mktemp -d "${TMPDIR:-/tmp}/bonsai-arm64.XXXXXX")"
SERVER_PID=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
  rm -rf "$LOG_DIR"
}
trap cleanup EXIT

# run_test CPU KERNEL NAME [gtest args...]: one test binary under qemu.
# KERNEL "" leaves BONSAI_KERNEL unset (the tier chosen from getauxval).
run_test() {
  local cpu="$1" kernel="$2" name="$3" bin log t0=$SECONDS
  shift 3
  bin="$(find "$BUILD_DIR/tests" -type f -name "$name" | head -1)"
  log="$LOG_DIR/$name.$cpu.${kernel:-auto}.log"
  if env QEMU_CPU="$cpu" ${kernel:+BONSAI_KERNEL=$kernel} timeout 900 "$QEMU" "$bin" "$@" >"$log" 2>&1; then
    echo "test-arm64: ok   $name (cpu $cpu, kernel ${kernel:-auto}): $(grep -E '^\[  PASSED  \]' "$log" | head -1 | sed 's/\[  PASSED  \] //'), $((SECONDS - t0)) s"
  else
    echo "test-arm64: FAIL $name (cpu $cpu, kernel ${kernel:-auto}), $((SECONDS - t0)) s"
    grep -E '^\[  FAILED  \]|Failure|rror' "$log" | head -30 || tail -30 "$log"
    failures+=("$name/$cpu/${kernel:-auto}")
  fi
}

# chat_text URL: the greedy reply of a fixed request (stories260K).
chat_text() {
  curl -s --max-time 600 -H 'Content-Type: application/json' "$1/v1/chat/completions" \
    -d '{"model": "stories", "messages": [{"role": "user", "content": "Once upon a time"}],
         "max_tokens": 24, "temperature": 0}'
}

# start_server BIN PREFIX...: `bonsai serve` on 127.0.0.1 (any free port),
# sets SERVER_PID and URL.
start_server() {
  local bin="$1" out="$LOG_DIR/serve.out"
  shift
  : >"$out"
  "$@" "$bin" serve -m "stories=$BONSAI_SHARED/models/stories260K/stories260K.gguf" --port 0 --threads 2 \
    >"$out" 2>"$LOG_DIR/serve.err" &
  SERVER_PID=$!
  URL=""
  for _ in $(seq 1 1200); do
    URL="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$out" 2>/dev/null | head -1 || true)"
    [ -n "$URL" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
}

stop_server() {
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}

# The x86 build's answer (same weights, bit-identical kernels: same text).
X86_BIN=build/apps/bonsai/bonsai
want=""
if [ -x "$X86_BIN" ] && [ -f "$BONSAI_SHARED/models/stories260K/stories260K.gguf" ]; then
  start_server "$X86_BIN" env
  [ -n "$URL" ] && want="$(chat_text "$URL" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' || true)"
  stop_server
fi

# server_smoke CPU KERNEL: one chat completion from the aarch64 server.
server_smoke() {
  local cpu="$1" kernel="$2" t0=$SECONDS label="server smoke (cpu $1, kernel ${2:-auto})" got
  if [ ! -f "$BONSAI_SHARED/models/stories260K/stories260K.gguf" ]; then
    if [ "$CI" = true ]; then failures+=("server-smoke: no stories260K"); fi
    echo "test-arm64: skip $label: no stories260K"
    return
  fi
  start_server "$BUILD_DIR/apps/bonsai/bonsai" env QEMU_CPU="$cpu" ${kernel:+BONSAI_KERNEL=$kernel} "$QEMU"
  if [ -z "$URL" ]; then
    echo "test-arm64: FAIL $label: the server did not start"
    cat "$LOG_DIR/serve.out" "$LOG_DIR/serve.err"
    failures+=("server-smoke/$cpu/${kernel:-auto}")
    stop_server
    return
  fi
  got="$(chat_text "$URL" | python3 -c '
import json, sys
r = json.load(sys.stdin)
c = r["choices"][0]
assert r["object"] == "chat.completion", r
assert c["message"]["role"] == "assistant", r
assert c["finish_reason"] in ("length", "stop"), r
assert r["usage"]["completion_tokens"] >= 1, r
assert c["message"]["content"], r
print(c["message"]["content"])' 2>&1)" || {
    echo "test-arm64: FAIL $label: $got"
    failures+=("server-smoke/$cpu/${kernel:-auto}")
    stop_server
    return
  }
  stop_server
  if [ -n "$want" ] && [ "$got" != "$want" ]; then
    echo "test-arm64: FAIL $label: the reply differs from x86's"
    echo "  x86:     $want"
    echo "  aarch64: $got"
    failures+=("server-smoke/$cpu/${kernel:-auto}")
    return
  fi
  echo "test-arm64: ok   $label: \"$got\"${want:+ (= the x86 reply)}, $((SECONDS - t0)) s"
}

# The subset (qemu runs ~50x slower than native; natively these take ~1 min):
GOLDENS='*qwen3_tiny_q1_0'  # the Qwen3 fixture's golden (Q1_0; natively every fixture runs)
BOS='InferenceEngine.GreedyFromBosMatchesOracle'  # stories260K: 256 greedy tokens from BOS
# Tiers: all but the two "within bound" tests (bit-identity is what
# IntegerPartsExact and the paired-layout tests prove; the bound tests'
# double references of the largest shapes take minutes under qemu).
TIERS='-Tiers.RandomAwkwardShapesWithinBound:Tiers.LargestBonsaiShapesThreaded'
# Packing: the NEON tiers pack nothing; these check they read the stored layout.
PACKING='Packing.NameAndChoice:Packing.OnlyTheOwningTierReadsThePackedCopy'
# Attention (attention_neon.cpp; the dotprod and i8mm tiers take its table
# with the SDOT Q8_0 scorer of attention_neon_dotprod.cpp): on CPU max the
# invariance cases (every head dim and KV type: decode = prefill chunkings =
# batch mixes, bit for bit, and within the bound of a double reference) of
# the neon-dotprod tier (the shared group step plus SDOT's scores), the
# Q8_0 scores of every tier against the formula, and which kernel each ARM
# tier picks; on cortex-a53 the neon tier's odd head groups against the
# reference (AttentionKernel.*: reference and neon only, half the tiers of
# max). Left out under qemu: the reference tier's invariance cases and the
# end-to-end logits (x86 runs them; minutes under emulation).
ATTN_MAX='All/AttentionInvariance.*_neon_dotprod:AttentionKernel.Q8ScoresBitIdenticalAcrossTiers:AttentionKernel.NeonIsUsedWhereAvailable'
export BONSAI_TEST_EMULATED=1  # invariance: batches up to 17 columns (invariance_test.cpp)

# CPU max: every ARM tier forced in turn.
# (The Q1_0 fixture's teacher-forced golden: ~2 min per tier under qemu on
# 2 cores with other work, 4 when loaded; natively every fixture runs.)
for kernel in neon-i8mm neon-dotprod neon; do
  run_test max "$kernel" model_golden_test --gtest_filter="$GOLDENS"
  run_test max "$kernel" engine_inference_test --gtest_filter="$BOS"
  server_smoke max "$kernel"
done
# The kernel tests try every supported tier themselves (max: all three).
run_test max "" kernels_test
run_test max "" kernels_formats_test
run_test max "" kernels_golden_test
run_test max "" kernels_tiers_test --gtest_filter="$TIERS"
run_test max "" kernels_invariance_test
run_test max "" kernels_packing_test --gtest_filter="$PACKING"
run_test max "" kernels_hadamard_test
run_test max "" kernels_delta_rule_test
run_test max "" kernels_silu_test
run_test max "" kernels_ssm_conv_test
run_test max "" model_attention_test --gtest_filter="$ATTN_MAX"
run_test max "" engine_sampling_test --gtest_filter='Argmax.*'  # the NEON argmax against the scalar scan
for t in "${TOKENIZER_TESTS[@]}"; do run_test max "" "$t"; done
# CPU without dotprod / i8mm: the baseline tier is the one offered and chosen.
run_test cortex-a53 "" kernels_test
run_test cortex-a53 "" kernels_tiers_test --gtest_filter='Tiers.IntegerPartsExact:Tiers.GemmMultiEqualsSeparateCalls'
run_test cortex-a53 "" model_golden_test --gtest_filter="$GOLDENS"
run_test cortex-a53 "" engine_inference_test --gtest_filter="$BOS"
run_test cortex-a53 "" model_attention_test --gtest_filter='AttentionKernel.*'
if ! env QEMU_CPU=cortex-a53 BONSAI_KERNEL=neon-dotprod "$QEMU" "$BUILD_DIR/apps/bonsai/bonsai" info \
       -m "$BONSAI_SHARED/fixtures/qwen3-tiny-q1_0.gguf" >/dev/null 2>"$LOG_DIR/forced.err" &&
   grep -q "neon-dotprod' is not supported" "$LOG_DIR/forced.err"; then
  echo "test-arm64: ok   BONSAI_KERNEL=neon-dotprod on a CPU without dotprod is refused"
else
  echo "test-arm64: FAIL BONSAI_KERNEL=neon-dotprod on cortex-a53 was not refused:"; cat "$LOG_DIR/forced.err"
  failures+=("forced-unsupported")
fi

echo "test-arm64: total $((SECONDS - start)) s"
if ((${#failures[@]})); then
  echo "test-arm64: ${#failures[@]} failed: ${failures[*]}"
  exit 1
fi
echo "test-arm64: all passed"
