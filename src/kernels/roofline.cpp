#include "kernels/roofline.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/cpu_features.h"  // cpu_features
#include "core/thread_pool.h"   // ThreadPool
#include "kernels/internal.h"   // amx_usable, amx_peak_loop

namespace bonsai::kernels {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Where the streaming sums go, so the compiler cannot drop the loads.
std::atomic<uint64_t> g_sink{0};

// ---- Read bandwidth --------------------------------------------------------------

constexpr size_t kPiece = size_t{1} << 20;  // bytes per parallel_for index

// Each reader sums 256 bytes per iteration with four independent
// accumulators and a software prefetch 4 KiB ahead, so neither the add chain
// nor the hardware prefetcher's page-boundary stop limits the rate.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t read_avx512(const uint8_t* p, size_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (size_t i = 0; i + 256 <= n; i += 256) {
    _mm_prefetch(reinterpret_cast<const char*>(p + i + 4096), _MM_HINT_T0);
    a = _mm512_add_epi64(a, _mm512_load_si512(p + i));
    b = _mm512_add_epi64(b, _mm512_load_si512(p + i + 64));
    c = _mm512_add_epi64(c, _mm512_load_si512(p + i + 128));
    d = _mm512_add_epi64(d, _mm512_load_si512(p + i + 192));
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
  uint64_t s = 0;
  for (uint64_t v : lanes) s += v;
  return s;
}

__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i + 256 <= n; i += 256) {
    _mm_prefetch(reinterpret_cast<const char*>(p + i + 4096), _MM_HINT_T0);
    const auto* q = reinterpret_cast<const __m256i*>(p + i);
    a = _mm256_add_epi64(a, _mm256_add_epi64(_mm256_load_si256(q + 0), _mm256_load_si256(q + 1)));
    b = _mm256_add_epi64(b, _mm256_add_epi64(_mm256_load_si256(q + 2), _mm256_load_si256(q + 3)));
    c = _mm256_add_epi64(c, _mm256_add_epi64(_mm256_load_si256(q + 4), _mm256_load_si256(q + 5)));
    d = _mm256_add_epi64(d, _mm256_add_epi64(_mm256_load_si256(q + 6), _mm256_load_si256(q + 7)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

uint64_t read_generic(const uint8_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, 32);
    a += w[0];
    b += w[1];
    c += w[2];
    d += w[3];
  }
  return a + b + c + d;
}

using ReadFn = uint64_t (*)(const uint8_t*, size_t);

ReadFn pick_reader() {
#if defined(__x86_64__)
  const auto& f = core::cpu_features();
  if (f.avx512f) return read_avx512;
  if (f.avx2) return read_avx2;
#endif
  return read_generic;
}

// ---- int8 dot peak ---------------------------------------------------------------

// One call: `iters` iterations of 12 independent multiply-accumulate chains
// held in registers. Returns a value that depends on every accumulator.
// kOpsPerIter = 12 instructions x lanes x 2 ops.
//
// Each chain feeds its own accumulator back as an operand (the dot
// instruction's accumulator, used as its unsigned bytes too, or the
// unsigned bytes of PMADDUBSW) and the chains start from different values,
// so the compiler can neither hoist the products out of the loop nor merge
// the 12 chains into one (both happened to the earlier loops, whose
// operands were loop-invariant: the AVX2 loop compiled to one VPADDD per
// iteration, the VNNI one to one VPDPBUSD). A VNNI product is one
// instruction and nothing else: an earlier version XORed the accumulator
// into the unsigned operand first, one more vector uop per product, which
// halved the figure on CPUs that issue two VPDPBUSD per cycle (an Intel
// Xeon: 423-445 GOPS from the probe vs 863-887 from a loop without the XOR;
// issue 27). 12 chains cover the latency (VPDPBUSD 5 cycles, two ports;
// PMADDUBSW + PMADDWD + PADDD 7-11) so the loop is bound by the
// multipliers' throughput, as the kernels are at best. (The AVX2 chain's
// three instructions are what the AVX2 kernels spend per product too.)
#if defined(__x86_64__)
constexpr double kOpsZmmIter = 12.0 * 64 * 2;
constexpr double kOpsYmmIter = 12.0 * 32 * 2;

#define BONSAI_REPEAT12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

__attribute__((target("avx512f,avx512bw,avx512vnni"))) uint64_t dot_avx512_vnni(int64_t iters) {
  __m512i b = _mm512_set1_epi8(-2);
  asm volatile("" : "+v"(b));  // not a constant the compiler could fold
#define DECL(i) __m512i c##i = _mm512_set1_epi32(i);
  BONSAI_REPEAT12(DECL)
#undef DECL
  for (int64_t it = 0; it < iters; ++it) {
#define STEP(i) c##i = _mm512_dpbusd_epi32(c##i, c##i, b);
    BONSAI_REPEAT12(STEP)
#undef STEP
  }
  __m512i s = _mm512_setzero_si512();
#define SUM(i) s = _mm512_add_epi32(s, c##i);
  BONSAI_REPEAT12(SUM)
#undef SUM
  alignas(64) uint32_t lanes[16];
  _mm512_store_si512(lanes, s);
  return lanes[0] + lanes[15];
}

__attribute__((target("avx512f,avx512bw"))) uint64_t dot_avx512bw(int64_t iters) {
  __m512i b = _mm512_set1_epi8(-2), ones = _mm512_set1_epi16(1);
  asm volatile("" : "+v"(b), "+v"(ones));
#define DECL(i) __m512i c##i = _mm512_set1_epi32(i + 1);
  BONSAI_REPEAT12(DECL)
#undef DECL
  for (int64_t it = 0; it < iters; ++it) {
#define STEP(i) c##i = _mm512_add_epi32(c##i, _mm512_madd_epi16(_mm512_maddubs_epi16(c##i, b), ones));
    BONSAI_REPEAT12(STEP)
#undef STEP
  }
  __m512i s = _mm512_setzero_si512();
#define SUM(i) s = _mm512_add_epi32(s, c##i);
  BONSAI_REPEAT12(SUM)
#undef SUM
  alignas(64) uint32_t lanes[16];
  _mm512_store_si512(lanes, s);
  return lanes[0] + lanes[15];
}

__attribute__((target("avx2,avxvnni"))) uint64_t dot_avx_vnni(int64_t iters) {
  __m256i b = _mm256_set1_epi8(-2);
  asm volatile("" : "+x"(b));
#define DECL(i) __m256i c##i = _mm256_set1_epi32(i);
  BONSAI_REPEAT12(DECL)
#undef DECL
  for (int64_t it = 0; it < iters; ++it) {
#define STEP(i) c##i = _mm256_dpbusd_avx_epi32(c##i, c##i, b);
    BONSAI_REPEAT12(STEP)
#undef STEP
  }
  __m256i s = _mm256_setzero_si256();
#define SUM(i) s = _mm256_add_epi32(s, c##i);
  BONSAI_REPEAT12(SUM)
#undef SUM
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[7];
}

__attribute__((target("avx2"))) uint64_t dot_avx2(int64_t iters) {
  __m256i b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  asm volatile("" : "+x"(b), "+x"(ones));
#define DECL(i) __m256i c##i = _mm256_set1_epi32(i + 1);
  BONSAI_REPEAT12(DECL)
#undef DECL
  for (int64_t it = 0; it < iters; ++it) {
#define STEP(i) c##i = _mm256_add_epi32(c##i, _mm256_madd_epi16(_mm256_maddubs_epi16(c##i, b), ones));
    BONSAI_REPEAT12(STEP)
#undef STEP
  }
  __m256i s = _mm256_setzero_si256();
#define SUM(i) s = _mm256_add_epi32(s, c##i);
  BONSAI_REPEAT12(SUM)
#undef SUM
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[7];
}
#undef BONSAI_REPEAT12
#endif

}  // namespace

ReadBandwidthProbe::ReadBandwidthProbe(core::ThreadPool& pool, size_t buffer_bytes) {
  const size_t n_pieces = std::max<size_t>(1, (buffer_bytes + kPiece - 1) / kPiece);
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = n_pieces * kPiece;
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge));
  if (buf == nullptr) return;
  // Huge pages as the model mappings ask for: 4 KiB pages would cost a TLB
  // miss per page and stop the prefetchers at each boundary.
  madvise(buf, (bytes + kHuge - 1) / kHuge * kHuge, MADV_HUGEPAGE);
  // First touch on the threads that read it (NUMA locality), non-zero data
  // (untouched or zero pages could all map the one shared zero page).
  pool.parallel_for(static_cast<int64_t>(n_pieces), [buf](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memset(buf + static_cast<size_t>(i) * kPiece, 0x5a, kPiece);
  });
  buf_ = buf;
  bytes_ = bytes;
}

ReadBandwidthProbe::~ReadBandwidthProbe() { std::free(buf_); }

double ReadBandwidthProbe::measure(core::ThreadPool& pool, int reps) const {
  if (buf_ == nullptr) return 0;
  const size_t n_pieces = bytes_ / kPiece;
  const ReadFn read = pick_reader();
  double best = 0;
  for (int r = 0; r <= std::max(1, reps); ++r) {
    std::atomic<uint64_t> sum{0};
    const auto t0 = Clock::now();
    pool.parallel_for(static_cast<int64_t>(n_pieces), [&](int64_t b, int64_t e) {
      const size_t off = static_cast<size_t>(b) * kPiece;
      sum.fetch_add(read(buf_ + off, static_cast<size_t>(e - b) * kPiece), std::memory_order_relaxed);
    });
    const double secs = seconds_since(t0);
    g_sink.fetch_add(sum.load(), std::memory_order_relaxed);
    if (r > 0 && secs > 0) best = std::max(best, static_cast<double>(bytes_) / secs / 1e9);  // r 0: warm-up
  }
  return best;
}

double measure_read_bandwidth(core::ThreadPool& pool, size_t buffer_bytes, int reps) {
  const ReadBandwidthProbe probe(pool, buffer_bytes);
  return probe.measure(pool, reps);
}

#if defined(__x86_64__)
namespace {
// 1e9 ops per second of `loop` (ops_per_iter per iteration) on every thread
// of `pool`: iterations calibrated on this thread for ~25 ms per piece, 4
// pieces per thread, best of 3 passes.
double loop_rate(core::ThreadPool& pool, uint64_t (*loop)(int64_t), double ops_per_iter) {
  int64_t iters = 1 << 10;
  for (;;) {
    const auto t0 = Clock::now();
    g_sink.fetch_add(loop(iters), std::memory_order_relaxed);
    const double secs = seconds_since(t0);
    if (secs > 0.005 || iters > (int64_t{1} << 34)) {
      iters = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(iters) * 0.025 / std::max(secs, 1e-9)));
      break;
    }
    iters *= 4;
  }
  const int64_t pieces = static_cast<int64_t>(pool.size()) * 4;
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    pool.parallel_for(pieces, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) g_sink.fetch_add(loop(iters), std::memory_order_relaxed);
    });
    const double secs = seconds_since(t0);
    if (secs > 0) {
      best = std::max(best, static_cast<double>(pieces) * static_cast<double>(iters) * ops_per_iter / secs / 1e9);
    }
  }
  return best;
}
}  // namespace
#endif

Int8Peak measure_int8_peak(core::ThreadPool& pool, Tier tier) {
  Int8Peak out;
  out.isa = "none";
#if defined(__x86_64__)
  const auto& f = core::cpu_features();
  if (tier == Tier::kReference || tier == Tier::kNeon) tier = best_tier();
  uint64_t (*loop)(int64_t) = nullptr;
  double ops_per_iter = 0;
  if (tier == Tier::kAvx512 && f.avx512f && f.avx512bw) {
    if (f.avx512vnni) {
      loop = dot_avx512_vnni, ops_per_iter = kOpsZmmIter, out.isa = "avx512-vnni";
    } else {
      loop = dot_avx512bw, ops_per_iter = kOpsZmmIter, out.isa = "avx512bw";
    }
  } else if (f.avx2) {
    if (f.avx_vnni) {
      loop = dot_avx_vnni, ops_per_iter = kOpsYmmIter, out.isa = "avx-vnni";
    } else {
      loop = dot_avx2, ops_per_iter = kOpsYmmIter, out.isa = "avx2";
    }
  }
  if (loop == nullptr) return out;
  out.gops = loop_rate(pool, loop, ops_per_iter);
  // AMX: 4 TDPBUSD of 16 x 16 x 64 multiply-adds per iteration.
  if (detail::amx_usable()) out.amx_gops = loop_rate(pool, detail::amx_peak_loop, 4.0 * 16 * 16 * 64 * 2);
#else
  (void)pool;
  (void)tier;
#endif
  return out;
}

}  // namespace bonsai::kernels
