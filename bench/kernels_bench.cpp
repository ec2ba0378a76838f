// bonsai_bench_kernels: GEMV / GEMM speed of the Q1_0 and Q2_0 kernels on the
// Bonsai-1.7B matrix shapes, next to the machine's memory read bandwidth
// measured in the same run.
//
// Memory, not cache: all weights live in one arena of --arena_mb (default
// 1536 MiB, several times the LLC of the target machines); each iteration
// multiplies by the next copy of the matrix in the arena, so every GEMV
// streams its weights from DRAM. The read-bandwidth benchmark reads the same
// arena with the same thread pool.
//
// Counters (per benchmark):
//   weight_GB/s  weight bytes streamed per second (GEMV and GEMM)
//   bw_ratio     weight_GB/s / read bandwidth with the same thread count
//                (the ReadBandwidth benchmark's best repetition)
//   bw_ratio_il  (GEMV only) weight_GB/s / read bandwidth measured interleaved
//                with the GEMV: every iteration also reads max(matrix, 8 MiB)
//                of the arena with the same threads, timed separately, so
//                both rates see the same machine load (this machine is shared)
//   cols/s       activation columns (vectors) multiplied per second
//   read_GB/s    (bandwidth benchmark) bytes read per second (mean); the
//                best iteration (read_GB/s_best) is what bw_ratio divides by
//   Int8Peak     a register-only loop of the tier's int8 dot instruction (12
//                independent chains per thread; kernels/roofline.h: VPDPBUSD
//                on VNNI CPUs, VPMADDUBSW + VPMADDWD on AVX2) on the same
//                threads: the int8 dot peak, MAC/s
// After the run a summary prints, per shape, thread count and N (medians of
// the repetitions): time, weight GB/s, columns/s and the ratios to the
// product's roofline: bw = cols/s / (N x the column rate the read bandwidth
// allows), peak = cols/s / (the column rate the int8 peak allows, rows x
// cols MACs per column), roof = cols/s / min(both) (the issue 8 target).
//
// Layouts: products run on the layout the model runs (kernels::packing_for:
// the AVX-512 tier's load-time repacked copy, made with pack_matrix from the
// stored copies into a second huge-page buffer of >= 768 MiB of copies per
// shape; the label names it); --repack=0 keeps the stored layout (the
// model's --no-repack). Q2_0 runs as g64 (format "Q2_0") and, for GEMV, as
// the two g128 layouts ("Q2_0(g128-d-first)" and "Q2_0(g128-qs-first)",
// copies with valid scales in their own buffer).
//
// Usage: bonsai_bench_kernels [--arena_mb=N] [--huge_pages=0|1] [--repack=0|1] [google-benchmark flags]
// The kernel tier is the best supported one unless BONSAI_KERNEL is set.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bench_report.h"  // huge_alloc
#include "core/cpu_features.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/roofline.h"  // measure_int8_peak

namespace {

using bonsai::core::ThreadPool;
namespace kn = bonsai::kernels;

size_t g_arena_bytes = size_t{1536} << 20;
bool g_huge_pages = true;
bool g_repack = true;

// 2 MiB-aligned allocation of n bytes, huge-page advised unless --huge_pages=0.
uint8_t* huge_alloc(size_t n) { return bonsai::bench::huge_alloc(n, g_huge_pages); }

// AnonHugePages of this process (kB, /proc/self/smaps_rollup), -1 if unknown:
// printed so a run shows whether the weight streams really got 2 MiB pages.
long anon_huge_kb() {
  FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb;
}

// One arena of random bytes shared by every benchmark. Every 18-byte block
// gets a sane fp16 scale at offset 0, which is where Q1_0 and Q2_0 (g64)
// both keep d, so any 18-byte-aligned slice is a valid matrix of either.
struct Arena {
  uint8_t* data = nullptr;
  size_t size = 0;
  Arena() {
    size = g_arena_bytes / 18 * 18;
    data = huge_alloc(size);
    // Transparent huge pages where the kernel allows them (Debian's default
    // is "madvise"), as bonsai asks for its model mappings: without them
    // every 4 KiB of a stream costs a TLB miss (a two-level walk under a
    // hypervisor) and the hardware prefetchers stop at each page boundary.
    // The read-bandwidth benchmark streams the same arena, so the ratios
    // compare like with like. --huge_pages=0 turns it off (huge_alloc).
    uint64_t s = 0x243f6a8885a308d3ull;
    for (size_t i = 0; i + 8 <= size; i += 8) {
      uint64_t z = (s += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      std::memcpy(data + i, &z, 8);
    }
    for (size_t b = 0; b + 18 <= size; b += 18) {
      const uint16_t h = bonsai::core::fp32_to_fp16(0.01f + 0.0001f * static_cast<float>(data[b + 1]));
      std::memcpy(data + b, &h, 2);
    }
  }
  ~Arena() { std::free(data); }
};

Arena& arena() {
  static Arena a;
  return a;
}

ThreadPool& pool(int threads) {
  static ThreadPool p1(1), p2(2);
  return threads == 1 ? p1 : p2;
}

// Read bandwidth measured per thread count (GB/s), best repetition.
std::map<int, double> g_bw;

// Results for the summary: (format, rows, cols, threads, n) -> cols/s and weight GB/s.
struct Result {
  double cols_per_s = 0;
  double gbps = 0;
  double il_ratio = 0;  // GEMV rate / interleaved read rate
};
std::map<std::tuple<std::string, int64_t, int64_t, int, int64_t>, std::vector<Result>> g_results;

// Sums n bytes (a multiple of 256) as fast as this core can stream them:
// AVX-512 loads with 4 accumulators and a software prefetch 4 KiB ahead
// (measured the best of several variants here), else a portable loop. The
// ratio GEMV / read bandwidth is only meaningful if this is the machine's
// real read bandwidth, so it must not be handicapped.
__attribute__((target("avx512f"))) uint64_t read_range_avx512(const uint8_t* p, size_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (size_t i = 0; i + 256 <= n; i += 256) {
    _mm_prefetch(reinterpret_cast<const char*>(p + i + 4096), _MM_HINT_T0);
    a = _mm512_add_epi64(a, _mm512_loadu_si512(p + i));
    b = _mm512_add_epi64(b, _mm512_loadu_si512(p + i + 64));
    c = _mm512_add_epi64(c, _mm512_loadu_si512(p + i + 128));
    d = _mm512_add_epi64(d, _mm512_loadu_si512(p + i + 192));
  }
  alignas(64) uint64_t lanes[8];  // (not _mm512_reduce_add_epi64: GCC 12 warns in its header)
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
  uint64_t sum = 0;
  for (uint64_t v : lanes) sum += v;
  return sum;
}

uint64_t read_range_generic(const uint8_t* p, size_t n) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  for (size_t i = 0; i + 8 <= n / 8; i += 8) {
    __builtin_prefetch(w + i + 512);
    a0 += w[i];
    a1 += w[i + 1];
    a2 += w[i + 2];
    a3 += w[i + 3];
    a4 += w[i + 4];
    a5 += w[i + 5];
    a6 += w[i + 6];
    a7 += w[i + 7];
  }
  return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

uint64_t read_range(const uint8_t* p, size_t n) {
  static const bool avx512 = bonsai::core::cpu_features().avx512f;
  return avx512 ? read_range_avx512(p, n) : read_range_generic(p, n);
}

// Reads [p, p + bytes) with the pool's threads (64 chunks); returns seconds.
double timed_read(ThreadPool& tp, const uint8_t* p, size_t bytes) {
  const size_t chunk = bytes / 64 / 64 * 64;
  std::vector<uint64_t> sums(64);
  const auto t0 = std::chrono::steady_clock::now();
  tp.parallel_for(
      64,
      [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) sums[static_cast<size_t>(c)] = read_range(p + c * chunk, chunk);
      },
      1);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(sums.data());
  return s;
}

void BM_ReadBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  Arena& a = arena();
  ThreadPool& tp = pool(threads);
  const size_t chunk = a.size / 64 / 4096 * 4096;  // 64 chunks shared by the threads
  double bytes = 0, secs = 0, best = 0;
  for (auto _ : state) {
    std::vector<uint64_t> sums(64);
    const auto t0 = std::chrono::steady_clock::now();
    tp.parallel_for(
        64,
        [&](int64_t b, int64_t e) {
          for (int64_t c = b; c < e; ++c) sums[static_cast<size_t>(c)] = read_range(a.data + c * chunk, chunk);
        },
        1);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(sums.data());
    state.SetIterationTime(s);
    bytes += static_cast<double>(chunk) * 64;
    secs += s;
    best = std::max(best, static_cast<double>(chunk) * 64 / s / 1e9);
  }
  const double gbps = bytes / secs / 1e9;
  state.counters["read_GB/s"] = gbps;
  state.counters["read_GB/s_best"] = best;
  // The ratios use the best iteration: conservative (GEMV rates are means).
  g_bw[threads] = std::max(g_bw[threads], best);
}

// Int8 dot peak (MAC/s) per thread count, best repetition.
std::map<int, double> g_peak;

// The int8 dot peak of the active tier's instruction (kernels/roofline.h:
// VPDPBUSD with AVX-512 VNNI or AVX-VNNI, VPMADDUBSW + VPMADDWD + VPADDD on
// AVX2 without VNNI), register-only, on the same pool. One MAC = 2 ops.
std::string g_peak_isa = "none";

void BM_Int8Peak(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  ThreadPool& tp = pool(threads);
  double best = 0, macs = 0, p_amx = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const kn::Int8Peak p = kn::measure_int8_peak(tp, kn::active_tier());
    p_amx = std::max(p_amx, p.amx_gops * 1e9 / 2);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(sec);
    if (p.gops <= 0) {
      state.SkipWithError("no int8 SIMD dot instruction on this CPU");
      return;
    }
    g_peak_isa = p.isa;
    macs += p.gops * 1e9 / 2;
    best = std::max(best, p.gops * 1e9 / 2);
  }
  state.counters["GMAC/s"] = macs / static_cast<double>(state.iterations()) / 1e9;
  state.counters["GMAC/s_best"] = best / 1e9;
  if (p_amx > 0) state.counters["AMX_GMAC/s_best"] = p_amx / 1e9;
  state.SetLabel(g_peak_isa);
  g_peak[threads] = std::max(g_peak[threads], best);
}

// Benchmark format ids (range 0).
kn::Format format_of_id(int64_t id) {
  switch (id) {
    case 0:
      return kn::Format::kQ1_0;
    case 1:
      return kn::Format::kQ2_0;
    case 2:
      return kn::Format::kQ2_0G128D;
    default:
      return kn::Format::kQ2_0G128Qs;
  }
}

// The copies of one (format, rows, cols) matrix the products stream: the
// arena's (Q1_0, Q2_0 g64), or a buffer of g128 copies with valid scales,
// each with its packed copy when the active tier packs it (--repack=1).
// One shape is kept at a time (the benchmarks of a shape run together).
struct Copies {
  kn::Format f = kn::Format::kF32;
  int64_t rows = 0, cols = 0;
  size_t mat = 0, count = 0;
  uint8_t* own = nullptr;  // g128 copies (else the arena's)
  uint8_t* packed = nullptr;
  size_t packed_stride = 0;
  kn::Packing packing = kn::Packing::kNone;
  ~Copies() {
    std::free(own);
    std::free(packed);
  }
  kn::MatrixView view(size_t i) const {
    const uint8_t* base = own != nullptr ? own : arena().data;
    kn::MatrixView w{base + (i % count) * mat, f, rows, cols, kn::row_bytes(f, cols)};
    if (packed != nullptr) {
      w.packed = packed + (i % count) * packed_stride;
      w.packing = packing;
    }
    return w;
  }
};

const Copies& copies_of(kn::Format f, int64_t rows, int64_t cols) {
  static std::unique_ptr<Copies> cur;
  if (cur && cur->f == f && cur->rows == rows && cur->cols == cols) return *cur;
  cur.reset();
  auto c = std::make_unique<Copies>();
  c->f = f;
  c->rows = rows;
  c->cols = cols;
  const size_t rb = kn::row_bytes(f, cols);
  c->mat = rb * static_cast<size_t>(rows);
  Arena& a = arena();
  if (f == kn::Format::kQ2_0G128D || f == kn::Format::kQ2_0G128Qs) {
    // 34-byte blocks: random codes (from the arena), a sane fp16 d at offset
    // 0 (d first) or 32 (qs first).
    c->count = std::max<size_t>(2, (size_t{768} << 20) / c->mat);
    c->own = huge_alloc(c->mat * c->count);
    const size_t dof = f == kn::Format::kQ2_0G128D ? 0 : 32;
    for (size_t i = 0; i < c->count; ++i) {
      uint8_t* m = c->own + i * c->mat;
      std::memcpy(m, a.data + (i * c->mat) % (a.size - c->mat), c->mat);
      for (size_t b = 0; b + 34 <= c->mat; b += 34) {
        const uint16_t h = bonsai::core::fp32_to_fp16(0.01f + 0.0001f * static_cast<float>(m[b + 17]));
        std::memcpy(m + b + dof, &h, 2);
      }
    }
  } else {
    c->count = std::max<size_t>(1, a.size / c->mat);
  }
  const kn::MatrixView w0 = c->view(0);
  c->packing = g_repack ? kn::packing_for(w0) : kn::Packing::kNone;
  if (c->packing != kn::Packing::kNone) {
    c->packed_stride = (kn::packed_bytes(w0, c->packing) + 63) / 64 * 64;
    // >= 768 MiB of packed copies (many times the L3), at most one per stored copy.
    c->count = std::min(c->count, std::max<size_t>(2, (size_t{768} << 20) / c->packed_stride));
    c->packed = huge_alloc(c->packed_stride * c->count);
    for (size_t i = 0; i < c->count; ++i) {
      kn::pack_matrix(c->view(i), c->packing, c->packed + i * c->packed_stride, &pool(2));
    }
  }
  cur = std::move(c);
  return *cur;
}

// range: format id (format_of_id), rows, cols, threads, n (1 = gemv)
void BM_Matmul(benchmark::State& state) {
  const kn::Format f = format_of_id(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const int64_t n = state.range(4);
  Arena& a = arena();
  const Copies& cp = copies_of(f, rows, cols);
  const size_t mat = cp.mat;
  std::vector<float> x(static_cast<size_t>(n * cols)), y(static_cast<size_t>(n * rows));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 2.0f;
  ThreadPool& tp = pool(threads);
  // Interleaved read: max(mat, 8 MiB) from a region away from the matrix copy.
  const size_t il_bytes =
      std::max<size_t>(4096, std::min(a.size, std::max<size_t>(mat, size_t{8} << 20)) / 4096 * 4096);
  const size_t il_slots = std::max<size_t>(1, a.size / il_bytes);
  size_t it = 0;
  double secs = 0, iters = 0, il_secs = 0, il_read = 0;
  for (auto _ : state) {
    const kn::MatrixView w = cp.view(it);
    const auto t0 = std::chrono::steady_clock::now();
    if (n == 1) {
      kn::gemv(w, x.data(), y.data(), &tp);
    } else {
      kn::gemm(w, x.data(), n, y.data(), &tp);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(y.data());
    state.SetIterationTime(s);
    secs += s;
    iters += 1;
    if (n == 1) {
      il_secs += timed_read(tp, a.data + ((it + il_slots / 2) % il_slots) * il_bytes, il_bytes);
      il_read += static_cast<double>(il_bytes);
    }
    ++it;
  }
  const double gbps = iters * static_cast<double>(mat) / secs / 1e9;
  const double cps = iters * static_cast<double>(n) / secs;
  state.counters["weight_GB/s"] = gbps;
  state.counters["cols/s"] = cps;
  if (g_bw.count(threads) != 0) state.counters["bw_ratio"] = gbps / g_bw[threads];
  double il_ratio = 0;
  if (n == 1 && il_secs > 0) {
    il_ratio = gbps / (il_read / il_secs / 1e9);
    state.counters["bw_ratio_il"] = il_ratio;
  }
  state.SetLabel(std::string(kn::packing_name(cp.packing)));
  g_results[{std::string(kn::format_name(f)), rows, cols, threads, n}].push_back(Result{cps, gbps, il_ratio});
}

// Bonsai-1.7B (n_embd 2048, n_ff 6144, q 2048, kv 1024, vocab 151936) and
// Bonsai-8B (n_embd 4096, n_ff 12288, q 4096, kv 1024) matrix shapes.
const int64_t kShapes[][2] = {{2048, 2048}, {1024, 2048}, {6144, 2048},  {2048, 6144}, {151936, 2048},
                              {4096, 4096}, {1024, 4096}, {12288, 4096}, {4096, 12288}};
const int64_t kNs[] = {1, 2, 4, 8, 16, 32, 64, 512};

// Which (shape, n) pairs run: the vocabulary projection only as a decode
// product (n <= 32; prompts project only their last position), the 8B
// shapes up to n = 64 (time).
bool runs(const int64_t* s, int64_t n) {
  if (s[0] == 151936) return n <= 32;
  if (s[1] == 4096 || s[1] == 12288) return n <= 64;
  return true;
}

void register_bandwidth() {
  for (int t : {1, 2}) {
    benchmark::RegisterBenchmark("ReadBandwidth", BM_ReadBandwidth)
        ->Arg(t)
        ->ArgName("threads")
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("Int8Peak", BM_Int8Peak)
        ->Arg(t)
        ->ArgName("threads")
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

// Bandwidth and peak first and again last (the summary uses the best of
// both, so a busy moment on a shared machine does not inflate the ratios).
void register_all() {
  register_bandwidth();
  for (int fmt : {0, 1, 2, 3}) {
    for (const auto& s : kShapes) {
      for (int64_t n : kNs) {
        if (!runs(s, n)) continue;
        if (fmt >= 2 && n > 1) continue;  // g128 layouts: GEMV (their batches run the g64 code)
        for (int t : {1, 2}) {
          static const char* const kNames[] = {"Q1_0", "Q2_0", "Q2_0g128d", "Q2_0g128qs"};
          const std::string name = std::string(kNames[fmt]) + (n == 1 ? "/gemv" : "/gemm");
          benchmark::RegisterBenchmark(name.c_str(), BM_Matmul)
              ->Args({fmt, s[0], s[1], t, n})
              ->ArgNames({"fmt", "rows", "cols", "threads", "n"})
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
  register_bandwidth();
}

Result median(std::vector<Result> v) {
  std::sort(v.begin(), v.end(), [](const Result& a, const Result& b) { return a.cols_per_s < b.cols_per_s; });
  return v[v.size() / 2];
}

void print_summary() {
  std::printf(
      "\nSummary (tier %s; medians of repetitions; read bandwidth 1 thread %.2f GB/s, 2 threads %.2f GB/s;"
      " int8 %s peak 1 thread %.1f GMAC/s, 2 threads %.1f GMAC/s; repack %s; AnonHugePages %ld kB)\n",
      kn::kernel_name().c_str(), g_bw[1], g_bw[2], g_peak_isa.c_str(), g_peak[1] / 1e9, g_peak[2] / 1e9,
      g_repack ? "on" : "off", anon_huge_kb());
  std::printf(
      "bw = cols/s / (N x bandwidth column rate); peak = cols/s / int8-peak column rate; "
      "roof = cols/s / min(N x bandwidth rate, peak rate)\n");
  std::printf("%-19s %14s %3s %4s %11s %9s %12s %7s %7s %7s\n", "format", "rows x cols", "thr", "N", "time us", "GB/s",
              "cols/s", "bw", "peak", "roof");
  for (int fid : {0, 1, 2, 3}) {
    const kn::Format f = format_of_id(fid);
    const std::string fstr(kn::format_name(f));
    const char* fname = fstr.c_str();
    for (const auto& s : kShapes) {
      for (int t : {1, 2}) {
        for (int64_t n : kNs) {
          const auto it = g_results.find({fname, s[0], s[1], t, n});
          if (it == g_results.end() || it->second.empty()) continue;
          const Result r = median(it->second);
          const double mat = static_cast<double>(kn::row_bytes(f, s[1])) * static_cast<double>(s[0]);
          const double bw_rate = static_cast<double>(n) * g_bw[t] * 1e9 / mat;  // cols/s
          const double peak_rate = g_peak[t] > 0 ? g_peak[t] / (static_cast<double>(s[0]) * s[1]) : 0;
          const double roof = peak_rate > 0 ? std::min(bw_rate, peak_rate) : bw_rate;
          char shape[32];
          std::snprintf(shape, sizeof(shape), "%ldx%ld", static_cast<long>(s[0]), static_cast<long>(s[1]));
          std::printf("%-19s %14s %3d %4ld %11.1f %9.2f %12.0f %6.1f%% %6.1f%% %6.1f%%\n", fname, shape, t,
                      static_cast<long>(n), 1e6 * static_cast<double>(n) / r.cols_per_s, r.gbps, r.cols_per_s,
                      100.0 * r.cols_per_s / bw_rate, peak_rate > 0 ? 100.0 * r.cols_per_s / peak_rate : 0.0,
                      100.0 * r.cols_per_s / roof);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Our own flag first (Google Benchmark rejects unknown flags).
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--arena_mb=", 11) == 0) {
      g_arena_bytes = static_cast<size_t>(std::atol(argv[i] + 11)) << 20;
    } else if (std::strncmp(argv[i], "--huge_pages=", 13) == 0) {
      g_huge_pages = std::atoi(argv[i] + 13) != 0;
    } else if (std::strncmp(argv[i], "--repack=", 9) == 0) {
      g_repack = std::atoi(argv[i] + 9) != 0;
    } else {
      args.push_back(argv[i]);
    }
  }
  int n_args = static_cast<int>(args.size());
  if (auto e = kn::init_tier_from_env(); !e) {
    std::fprintf(stderr, "bonsai_bench_kernels: %s\n", e.error().message.c_str());
    return 2;
  }
  std::printf("kernel tier: %s; cpu: %s\n", kn::kernel_name().c_str(),
              bonsai::core::cpu_features().to_string().c_str());
  benchmark::Initialize(&n_args, args.data());
  register_all();
  arena();  // allocate and fill before timing anything
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary();
  return 0;
}
