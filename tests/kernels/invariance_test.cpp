// Batch invariance (DESIGN.md "Numerics"): a column's product is
// bit-identical whatever path computes it -- gemv, gemm with any number of
// other columns (N = 1 .. 512), gemm_multi, any thread count, any row split
// -- on every tier and test-hook variant. For the quantized formats every
// tier must also equal the scalar reference bit for bit (internal.h's
// canonical order); float formats only within a tier.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace bonsai::kernels {
namespace {

struct Variant {
  Tier tier;
  bool gfni, amx, vnni;
  std::string label;
};

std::vector<Variant> variants() {
  std::vector<Variant> v{{Tier::kReference, true, true, true, "reference"}};
  if (tier_supported(Tier::kAvx512)) {
    v.push_back({Tier::kAvx512, true, true, true, "avx512"});
    v.push_back({Tier::kAvx512, true, false, true, "avx512-noamx"});
    v.push_back({Tier::kAvx512, false, false, true, "avx512-noamx-nogfni"});
  }
  if (tier_supported(Tier::kAvx2)) {
    v.push_back({Tier::kAvx2, true, true, true, "avx2"});
    if (core::cpu_features().avx_vnni) v.push_back({Tier::kAvx2, true, true, false, "avx2-novnni"});
  }
  for (Tier t : {Tier::kNeon, Tier::kNeonDotprod, Tier::kNeonI8mm})
    if (tier_supported(t)) v.push_back({t, true, true, true, std::string(tier_name(t))});
  return v;
}

// Sets a variant's tier and hooks for the scope.
struct VariantScope {
  explicit VariantScope(const Variant& v)
      : tier(active_tier()),
        gfni(detail::set_avx512_gfni(v.gfni)),
        amx(detail::set_avx512_amx(v.amx ? detail::AmxMode::kOn : detail::AmxMode::kOff)),
        vnni(detail::set_avx2_vnni(v.vnni)) {
    EXPECT_TRUE(set_active_tier(v.tier).has_value());
  }
  ~VariantScope() {
    detail::set_avx512_gfni(gfni);
    detail::set_avx512_amx(amx);
    detail::set_avx2_vnni(vnni);
    (void)set_active_tier(tier);
  }
  Tier tier;
  bool gfni;
  detail::AmxMode amx;
  bool vnni;
};

struct Shape {
  int64_t rows, cols, max_n;
};

// Column j of a [n][rows] result equals want (rows floats) bit for bit.
::testing::AssertionResult same_column(const std::vector<float>& y, int64_t rows, int64_t j, const float* want) {
  if (std::memcmp(y.data() + j * rows, want, static_cast<size_t>(rows) * sizeof(float)) == 0) {
    return ::testing::AssertionSuccess();
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (std::memcmp(&y[static_cast<size_t>(j * rows + r)], want + r, sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "column " << j << " row " << r << ": " << y[static_cast<size_t>(j * rows + r)] << " vs " << want[r];
    }
  }
  return ::testing::AssertionFailure();
}

TEST(BatchInvariance, EveryPathEveryTierBitIdentical) {
  core::ThreadPool pool2(2);
  Shape shapes[] = {{67, 128, 512}, {130, 256, 64}, {33, 384, 512}, {70, 2048, 64}, {5, 6144, 16}};
  const int64_t ns[] = {1, 2, 3, 8, 16, 64, 512};
  // Under emulation (BONSAI_TEST_EMULATED=1, scripts/test-arm64.sh's qemu
  // runs: ~50x slower) the batches stop at 17 columns: every shape and
  // path (GEMV, 2..16 columns, i8mm's row and column pairs with odd
  // leftovers, threads, row splits) stays, the large-batch repeats go.
  if (const char* e = std::getenv("BONSAI_TEST_EMULATED"); e != nullptr && std::string_view(e) == "1") {
    for (Shape& s : shapes) s.max_n = std::min<int64_t>(s.max_n, 17);
  }
  for (const Variant& v : variants()) {
    VariantScope scope(v);
    for (Format f : testing::kAllFormats) {
      for (const Shape& s : shapes) {
        if (!testing::is_quantized(f) && s.cols > 2048) continue;
        auto m = testing::random_matrix(f, s.rows, s.cols, 17 + static_cast<uint32_t>(s.cols + s.rows));
        const auto x = testing::random_batch(s.max_n, s.cols, 1000 + static_cast<uint32_t>(s.cols));
        const std::string where =
            v.label + " " + std::string(format_name(f)) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols);
        // The definition for this tier: gemv of each column, one thread.
        std::vector<float> col(static_cast<size_t>(s.max_n * s.rows));
        for (int64_t j = 0; j < s.max_n; ++j) gemv(m.view, x.data() + j * s.cols, col.data() + j * s.rows, nullptr);
        // Quantized formats: the tier equals the reference bit for bit.
        if (testing::is_quantized(f) && v.tier != Tier::kReference) {
          std::vector<float> yr(static_cast<size_t>(3 * s.rows));
          gemm_rows(Tier::kReference, m.view, x.data(), 3, yr.data(), 0, s.rows);
          for (int64_t j = 0; j < 3; ++j)
            ASSERT_TRUE(same_column(yr, s.rows, j, col.data() + j * s.rows)) << where << " vs reference";
        }
        // gemv on the pool.
        std::vector<float> y1(static_cast<size_t>(s.rows));
        gemv(m.view, x.data(), y1.data(), &pool2);
        ASSERT_TRUE(same_column(y1, s.rows, 0, col.data())) << where << " gemv 2 threads";
        for (int64_t n : ns) {
          if (n > s.max_n) continue;
          std::vector<float> y(static_cast<size_t>(n * s.rows));
          for (core::ThreadPool* tp : {static_cast<core::ThreadPool*>(nullptr), &pool2}) {
            gemm(m.view, x.data(), n, y.data(), tp);
            for (int64_t j = 0; j < n; ++j) {
              ASSERT_TRUE(same_column(y, s.rows, j, col.data() + j * s.rows))
                  << where << " gemm n=" << n << (tp ? " 2 threads" : " 1 thread");
            }
          }
          // Odd row splits (single-threaded tier entry point).
          std::vector<float> ys(static_cast<size_t>(n * s.rows));
          const int64_t cut1 = s.rows / 3, cut2 = cut1 + 1 + s.rows / 5;
          gemm_rows(v.tier, m.view, x.data(), n, ys.data(), 0, cut1);
          gemm_rows(v.tier, m.view, x.data(), n, ys.data(), cut1, cut2 < s.rows ? cut2 : s.rows);
          if (cut2 < s.rows) gemm_rows(v.tier, m.view, x.data(), n, ys.data(), cut2, s.rows);
          for (int64_t j = 0; j < n; ++j) {
            ASSERT_TRUE(same_column(ys, s.rows, j, col.data() + j * s.rows)) << where << " row split n=" << n;
          }
        }
        // A column's position in the batch does not matter either: the last
        // column of a batch of 3 equals its own gemv (checked above) and the
        // same vector placed first.
      }
    }
  }
}

// gemm_multi (shared quantization, one dispatch over several matrices, the
// rows of a chunk spanning matrices) gives each matrix's columns exactly.
TEST(BatchInvariance, GemmMultiEqualsGemvColumns) {
  core::ThreadPool pool2(2);
  for (const Variant& v : variants()) {
    VariantScope scope(v);
    for (Format f : {Format::kQ1_0, Format::kQ2_0, Format::kQ2_0G128Qs, Format::kF16}) {
      auto a = testing::random_matrix(f, 200, 512, 31);
      auto b = testing::random_matrix(f, 72, 512, 32);
      const MatrixView ws[2] = {a.view, b.view};
      for (int64_t n : {1, 2, 5, 16, 64}) {
        const auto x = testing::random_batch(n, 512, 77);
        std::vector<float> ya(static_cast<size_t>(n * 200)), yb(static_cast<size_t>(n * 72));
        float* ys[2] = {ya.data(), yb.data()};
        gemm_multi(ws, 2, x.data(), n, ys, &pool2);
        for (int64_t j = 0; j < n; ++j) {
          std::vector<float> ga(200), gb(72);
          gemv(a.view, x.data() + j * 512, ga.data(), nullptr);
          gemv(b.view, x.data() + j * 512, gb.data(), nullptr);
          ASSERT_TRUE(same_column(ya, 200, j, ga.data())) << v.label << " " << format_name(f) << " n=" << n;
          ASSERT_TRUE(same_column(yb, 72, j, gb.data())) << v.label << " " << format_name(f) << " n=" << n;
        }
      }
    }
  }
}

// The canonical order is really the per-chunk lane order: a hand-computed
// Q1_0 row (one block of 128, scale 1) whose four chunks need distinct fp32
// roundings gives exactly the reference formula on every tier.
TEST(BatchInvariance, CanonicalOrderByHand) {
  // Weights all +1 (bits set), d = 1; activations: chunk k all equal to v_k
  // so that each chunk's quant sum is 32 * q_k.
  std::vector<uint8_t> blk(18, 0xff);
  const uint16_t one = 0x3c00;
  std::memcpy(blk.data(), &one, 2);
  const MatrixView w{blk.data(), Format::kQ1_0, 1, 128, 18};
  std::vector<float> x(128);
  const float v[4] = {1.0f, 3.0e-3f, 7.7f, -0.11f};
  for (int i = 0; i < 128; ++i) x[i] = v[i / 32];
  // Reference formula by hand: each chunk's amax = |v_k|, q = +-127,
  // dx = fp16(|v_k| / 127); lane k = fl(32 * 127 * sign * dx) * 1.
  float lanes[16] = {};
  for (int k = 0; k < 4; ++k) {
    const float dx = core::fp16_to_fp32(core::fp32_to_fp16(std::fabs(v[k]) / 127.0f));
    lanes[k] = static_cast<float>(v[k] < 0 ? -32 * 127 : 32 * 127) * dx;
  }
  const float want = ((lanes[0] + lanes[2]) + (lanes[1] + lanes[3]));
  for (const Variant& var : variants()) {
    VariantScope scope(var);
    float y = 0;
    gemv(w, x.data(), &y, nullptr);
    EXPECT_EQ(y, want) << var.label;
  }
}

}  // namespace
}  // namespace bonsai::kernels
