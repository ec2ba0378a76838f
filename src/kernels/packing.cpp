// Load-time repacked weight layouts (kernels.h Packing; internal.h "Packed
// row-quad layout" and "Packed tile16 layout"): which packing a matrix
// gets, its size, and the packing itself. Portable code (no ISA flags; SSE2, x86-64's baseline, where the target has
// it): packing is byte moves.
#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/thread_pool.h"
#include "kernels/formats.h"
#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace bonsai::kernels {

namespace {

// Formats with the grouped kernels' units (Q1_0, the Q2_0 layouts): the
// row-quad layout is defined for them.
bool has_units(Format f) { return unit_elems(f) != 0; }

// Weight units of the grouped kernel per row: Q1_0 blocks, or 64-weight Q2_0 units.
int64_t rq_units(const MatrixView& w) { return w.cols / unit_elems(w.format); }
int64_t rq_groups(const MatrixView& w) { return (rq_units(w) + 3) / 4; }
// Two units per block (the g128 layouts): one fp16 per two units.
bool shares_d(Format f) { return units_per_block(f) == 2; }
// Groups per block (K) and block bytes of w's layout (internal.h).
int64_t rq_block_groups(const MatrixView& w) { return shares_d(w.format) ? 4 : 2; }
size_t rq_block_bytes(const MatrixView& w) {
  return shares_d(w.format) ? detail::kPackG128BlockBytes : detail::kPackPairBytes;
}
size_t rq_quad_bytes(const MatrixView& w) {
  const int64_t k = rq_block_groups(w);
  return static_cast<size_t>((rq_groups(w) + k - 1) / k) * rq_block_bytes(w);
}

// Quads [q0, q1) of w in the row-quad layout.
template <Format F>
void pack_row_quads_of(const MatrixView& w, uint8_t* dst, int64_t q0, int64_t q1) {
  const int64_t units = rq_units(w), groups = rq_groups(w);
  const size_t qb = rq_quad_bytes(w);
  const bool g128 = shares_d(w.format);
  constexpr bool code3_is_zero = kDef<F>.code3_is_zero;
  const int64_t k = rq_block_groups(w);
  const size_t bb = rq_block_bytes(w);
  const size_t sb = g128 ? detail::kPackG128SBytes : detail::kPackSBytes;  // S bytes per group
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t q = q0; q < q1; ++q) {
    uint8_t* quad = dst + static_cast<size_t>(q) * qb;
    std::memset(quad, 0, qb);
    for (int64_t i = 0; i < 4 && 4 * q + i < w.rows; ++i) {
      const uint8_t* row = src + static_cast<size_t>(4 * q + i) * w.row_stride;
      for (int64_t g = 0; g < groups; ++g) {
        uint8_t* blk = quad + static_cast<size_t>(g / k) * bb;
        uint8_t* qd = blk + static_cast<size_t>(g % k) * detail::kPackQBytes + static_cast<size_t>(i) * 64;
        uint8_t* sd = blk + static_cast<size_t>(k) * detail::kPackQBytes + static_cast<size_t>(g % k) * sb +
                      static_cast<size_t>(i) * (sb / 4);
        for (int64_t u = 0; u < 4 && 4 * g + u < units; ++u) {
          const int64_t t = 4 * g + u;
          std::memcpy(qd + 16 * u, row + UnitGeo<F>::unit_qs(t), 16);
          // g128: one fp16 per 128-weight block (units 2h, 2h + 1 share it).
          if (!g128 || u % 2 == 0) std::memcpy(sd + 2 * (g128 ? u / 2 : u), row + UnitGeo<F>::unit_d(t), 2);
          if constexpr (code3_is_zero) {
            // Code 3 means 0 in the g128 layouts, as code 1 does: store 1, so
            // the kernel treats every Q2_0 layout as g64 (whose 3 is +2).
            for (int k = 0; k < 16; ++k) {
              const uint8_t b = qd[16 * u + k];
              qd[16 * u + k] = static_cast<uint8_t>(b & ~((b << 1) & 0xAA));
            }
          }
        }
      }
    }
  }
}

// The quads of w's format (offsets known at compile time: the byte copies
// inline; a table lookup per unit was ~2% of a 27B model's load profile).
void pack_row_quads(const MatrixView& w, uint8_t* dst, int64_t q0, int64_t q1) {
  visit_format(w.format, [&](auto fc) {
    if constexpr (kHasUnits<fc.value>) pack_row_quads_of<fc.value>(w, dst, q0, q1);
  });
}

// Whether layout p (tile16 or avx2-tile16) is defined for w: Q1_0 rows of
// at most kTileMaxUnits (tile16) or kAvx2TileMaxUnits units.
bool tile16_defined(const MatrixView& w, Packing p) {
  return w.format == Format::kQ1_0 &&
         w.cols / 128 <= (p == Packing::kAvx2Tile16 ? detail::kAvx2TileMaxUnits : detail::kTileMaxUnits);
}

// fn(i0, i1) over [0, count) on `pool` (grain: the smallest piece), or on
// the calling thread without one.
template <class F>
void split(core::ThreadPool* pool, int64_t count, int64_t grain, F fn) {
  if (pool == nullptr || pool->size() <= 1) {
    fn(int64_t{0}, count);
    return;
  }
  pool->parallel_for(count, std::move(fn), grain);
}

// Unit pairs per row and bytes per 16-row tile of the tile16 layout (Q1_0).
int64_t tile_pairs(const MatrixView& w) { return (w.cols / 128 + 1) / 2; }
size_t tile_bytes(const MatrixView& w) { return static_cast<size_t>(tile_pairs(w)) * detail::kTilePairBytes; }

// The inverse of a permutation of the 16 rows of a tile (row -> position).
constexpr std::array<int, 16> inverse16(const int (&pos_row)[16]) {
  std::array<int, 16> row_pos{};
  for (int p = 0; p < 16; ++p) row_pos[static_cast<size_t>(pos_row[p])] = p;
  return row_pos;
}

// out[16 i + p] = a[p][i] (i, p = 0..15): the 16 x 16 byte transpose that
// makes an avx2-tile16 unit (internal.h) byte-major, a[p] holding the 16
// packed bytes of the row at position p. SSE2 (x86-64's baseline) where
// available: the bytes 16 at a time, 64 unpacks (the scalar loop made
// repacking ~5x slower than tile16's, over issue 8's 0.5 s per GB).
void transpose16(const uint8_t (&a)[16][16], uint8_t* out) {
#if defined(__SSE2__)
  __m128i t[16], u[16];
  // t[i] / t[8 + i]: bytes 0..7 / 8..15 of positions 2i, 2i + 1, interleaved.
  for (int i = 0; i < 8; ++i) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[2 * i]));
    const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[2 * i + 1]));
    t[i] = _mm_unpacklo_epi8(x, y);
    t[8 + i] = _mm_unpackhi_epi8(x, y);
  }
  // u[8h + 2i + g]: bytes 8h + 4g .. + 3 of positions 4i .. 4i + 3.
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 4; ++i) {
      u[8 * h + 2 * i] = _mm_unpacklo_epi16(t[8 * h + 2 * i], t[8 * h + 2 * i + 1]);
      u[8 * h + 2 * i + 1] = _mm_unpackhi_epi16(t[8 * h + 2 * i], t[8 * h + 2 * i + 1]);
    }
  }
  // Bytes 4c .. 4c + 3 (c = 2h + g) of positions 8m .. 8m + 7 (lo: 4c, 4c + 1;
  // hi: 4c + 2, 4c + 3), then the two halves of the positions joined.
  for (int c = 0; c < 4; ++c) {
    const int h = c / 2, g = c % 2;
    __m128i lo[2], hi[2];
    for (int m = 0; m < 2; ++m) {
      const __m128i x = u[8 * h + 4 * m + g], y = u[8 * h + 4 * m + 2 + g];
      lo[m] = _mm_unpacklo_epi32(x, y);
      hi[m] = _mm_unpackhi_epi32(x, y);
    }
    auto* o = reinterpret_cast<__m128i*>(out + 64 * c);
    _mm_storeu_si128(o + 0, _mm_unpacklo_epi64(lo[0], lo[1]));
    _mm_storeu_si128(o + 1, _mm_unpackhi_epi64(lo[0], lo[1]));
    _mm_storeu_si128(o + 2, _mm_unpacklo_epi64(hi[0], hi[1]));
    _mm_storeu_si128(o + 3, _mm_unpackhi_epi64(hi[0], hi[1]));
  }
#else
  for (int i = 0; i < 16; ++i)
    for (int p = 0; p < 16; ++p) out[16 * i + p] = a[p][i];
#endif
}

// Tiles [t0, t1) of Q1_0 matrix w in the tile16 layout, or with `avx2` its
// avx2-tile16 variant (internal.h: byte-major vectors, rows in
// kAvx2TilePosRow order; scales in kAvx2TileScaleRow order).
void pack_tiles(const MatrixView& w, uint8_t* dst, int64_t t0, int64_t t1, bool avx2) {
  static constexpr std::array<int, 16> kScalePos = inverse16(detail::kAvx2TileScaleRow);
  const int64_t units = w.cols / 128;
  const size_t tb = tile_bytes(w);
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t t = t0; t < t1; ++t) {
    uint8_t* tile = dst + static_cast<size_t>(t) * tb;
    const int64_t nr = std::min(detail::kTileRows, w.rows - t * detail::kTileRows);
    // The loop below writes every byte of a whole tile with an even unit
    // count; only padding (rows past the matrix, the zero unit) needs zeros.
    if (nr < detail::kTileRows || units % 2 != 0) std::memset(tile, 0, tb);
    const uint8_t* rows = src + static_cast<size_t>(t * detail::kTileRows) * w.row_stride;
    for (int64_t u = 0; u < units; ++u) {
      uint8_t* pair = tile + static_cast<size_t>(u / 2) * detail::kTilePairBytes;
      uint8_t* wu = pair + 64 + static_cast<size_t>(u % 2) * detail::kTileUnitBytes;
      uint8_t* sc = pair + 32 * (u % 2);
      if (avx2) {
        uint8_t a[16][16] = {};  // the rows' packed bytes by position (zero rows past the matrix)
        for (int p = 0; p < 16; ++p) {
          const int64_t r = detail::kAvx2TilePosRow[p];
          if (r < nr) std::memcpy(a[p], rows + static_cast<size_t>(r) * w.row_stride + 18 * u + 2, 16);
        }
        transpose16(a, wu);
        for (int64_t r = 0; r < nr; ++r)
          std::memcpy(sc + 2 * kScalePos[static_cast<size_t>(r)], rows + static_cast<size_t>(r) * w.row_stride + 18 * u,
                      2);
        continue;
      }
      for (int64_t r = 0; r < nr; ++r) {
        const uint8_t* blk = rows + static_cast<size_t>(r) * w.row_stride + 18 * u;
        std::memcpy(sc + 2 * r, blk, 2);  // fp16 d
        for (int k = 0; k < 4; ++k) std::memcpy(wu + 64 * k + 4 * r, blk + 2 + 4 * k, 4);
      }
    }
  }
}

}  // namespace

std::string_view packing_name(Packing p) {
  switch (p) {
    case Packing::kNone:
      return "none";
    case Packing::kAvx512RowQuad:
      return "avx512-row-quad";
    case Packing::kTile16:
      return "tile16";
    case Packing::kAvx2Tile16:
      return "avx2-tile16";
  }
  return "?";
}

MatrixView detail::pq2_twin(const MatrixView& w) {
  MatrixView t = w;
  t.format = Format::kPQ2_0;
  t.row_stride = row_bytes(Format::kPQ2_0, w.cols);
  return t;
}

Packing packing_for(const MatrixView& w) {
  if (w.format == Format::kPTQ1_0) {
    // Packed as its PQ2_0 twin (see kernels.h "Load-time transcoding"), in
    // the one layout the twin can get, row quads (so only on the AVX-512
    // tier): the checks and padding rule are the twin's, its 34/28 of the
    // file being the transcoding's known cost.
    return packing_for(detail::pq2_twin(w)) == Packing::kAvx512RowQuad ? Packing::kAvx512RowQuad : Packing::kNone;
  }
  if (!has_units(w.format) || w.rows <= 0 || w.cols <= 0 || w.data == nullptr) return Packing::kNone;
  const Tier tier = active_tier();
  if (tier != Tier::kAvx512 && tier != Tier::kAvx2) return Packing::kNone;
  if (tier == Tier::kAvx512 && detail::avx512_amx_in_use()) return Packing::kNone;
  // Resident memory must stay about the file size: no packing where padding
  // (rows to quads, units to groups, groups to pairs) would add more than
  // 1/32 of the tensor. The Bonsai shapes (2048 .. 12288 columns) of every
  // layout pad nothing (g128 keeps its one scale per 128 weights, in blocks
  // of four groups); e.g. 384 columns of Q1_0 (3 units in a pair of 8)
  // would take 2.7x, so those stay zero-copy.
  // Q1_0 rows of up to 2,048 columns with VBMI: the tile16 layout (the
  // table-lookup kernel; avx512_tile.inc), under the same padding rule
  // (rows to 16, units to even); else row quads.
  const size_t stored = static_cast<size_t>(w.rows) * row_bytes(w.format, w.cols);
  const auto fits = [&](Packing p) { return packed_bytes(w, p) <= stored + stored / 32; };
  // The AVX2 tier without AVX-VNNI (Zen 2/3, Haswell..Comet Lake) reads
  // avx2-tile16 (its VPSHUFB lookup kernel, avx2_tile.inc), Q1_0 rows of
  // up to 12,288 columns: on Zen 3, 2 threads, from DRAM, 1.07-1.53x its
  // PMADDUBSW kernel per product (2048..151936 rows, 2048..12288 columns,
  // N = 1..16); the 1.7B's pp512 1.28-1.40x and the 8B's tg32 1.40-1.45x
  // the tile16 build before it (bench/results/tile16-avx2-2026-12-03-zen3.txt
  // section 5; tile16 itself was 1.11-1.41x on Zen 5 with AVX-VNNI switched
  // off; on Intel cores before Ice Lake, with one shuffle port, the
  // operation counts predict parity, not measured). With AVX-VNNI (Alder
  // Lake and later) the pair kernel was as fast as tile16, so there every
  // matrix stays zero-copy.
  if (tier == Tier::kAvx2) {
    return !detail::avx2_vnni_in_use() && tile16_defined(w, Packing::kAvx2Tile16) && fits(Packing::kAvx2Tile16)
               ? Packing::kAvx2Tile16
               : Packing::kNone;
  }
  if (tile16_defined(w, Packing::kTile16) && detail::avx512_vbmi_in_use() && fits(Packing::kTile16)) {
    return Packing::kTile16;
  }
  return fits(Packing::kAvx512RowQuad) ? Packing::kAvx512RowQuad : Packing::kNone;
}

size_t packed_bytes(const MatrixView& w, Packing p) {
  if (w.format == Format::kPTQ1_0) return p == Packing::kAvx512RowQuad ? packed_bytes(detail::pq2_twin(w), p) : 0;
  switch (p) {
    case Packing::kNone:
      return 0;
    case Packing::kAvx512RowQuad:
      return static_cast<size_t>((w.rows + 3) / 4) * rq_quad_bytes(w);
    case Packing::kTile16:
    case Packing::kAvx2Tile16:
      return tile16_defined(w, p)
                 ? static_cast<size_t>((w.rows + detail::kTileRows - 1) / detail::kTileRows) * tile_bytes(w)
                 : 0;
  }
  return 0;
}

void pack_matrix(const MatrixView& w, Packing p, void* dst, core::ThreadPool* pool) {
  auto* out = static_cast<uint8_t*>(dst);
  if (w.format == Format::kPTQ1_0) {
    if (p != Packing::kAvx512RowQuad) return;
    // Each thread transcodes a few quads' rows at a time to PQ2_0 in its own
    // scratch, sized to stay in its core's L2 (<= kScratchBytes, at least
    // one quad: 64 rows of 5,120 columns are 85 KiB), and packs them into
    // their quads' place: one dispatch per matrix, and the PQ2_0 rows are
    // read back from L2, not memory. (Before: 1,024-row slices, each
    // transcoded and packed by its own dispatch over a scratch of up to
    // 4.7 MiB; 1.9-2.3 GB/s of PTQ1_0 input on 2 Zen 5 threads, now
    // bench/results/ptq1-load-2026-12-07-zen5.txt.)
    constexpr size_t kScratchBytes = size_t{512} << 10;
    const MatrixView twin = detail::pq2_twin(w);
    const size_t quad_bytes = rq_quad_bytes(twin);
    const int64_t slice_quads = std::clamp<int64_t>(static_cast<int64_t>(kScratchBytes / (4 * twin.row_stride)), 1, 16);
    const auto* in = static_cast<const uint8_t*>(w.data);
    split(pool, (w.rows + 3) / 4, slice_quads, [&](int64_t q0, int64_t q1) {
      thread_local std::vector<uint8_t> scratch;  // (kept: the next matrix reuses it)
      const size_t need = static_cast<size_t>(std::min<int64_t>(4 * slice_quads, w.rows)) * twin.row_stride;
      if (scratch.size() < need) scratch.resize(need);
      for (int64_t qa = q0; qa < q1; qa += slice_quads) {
        const int64_t r0 = 4 * qa, r1 = std::min(w.rows, 4 * std::min(q1, qa + slice_quads));
        const MatrixView src{in + static_cast<size_t>(r0) * w.row_stride, w.format, r1 - r0, w.cols, w.row_stride};
        transcode_ptq1_0_to_pq2_0(src, scratch.data(), nullptr);
        const MatrixView slice{scratch.data(), Format::kPQ2_0, r1 - r0, w.cols, twin.row_stride};
        pack_matrix(slice, p, out + static_cast<size_t>(qa) * quad_bytes, nullptr);
      }
    });
    return;
  }
  if (detail::is_lut_packing(p) && tile16_defined(w, p)) {
    const bool avx2 = p == Packing::kAvx2Tile16;
    split(pool, (w.rows + detail::kTileRows - 1) / detail::kTileRows, 4,
          [&w, out, avx2](int64_t t0, int64_t t1) { pack_tiles(w, out, t0, t1, avx2); });
  } else if (p == Packing::kAvx512RowQuad && has_units(w.format)) {
    split(pool, (w.rows + 3) / 4, 16, [&w, out](int64_t q0, int64_t q1) { pack_row_quads(w, out, q0, q1); });
  }
}

Format transcode_target(const MatrixView& w) {
  if (w.format != Format::kPTQ1_0 || w.data == nullptr) return w.format;
  if (packing_for(w) != Packing::kNone) return w.format;  // packed instead (pack_matrix)
  const Tier tier = active_tier();
  return tier == Tier::kAvx2 || tier == Tier::kAvx512 ? Format::kPQ2_0 : w.format;
}

void detail::transcode_ptq1_0_row_scalar(const uint8_t* src, uint8_t* dst, int64_t blocks) {
  // spread[b]: the five base-3 digits of byte b (most significant first, as
  // BlockPTQ1_0 reads them: ((uint8)(b * 3^n) * 3) >> 8), digit n in byte n
  // of the word. A digit t means t - 1, as PQ2_0's 2-bit code c means c - 1,
  // so a digit is its code.
  static const auto spread = [] {
    std::array<uint64_t, 256> t{};
    for (int b = 0; b < 256; ++b) {
      int p3 = 1;
      for (int n = 0; n < 5; ++n, p3 *= 3)
        t[static_cast<size_t>(b)] |= static_cast<uint64_t>((static_cast<uint8_t>(b * p3) * 3) >> 8) << (8 * n);
    }
    return t;
  }();
  // The codes of the four digit bytes src[0..3] interleaved: byte n of the
  // result = digit n of src[0] | digit n of src[1] << 2 | ... << 6, i.e.
  // the PQ2_0 byte of four consecutive weights (codes <= 2: no carries).
  const auto four = [](const uint8_t* p) {
    return spread[p[0]] | spread[p[1]] << 2 | spread[p[2]] << 4 | spread[p[3]] << 6;
  };
  for (int64_t b = 0; b < blocks; ++b) {
    BlockPTQ1_0 in;
    std::memcpy(&in, src + b * sizeof(BlockPTQ1_0), sizeof in);
    BlockPQ2_0 o{};
    std::memcpy(o.d, in.d, 2);
    // Weight e at PQ2_0 byte e / 4, bits 2 (e % 4). qs[m], m < 16: digit n
    // is weight 16 n + m (byte 4 n + m / 4); qs[16 + m], m < 8: weight
    // 80 + 8 n + m (byte 20 + 2 n + m / 4); qh[h]'s 4 digits: weight
    // 120 + 2 n + h.
    for (int a = 0; a < 4; ++a) {
      const uint64_t x = four(in.qs + 4 * a);
      for (int n = 0; n < 5; ++n) o.qs[4 * n + a] = static_cast<uint8_t>(x >> (8 * n));
    }
    for (int a = 0; a < 2; ++a) {
      const uint64_t x = four(in.qs + 16 + 4 * a);
      for (int n = 0; n < 5; ++n) o.qs[20 + 2 * n + a] = static_cast<uint8_t>(x >> (8 * n));
    }
    for (int h = 0; h < 2; ++h) {
      const uint64_t x = spread[in.qh[h]];
      for (int n = 0; n < 4; ++n) {
        const int e = 120 + 2 * n + h;
        o.qs[e / 4] |= static_cast<uint8_t>(((x >> (8 * n)) & 3) << (2 * (e % 4)));
      }
    }
    std::memcpy(dst + b * sizeof(BlockPQ2_0), &o, sizeof o);
  }
}

void transcode_ptq1_0_to_pq2_0(const MatrixView& w, void* dst, core::ThreadPool* pool) {
  // A 27B model's load goes through every byte once: the AVX2 decode on the
  // x86 SIMD tiers (the AVX-512 tier runs AVX2 code too), else the
  // table-driven scalar form; the bytes are the same.
  const Tier tier = active_tier();
  const auto row_fn = tier == Tier::kAvx2 || tier == Tier::kAvx512 ? detail::transcode_ptq1_0_row_avx2
                                                                   : detail::transcode_ptq1_0_row_scalar;
  const int64_t blocks = w.cols / block_elems(Format::kPTQ1_0);
  const size_t out_stride = row_bytes(Format::kPQ2_0, w.cols);
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(w.data);
  split(pool, w.rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      row_fn(in + static_cast<size_t>(r) * w.row_stride, out + static_cast<size_t>(r) * out_stride, blocks);
  });
}

}  // namespace bonsai::kernels
