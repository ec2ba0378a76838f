// bonsai_bench_pv_pipes [-r ROUNDS=5] [--json FILE] (or the old positional [ROUNDS]): the per-key cost of AVX2 decode
// attention's PV step on Q8_0 values (attention.cpp pv_group8<2, 4, RowsQ8>: two query heads share each value row) with
// every operand in L1, split into its parts, so that the pipe that bounds it can be named on the machine at hand.
//
// Each variant walks 64 keys of one 32-value Q8_0 block (int8 quants, an fp32
// scale d per key, one probability p per key and head) and updates 2 heads x 4
// chunks = 8 fp32 accumulators per key (8 independent fma chains: on a CPU
// with two 4-cycle FMA pipes, 8 fmas per key sit on both the throughput and
// the latency bound, so "fma only" is a floor, not a pipe count by itself):
//   fma only      acc += p * c (c a vector of 1.5 the compiler cannot see):
//                 the 8 fmas alone
//   cvt           v = cvtdq2ps(pmovsxbd(q)); acc += p * v
//   cvt * d       v = d * cvtdq2ps(pmovsxbd(q)); acc += p * v   (pv_group8's
//                 arithmetic today, v = fl(d * q) exact; it also converts the
//                 fp16 scale per key and ticks the prefetch cursor, left out here)
//   magic * d     the int8 -> fp32 conversion as (zero-extend(q) ^ 0x4b000080)
//                 - (2^23 + 128) (exact, no cvt), then * d
//   cvt, p*d      v = cvtdq2ps(pmovsxbd(q)); acc += fl(p * d) * v (2 multiplies per
//                 key instead of 4: changes the rounding, so not attention's bits)
// Prints ns per key (minimum over ROUNDS, after one warm-up pass of every
// variant) and the ratio to "fma only". On a CPU whose conversions and
// multiplies share the two FMA pipes (Zen 3: bench/results/
// decode-q8-pipes-2026-12-04-zen3-session17.txt) "cvt * d" issues 16
// operations per key on those pipes against 8 fmas: about 2x.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>

#include "bench_report.h"       // CLI11 flags, --json
#include "core/cpu_features.h"  // cpu_features

namespace {

constexpr int kKeys = 64;  // keys per pass (all operands stay in L1)

struct Data {
  alignas(64) int8_t q[kKeys][32];
  alignas(64) float d[kKeys];
  alignas(64) float p[kKeys][2];
};

enum class Mode { kFmaOnly, kCvt, kCvtScale, kMagicScale, kCvtFoldedScale };

// One 8-value chunk's fp32 values v of key t (per the mode) for chunk c.
template <Mode M>
__attribute__((target("avx2,fma"), always_inline)) inline __m256 value(const Data* dp, int t, int c, __m256 d,
                                                                       __m256 cvec) {
  if constexpr (M == Mode::kFmaOnly) {
    return cvec;
  }
  const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(&dp->q[t][8 * c]));
  if constexpr (M == Mode::kCvt || M == Mode::kCvtFoldedScale) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
  } else if constexpr (M == Mode::kCvtScale) {
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)));
  } else {
    const __m256 f = _mm256_castsi256_ps(_mm256_xor_si256(_mm256_cvtepu8_epi32(q8), _mm256_set1_epi32(0x4b000080)));
    return _mm256_mul_ps(d, _mm256_sub_ps(f, _mm256_set1_ps(8388608.0f + 128.0f)));
  }
}

template <Mode M>
__attribute__((target("avx2,fma"), noinline)) float run(const Data& data, int64_t passes) {
  // Eight named accumulators (an array was kept in memory by GCC 12 here:
  // a store per fma, which then bounded the loop instead of the pipes).
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const Data* dp = &data;
  __m256 cvec = _mm256_set1_ps(1.5f);
  asm volatile("" : "+x"(cvec));  // not a constant: fma(p, c, acc) stays an fma
  for (int64_t pass = 0; pass < passes; ++pass) {
    asm volatile("" : "+r"(dp));  // the loads below are not hoisted out of the pass loop
    for (int t = 0; t < kKeys; ++t) {
      const __m256 d = _mm256_broadcast_ss(&dp->d[t]);
      __m256 p0 = _mm256_broadcast_ss(&dp->p[t][0]), p1 = _mm256_broadcast_ss(&dp->p[t][1]);
      if constexpr (M == Mode::kCvtFoldedScale) {
        p0 = _mm256_mul_ps(p0, d);
        p1 = _mm256_mul_ps(p1, d);
      }
      const __m256 v0 = value<M>(dp, t, 0, d, cvec);
      a0 = _mm256_fmadd_ps(p0, v0, a0);
      a1 = _mm256_fmadd_ps(p1, v0, a1);
      const __m256 v1 = value<M>(dp, t, 1, d, cvec);
      a2 = _mm256_fmadd_ps(p0, v1, a2);
      a3 = _mm256_fmadd_ps(p1, v1, a3);
      const __m256 v2 = value<M>(dp, t, 2, d, cvec);
      a4 = _mm256_fmadd_ps(p0, v2, a4);
      a5 = _mm256_fmadd_ps(p1, v2, a5);
      const __m256 v3 = value<M>(dp, t, 3, d, cvec);
      a6 = _mm256_fmadd_ps(p0, v3, a6);
      a7 = _mm256_fmadd_ps(p1, v3, a7);
    }
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  return _mm256_cvtss_f32(s);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  std::string json;
  CLI::App app("Per-key cost of AVX2 decode attention's Q8_0 PV step, split into its parts (operands in L1)");
  app.add_option("ROUNDS,-r,--rounds", rounds, "Rounds (minimum over them)")
      ->capture_default_str()
      ->check(bonsai::bench::kPositive);
  bonsai::bench::add_json_option(app, json);
  if (auto rc = bonsai::bench::parse(app, argc, argv)) return *rc;
  if (!bonsai::core::cpu_features().avx2) {  // AVX2 + FMA (+ F16C), with the OS saving YMM state
    std::fprintf(stderr, "pv_pipes_bench: needs AVX2 and FMA\n");
    return 1;
  }
  static Data data;
  for (int t = 0; t < kKeys; ++t) {
    for (int e = 0; e < 32; ++e) data.q[t][e] = static_cast<int8_t>((t * 37 + e * 11) % 255 - 127);
    data.d[t] = 1e-3f * static_cast<float>(1 + t % 7);
    data.p[t][0] = 1e-4f * static_cast<float>(1 + t % 5);
    data.p[t][1] = 1e-4f * static_cast<float>(1 + t % 3);
  }
  struct Variant {
    const char* name;
    float (*fn)(const Data&, int64_t);
  };
  const Variant variants[] = {{"fma only", run<Mode::kFmaOnly>},
                              {"cvt", run<Mode::kCvt>},
                              {"cvt * d (pv_group8 today)", run<Mode::kCvtScale>},
                              {"magic * d", run<Mode::kMagicScale>},
                              {"cvt, p*d (other bits)", run<Mode::kCvtFoldedScale>}};
  constexpr int64_t kPasses = 2'000'000;  // 128M keys per variant and round
  double best[std::size(variants)];
  std::fill(std::begin(best), std::end(best), 1e30);
  volatile float sink = 0.0f;
  for (const Variant& v : variants) sink = sink + v.fn(data, kPasses / 8);  // warm-up
  for (int r = 0; r < rounds; ++r) {
    for (size_t v = 0; v < std::size(variants); ++v) {  // variants alternate within each round
      const auto t0 = std::chrono::steady_clock::now();
      sink = sink + variants[v].fn(data, kPasses);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best[v] = std::min(best[v], s / static_cast<double>(kPasses * kKeys) * 1e9);
    }
  }
  std::printf("PV step per key (2 heads x 32 Q8_0 values, L1), min of %d rounds:\n", rounds);
  for (size_t v = 0; v < std::size(variants); ++v) {
    std::printf("  %-28s %6.3f ns/key  %.2fx fma only\n", variants[v].name, best[v], best[v] / best[0]);
  }
  nlohmann::json out = {{"rounds", rounds}};
  for (size_t v = 0; v < std::size(variants); ++v) {
    out["variants"].push_back(
        {{"name", variants[v].name}, {"ns_per_key", best[v]}, {"ratio_to_fma_only", best[v] / best[0]}});
  }
  return bonsai::bench::write_json(json, "pv_pipes", argc, argv, std::move(out)) ? 0 : 1;
}
