// Coverage bridge for building the libFuzzer target with g++ (scripts/fuzz.sh).
// Why: clang 14 (Debian 12's clang) cannot compile libstdc++ 12's <expected>,
// which the whole code base uses, so `clang++ -fsanitize=fuzzer` is not an
// option; and libFuzzer 14 no longer accepts GCC's -fsanitize-coverage=trace-pc
// hook. fuzz.sh renames that hook in the instrumented objects (objcopy
// --redefine-sym __sanitizer_cov_trace_pc=bonsai_fuzz_trace_pc) to this
// function, which bumps a counter chosen by the calling PC in the
// `__libfuzzer_extra_counters` section that libFuzzer reads as coverage.
// GCC's trace-cmp hooks go to libFuzzer directly (value profile, CMP table).
// This file itself is compiled without coverage instrumentation.
#include <cstdint>

namespace {
constexpr uintptr_t kCounters = 1u << 16;
}

__attribute__((section("__libfuzzer_extra_counters"), used)) uint8_t bonsai_fuzz_counters[kCounters];

extern "C" void bonsai_fuzz_trace_pc() {
  const uintptr_t pc = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  uint8_t& c = bonsai_fuzz_counters[(pc ^ (pc >> 16)) & (kCounters - 1)];
  c = static_cast<uint8_t>(c + 1);
}

// GCC's trace-cmp also emits float/double comparison hooks that libFuzzer does not define.
extern "C" void __sanitizer_cov_trace_cmpf(float, float) {}
extern "C" void __sanitizer_cov_trace_cmpd(double, double) {}
