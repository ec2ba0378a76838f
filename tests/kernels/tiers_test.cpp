// Every supported SIMD tier against the scalar reference.
//
// What "equal" means here (DESIGN.md: integers exactly, floats within a
// stated bound):
//  * Activation quantization (int8 quants and their fp16 scales) must be
//    bit-identical to the reference's.
//  * Integer parts: with inputs whose fp32 scaling is exact (weight scales in
//    {0.5, 1}, activation sub-blocks whose amax is 127 * 2^k so that d = 2^k
//    and q = x / d), every tier's output must equal the reference bit for
//    bit. Any error in weight expansion, bit order, code mapping, lane sums
//    or activation layout shows up here as an exact mismatch.
//  * Float parts: on random inputs the tier and the reference differ only in
//    the order of fp32 operations. Bound used: |y_tier - y_ref| <=
//    2 * (T + 16) * 2^-23 * sum_j |w_j * x_j|, where T is the number of
//    fp32 partial sums of a row (cols/32 + cols/128 for quantized weights,
//    cols for float weights) and w, x are the dequantized weights and the
//    activations as the kernels see them (Q8_0-rounded for quantized
//    weights). This is twice the classic worst-case bound T*u*sum|w x|
//    (u = 2^-24) for one summation order (one for each side).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace bonsai::kernels {
namespace {

using testing::kAllFormats;

// A tier under test, with a label. The AVX-512 tier is run three ways: as
// it can run in production (GFNI weight expansion, the AMX GEMM forced on
// for n >= 6 where the CPU has it: BONSAI_KERNEL=avx512-amx), without AMX
// (VNNI GEMM: the default today), and without AMX and GFNI. The AVX2
// tier runs with AVX-VNNI (where the CPU has it) and without.
struct Variant {
  Tier tier;
  bool gfni;
  bool amx;
  std::string label;
  bool vnni = true;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (Tier t : {Tier::kAvx2, Tier::kAvx512, Tier::kNeon, Tier::kNeonDotprod, Tier::kNeonI8mm}) {
    if (!tier_supported(t)) continue;
    v.push_back(
        {t, true, true, std::string(tier_name(t)) + (t == Tier::kAvx512 && detail::amx_usable() ? "+amx" : "")});
    if (t == Tier::kAvx512) {
      v.push_back({t, true, false, "avx512-noamx"});
      v.push_back({t, false, false, "avx512-noamx-nogfni"});
    }
    if (t == Tier::kAvx2 && core::cpu_features().avx_vnni) v.push_back({t, true, true, "avx2-novnni", false});
  }
  return v;
}

struct GfniScope {
  explicit GfniScope(const Variant& v)
      : prev(detail::set_avx512_gfni(v.gfni)),
        prev_amx(detail::set_avx512_amx(v.amx ? detail::AmxMode::kOn : detail::AmxMode::kOff)),
        prev_vnni(detail::set_avx2_vnni(v.vnni)) {}
  ~GfniScope() {
    detail::set_avx512_gfni(prev);
    detail::set_avx512_amx(prev_amx);
    detail::set_avx2_vnni(prev_vnni);
  }
  bool prev;
  detail::AmxMode prev_amx;
  bool prev_vnni;
};

std::vector<float> random_batch(int64_t n, int64_t cols, uint32_t seed) {
  std::vector<float> x;
  x.reserve(static_cast<size_t>(n * cols));
  for (int64_t j = 0; j < n; ++j) {
    const auto v = testing::random_vector(cols, seed + static_cast<uint32_t>(j), 0.5f + 0.25f * (j % 5));
    x.insert(x.end(), v.begin(), v.end());
  }
  return x;
}

TEST(Tiers, AtLeastOneSimdTierOnX86) {
#if defined(__x86_64__)
  // Every x86-64 machine this project targets has AVX2.
  EXPECT_TRUE(tier_supported(Tier::kAvx2) || !core::cpu_features().avx2);
#endif
  EXPECT_TRUE(tier_supported(best_tier()));
}

TEST(Tiers, ActivationQuantizationBitIdentical) {
  for (const Variant& v : variants()) {
    GfniScope g(v);
    const detail::TierOps* ops = detail::tier_ops(v.tier);
    ASSERT_NE(ops, nullptr);
    for (Format f : testing::kQuantFormats) {
      for (int64_t cols : {128, 384, 2048}) {
        auto x = random_batch(3, cols, 77);
        x[5] = 0.0f;
        for (int i = 32; i < 64; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero sub-block
        x[70] = 1e-30f;                                                  // tiny
        x[200] = std::numeric_limits<float>::infinity();                 // d = inf, id = 0
        detail::QuantAct ref, got;
        detail::reference_ops()->prepare(f, x.data(), 3, cols, ref);
        ops->prepare(f, x.data(), 3, cols, got);
        ASSERT_EQ(std::memcmp(ref.q, got.q, static_cast<size_t>(3 * cols)), 0) << v.label << " " << cols;
        ASSERT_EQ(std::memcmp(ref.d, got.d, static_cast<size_t>(3 * cols / 32) * sizeof(float)), 0)
            << v.label << " " << cols;
      }
    }
  }
}

// Quantized weights with scales in {0.5, 1} and activations whose fp32
// arithmetic is exact: every tier must match the reference bit for bit.
TEST(Tiers, IntegerPartsExact) {
  struct Shape {
    int64_t rows, cols, n;
  };
  for (const Variant& v : variants()) {
    GfniScope g(v);
    for (Format f : testing::kQuantFormats) {
      for (Shape s : {Shape{1, 128, 1}, Shape{7, 384, 3}, Shape{33, 2048, 1}, Shape{5, 6144, 17}, Shape{3, 1024, 64}}) {
        auto m = testing::random_matrix(f, s.rows, s.cols, 900 + static_cast<uint32_t>(f));
        // Scales 0.5 or 1.
        const size_t bb = block_bytes(f);
        const size_t nblk = m.bytes.size() / bb;
        for (size_t b = 0; b < nblk; ++b) {
          const uint16_t h = (b * 2654435761u >> 7) & 1 ? 0x3800 : 0x3c00;
          std::memcpy(m.bytes.data() + b * bb + testing::scale_offset(f), &h, 2);
        }
        // Activations: each 32-block has amax 127 * 2^k (k in {-1, 0}), values multiples of 2^k.
        std::vector<float> x(static_cast<size_t>(s.n * s.cols));
        std::mt19937 rng(1234);
        for (size_t blk = 0; blk < x.size() / 32; ++blk) {
          const float d = (rng() & 1) ? 1.0f : 0.5f;
          for (int i = 0; i < 32; ++i) x[blk * 32 + i] = d * static_cast<float>(static_cast<int>(rng() % 255) - 127);
          x[blk * 32 + rng() % 32] = (rng() & 1 ? 127.0f : -127.0f) * d;
        }
        std::vector<float> yr(static_cast<size_t>(s.n * s.rows)), yt(yr.size());
        gemm_rows(Tier::kReference, m.view, x.data(), s.n, yr.data(), 0, s.rows);
        gemm_rows(v.tier, m.view, x.data(), s.n, yt.data(), 0, s.rows);
        for (size_t i = 0; i < yr.size(); ++i) {
          ASSERT_EQ(yt[i], yr[i]) << v.label << " " << format_name(f) << " " << s.rows << "x" << s.cols << " n=" << s.n
                                  << " at " << i;
        }
      }
    }
  }
}

// Compares rows [rows_to_check] of y (a [n][rows] result of `tier`) with the
// reference, within the documented bound.
void expect_close_to_reference(const std::string& label, const MatrixView& w, const float* x, int64_t n, const float* y,
                               const std::vector<int64_t>& rows_to_check) {
  std::vector<float> yr(static_cast<size_t>(n * w.rows));
  std::vector<std::vector<float>> xe;
  for (int64_t j = 0; j < n; ++j) xe.push_back(testing::effective_x(w.format, x + j * w.cols, w.cols));
  int failures = 0;
  for (int64_t r : rows_to_check) {
    gemm_rows(Tier::kReference, w, x, n, yr.data(), r, r + 1);
    const auto wr = testing::dequant_row(w, r);
    for (int64_t j = 0; j < n; ++j) {
      const auto dd = testing::dot_double(wr, xe[static_cast<size_t>(j)]);
      const double tol = 2.0 * testing::float_tol(testing::sum_terms(w.format, w.cols), dd.abs);
      const float got = y[j * w.rows + r];
      const float want = yr[static_cast<size_t>(j * w.rows + r)];
      if (!(std::fabs(static_cast<double>(got) - want) <= tol) && ++failures <= 5) {
        ADD_FAILURE() << label << " " << format_name(w.format) << " " << w.rows << "x" << w.cols << " n=" << n
                      << " row " << r << " col " << j << ": got " << got << " ref " << want << " tol " << tol;
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(Tiers, RandomAwkwardShapesWithinBound) {
  for (const Variant& v : variants()) {
    GfniScope g(v);
    for (Format f : kAllFormats) {
      for (int64_t rows : {1, 7, 33}) {
        for (int64_t cols : {128, 384, 2048, 6144}) {
          for (int64_t n : {1, 3, 17, 64}) {
            if (rows * cols * n > 4'000'000) continue;  // keep the reference cost bounded
            auto m = testing::random_matrix(f, rows, cols, static_cast<uint32_t>(rows * 31 + cols + n));
            const auto x = random_batch(n, cols, static_cast<uint32_t>(cols + 5 * n));
            std::vector<float> y(static_cast<size_t>(n * rows), std::nanf(""));
            gemm_rows(v.tier, m.view, x.data(), n, y.data(), 0, rows);
            std::vector<int64_t> all;
            for (int64_t r = 0; r < rows; ++r) all.push_back(r);
            expect_close_to_reference(v.label, m.view, x.data(), n, y.data(), all);
          }
        }
      }
    }
  }
}

// The public gemv/gemm (active tier, thread pool) on the largest Bonsai
// shapes, checked on a sample of rows.
TEST(Tiers, LargestBonsaiShapesThreaded) {
  core::ThreadPool pool(2);
  const Tier before = active_tier();
  struct Case {
    Format f;
    int64_t rows, cols, n;
  };
  const Case cases[] = {
      {Format::kQ1_0, 151936, 2048, 1}, {Format::kQ2_0, 151936, 2048, 1}, {Format::kQ1_0, 2048, 6144, 1},
      {Format::kQ2_0, 6144, 2048, 64},  {Format::kQ1_0, 6144, 2048, 64},  {Format::kQ2_0G128Qs, 2048, 6144, 3},
  };
  for (const Variant& v : variants()) {
    GfniScope g(v);
    ASSERT_TRUE(set_active_tier(v.tier).has_value());
    for (const Case& c : cases) {
      auto m = testing::random_matrix(c.f, c.rows, c.cols, 4242);
      const auto x = random_batch(c.n, c.cols, 99);
      std::vector<float> y(static_cast<size_t>(c.n * c.rows), std::nanf(""));
      if (c.n == 1) {
        gemv(m.view, x.data(), y.data(), &pool);
      } else {
        gemm(m.view, x.data(), c.n, y.data(), &pool);
      }
      std::vector<int64_t> sample;
      for (int64_t r = 0; r < c.rows; r += c.rows / 37 + 1) sample.push_back(r);
      sample.push_back(c.rows - 1);
      expect_close_to_reference(v.label, m.view, x.data(), c.n, y.data(), sample);
    }
  }
  ASSERT_TRUE(set_active_tier(before).has_value());
}

// gemm_multi (shared quantization, one dispatch) equals separate gemm calls
// bit for bit, for every tier, including mixed-format fallbacks.
TEST(Tiers, GemmMultiEqualsSeparateCalls) {
  core::ThreadPool pool(2);
  const Tier before = active_tier();
  for (Tier t : kAllTiers) {
    if (!tier_supported(t)) continue;
    ASSERT_TRUE(set_active_tier(t).has_value());
    for (int64_t n : {1, 3, 17}) {
      for (Format f2 : {Format::kQ1_0, Format::kQ2_0}) {  // third matrix: same or different format
        auto q = testing::random_matrix(Format::kQ1_0, 257, 512, 11);
        auto k = testing::random_matrix(Format::kQ1_0, 64, 512, 12);
        auto v = testing::random_matrix(f2, 33, 512, 13);
        const auto x = random_batch(n, 512, 14);
        const MatrixView ws[3] = {q.view, k.view, v.view};
        std::vector<float> y0(static_cast<size_t>(n * 257)), y1(static_cast<size_t>(n * 64)),
            y2(static_cast<size_t>(n * 33));
        float* ys[3] = {y0.data(), y1.data(), y2.data()};
        gemm_multi(ws, 3, x.data(), n, ys, &pool);
        for (int i = 0; i < 3; ++i) {
          std::vector<float> sep(static_cast<size_t>(n * ws[i].rows));
          gemm(ws[i], x.data(), n, sep.data(), &pool);
          for (size_t e = 0; e < sep.size(); ++e) {
            ASSERT_EQ(ys[i][e], sep[e]) << tier_name(t) << " n=" << n << " matrix " << i << " at " << e;
          }
        }
      }
    }
  }
  ASSERT_TRUE(set_active_tier(before).has_value());
}

// A g64 Q2_0 matrix whose consecutive block pairs share one scale, written in
// the g64 layout and in both g128 layouts (README of the paired fixtures):
// g128 block k = g64 blocks 2k, 2k+1 (codes back to back, the shared d).
// Random g64 code 3 (+2, not expressible in g128) becomes code 1 (value 0)
// in the g64 matrix and stays code 3 (value 0 there) in the g128 ones, so
// the g128 3 -> 0 mapping is exercised too.
struct PairedMatrices {
  testing::RandomMatrix g64;
  std::vector<uint8_t> d_first, qs_first;
  MatrixView d_view, qs_view;
};

PairedMatrices paired_matrices(int64_t rows, int64_t cols, uint32_t seed) {
  PairedMatrices p;
  p.g64 = testing::random_matrix(Format::kQ2_0, rows, cols, seed);
  const int64_t nb = rows * cols / 128;  // g128 blocks
  p.d_first.assign(static_cast<size_t>(nb) * 34 + 64, 0);
  p.qs_first.assign(static_cast<size_t>(nb) * 34 + 64, 0);
  uint8_t* g = p.g64.bytes.data();
  for (int64_t k = 0; k < nb; ++k) {
    uint8_t* b0 = g + 2 * k * 18;
    uint8_t* b1 = b0 + 18;
    std::memcpy(b1, b0, 2);  // shared scale
    uint8_t* dd = p.d_first.data() + k * 34;
    uint8_t* qd = p.qs_first.data() + k * 34;
    std::memcpy(dd, b0, 2);
    std::memcpy(qd + 32, b0, 2);
    for (int i = 0; i < 32; ++i) {
      // (Not `(i < 16 ? b0 : b1)[...]`: GCC 12 with -fsanitize=address,undefined
      // miscompiles that lvalue here and the g64 twin came out wrong.)
      uint8_t* half = i < 16 ? b0 : b1;
      uint8_t& src = half[2 + i % 16];
      dd[2 + i] = src;
      qd[i] = src;
      uint8_t fixed = src;
      for (int sh = 0; sh < 8; sh += 2) {
        if (((fixed >> sh) & 3) == 3) fixed = static_cast<uint8_t>(fixed & ~(2u << sh));  // 3 -> 1
      }
      src = fixed;
    }
  }
  p.d_view = MatrixView{p.d_first.data(), Format::kQ2_0G128D, rows, cols, static_cast<size_t>(cols / 128 * 34)};
  p.qs_view = MatrixView{p.qs_first.data(), Format::kQ2_0G128Qs, rows, cols, static_cast<size_t>(cols / 128 * 34)};
  return p;
}

// variants() with the reference tier first (the twin-format tests compare
// within each tier, the reference included).
std::vector<Variant> variants_and_reference() {
  std::vector<Variant> vs = variants();
  vs.insert(vs.begin(), Variant{Tier::kReference, true, true, "reference"});
  return vs;
}

// The g128 layouts accumulate exactly as their g64 twin: gemv/gemm results
// are bit-identical within each tier (incl. AVX-512 with/without GFNI, AMX).
TEST(Tiers, G128BitIdenticalToPairedG64) {
  const int64_t rows = 37, cols = 1024;
  const PairedMatrices p = paired_matrices(rows, cols, 515);
  // The conversion itself: identical dequantized weights.
  for (int64_t r = 0; r < rows; ++r) {
    const auto w64 = testing::dequant_row(p.g64.view, r);
    ASSERT_EQ(w64, testing::dequant_row(p.d_view, r)) << r;
    ASSERT_EQ(w64, testing::dequant_row(p.qs_view, r)) << r;
  }
  const std::vector<Variant> vs = variants_and_reference();
  core::ThreadPool pool(2);
  const Tier before = active_tier();
  for (const Variant& v : vs) {
    GfniScope g(v);
    ASSERT_TRUE(set_active_tier(v.tier).has_value());
    for (int64_t n : {1, 3, 17, 64}) {
      const auto x = random_batch(n, cols, 600 + static_cast<uint32_t>(n));
      const size_t ny = static_cast<size_t>(n * rows);
      std::vector<float> y64(ny), yd(ny), yq(ny);
      // Single-threaded tier entry point.
      gemm_rows(v.tier, p.g64.view, x.data(), n, y64.data(), 0, rows);
      gemm_rows(v.tier, p.d_view, x.data(), n, yd.data(), 0, rows);
      gemm_rows(v.tier, p.qs_view, x.data(), n, yq.data(), 0, rows);
      EXPECT_EQ(std::memcmp(y64.data(), yd.data(), ny * sizeof(float)), 0) << v.label << " rows n=" << n;
      EXPECT_EQ(std::memcmp(y64.data(), yq.data(), ny * sizeof(float)), 0) << v.label << " rows n=" << n;
      // Public gemv / gemm (active tier, thread pool).
      if (n == 1) {
        gemv(p.g64.view, x.data(), y64.data(), &pool);
        gemv(p.d_view, x.data(), yd.data(), &pool);
        gemv(p.qs_view, x.data(), yq.data(), &pool);
      } else {
        gemm(p.g64.view, x.data(), n, y64.data(), &pool);
        gemm(p.d_view, x.data(), n, yd.data(), &pool);
        gemm(p.qs_view, x.data(), n, yq.data(), &pool);
      }
      EXPECT_EQ(std::memcmp(y64.data(), yd.data(), ny * sizeof(float)), 0) << v.label << " gemm n=" << n;
      EXPECT_EQ(std::memcmp(y64.data(), yq.data(), ny * sizeof(float)), 0) << v.label << " gemm n=" << n;
      // Not trivially equal: the outputs are non-zero.
      EXPECT_NE(y64[0], 0.0f) << v.label;
    }
  }
  ASSERT_TRUE(set_active_tier(before).has_value());
}

// PrismML's PQ2_0 and PTQ1_0 (issue 30) holding the weights of a g64 matrix
// whose block pairs share d give its products bit for bit on every tier
// (PTQ1_0 on the AVX2 kernels of avx2_trit.inc where the tier has them,
// TierOps::formats); PQ2_0's code 3
// is +2, as g64's, so random codes 3 stay in.
TEST(Tiers, PrismFormatsBitIdenticalToPairedG64) {
  const int64_t rows = 29, cols = 1024;
  testing::RandomMatrix g64 = testing::random_matrix(Format::kQ2_0, rows, cols, 733);
  const int64_t nb = rows * cols / 128;
  std::vector<uint8_t> pq(static_cast<size_t>(nb) * 34 + 64), pt(static_cast<size_t>(nb) * 28 + 64);
  std::vector<uint8_t> g64_ternary = g64.bytes;  // PTQ1_0 twin: codes 3 -> 1 (digits are 0..2)
  for (int64_t k = 0; k < nb; ++k) {
    uint8_t* b0 = g64.bytes.data() + 2 * k * 18;
    std::memcpy(b0 + 18, b0, 2);  // the pair shares d
    std::memcpy(g64_ternary.data() + (2 * k + 1) * 18, b0, 2);
    uint8_t* p = pq.data() + k * 34;
    std::memcpy(p, b0, 2);
    std::memcpy(p + 2, b0 + 2, 16);
    std::memcpy(p + 18, b0 + 20, 16);
    int8_t t[128];  // the ternary weights, -1 / 0 / +1
    for (int e = 0; e < 128; ++e) {
      const uint8_t* qs = (e < 64 ? b0 : b0 + 18) + 2;
      const int j = e % 64;
      const int code = (qs[j / 4] >> (2 * (j % 4))) & 3;
      t[e] = static_cast<int8_t>((code == 3 ? 1 : code) - 1);
      uint8_t& tb = g64_ternary[static_cast<size_t>((2 * k + e / 64) * 18 + 2 + j / 4)];
      if (code == 3) tb = static_cast<uint8_t>(tb & ~(2u << (2 * (j % 4))));
    }
    uint16_t d16 = 0;
    std::memcpy(&d16, b0, 2);
    encode_ptq1_0(t, d16, pt.data() + k * 28);
  }
  const MatrixView pq_view{pq.data(), Format::kPQ2_0, rows, cols, static_cast<size_t>(cols / 128 * 34)};
  const MatrixView pt_view{pt.data(), Format::kPTQ1_0, rows, cols, static_cast<size_t>(cols / 128 * 28)};
  const MatrixView tern_view{g64_ternary.data(), Format::kQ2_0, rows, cols, g64.view.row_stride};
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_EQ(testing::dequant_row(g64.view, r), testing::dequant_row(pq_view, r)) << r;
    ASSERT_EQ(testing::dequant_row(tern_view, r), testing::dequant_row(pt_view, r)) << r;
  }
  const std::vector<Variant> vs = variants_and_reference();
  core::ThreadPool pool(2);
  const Tier before = active_tier();
  for (const Variant& v : vs) {
    GfniScope g(v);
    ASSERT_TRUE(set_active_tier(v.tier).has_value());
    for (int64_t n : {1, 3, 17, 64}) {
      const auto x = random_batch(n, cols, 700 + static_cast<uint32_t>(n));
      const size_t ny = static_cast<size_t>(n * rows);
      std::vector<float> y64(ny), ypq(ny), ytern(ny), ypt(ny);
      gemm_rows(v.tier, g64.view, x.data(), n, y64.data(), 0, rows);
      gemm_rows(v.tier, pq_view, x.data(), n, ypq.data(), 0, rows);
      gemm_rows(v.tier, tern_view, x.data(), n, ytern.data(), 0, rows);
      gemm_rows(v.tier, pt_view, x.data(), n, ypt.data(), 0, rows);
      EXPECT_EQ(std::memcmp(y64.data(), ypq.data(), ny * sizeof(float)), 0) << v.label << " PQ2_0 rows n=" << n;
      EXPECT_EQ(std::memcmp(ytern.data(), ypt.data(), ny * sizeof(float)), 0) << v.label << " PTQ1_0 rows n=" << n;
      gemm(pq_view, x.data(), n, ypq.data(), &pool);
      gemm(pt_view, x.data(), n, ypt.data(), &pool);
      EXPECT_EQ(std::memcmp(y64.data(), ypq.data(), ny * sizeof(float)), 0) << v.label << " PQ2_0 gemm n=" << n;
      EXPECT_EQ(std::memcmp(ytern.data(), ypt.data(), ny * sizeof(float)), 0) << v.label << " PTQ1_0 gemm n=" << n;
      EXPECT_NE(y64[0], 0.0f) << v.label;
    }
  }
  ASSERT_TRUE(set_active_tier(before).has_value());
}

// PTQ1_0 on every SIMD tier equals the reference tier bit for bit on random
// weights (every byte value: digits past a qh byte's fourth are ignored),
// random scales and activations: the integer chunk sums are exact and the
// float operations follow the canonical order. Odd row counts (the GEMV's
// row pairs), one to many blocks per row, GEMV and GEMM (1 to 4 columns per
// micro-kernel, column tiles of 64), per row range and threaded.
TEST(Tiers, Ptq1BitIdenticalToReference) {
  struct Shape {
    int64_t rows, cols;
  };
  core::ThreadPool pool(2);
  const Tier before = active_tier();
  for (const Variant& v : variants()) {
    GfniScope g(v);
    ASSERT_TRUE(set_active_tier(v.tier).has_value());
    for (Shape s : {Shape{1, 128}, Shape{3, 256}, Shape{7, 384}, Shape{33, 1152}, Shape{130, 2048}, Shape{5, 5120}}) {
      auto m = testing::random_matrix(Format::kPTQ1_0, s.rows, s.cols, 4100 + static_cast<uint32_t>(s.rows + s.cols));
      for (int64_t n : {1, 2, 3, 5, 17, 66}) {
        const auto x = random_batch(n, s.cols, 800 + static_cast<uint32_t>(n + s.cols));
        const size_t ny = static_cast<size_t>(n * s.rows);
        std::vector<float> yr(ny), yt(ny, std::nanf("")), yp(ny, std::nanf(""));
        gemm_rows(Tier::kReference, m.view, x.data(), n, yr.data(), 0, s.rows);
        gemm_rows(v.tier, m.view, x.data(), n, yt.data(), 0, s.rows);
        if (n == 1) {
          gemv(m.view, x.data(), yp.data(), &pool);
        } else {
          gemm(m.view, x.data(), n, yp.data(), &pool);
        }
        for (size_t i = 0; i < ny; ++i) {
          ASSERT_EQ(std::memcmp(&yr[i], &yt[i], sizeof(float)), 0)
              << v.label << " rows " << s.rows << "x" << s.cols << " n=" << n << " at " << i << ": " << yt[i] << " ref "
              << yr[i];
          ASSERT_EQ(std::memcmp(&yr[i], &yp[i], sizeof(float)), 0)
              << v.label << " gemm " << s.rows << "x" << s.cols << " n=" << n << " at " << i << ": " << yp[i] << " ref "
              << yr[i];
        }
      }
    }
  }
  ASSERT_TRUE(set_active_tier(before).has_value());
}

}  // namespace
}  // namespace bonsai::kernels
