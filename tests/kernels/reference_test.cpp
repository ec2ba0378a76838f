// Reference tier: formats table, hand-decoded blocks, quantize/dequantize
// round trips, gemv/gemm against double-precision dots, tier selection and
// the float helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/formats.h"
#include "kernels/internal.h"  // AmxMode, amx_usable
#include "kernels/kernels.h"

namespace bonsai::kernels {
namespace {

using testing::kAllFormats;

TEST(Formats, GeometryMatchesGgml) {
  EXPECT_EQ(block_elems(Format::kQ1_0), 128);
  EXPECT_EQ(block_bytes(Format::kQ1_0), 18u);
  EXPECT_EQ(block_elems(Format::kQ2_0), 64);
  EXPECT_EQ(block_bytes(Format::kQ2_0), 18u);
  EXPECT_EQ(block_elems(Format::kQ2_0G128D), 128);
  EXPECT_EQ(block_bytes(Format::kQ2_0G128D), 34u);
  EXPECT_EQ(block_elems(Format::kQ2_0G128Qs), 128);
  EXPECT_EQ(block_bytes(Format::kQ2_0G128Qs), 34u);
  EXPECT_EQ(block_elems(Format::kQ8_0), 32);
  EXPECT_EQ(block_bytes(Format::kQ8_0), 34u);
  EXPECT_EQ(block_bytes(Format::kF16), 2u);
  EXPECT_EQ(block_bytes(Format::kBF16), 2u);
  EXPECT_EQ(block_bytes(Format::kF32), 4u);
  EXPECT_EQ(row_bytes(Format::kQ1_0, 2048), 16u * 18u);
  EXPECT_EQ(row_bytes(Format::kQ2_0, 2048), 32u * 18u);
  // Geometry agrees with core's ggml type table.
  for (auto [type, layout] :
       {std::pair{core::GgmlType::Q1_0, core::Q2Layout::kG64}, std::pair{core::GgmlType::Q2_0, core::Q2Layout::kG64},
        std::pair{core::GgmlType::Q2_0, core::Q2Layout::kG128DFirst},
        std::pair{core::GgmlType::Q2_0, core::Q2Layout::kG128QsFirst},
        std::pair{core::GgmlType::Q8_0, core::Q2Layout::kG64}, std::pair{core::GgmlType::F16, core::Q2Layout::kG64}}) {
    const auto f = format_of(type, layout);
    ASSERT_TRUE(f.has_value());
    auto traits = type == core::GgmlType::Q2_0 ? core::q2_block_geometry(layout)
                                               : *core::ggml_type_traits(static_cast<uint32_t>(type));
    EXPECT_EQ(static_cast<uint32_t>(block_elems(*f)), traits.block_size) << format_name(*f);
    EXPECT_EQ(block_bytes(*f), traits.type_size) << format_name(*f);
  }
}

TEST(Formats, FormatOf) {
  EXPECT_EQ(format_of(core::GgmlType::Q2_0, core::Q2Layout::kG128QsFirst), Format::kQ2_0G128Qs);
  EXPECT_EQ(format_of(core::GgmlType::Q2_0, core::Q2Layout::kG128DFirst), Format::kQ2_0G128D);
  EXPECT_EQ(format_of(core::GgmlType::Q2_0), Format::kQ2_0);
  EXPECT_EQ(format_of(core::GgmlType::BF16), Format::kBF16);
  EXPECT_FALSE(format_of(core::GgmlType::Q4_K).has_value());
  EXPECT_EQ(format_name(Format::kQ2_0G128D), "Q2_0(g128-d-first)");
}

// ---- Hand-decoded blocks -------------------------------------------------------

TEST(Dequantize, Q1_0HandBlock) {
  BlockQ1_0 b{};
  const uint16_t d = 0x3800;  // 0.5
  std::memcpy(b.d, &d, 2);
  b.qs[0] = 0x05;   // elements 0 and 2 set
  b.qs[15] = 0x80;  // element 127 set
  float out[128];
  dequantize_row(Format::kQ1_0, &b, out, 128);
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], -0.5f);
  EXPECT_EQ(out[2], 0.5f);
  EXPECT_EQ(out[3], -0.5f);
  EXPECT_EQ(out[126], -0.5f);
  EXPECT_EQ(out[127], 0.5f);
  int pos = 0;
  for (float v : out) pos += v > 0;
  EXPECT_EQ(pos, 3);
}

TEST(Dequantize, Q2_0G64HandBlock) {
  BlockQ2_0 b{};
  const uint16_t d = 0x4000;  // 2.0
  std::memcpy(b.d, &d, 2);
  std::memset(b.qs, 0x55, 16);       // every code 1 -> 0
  b.qs[0] = 0xE4;                    // codes 0,1,2,3 for elements 0..3
  b.qs[15] = 0x02 << 6 | 0x55 >> 2;  // element 63 code 2, elements 60..62 code 1
  float out[64];
  dequantize_row(Format::kQ2_0, &b, out, 64);
  EXPECT_EQ(out[0], -2.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 2.0f);
  EXPECT_EQ(out[3], 4.0f);  // llama.cpp: code 3 -> +2d
  for (int j = 4; j < 63; ++j) EXPECT_EQ(out[j], 0.0f) << j;
  EXPECT_EQ(out[63], 2.0f);
}

TEST(Dequantize, Q2_0G128BothOrders) {
  uint8_t qs[32];
  std::memset(qs, 0x55, 32);
  qs[0] = 0xE4;               // -d, 0, +d, code 3 -> 0 in the g128 layouts
  qs[16] = 0x56;              // element 64 code 2 (+d), elements 65..67 code 1
  qs[31] = 0x15;              // elements 124..126 code 1, element 127 code 0 (-d)
  const uint16_t d = 0x3c00;  // 1.0
  BlockQ2_0G128D a{};
  std::memcpy(a.d, &d, 2);
  std::memcpy(a.qs, qs, 32);
  BlockQ2_0G128Qs b{};
  std::memcpy(b.qs, qs, 32);
  std::memcpy(b.d, &d, 2);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(&b)[32], 0x00);  // d sits after the codes
  EXPECT_EQ(reinterpret_cast<uint8_t*>(&b)[33], 0x3c);
  float oa[128], ob[128];
  dequantize_row(Format::kQ2_0G128D, &a, oa, 128);
  dequantize_row(Format::kQ2_0G128Qs, &b, ob, 128);
  for (const float* o : {oa, ob}) {
    EXPECT_EQ(o[0], -1.0f);
    EXPECT_EQ(o[1], 0.0f);
    EXPECT_EQ(o[2], 1.0f);
    EXPECT_EQ(o[3], 0.0f);
    EXPECT_EQ(o[64], 1.0f);
    EXPECT_EQ(o[65], 0.0f);
    EXPECT_EQ(o[127], -1.0f);
    int nz = 0;
    for (int j = 0; j < 128; ++j) nz += o[j] != 0.0f;
    EXPECT_EQ(nz, 4);
  }
}

TEST(Dequantize, Q8_0AndFloats) {
  BlockQ8_0 b{};
  const uint16_t d = 0x3400;  // 0.25
  std::memcpy(b.d, &d, 2);
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j - 16);
  float out[32];
  dequantize_row(Format::kQ8_0, &b, out, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 0.25f * (j - 16));

  const uint16_t h[3] = {0x3c00, 0xc000, 0x7bff};  // 1, -2, 65504
  float o3[3];
  dequantize_row(Format::kF16, h, o3, 3);
  EXPECT_EQ(o3[0], 1.0f);
  EXPECT_EQ(o3[1], -2.0f);
  EXPECT_EQ(o3[2], 65504.0f);
  const uint16_t bf[2] = {0x3f80, 0xc0a0};  // 1, -5
  dequantize_row(Format::kBF16, bf, o3, 2);
  EXPECT_EQ(o3[0], 1.0f);
  EXPECT_EQ(o3[1], -5.0f);
  const float f[2] = {3.5f, -0.125f};
  dequantize_row(Format::kF32, f, o3, 2);
  EXPECT_EQ(o3[0], 3.5f);
  EXPECT_EQ(o3[1], -0.125f);
}

// ---- Quantize round trips ------------------------------------------------------------

TEST(Quantize, Q8_0RoundTripWithinHalfStep) {
  const auto x = testing::random_vector(4096, 11);
  std::vector<uint8_t> q(row_bytes(Format::kQ8_0, 4096));
  quantize_row_q8_0(x.data(), q.data(), 4096);
  std::vector<float> y(4096);
  dequantize_row(Format::kQ8_0, q.data(), y.data(), 4096);
  for (int b = 0; b < 4096 / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    // Half a step plus the fp16 rounding of d times |q| <= 127.
    const float tol = amax * (0.5f / 127.0f + std::ldexp(1.0f, -10)) + 1e-7f;
    for (int j = 0; j < 32; ++j) EXPECT_NEAR(y[b * 32 + j], x[b * 32 + j], tol) << b << " " << j;
  }
  // An all-zero block quantizes to d = 0, q = 0.
  std::vector<float> z(32, 0.0f);
  quantize_row_q8_0(z.data(), q.data(), 32);
  for (size_t i = 0; i < 34; ++i) EXPECT_EQ(q[i], 0);
}

TEST(Quantize, Q1_0SignsAndMeanScale) {
  const auto x = testing::random_vector(1024, 12);
  std::vector<uint8_t> q(row_bytes(Format::kQ1_0, 1024));
  quantize_row_q1_0(x.data(), q.data(), 1024);
  std::vector<float> y(1024);
  dequantize_row(Format::kQ1_0, q.data(), y.data(), 1024);
  for (int b = 0; b < 8; ++b) {
    double mean = 0;
    for (int j = 0; j < 128; ++j) mean += std::fabs(x[b * 128 + j]);
    mean /= 128;
    for (int j = 0; j < 128; ++j) {
      const int i = b * 128 + j;
      EXPECT_EQ(y[i] > 0, x[i] >= 0) << i;
      EXPECT_NEAR(std::fabs(y[i]), mean, mean * std::ldexp(1.0, -11)) << i;
    }
  }
  // Idempotent: re-quantizing the dequantized row gives the same bytes.
  std::vector<uint8_t> q2(q.size());
  quantize_row_q1_0(y.data(), q2.data(), 1024);
  EXPECT_EQ(q, q2);
}

TEST(Quantize, Q2_0TernaryRoundTripExact) {
  // Rows of {-d, 0, +d} with d a power-of-two multiple per block reproduce exactly.
  std::vector<float> x(512);
  uint32_t s = 7;
  for (int b = 0; b < 8; ++b) {
    const float d = std::ldexp(1.0f, b - 4);
    for (int j = 0; j < 64; ++j) {
      s = s * 1664525u + 1013904223u;
      x[b * 64 + j] = static_cast<float>(static_cast<int>((s >> 16) % 3) - 1) * d;
    }
    x[b * 64 + 5] = d;  // amax = d
  }
  std::vector<uint8_t> q(row_bytes(Format::kQ2_0, 512));
  quantize_row_q2_0(x.data(), q.data(), 512);
  std::vector<float> y(512);
  dequantize_row(Format::kQ2_0, q.data(), y.data(), 512);
  EXPECT_EQ(x, y);
  // Valid ternary data never holds code 3.
  for (int b = 0; b < 8; ++b) {
    for (int k = 0; k < 16; ++k) {
      const uint8_t v = q[b * 18 + 2 + k];
      for (int c = 0; c < 4; ++c) EXPECT_NE((v >> (2 * c)) & 3, 3);
    }
  }
  // General inputs: each value within d/2 of its ternary reconstruction.
  const auto r = testing::random_vector(640, 13);
  std::vector<uint8_t> q3(row_bytes(Format::kQ2_0, 640));
  quantize_row_q2_0(r.data(), q3.data(), 640);
  std::vector<float> ry(640);
  dequantize_row(Format::kQ2_0, q3.data(), ry.data(), 640);
  for (int b = 0; b < 10; ++b) {
    const float d = core::fp16_to_fp32(static_cast<uint16_t>(q3[b * 18] | q3[b * 18 + 1] << 8));
    for (int j = 0; j < 64; ++j) EXPECT_LE(std::fabs(ry[b * 64 + j] - r[b * 64 + j]), 0.5f * d * 1.002f);
  }
}

// ---- GEMV / GEMM on the reference tier vs double ----------------------------------

struct Shape {
  int64_t rows, cols;
};

TEST(ReferenceGemv, MatchesDoubleDotOfDequantizedRows) {
  for (Format f : kAllFormats) {
    for (Shape s : {Shape{1, 128}, Shape{7, 256}, Shape{33, 384}, Shape{5, 2048}}) {
      auto m = testing::random_matrix(f, s.rows, s.cols, 100 + static_cast<uint32_t>(f));
      const auto x = testing::random_vector(s.cols, 200);
      std::vector<float> y(static_cast<size_t>(s.rows));
      gemm_rows(Tier::kReference, m.view, x.data(), 1, y.data(), 0, s.rows);
      const auto xe = testing::effective_x(f, x.data(), s.cols);
      for (int64_t r = 0; r < s.rows; ++r) {
        const auto w = testing::dequant_row(m.view, r);
        const auto dd = testing::dot_double(w, xe);
        EXPECT_NEAR(y[r], dd.dot, testing::float_tol(testing::sum_terms(f, s.cols), dd.abs))
            << format_name(f) << " " << s.rows << "x" << s.cols << " row " << r;
        // And against the unquantized x: within the Q8_0 rounding of x.
        if (testing::is_quantized(f)) {
          double wabs = 0;
          for (float v : w) wabs += std::fabs(v);
          const auto exact = testing::dot_double(w, std::vector<float>(x.begin(), x.end()));
          EXPECT_NEAR(y[r], exact.dot, wabs * (8 * 4.0 / 127 * 0.5 + 0.02) + 1e-3);
        }
      }
    }
  }
}

TEST(ReferenceGemm, ColumnsEqualGemvAndPoolEqualsSerial) {
  core::ThreadPool pool(2);
  ASSERT_TRUE(set_active_tier(Tier::kReference).has_value());
  for (Format f : {Format::kQ1_0, Format::kQ2_0, Format::kF16}) {
    const int64_t rows = 37, cols = 512, n = 5;
    auto m = testing::random_matrix(f, rows, cols, 300);
    std::vector<float> x;
    for (int j = 0; j < n; ++j) {
      auto v = testing::random_vector(cols, 400 + j);
      x.insert(x.end(), v.begin(), v.end());
    }
    std::vector<float> y(static_cast<size_t>(n * rows));
    gemm(m.view, x.data(), n, y.data(), &pool);
    for (int j = 0; j < n; ++j) {
      std::vector<float> yj(static_cast<size_t>(rows));
      gemv(m.view, x.data() + j * cols, yj.data(), nullptr);
      for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(y[j * rows + r], yj[r]) << format_name(f);
    }
    // Row sub-ranges write only their rows.
    std::vector<float> ys(static_cast<size_t>(n * rows), -7.0f);
    gemm_rows(Tier::kReference, m.view, x.data(), n, ys.data(), 3, 9);
    for (int j = 0; j < n; ++j) {
      for (int64_t r = 0; r < rows; ++r) {
        if (r >= 3 && r < 9) {
          EXPECT_EQ(ys[j * rows + r], y[j * rows + r]);
        } else {
          EXPECT_EQ(ys[j * rows + r], -7.0f);
        }
      }
    }
  }
  ASSERT_TRUE(set_active_tier(best_tier()).has_value());
}

TEST(ReferenceGemv, RowStrideLargerThanRow) {
  // A view with padding between rows (e.g. a slice) reads only its rows.
  auto m = testing::random_matrix(Format::kQ1_0, 6, 256, 500);
  const size_t rb = row_bytes(Format::kQ1_0, 256);
  MatrixView every_other{m.bytes.data(), Format::kQ1_0, 3, 256, 2 * rb};
  const auto x = testing::random_vector(256, 501);
  float y_all[6], y_sub[3];
  gemm_rows(Tier::kReference, m.view, x.data(), 1, y_all, 0, 6);
  gemm_rows(Tier::kReference, every_other, x.data(), 1, y_sub, 0, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(y_sub[i], y_all[2 * i]);
}

// ---- Tiers ----------------------------------------------------------------------------

TEST(Tiers, NamesAndSelection) {
  for (Tier t : kAllTiers) {
    EXPECT_EQ(parse_tier(tier_name(t)), t);
  }
  EXPECT_EQ(tier_name(Tier::kNeonDotprod), "neon-dotprod");
  EXPECT_EQ(tier_name(Tier::kNeonI8mm), "neon-i8mm");
  EXPECT_FALSE(parse_tier("sse9").has_value());
  EXPECT_TRUE(tier_supported(Tier::kReference));
  EXPECT_TRUE(tier_supported(best_tier()));
#if defined(__x86_64__)
  EXPECT_FALSE(tier_supported(Tier::kNeon));
  EXPECT_FALSE(tier_supported(Tier::kNeonDotprod));
  EXPECT_FALSE(tier_supported(Tier::kNeonI8mm));
  auto e = set_active_tier(Tier::kNeon);
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code, core::Errc::kUnsupported);
  EXPECT_NE(e.error().message.find("neon"), std::string::npos);
#endif
}

TEST(Tiers, EnvironmentOverride) {
  const Tier before = active_tier();
  ::setenv("BONSAI_KERNEL", "reference", 1);
  ASSERT_TRUE(init_tier_from_env().has_value());
  EXPECT_EQ(active_tier(), Tier::kReference);
  ::setenv("BONSAI_KERNEL", "bogus", 1);
  auto e = init_tier_from_env();
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code, core::Errc::kInvalidArgument);
  EXPECT_NE(e.error().message.find("bogus"), std::string::npos);
#if defined(__x86_64__)
  ::setenv("BONSAI_KERNEL", "neon", 1);
  e = init_tier_from_env();
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code, core::Errc::kUnsupported);
#endif
#if defined(__aarch64__)
  // Each ARM tier by name where the CPU has it, refused where it does not.
  for (Tier t : {Tier::kNeon, Tier::kNeonDotprod, Tier::kNeonI8mm}) {
    ::setenv("BONSAI_KERNEL", std::string(tier_name(t)).c_str(), 1);
    e = init_tier_from_env();
    if (tier_supported(t)) {
      ASSERT_TRUE(e.has_value()) << e.error().message;
      EXPECT_EQ(active_tier(), t);
      EXPECT_EQ(kernel_name(), tier_name(t));
    } else {
      ASSERT_FALSE(e.has_value());
      EXPECT_EQ(e.error().code, core::Errc::kUnsupported);
      EXPECT_NE(e.error().message.find(tier_name(t)), std::string::npos) << e.error().message;
    }
  }
#endif
  // avx512: the AVX-512 tier with AMX off; avx512-amx: AMX forced on, or
  // kUnsupported where the CPU or OS does not allow it (issue 27).
  if (tier_supported(Tier::kAvx512)) {
    ::setenv("BONSAI_KERNEL", "avx512", 1);
    ASSERT_TRUE(init_tier_from_env().has_value());
    EXPECT_EQ(active_tier(), Tier::kAvx512);
    EXPECT_EQ(detail::avx512_amx_mode(), detail::AmxMode::kOff);
    EXPECT_FALSE(detail::avx512_amx_in_use());
    EXPECT_EQ(kernel_name(), "avx512");
  }
  ::setenv("BONSAI_KERNEL", "avx512-amx", 1);
  e = init_tier_from_env();
  if (tier_supported(Tier::kAvx512) && detail::amx_usable()) {
    ASSERT_TRUE(e.has_value()) << e.error().message;
    EXPECT_EQ(detail::avx512_amx_mode(), detail::AmxMode::kOn);
    EXPECT_TRUE(detail::avx512_amx_in_use());
    EXPECT_TRUE(detail::avx512_amx_for(detail::kAmxMinCols));
    EXPECT_FALSE(detail::avx512_amx_for(detail::kAmxMinCols - 1));
    EXPECT_EQ(kernel_name(), "avx512-amx");
  } else {
    ASSERT_FALSE(e.has_value());
    EXPECT_EQ(e.error().code, core::Errc::kUnsupported);
    EXPECT_NE(e.error().message.find(tier_supported(Tier::kAvx512) ? "AMX" : "avx512"), std::string::npos)
        << e.error().message;
  }
  ::unsetenv("BONSAI_KERNEL");
  ASSERT_TRUE(init_tier_from_env().has_value());
  EXPECT_EQ(active_tier(), best_tier());
  EXPECT_EQ(detail::avx512_amx_mode(), detail::AmxMode::kAuto);
  EXPECT_EQ(kernel_name(), tier_name(best_tier()));  // kAuto: no measured AMX win today
  ASSERT_TRUE(set_active_tier(before).has_value());
}

// ---- Float helpers (every supported tier) ---------------------------------------------

TEST(FloatHelpers, AllTiersAgreeWithDouble) {
  const Tier before = active_tier();
  for (Tier t : kAllTiers) {
    if (!tier_supported(t)) continue;
    ASSERT_TRUE(set_active_tier(t).has_value());
    for (int64_t n : {1, 7, 64, 129, 1000}) {
      const auto a = testing::random_vector(n, 600);
      const auto b = testing::random_vector(n, 601);
      std::vector<uint16_t> ah(static_cast<size_t>(n));
      f32_to_f16_row(a.data(), ah.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ah[i], core::fp32_to_fp16(a[i])) << tier_name(t);
      double dd = 0, da = 0, dh = 0, dha = 0;
      for (int64_t i = 0; i < n; ++i) {
        dd += static_cast<double>(a[i]) * b[i];
        da += std::fabs(static_cast<double>(a[i]) * b[i]);
        const double hv = core::fp16_to_fp32(ah[i]);
        dh += hv * b[i];
        dha += std::fabs(hv * b[i]);
      }
      EXPECT_NEAR(dot_f32(a.data(), b.data(), n), dd, testing::float_tol(n, da)) << tier_name(t);
      EXPECT_NEAR(dot_f16_f32(ah.data(), b.data(), n), dh, testing::float_tol(n, dha)) << tier_name(t);
      std::vector<float> y1(b), y2(b);
      axpy_f32(0.75f, a.data(), y1.data(), n);
      axpy_f16(-1.5f, ah.data(), y2.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        // One multiply-add per element: fused or not, within 1 ulp-ish of double.
        const double e1 = b[i] + 0.75 * a[i];
        const double e2 = b[i] - 1.5 * core::fp16_to_fp32(ah[i]);
        EXPECT_NEAR(y1[i], e1, 1e-6 * (std::fabs(b[i]) + std::fabs(a[i])) + 1e-30) << tier_name(t);
        EXPECT_NEAR(y2[i], e2, 1e-6 * (std::fabs(b[i]) + 2 * std::fabs(a[i])) + 1e-30) << tier_name(t);
      }
    }
  }
  ASSERT_TRUE(set_active_tier(before).has_value());
}

}  // namespace
}  // namespace bonsai::kernels
