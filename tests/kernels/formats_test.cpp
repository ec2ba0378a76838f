// The format definitions (kernels/formats.h): the table agrees with the GGUF
// reader's ggml type table, the unit geometry the tiers and the packer read
// gives the byte offsets of each stored layout, the reference block decodes
// follow the documented value mappings, and products of a format a tier
// does not list run on the reference tier.
#include "kernels/formats.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "core/fp16.h"
#include "core/ggml_types.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace bonsai::kernels {
namespace {

constexpr Format kAll[] = {Format::kF32,  Format::kF16,       Format::kBF16,       Format::kQ8_0,  Format::kQ1_0,
                           Format::kQ2_0, Format::kQ2_0G128D, Format::kQ2_0G128Qs, Format::kPQ2_0, Format::kPTQ1_0};
static_assert(std::size(kAll) == kFormatCount);

TEST(Formats, TableAgreesWithTheGgmlTypeTable) {
  for (Format f : kAll) {
    const FormatDef& def = format_def(f);
    SCOPED_TRACE(std::string(def.name));
    EXPECT_EQ(format_of(def.ggml_type, def.q2_layout), f);
    const core::GgmlTypeTraits t = def.ggml_type == core::GgmlType::Q2_0
                                       ? core::q2_block_geometry(def.q2_layout)
                                       : *core::ggml_type_traits(static_cast<uint32_t>(def.ggml_type));
    EXPECT_EQ(block_elems(f), static_cast<int64_t>(t.block_size));
    EXPECT_EQ(block_bytes(f), static_cast<size_t>(t.type_size));
    EXPECT_EQ(format_name(f).substr(0, t.name.size()), t.name);
    EXPECT_EQ(detail::is_quantized(f), def.family != Family::kFloat);
  }
  EXPECT_EQ(format_name(Format::kQ2_0G128Qs), "Q2_0(g128-qs-first)");
  EXPECT_EQ(detail::chunk_elems(Format::kQ1_0), 32);
  EXPECT_EQ(detail::chunk_elems(Format::kQ2_0G128D), 16);
  EXPECT_EQ(detail::chunk_elems(Format::kQ8_0), 4);
  EXPECT_FALSE(format_of(core::GgmlType::Q4_K).has_value());
}

// Unit t of a row: Q1_0 / g64 18-byte blocks (d then qs); g128 34-byte
// blocks of two 64-weight units, d first (PrismML) or qs first (OxiBonsai).
TEST(Formats, UnitOffsetsOfEachLayout) {
  for (int64_t t = 0; t < 9; ++t) {
    SCOPED_TRACE(t);
    EXPECT_EQ(unit_qs_offset(Format::kQ1_0, t), static_cast<size_t>(18 * t + 2));
    EXPECT_EQ(unit_d_offset(Format::kQ1_0, t), static_cast<size_t>(18 * t));
    EXPECT_EQ(unit_qs_offset(Format::kQ2_0, t), static_cast<size_t>(18 * t + 2));
    EXPECT_EQ(unit_qs_offset(Format::kQ2_0G128D, t), static_cast<size_t>(34 * (t / 2) + 2 + 16 * (t % 2)));
    EXPECT_EQ(unit_d_offset(Format::kQ2_0G128D, t), static_cast<size_t>(34 * (t / 2)));
    EXPECT_EQ(unit_qs_offset(Format::kQ2_0G128Qs, t), static_cast<size_t>(34 * (t / 2) + 16 * (t % 2)));
    EXPECT_EQ(unit_d_offset(Format::kQ2_0G128Qs, t), static_cast<size_t>(34 * (t / 2) + 32));
  }
  EXPECT_EQ(unit_elems(Format::kQ1_0), 128);
  EXPECT_EQ(unit_elems(Format::kQ2_0G128Qs), 64);
  EXPECT_EQ(units_per_block(Format::kQ2_0G128D), 2);
  EXPECT_EQ(units_per_block(Format::kQ2_0), 1);
  EXPECT_EQ(unit_elems(Format::kQ8_0), 0);  // no units
  static_assert(UnitGeo<Format::kQ2_0G128Qs>::unit_d(3) == 34 + 32);
  static_assert(UnitGeo<Format::kQ1_0>::kPlanes == 8 && UnitGeo<Format::kQ2_0>::kPlanes == 4);
}

TEST(Formats, ReferenceDecodesFollowTheValueMappings) {
  const uint16_t d = 0x3C00;  // fp16 1.0
  int8_t w[kMaxBlockElems];
  // 2-bit codes 0, 1, 2, 3 in every byte (0b11100100): -1, 0, +1, then +2 (g64) or 0 (g128).
  BlockQ2_0 g64{};
  std::memcpy(g64.d, &d, 2);
  std::memset(g64.qs, 0xE4, sizeof(g64.qs));
  EXPECT_EQ(format_def(Format::kQ2_0).decode_block(reinterpret_cast<const uint8_t*>(&g64), w), 1.0f);
  EXPECT_EQ((std::vector<int>{w[0], w[1], w[2], w[3], w[63]}), (std::vector<int>{-1, 0, 1, 2, 2}));
  BlockQ2_0G128Qs g128{};
  std::memcpy(g128.d, &d, 2);
  std::memset(g128.qs, 0xE4, sizeof(g128.qs));
  EXPECT_EQ(format_def(Format::kQ2_0G128Qs).decode_block(reinterpret_cast<const uint8_t*>(&g128), w), 1.0f);
  EXPECT_EQ((std::vector<int>{w[0], w[1], w[2], w[3], w[127]}), (std::vector<int>{-1, 0, 1, 0, 0}));
  // Q1_0: bit j of qs[j/8] set -> +1, clear -> -1.
  BlockQ1_0 q1{};
  std::memcpy(q1.d, &d, 2);
  q1.qs[0] = 0x05;  // elements 0 and 2
  format_def(Format::kQ1_0).decode_block(reinterpret_cast<const uint8_t*>(&q1), w);
  EXPECT_EQ((std::vector<int>{w[0], w[1], w[2], w[3], w[127]}), (std::vector<int>{1, -1, 1, -1, -1}));
  // dequantize_row is decode * d for the quantized formats.
  float out[128];
  dequantize_row(Format::kQ2_0G128Qs, &g128, out, 128);
  EXPECT_EQ(out[0], -1.0f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(out[6], 1.0f);
}

// Every built tier computes every format there is today with its own
// kernels (no silent fall back, which would be slow) except PTQ1_0, which
// the AVX2 tier computes (the AVX-512 tier hands it to the AVX2 one) and
// the NEON tiers hand to the reference; the reference tier lists every format; a
// tier that lacks a format hands it to the reference.
TEST(Formats, EachTierListsItsFormatsAndTheRestRunOnTheReference) {
  EXPECT_EQ(detail::reference_ops()->formats, kAllFormats);
  for (Tier t : kAllTiers) {
    const detail::TierOps* ops = detail::tier_ops(t);
    if (ops == nullptr) continue;
    SCOPED_TRACE(std::string(tier_name(t)));
    for (Format f : kAll) {
      const detail::TierOps* want = ops;
      if (f == Format::kPTQ1_0 && t == Tier::kAvx512) {
        want = tier_supported(Tier::kAvx2) ? detail::avx2_ops() : detail::reference_ops();
      } else if (f == Format::kPTQ1_0 && (t == Tier::kNeon || t == Tier::kNeonDotprod || t == Tier::kNeonI8mm)) {
        want = detail::reference_ops();
      }
      EXPECT_EQ(detail::ops_for_format(ops, f), want) << format_name(f);
    }
  }
  detail::TierOps partial = *detail::reference_ops();
  partial.formats = format_bit(Format::kF32);
  EXPECT_EQ(detail::ops_for_format(&partial, Format::kF32), &partial);
  EXPECT_EQ(detail::ops_for_format(&partial, Format::kQ1_0), detail::reference_ops());
}

// ../shared/fixtures/qwen35/golden/qwen35-dequant.json: rows of the qwen35
// fixtures dequantized by llama.cpp (PrismML's fork; PTQ1_0 by the fixture's
// reference, equal to the PQ2_0 rows). Every listed row of every quantized
// tensor in the Q1_0, Q2_0 g64, PQ2_0 and PTQ1_0 files decodes to exactly
// those floats, and the PTQ1_0 file's rows equal the PQ2_0 file's.
TEST(Formats, Qwen35FixtureRowsDequantizeExactly) {
  const std::string golden = test::shared_path("fixtures/qwen35/golden/qwen35-dequant.json");
  BONSAI_REQUIRE_FILE(golden);
  std::ifstream in(golden);
  const auto j = nlohmann::json::parse(in);
  std::map<std::string, int> rows_checked;
  for (const auto& fj : j.at("files")) {
    const std::string name = fj.at("file").get<std::string>();
    const std::string path = test::shared_path("fixtures/qwen35/" + name);
    BONSAI_REQUIRE_FILE(path);
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.has_value()) << path << ": " << file.error().message;
    for (const auto& tj : fj.at("tensors")) {
      const std::string tname = tj.at("name").get<std::string>();
      const gguf::TensorInfo* t = (*file)->find_tensor(tname);
      ASSERT_NE(t, nullptr) << name << " " << tname;
      const auto fmt = format_of(t->type, (*file)->q2_layout().value_or(core::Q2Layout::kG64));
      ASSERT_TRUE(fmt.has_value()) << name << " " << tname << " type " << t->type_id;
      if (!detail::is_quantized(*fmt)) continue;
      const int64_t cols = t->ne[0];
      std::vector<float> row(static_cast<size_t>(cols));
      for (const auto& [key, values] : tj.at("rows").items()) {
        const int64_t r = std::stoll(key);
        dequantize_row(*fmt, t->data + static_cast<size_t>(r) * row_bytes(*fmt, cols), row.data(), cols);
        const auto expected = values.get<std::vector<float>>();
        ASSERT_EQ(expected.size(), row.size()) << name << " " << tname;
        for (int64_t c = 0; c < cols; ++c) {
          ASSERT_EQ(row[static_cast<size_t>(c)], expected[static_cast<size_t>(c)])
              << name << " " << tname << " row " << r << " col " << c;
        }
        ++rows_checked[std::string(format_name(*fmt))];
      }
    }
  }
  // Each of the four quantized formats had rows to check.
  for (const char* f : {"Q1_0", "Q2_0", "PQ2_0", "PTQ1_0"}) EXPECT_GT(rows_checked[f], 0) << f;
}

// The load-time PTQ1_0 -> PQ2_0 transcode keeps every weight and scale:
// random trits (every digit position of qs and qh), 3 rows x 4 blocks, split
// over a pool; each output block decodes (PQ2_0 reference) to the input's.
TEST(Formats, Ptq1TranscodesToPq2Exactly) {
  const int64_t rows = 3, cols = 512;
  std::vector<uint8_t> src(static_cast<size_t>(rows) * row_bytes(Format::kPTQ1_0, cols));
  uint64_t s = 12345;
  std::vector<int8_t> want(static_cast<size_t>(rows * cols));
  for (int64_t b = 0; b < rows * cols / 128; ++b) {
    int8_t* w = want.data() + b * 128;
    for (int e = 0; e < 128; ++e) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      w[e] = static_cast<int8_t>(static_cast<int>(s >> 62) % 3 - 1);
    }
    encode_ptq1_0(w, static_cast<uint16_t>(0x3c00 + b), src.data() + b * 28);
  }
  const MatrixView m{src.data(), Format::kPTQ1_0, rows, cols, row_bytes(Format::kPTQ1_0, cols)};
  std::vector<uint8_t> out(static_cast<size_t>(rows) * row_bytes(Format::kPQ2_0, cols));
  core::ThreadPool pool(2);
  transcode_ptq1_0_to_pq2_0(m, out.data(), &pool);
  for (int64_t b = 0; b < rows * cols / 128; ++b) {
    int8_t got[128];
    const float d = decode_pq2_0(out.data() + b * 34, got);
    EXPECT_EQ(d, core::fp16_to_fp32(static_cast<uint16_t>(0x3c00 + b))) << "block " << b;
    EXPECT_EQ(std::memcmp(got, want.data() + b * 128, 128), 0) << "block " << b;
  }
  // Only PTQ1_0 has a target, and only where the SIMD tiers run.
  const MatrixView q1{src.data(), Format::kQ1_0, 1, 128, 18};
  EXPECT_EQ(transcode_target(q1), Format::kQ1_0);
  const bool simd = active_tier() == Tier::kAvx2 || active_tier() == Tier::kAvx512;
  EXPECT_EQ(transcode_target(m), simd ? Format::kPQ2_0 : Format::kPTQ1_0);
}

// The AVX2 row transcode writes the scalar one's bytes for every byte value
// at every position of a block (valid base-3 bytes, 0..242, and the 243..255
// no encoder writes, which both decode by the same digit rule), row lengths
// of 1..9 blocks (no read or write past a row: the buffers are exact, and
// the bytes after dst's last block are checked untouched).
TEST(Formats, Ptq1TranscodeAvx2MatchesScalar) {
  if (!tier_supported(Tier::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU or build";
  uint64_t s = 99;
  auto next = [&s] {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint8_t>(s >> 56);
  };
  for (int64_t blocks = 1; blocks <= 9; ++blocks) {
    for (int round = 0; round < 64; ++round) {
      std::vector<uint8_t> src(static_cast<size_t>(blocks) * 28);
      for (size_t i = 0; i < src.size(); ++i) {
        // Round r sweeps byte value 4 r .. 4 r + 3 through every position; the rest random.
        src[i] = (i + static_cast<size_t>(round)) % 7 == 0 ? static_cast<uint8_t>(4 * round + i % 4) : next();
      }
      std::vector<uint8_t> a(static_cast<size_t>(blocks) * 34 + 8, 0xEE), b(a.size(), 0xEE);
      detail::transcode_ptq1_0_row_scalar(src.data(), a.data(), blocks);
      detail::transcode_ptq1_0_row_avx2(src.data(), b.data(), blocks);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << blocks << " blocks, round " << round;
      for (size_t i = static_cast<size_t>(blocks) * 34; i < b.size(); ++i) ASSERT_EQ(b[i], 0xEE);
    }
  }
  // Every byte value in every qs / qh position, one block at a time.
  for (int pos = 0; pos < 26; ++pos) {
    for (int v = 0; v < 256; ++v) {
      uint8_t src[28];
      for (auto& x : src) x = next();
      src[pos] = static_cast<uint8_t>(v);
      uint8_t a[34], b[34];
      detail::transcode_ptq1_0_row_scalar(src, a, 1);
      detail::transcode_ptq1_0_row_avx2(src, b, 1);
      ASSERT_EQ(std::memcmp(a, b, 34), 0) << "byte " << pos << " = " << v;
    }
  }
}

}  // namespace
}  // namespace bonsai::kernels
