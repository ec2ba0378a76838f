// Load-time repacked layouts (kernels.h Packing, issue 8 decision 2): a
// packed view (row quads; tile16 for Q1_0 rows of up to 2,048 columns, avx2-tile16 up to 12,288) gives
// bit-identical products to the stored layout on every path (gemv, gemm at
// N = 1 .. 512: the table lookups in groups of lut_group_cols columns, and
// its row quads converted per block without VBMI; gemm_multi mixing packed and stored views, 1
// and 2 threads, row ranges that cut quads and tiles), every AVX-512 hook
// variant, odd shapes (rows not a multiple of 4 or 16, units not a multiple
// of 4, an odd number of units or groups); other tiers ignore the packing
// (they read the stored bytes) and give their own results unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace bonsai::kernels {
namespace {

constexpr Format kPackFormats[] = {Format::kQ1_0, Format::kQ2_0, Format::kQ2_0G128D, Format::kQ2_0G128Qs};

// A packed copy of m (64-byte aligned) and the view that carries it.
struct Packed {
  std::unique_ptr<uint8_t[], void (*)(uint8_t*)> buf{nullptr,
                                                     [](uint8_t* p) { ::operator delete[](p, std::align_val_t(64)); }};
  MatrixView view;
};

Packed pack(const MatrixView& w, core::ThreadPool* pool, Packing packing = Packing::kAvx512RowQuad) {
  Packed p;
  const size_t n = packed_bytes(w, packing);
  p.buf.reset(static_cast<uint8_t*>(::operator new[](n, std::align_val_t(64))));
  std::memset(p.buf.get(), 0xCD, n);  // packing must write every byte
  pack_matrix(w, packing, p.buf.get(), pool);
  p.view = w;
  p.view.packed = p.buf.get();
  p.view.packing = packing;
  return p;
}

// The layouts defined for a matrix of format f with `cols` columns.
std::vector<Packing> packings(Format f, int64_t cols) {
  std::vector<Packing> v{Packing::kAvx512RowQuad};
  if (f == Format::kQ1_0 && cols / 128 <= detail::kTileMaxUnits) v.push_back(Packing::kTile16);
  if (f == Format::kQ1_0 && cols / 128 <= detail::kAvx2TileMaxUnits) v.push_back(Packing::kAvx2Tile16);
  return v;
}

struct Variant {
  Tier tier;
  bool gfni;
  std::string label;
  bool vnni = true;  // AVX2 tier: AVX-VNNI where the CPU has it (set_avx2_vnni)
};

struct Scope {
  explicit Scope(const Variant& v)
      : tier(active_tier()),
        gfni(detail::set_avx512_gfni(v.gfni)),
        amx(detail::set_avx512_amx(detail::AmxMode::kOff)),
        vnni(detail::set_avx2_vnni(v.vnni)) {
    EXPECT_TRUE(set_active_tier(v.tier).has_value());
  }
  ~Scope() {
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

std::vector<Variant> variants() {
  std::vector<Variant> v{{Tier::kReference, true, "reference"}};
  if (tier_supported(Tier::kAvx512)) {
    v.push_back({Tier::kAvx512, true, "avx512"});
    v.push_back({Tier::kAvx512, false, "avx512-nogfni"});
  }
  if (tier_supported(Tier::kAvx2)) {
    v.push_back({Tier::kAvx2, true, "avx2"});
    // What AVX2-only CPUs run (the AVX2 tier packs tile16 there); on a CPU
    // without AVX-VNNI "avx2" is this already.
    if (core::cpu_features().avx_vnni) v.push_back({Tier::kAvx2, true, "avx2-novnni", false});
  }
  for (Tier t : {Tier::kNeon, Tier::kNeonDotprod, Tier::kNeonI8mm})
    if (tier_supported(t)) v.push_back({t, true, std::string(tier_name(t))});
  return v;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Packing, NameAndChoice) {
  EXPECT_EQ(packing_name(Packing::kNone), "none");
  EXPECT_EQ(packing_name(Packing::kAvx512RowQuad), "avx512-row-quad");
  EXPECT_EQ(packing_name(Packing::kTile16), "tile16");
  EXPECT_EQ(packing_name(Packing::kAvx2Tile16), "avx2-tile16");
  auto q1 = testing::random_matrix(Format::kQ1_0, 8, 256, 1);         // 2 units: padded to a pair of groups (4x)
  auto q1w = testing::random_matrix(Format::kQ1_0, 8, 1024, 1);       // 8 rows: a tile of 16 would double them
  auto q1t = testing::random_matrix(Format::kQ1_0, 32, 2048, 1);      // tile16: two whole tiles
  auto q1long = testing::random_matrix(Format::kQ1_0, 32, 4096, 1);   // past kTileMaxUnits: row quads, avx2-tile16
  auto q1huge = testing::random_matrix(Format::kQ1_0, 16, 13312, 1);  // past kAvx2TileMaxUnits too: row quads
  // 97 units: past kAvx2TileMaxUnits, and row quads would pad them to 104
  // (7% > 1/32), so no tier packs it (this case once expected row quads:
  // written on AVX2 machines, it failed on every AVX-512 one; issue 27).
  auto q1huge_odd = testing::random_matrix(Format::kQ1_0, 16, 12416, 1);
  auto q2w = testing::random_matrix(Format::kQ2_0, 12, 2048, 1);
  // g128 layouts: packed with their one scale per 128 weights (blocks of
  // four groups), the stored bytes exactly at 2048 columns; 640 columns (10
  // units: 3 groups in a block of 4) would add 1/3, so not packed.
  auto g128 = testing::random_matrix(Format::kQ2_0G128Qs, 12, 2048, 1);
  auto g128d = testing::random_matrix(Format::kQ2_0G128D, 12, 2048, 1);
  auto g128odd = testing::random_matrix(Format::kQ2_0G128D, 12, 640, 1);
  auto f32 = testing::random_matrix(Format::kF32, 8, 256, 1);
  auto q8 = testing::random_matrix(Format::kQ8_0, 8, 256, 1);
  for (const Variant& v : variants()) {
    Scope s(v);
    const bool want = v.tier == Tier::kAvx512;  // AMX is off in the scope
    EXPECT_EQ(packing_for(q1w.view), want ? Packing::kAvx512RowQuad : Packing::kNone) << v.label;
    // tile16: the AVX-512 tier with VBMI (off in the nogfni variant); avx2-tile16: the AVX2 tier without AVX-VNNI.
    const bool tile16 = want && detail::avx512_vbmi_in_use();
    const bool avx2_tile16 = v.tier == Tier::kAvx2 && !(v.vnni && core::cpu_features().avx_vnni);
    EXPECT_EQ(packing_for(q1t.view), tile16        ? Packing::kTile16
                                     : avx2_tile16 ? Packing::kAvx2Tile16
                                     : want        ? Packing::kAvx512RowQuad
                                                   : Packing::kNone)
        << v.label;
    EXPECT_EQ(packing_for(q1long.view), avx2_tile16 ? Packing::kAvx2Tile16
                                        : want      ? Packing::kAvx512RowQuad
                                                    : Packing::kNone)
        << v.label;
    EXPECT_EQ(packing_for(q1huge.view), want ? Packing::kAvx512RowQuad : Packing::kNone) << v.label;
    EXPECT_EQ(packing_for(q1huge_odd.view), Packing::kNone) << v.label;
    EXPECT_EQ(packing_for(q2w.view), want ? Packing::kAvx512RowQuad : Packing::kNone) << v.label;
    EXPECT_EQ(packing_for(q1.view), Packing::kNone) << v.label << ": padding would cost more than 1/32";
    EXPECT_EQ(packing_for(g128.view), want ? Packing::kAvx512RowQuad : Packing::kNone) << v.label;
    EXPECT_EQ(packing_for(g128d.view), want ? Packing::kAvx512RowQuad : Packing::kNone) << v.label;
    EXPECT_EQ(packing_for(g128odd.view), Packing::kNone) << v.label;
    EXPECT_EQ(packing_for(f32.view), Packing::kNone) << v.label;
    EXPECT_EQ(packing_for(q8.view), Packing::kNone) << v.label;
  }
  // Sizes: the stored bytes plus the padding of rows to quads, units to groups, groups to pairs.
  EXPECT_EQ(packed_bytes(q1.view, Packing::kNone), 0u);
  EXPECT_EQ(packed_bytes(q1.view, Packing::kAvx512RowQuad), 2 * detail::kPackPairBytes);  // 2 quads x 1 pair
  auto big = testing::random_matrix(Format::kQ1_0, 6144, 2048, 2);
  EXPECT_EQ(packed_bytes(big.view, Packing::kAvx512RowQuad), 6144u * row_bytes(Format::kQ1_0, 2048));
  EXPECT_EQ(packed_bytes(g128.view, Packing::kAvx512RowQuad), 12u * row_bytes(Format::kQ2_0G128Qs, 2048));
  EXPECT_EQ(packed_bytes(g128odd.view, Packing::kAvx512RowQuad), 3 * detail::kPackG128BlockBytes);  // 3 quads x 1 block
  // tile16: rows to tiles of 16, units to even; only rows of <= kTileMaxUnits units.
  EXPECT_EQ(packed_bytes(q1t.view, Packing::kTile16), 32u * row_bytes(Format::kQ1_0, 2048));
  auto q1odd = testing::random_matrix(Format::kQ1_0, 17, 384, 1);  // 2 tiles x 2 pairs (3 units + 1 zero unit)
  EXPECT_EQ(packed_bytes(q1odd.view, Packing::kTile16), 2 * 2 * detail::kTilePairBytes);
  EXPECT_EQ(packed_bytes(q1long.view, Packing::kTile16), 0u);
  EXPECT_EQ(packed_bytes(q2w.view, Packing::kTile16), 0u);
  // avx2-tile16: the same sizes (other byte orders), for rows of up to kAvx2TileMaxUnits units.
  for (const auto* m : {&q1t, &q1odd, &q2w})
    EXPECT_EQ(packed_bytes(m->view, Packing::kAvx2Tile16), packed_bytes(m->view, Packing::kTile16));
  EXPECT_EQ(packed_bytes(q1long.view, Packing::kAvx2Tile16), 32u * row_bytes(Format::kQ1_0, 4096));
  EXPECT_EQ(packed_bytes(q1huge.view, Packing::kAvx2Tile16), 0u);
  EXPECT_EQ(packed_bytes(q1huge.view, Packing::kAvx512RowQuad), 16u * row_bytes(Format::kQ1_0, 13312));
  EXPECT_EQ(packed_bytes(q1huge_odd.view, Packing::kAvx512RowQuad), 4u * 13 * detail::kPackPairBytes);  // 104 units
}

// The AVX-512 tier packs whatever AMX mode is set unless AMX would really
// read the stored layout (kOn on a CPU and OS that allow AMX, or kAuto where
// kAmxMeasured shows a win, which today is nowhere): so on an AMX machine
// the default run packs, as every other AVX-512 machine does (issue 27).
TEST(Packing, FollowsAmxMode) {
  if (!tier_supported(Tier::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  auto m = testing::random_matrix(Format::kQ1_0, 8, 1024, 1);
  const Tier tier = active_tier();
  ASSERT_TRUE(set_active_tier(Tier::kAvx512).has_value());
  const detail::AmxMode prev = detail::set_avx512_amx(detail::AmxMode::kAuto);
  EXPECT_FALSE(detail::avx512_amx_in_use()) << "kAmxMeasured has a win: update this test and the docs";
  EXPECT_EQ(packing_for(m.view), Packing::kAvx512RowQuad);
  detail::set_avx512_amx(detail::AmxMode::kOff);
  EXPECT_EQ(packing_for(m.view), Packing::kAvx512RowQuad);
  detail::set_avx512_amx(detail::AmxMode::kOn);
  EXPECT_EQ(detail::avx512_amx_in_use(), detail::amx_usable());
  EXPECT_EQ(packing_for(m.view), detail::amx_usable() ? Packing::kNone : Packing::kAvx512RowQuad);
  detail::set_avx512_amx(prev);
  (void)set_active_tier(tier);
}

// kAmxMeasured's rule: the entry with the largest measured N <= n decides.
TEST(Packing, AmxChoiceFromMeasurements) {
  EXPECT_FALSE(detail::amx_wins(1));
  EXPECT_FALSE(detail::amx_wins(detail::kAmxMinCols - 1));
  for (const detail::AmxMeasure& m : detail::kAmxMeasured) {
    EXPECT_EQ(detail::amx_wins(m.n), m.amx_us < m.vnni_us) << m.n;
    EXPECT_GT(m.amx_us, 0);
    EXPECT_GT(m.vnni_us, 0);
  }
  // Today's table (issue 27's Xeon): AMX lost everywhere.
  for (int64_t n : {6, 8, 15, 16, 100, 512, 4096}) EXPECT_FALSE(detail::amx_wins(n)) << n;
}

// The avx2-tile16 layout holds the tile16 bytes in its own orders
// (internal.h): byte j of row r's dword of W(u, k) at 16 j + position(r),
// scale of row r at kAvx2TileScaleRow's position of r; padding the same.
TEST(Packing, Avx2Tile16IsTile16Reordered) {
  auto m = testing::random_matrix(Format::kQ1_0, 21, 640, 8);  // 2 tiles (the second 5 rows), 5 units (+ 1 zero unit)
  const Packed t = pack(m.view, nullptr, Packing::kTile16);
  const Packed a = pack(m.view, nullptr, Packing::kAvx2Tile16);
  const size_t n = packed_bytes(m.view, Packing::kTile16);
  ASSERT_EQ(n, 2u * 3u * detail::kTilePairBytes);
  int pos[16], spos[16];
  for (int p = 0; p < 16; ++p) {
    pos[detail::kAvx2TilePosRow[p]] = p;
    spos[detail::kAvx2TileScaleRow[p]] = p;
  }
  for (size_t tile = 0; tile < 2; ++tile) {
    for (size_t pair = 0; pair < 3; ++pair) {
      const size_t base = (tile * 3 + pair) * detail::kTilePairBytes;
      for (size_t h = 0; h < 2; ++h) {
        for (int r = 0; r < 16; ++r) {
          const size_t ts = base + 32 * h + 2 * static_cast<size_t>(r), as = base + 32 * h + 2 * spos[r];
          ASSERT_EQ(std::memcmp(t.buf.get() + ts, a.buf.get() + as, 2), 0)
              << tile << " " << pair << " " << h << " " << r;
          for (size_t k = 0; k < 4; ++k) {
            for (size_t j = 0; j < 4; ++j) {
              const size_t w = base + 64 + h * detail::kTileUnitBytes + 64 * k;
              ASSERT_EQ(t.buf[w + 4 * static_cast<size_t>(r) + j], a.buf[w + 16 * j + static_cast<size_t>(pos[r])])
                  << "tile " << tile << " pair " << pair << " unit " << h << " row " << r << " k " << k << " j " << j;
            }
          }
        }
      }
    }
  }
}

// The tiers that own a layout really read the packed copy (AVX-512 both,
// AVX2 avx2-tile16), and every other tier the stored bytes: with the packed copy
// zeroed (zero scales) their product is exactly 0, the others are unchanged.
TEST(Packing, OnlyTheOwningTierReadsThePackedCopy) {
  auto m = testing::random_matrix(Format::kQ1_0, 12, 512, 3);
  const auto x = testing::random_batch(70, 512, 5);
  for (Packing packing : packings(Format::kQ1_0, 512)) {
    Packed p = pack(m.view, nullptr, packing);
    std::memset(p.buf.get(), 0, packed_bytes(m.view, packing));
    for (const Variant& v : variants()) {
      Scope scope(v);
      for (int64_t n : {1, 3, 70}) {  // (tile16: one and two column groups)
        std::vector<float> want(static_cast<size_t>(12 * n)), got(want.size());
        gemm(m.view, x.data(), n, want.data(), nullptr);
        gemm(p.view, x.data(), n, got.data(), nullptr);
        // (The AVX-512 tier reads its row quads and tile16, the AVX2 tier avx2-tile16.)
        if ((v.tier == Tier::kAvx512 && packing != Packing::kAvx2Tile16) ||
            (v.tier == Tier::kAvx2 && packing == Packing::kAvx2Tile16)) {
          EXPECT_EQ(got, std::vector<float>(want.size(), 0.0f))
              << v.label << " " << packing_name(packing) << " n=" << n;
        } else {
          EXPECT_TRUE(same(want, got)) << v.label << " " << packing_name(packing) << " n=" << n;
        }
      }
    }
  }
}

TEST(Packing, BitIdenticalOnEveryPath) {
  core::ThreadPool pool2(2);
  struct Shape {
    int64_t rows, cols, max_n;
  };
  // Units per row (Q1_0 / Q2_0 g64): 1/2, 2/4, 3/6, 5/10, 16/32, 48/96,
  // 15/30, 17/34 (avx2-tile16 past 2,048 columns: tables past L1, fewer
  // columns per table group, lut_group_cols: 6,144 -> 21, so 65 is 4 groups;
  // 12,288 (96 units, the layout's limit) -> 10, so 17 is 2).
  const Shape shapes[] = {{67, 128, 512}, {130, 256, 64}, {33, 384, 512}, {9, 640, 17},   {70, 2048, 65},
                          {21, 6144, 65}, {48, 1920, 17}, {19, 2176, 65}, {17, 12288, 17}};
  const int64_t ns[] = {1, 2, 3, 8, 17, 64, 65, 512};
  for (const Variant& v : variants()) {
    Scope scope(v);
    for (Format f : kPackFormats) {
      for (const Shape& s : shapes) {
        for (Packing packing : packings(f, s.cols)) {
          auto m = testing::random_matrix(f, s.rows, s.cols, 5 + static_cast<uint32_t>(s.rows * 7 + s.cols));
          const Packed p = pack(m.view, &pool2, packing);
          {  // the packing does not depend on the thread count
            const Packed p1 = pack(m.view, nullptr, packing);
            ASSERT_EQ(std::memcmp(p.buf.get(), p1.buf.get(), packed_bytes(m.view, packing)), 0);
          }
          const auto x = testing::random_batch(s.max_n, s.cols, 300 + static_cast<uint32_t>(s.cols));
          const std::string where = v.label + " " + std::string(format_name(f)) + " " + std::to_string(s.rows) + "x" +
                                    std::to_string(s.cols) + " " + std::string(packing_name(packing));
          for (int64_t n : ns) {
            if (n > s.max_n) continue;
            std::vector<float> want(static_cast<size_t>(n * s.rows)), got(want.size());
            gemm(m.view, x.data(), n, want.data(), nullptr);  // stored layout, one thread
            for (core::ThreadPool* tp : {static_cast<core::ThreadPool*>(nullptr), &pool2}) {
              std::fill(got.begin(), got.end(), -1.0f);
              if (n == 1) {
                gemv(p.view, x.data(), got.data(), tp);
              } else {
                gemm(p.view, x.data(), n, got.data(), tp);
              }
              ASSERT_TRUE(same(want, got)) << where << " n=" << n << (tp ? " 2 threads" : " 1 thread");
            }
            // Row ranges that start and end inside quads.
            std::fill(got.begin(), got.end(), -1.0f);
            const int64_t cut1 = s.rows / 3, cut2 = cut1 + 1 + s.rows / 5 < s.rows ? cut1 + 1 + s.rows / 5 : s.rows;
            gemm_rows(v.tier, p.view, x.data(), n, got.data(), 0, cut1);
            gemm_rows(v.tier, p.view, x.data(), n, got.data(), cut1, cut2);
            gemm_rows(v.tier, p.view, x.data(), n, got.data(), cut2, s.rows);
            ASSERT_TRUE(same(want, got)) << where << " row split n=" << n;
          }
        }
      }
    }
  }
}

// gemm_multi over a packed and a stored matrix (one dispatch, chunks spanning both).
TEST(Packing, GemmMultiMixesPackedAndStored) {
  core::ThreadPool pool2(2);
  for (const Variant& v : variants()) {
    Scope scope(v);
    for (Format f : kPackFormats) {
      auto a = testing::random_matrix(f, 203, 512, 41);
      auto b = testing::random_matrix(f, 70, 512, 42);
      for (Packing packing : packings(f, 512)) {
        const Packed pa = pack(a.view, &pool2, packing);
        const Packed pb = pack(b.view, &pool2, packing);
        // Packed + stored, and both packed (tile16: the tables alone, no grouped layout).
        for (const MatrixView& second : {b.view, pb.view}) {
          const MatrixView ws[2] = {pa.view, second};
          for (int64_t n : {1, 2, 5, 16, 64, 65}) {
            const auto x = testing::random_batch(n, 512, 99 + static_cast<uint32_t>(n));
            std::vector<float> ya(static_cast<size_t>(n * 203)), yb(static_cast<size_t>(n * 70));
            std::vector<float> wa(ya.size()), wb(yb.size());
            float* ys[2] = {ya.data(), yb.data()};
            // A fresh scratch: a layout the product needs but skipped would
            // be read uninitialized, not left over from the references.
            ActScratch fresh;
            gemm_multi(ws, 2, x.data(), n, ys, &pool2, &fresh);
            gemm(a.view, x.data(), n, wa.data(), nullptr);
            gemm(b.view, x.data(), n, wb.data(), nullptr);
            const std::string where =
                v.label + " " + std::string(format_name(f)) + " " + std::string(packing_name(packing)) +
                (second.packed != nullptr ? " both packed" : " one packed") + " n=" + std::to_string(n);
            ASSERT_TRUE(same(ya, wa)) << where;
            ASSERT_TRUE(same(yb, wb)) << where;
          }
        }
      }
    }
  }
}

// PTQ1_0 is packed as its PQ2_0 twin's row quads (kernels.h "Load-time
// transcoding"), in slices of 1,024 rows: the AVX-512 tier chooses it (and
// no longer transcodes), the AVX2 tier still transcodes; every tier gives
// the stored PTQ1_0 matrix's bits (products, gemm_multi with a stored
// PTQ1_0 matrix, gemm_rows ranges that cut quads), 1 and 2 threads. 1,030
// rows: a slice boundary and a partial last quad.
TEST(Packing, Ptq1PackedAsItsPq2Twin) {
  core::ThreadPool pool2(2);
  const int64_t rows = 1030, cols = 2048;
  auto m = testing::random_matrix(Format::kPTQ1_0, rows, cols, 77);
  auto other = testing::random_matrix(Format::kPTQ1_0, 70, cols, 78);
  const MatrixView twin = detail::pq2_twin(m.view);
  EXPECT_EQ(twin.format, Format::kPQ2_0);
  EXPECT_EQ(twin.row_stride, row_bytes(Format::kPQ2_0, cols));
  EXPECT_EQ(packed_bytes(m.view, Packing::kAvx512RowQuad), packed_bytes(twin, Packing::kAvx512RowQuad));
  EXPECT_EQ(packed_bytes(m.view, Packing::kTile16), 0u);
  const Packed p = pack(m.view, &pool2);
  {
    const Packed p1 = pack(m.view, nullptr);
    ASSERT_EQ(std::memcmp(p.buf.get(), p1.buf.get(), packed_bytes(m.view, Packing::kAvx512RowQuad)), 0);
  }
  // The same bytes as packing a transcoded copy.
  {
    std::vector<uint8_t> pq(static_cast<size_t>(rows) * twin.row_stride);
    transcode_ptq1_0_to_pq2_0(m.view, pq.data(), &pool2);
    const MatrixView pqv{pq.data(), Format::kPQ2_0, rows, cols, twin.row_stride};
    const Packed pp = pack(pqv, nullptr);
    ASSERT_EQ(std::memcmp(p.buf.get(), pp.buf.get(), packed_bytes(pqv, Packing::kAvx512RowQuad)), 0);
  }
  const auto x = testing::random_batch(65, cols, 123);
  for (const Variant& v : variants()) {
    Scope scope(v);
    const bool avx512 = v.tier == Tier::kAvx512;
    EXPECT_EQ(packing_for(m.view), avx512 ? Packing::kAvx512RowQuad : Packing::kNone) << v.label;
    const Format target = avx512 || v.tier == Tier::kReference || v.tier == Tier::kNeon ||
                                  v.tier == Tier::kNeonDotprod || v.tier == Tier::kNeonI8mm
                              ? Format::kPTQ1_0
                              : Format::kPQ2_0;
    EXPECT_EQ(transcode_target(m.view), target) << v.label;
    for (int64_t n : {1, 2, 5, 17, 65}) {
      const std::string where = v.label + " n=" + std::to_string(n);
      std::vector<float> want(static_cast<size_t>(n * rows)), got(want.size());
      gemm(m.view, x.data(), n, want.data(), nullptr);  // the stored PTQ1_0 bytes
      for (core::ThreadPool* tp : {static_cast<core::ThreadPool*>(nullptr), &pool2}) {
        std::fill(got.begin(), got.end(), -1.0f);
        gemm(p.view, x.data(), n, got.data(), tp);
        ASSERT_TRUE(same(want, got)) << where << (tp ? " 2 threads" : " 1 thread");
      }
      std::fill(got.begin(), got.end(), -1.0f);
      gemm_rows(v.tier, p.view, x.data(), n, got.data(), 0, 333);
      gemm_rows(v.tier, p.view, x.data(), n, got.data(), 333, 1029);
      gemm_rows(v.tier, p.view, x.data(), n, got.data(), 1029, rows);
      ASSERT_TRUE(same(want, got)) << where << " row split";
      // One dispatch over the packed matrix and a stored one.
      std::vector<float> ya(want.size()), yb(static_cast<size_t>(n * 70)), wb(yb.size());
      float* ys[2] = {ya.data(), yb.data()};
      const MatrixView ws[2] = {p.view, other.view};
      ActScratch fresh;
      gemm_multi(ws, 2, x.data(), n, ys, &pool2, &fresh);
      gemm(other.view, x.data(), n, wb.data(), nullptr);
      ASSERT_TRUE(same(want, ya)) << where << " gemm_multi";
      ASSERT_TRUE(same(wb, yb)) << where << " gemm_multi stored";
    }
  }
}

// tile16's lookup tables are built per thread from the prepared activations
// and reused until the next prepare: products with other activations (or
// other columns counts) in any order, on one scratch and on the calling
// thread's, never see stale tables.
// A NaN activation quantizes to -128 (outside the canonical +-127; NaN
// inputs are not bit-identical across tiers, reference.cpp), which a tier's
// lookup tables must still sum exactly: per tier, the packed product equals
// the stored one bit for bit, and the block's other rows stay finite.
TEST(Packing, Tile16LookupsAreExactForQuantMinus128) {
  auto m = testing::random_matrix(Format::kQ1_0, 40, 512, 21);
  auto x = testing::random_batch(3, 512, 22);
  // A whole group of 4 (elements 4g .. 4g + 3) at -128: its signed sums reach +-512.
  for (int64_t j = 0; j < 3; ++j)
    for (int64_t e = 0; e < 4; ++e) x[static_cast<size_t>(j * 512 + 36 + 32 * j + e)] = std::nanf("");
  std::vector<float> want(3 * 40), got(want.size());
  for (const Variant& v : variants()) {
    Scope scope(v);
    for (int64_t n : {1, 3}) {
      gemm(m.view, x.data(), n, want.data(), nullptr);
      for (Packing packing : {Packing::kTile16, Packing::kAvx2Tile16}) {
        const Packed p = pack(m.view, nullptr, packing);
        std::fill(got.begin(), got.end(), -1.0f);
        gemm(p.view, x.data(), n, got.data(), nullptr);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), static_cast<size_t>(n * 40) * sizeof(float)), 0)
            << v.label << " " << packing_name(packing) << " n=" << n << ": " << got[0] << " vs " << want[0];
      }
      EXPECT_TRUE(std::isfinite(want[0]))
          << v.label << " n=" << n << ": the NaN reached the output (" << want[0] << "), so -128 was not exercised";
    }
  }
}

// One matrix, two inputs, a sequence of products with and without a pool
// and scratch: each equals the stored layout's result for its input.
void tables_follow_every_prepare(Packing packing) {
  core::ThreadPool pool2(2);
  auto m = testing::random_matrix(Format::kQ1_0, 96, 1024, 7);
  const Packed p = pack(m.view, &pool2, packing);
  const auto x1 = testing::random_batch(3, 1024, 11), x2 = testing::random_batch(3, 1024, 12);
  std::vector<float> w1(3 * 96), w2(3 * 96), got(3 * 96);
  gemm(m.view, x1.data(), 3, w1.data(), nullptr);
  gemm(m.view, x2.data(), 3, w2.data(), nullptr);
  ActScratch scratch;
  struct Step {
    const std::vector<float>* x;
    const std::vector<float>* want;
    int64_t n;
    core::ThreadPool* pool;
    ActScratch* scratch;
  };
  const Step steps[] = {{&x1, &w1, 3, &pool2, &scratch}, {&x2, &w2, 3, &pool2, &scratch},
                        {&x1, &w1, 1, nullptr, nullptr}, {&x2, &w2, 1, nullptr, &scratch},
                        {&x2, &w2, 2, &pool2, nullptr},  {&x1, &w1, 3, nullptr, &scratch},
                        {&x1, &w1, 3, &pool2, &scratch}};
  for (size_t i = 0; i < std::size(steps); ++i) {
    const Step& st = steps[i];
    std::fill(got.begin(), got.end(), -1.0f);
    gemm(p.view, st.x->data(), st.n, got.data(), st.pool, st.scratch);
    ASSERT_EQ(std::memcmp(got.data(), st.want->data(), static_cast<size_t>(st.n * 96) * sizeof(float)), 0)
        << "step " << i;
  }
}

// Each tier's per-thread tables (kept per prepare and column group) follow
// every new prepare: the AVX-512 tier with VBMI and the AVX2 tier.
TEST(Packing, Tile16TablesFollowEveryPrepare) {
  std::vector<std::pair<Variant, Packing>> tiers;
  if (tier_supported(Tier::kAvx512) && detail::avx512_vbmi_in_use())
    tiers.push_back({{Tier::kAvx512, true, "avx512"}, Packing::kTile16});
  if (tier_supported(Tier::kAvx2)) tiers.push_back({{Tier::kAvx2, true, "avx2-novnni", false}, Packing::kAvx2Tile16});
  if (tiers.empty()) GTEST_SKIP() << "no tier reads a lookup layout here";
  for (const auto& [v, packing] : tiers) {
    SCOPED_TRACE(v.label);
    Scope scope(v);
    tables_follow_every_prepare(packing);
  }
}

}  // namespace
}  // namespace bonsai::kernels
