// The two hardware ceilings the benchmarks divide their speeds by (`bonsai
// bench`, bench/kernels_bench.cpp), measured in the same run on the same
// threads as the work they rate:
//  - read bandwidth: a multi-threaded streaming read of a large buffer (the
//    bound of decode, which streams every weight once per token);
//  - int8 dot peak: a register-only loop of the int8 multiply-accumulate
//    instruction the kernels use (VPDPBUSD on AVX-512 VNNI or AVX-VNNI,
//    VPMADDUBSW + VPMADDWD + VPADDD on AVX2 / AVX-512 without VNNI): the
//    bound of prompt processing, which is compute-bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/kernels.h"  // Tier

namespace bonsai::core {
class ThreadPool;
}

namespace bonsai::kernels {

// Bytes read per second (decimal GB/s = 1e9 B/s) by every thread of `pool`
// streaming disjoint slices of one `buffer_bytes` buffer (allocated, backed by
// transparent huge pages where the kernel allows, and written once here),
// best of `reps` passes after one warm-up pass. Uses AVX-512 or AVX2 loads
// with prefetch where the CPU has them (the kernels' own loads), else a
// portable 64-bit loop. buffer_bytes is rounded up to a multiple of 1 MiB;
// it should be several times the last-level cache (the default 1 GiB is).
// Returns 0 if the buffer cannot be allocated.
double measure_read_bandwidth(core::ThreadPool& pool, size_t buffer_bytes, int reps = 5);

// The same measurement, repeatable on one buffer: allocated and written once
// (as above, on the threads of the pool given to the constructor) and kept
// until destruction, so a benchmark can measure the bandwidth again right
// next to each timed run it rates (`bonsai bench`'s tg repetitions) for the
// cost of the passes alone. Holds buffer_bytes (rounded up to 1 MiB) for its
// lifetime; not copyable. A failed allocation leaves ok() false and every
// measure() 0.
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(core::ThreadPool& pool, size_t buffer_bytes);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;

  bool ok() const { return buf_ != nullptr; }
  // GB/s (1e9 B/s) of every thread of `pool` streaming disjoint slices of
  // the buffer: the best of `reps` passes after one warm-up pass.
  double measure(core::ThreadPool& pool, int reps) const;

 private:
  uint8_t* buf_ = nullptr;
  size_t bytes_ = 0;
};

// Result of measure_int8_peak.
struct Int8Peak {
  double gops = 0;  // 1e9 integer ops per second; one 8-bit multiply-add = 2 ops
  std::string isa;  // what ran: "avx512-vnni", "avx-vnni", "avx512bw", "avx2", or "none"
  // The same for AMX-INT8 tile products (TDPBUSD) where the CPU and OS
  // allow AMX, whichever kernel path is in use; 0 elsewhere.
  double amx_gops = 0;
};

// Integer-op rate of a register-only loop (12 independent accumulators, no
// memory traffic, one instruction per VNNI product) of the int8 dot
// instruction of `tier` (the reference tier measures the best tier this CPU
// supports), on every thread of `pool`, best of 3 passes of about 0.1 s
// each; and, where AMX is usable, of a loop of 4 independent TDPBUSD tile
// products (amx_gops). On a CPU without x86 SIMD: gops 0, isa "none".
Int8Peak measure_int8_peak(core::ThreadPool& pool, Tier tier);

}  // namespace bonsai::kernels
