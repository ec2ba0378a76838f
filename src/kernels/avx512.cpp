// AVX-512 tier (F, BW, VL, DQ + VNNI; GFNI used when present). Compiled with
// its own ISA flags (src/kernels/CMakeLists.txt) and only called when
// kernels.cpp's CPUID check passes. This file uses intrinsics and its own
// internal-linkage helpers only (see internal.h for why).
//
// Quantized weights (Q1_0, Q2_0 layouts) follow internal.h's canonical
// order exactly (bit-identical to the reference tier): activations are
// quantized to Q8_0 (bit-identical to the reference) and laid out in the
// "grouped" layout below, so that one dword lane of a 512-bit accumulator
// is one canonical chunk (32 weights for Q1_0, 16 for Q2_0) and lane L of
// group g is chunk 16 g + L: lane index = chunk mod 16 by construction. Per
// group, row and column: VPDPBUSD into int32 lanes (exact), then one
// VCVTDQ2PS, VMULPS (activation scale) and VFMADD (weight scale) on 16
// lanes, and reduce16 at the end: the canonical operations in order. GEMV,
// small batches and large batches differ only in how many rows and columns
// share one pass (register blocking, cache blocking), never in the
// operations on a column, so results are batch invariant.
// Weight expansion uses GF2P8AFFINEQB and the group gather VPERMT2B where
// the CPU has GFNI / AVX512_VBMI (Ice Lake and later); without them (e.g.
// Skylake-SP / Cascade Lake, or the test hook set_avx512_gfni(false)) the
// same layout is built from bit tests / shifts and four 16-byte loads, with
// identical integer results. The weight stream is prefetched in software
// (L2 4 KiB, L1 1 KiB ahead). Batches go to the AMX tiles (amx.cpp) when
// the AMX mode chooses it (internal.h AmxMode; by default only where
// kAmxMeasured shows AMX winning, which today is nowhere) and the CPU and OS
// allow; that path follows the same canonical order.
// Q8_0 weights: natural activation order, 256-bit VNNI, the canonical Q8_0
// order (acc0/acc1 are lanes 0-7 / 8-15). Float weights (F32/F16/BF16) use
// FMA on fp32 directly (same code for every n).
#include "core/cpu_features.h"  // cpu_features
#include "kernels/internal.h"

#if defined(__x86_64__) && defined(__AVX512VNNI__)

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>

namespace bonsai::kernels::detail {
namespace {

// ---- Small helpers (internal linkage) ------------------------------------------------

alignas(64) float g_fp16_lut[65536];  // fp16 bits -> float, filled once by init_once()

bool g_has_gfni = false;              // CPUID says GFNI
bool g_has_vbmi = false;              // CPUID says AVX512_VBMI (vpermb, for activation prep)
bool g_use_gfni = true;               // test hook (set_avx512_gfni)
AmxMode g_amx_mode = AmxMode::kAuto;  // set_avx512_amx
// Software prefetch of the streamed weights, two levels: into L2 4 KiB
// ahead and into L1 1 KiB ahead of the bytes being read (the grouped path
// prefetches two lines per level per 72-byte group, so no line is skipped).
// The hardware prefetcher alone left the GEMV ~40% short of the memory
// bandwidth here; two levels (L2 prefetches do not hold L1 fill buffers)
// measured best; in one sweep of the grouped Q1_0 GEMV on Sapphire Rapids
// (2 MiB pages) 4 KiB / 1 KiB came out ahead of 8 / 2, 16 / 2, 8 / 4,
// 2 / 0.5, 4 / 0.5, 3 / 1 and 6 / 1 KiB, by 2-6% (run-to-run noise ~3%).
constexpr int64_t kPrefetchL2Bytes = 4096;
constexpr int64_t kPrefetchL1Bytes = 1024;

void init_tables() {
  for (int i = 0; i < 65536; i += 16) {
    alignas(32) uint16_t h[16];
    for (int k = 0; k < 16; ++k) h[k] = static_cast<uint16_t>(i + k);
    _mm512_store_ps(g_fp16_lut + i, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h))));
  }
  g_has_gfni = core::cpu_features().gfni;
  g_has_vbmi = core::cpu_features().avx512vbmi;
}

// GF2P8AFFINEQB weight expansion / VPERMB-VPERMT2B gathers (the test hook
// set_avx512_gfni(false) turns both off, giving the Cascade Lake code).
bool use_gfni() { return g_has_gfni && g_use_gfni; }
bool use_vbmi() { return g_has_vbmi && g_use_gfni; }

void init_once() {
  static const bool done = (init_tables(), true);
  (void)done;
}

inline float lut_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return g_fp16_lut[h];
}

// ---- Grouped layout: four weight units per vector ------------------------------------------
//
// Every quantized product of Q1_0 / Q2_0 weights (GEMV, any batch). Four
// consecutive units of a row (Q1_0 blocks, Q2_0 g64 blocks, or g128
// 64-weight halves) form a group; one VPERMT2B gathers their 4 x 16 packed
// bytes into Q (unit u in 128-bit lane u, its packed bytes in order) and one
// VPERMT2W + VCVTPH2PS their four fp16 scales into a lane vector. Each dword
// lane of the accumulator is then one (unit, lane-chunk) pair:
//   * Q1_0 (8 bit planes m): plane m's weight byte p = 2 * bit m of Q byte p
//     (one GF2P8AFFINEQB; plane 1 one VPAND), the weight of element 8*(p%16) + m of unit p/16;
//     lane L (= 4u + k) sums the 32 elements of sub-block k of unit u.
//   * Q2_0 (4 code planes c): plane c's byte p = code c of Q byte p (one
//     GF2P8AFFINEQB; plane 0 one VPAND), the code of element 4*(p%16) + c of unit p/16; lane L
//     sums elements [16*(L%4), +16) of unit L/4 (one half of a sub-block).
//     g128 codes are remapped 3 -> 1 (value 0) on Q before the planes.
// The activations are laid out to match (prepare_cols_grouped): per group,
// plane-major vectors X[plane][64], the lane's negated quant sum (the
// accumulator's start, as in the per-block path) and the lane's activation
// scale. Per group and row that is 8 (Q1_0) or 4 (Q2_0) expansions and
// VPDPBUSDs, and one int->float conversion, multiply and FMA for 16 lanes,
// instead of three float operations per unit. Lane L of group g always
// covers elements [W*(16g+L), +W) (W = 32 for Q1_0, 16 for Q2_0), so the
// lane sums and scales are in natural order. A last partial group (units
// not a multiple of 4) is loaded with byte masks (no read past the row) and
// its missing lanes are zero on the activation side.
// A g128 matrix and its g64 twin (blocks paired with equal d) run the same
// groups, lanes and operations, so they stay bit-identical.

// The 1- and 2-bit kernels are templates over the Format (formats.h);
// GGeo<F> is a group of four of its units (UnitGeo<F>): planes, weights per
// unit, bytes a whole group spans (72 for 18-byte blocks, 68 for g128).
template <Format F>
struct GGeo {
  static constexpr int kPlanes = UnitGeo<F>::kPlanes, kElems = UnitGeo<F>::kElems;
  static constexpr int kGroupBytes = 4 / UnitGeo<F>::kPerBlock * UnitGeo<F>::kBytes;
};

// Byte offset (from the group start) of packed byte j of unit u, and of
// unit u's fp16 scale.
template <Format F>
constexpr int gq_offset(int u, int j) {
  return static_cast<int>(UnitGeo<F>::unit_qs(u)) + j;
}
template <Format F>
constexpr int gd_offset(int u) {
  return static_cast<int>(UnitGeo<F>::unit_d(u));
}
// Bytes a group of nu units spans (nu <= 4; even for g128).
template <Format F>
constexpr int gspan(int nu) {
  return nu / UnitGeo<F>::kPerBlock * UnitGeo<F>::kBytes;
}

struct GConsts {
  __m512i qidx;      // VPERMT2B index: Q byte p <- group byte gq_offset(p/16, p%16)
  __m512i didx;      // VPERMT2W index: word w < 16 <- scale of unit w/4
  __m512i plane[8];  // GF2P8AFFINEQB matrices, one per plane
  __m512i odd;       // 0xAA in every byte (g128 remap)
};

template <Format F>
GConsts make_gconsts() {
  GConsts c;
  alignas(64) uint8_t qi[64];
  alignas(64) uint16_t di[32];
  for (int p = 0; p < 64; ++p) qi[p] = static_cast<uint8_t>(gq_offset<F>(p / 16, p % 16));
  for (int w = 0; w < 32; ++w) di[w] = static_cast<uint16_t>(gd_offset<F>((w % 16) / 4) / 2);
  c.qidx = _mm512_load_si512(qi);
  c.didx = _mm512_load_si512(di);
  for (int m = 0; m < 8; ++m) {
    uint64_t q = 0;
    if constexpr (kDef<F>.family == Family::kSign) {
      q = static_cast<uint64_t>(1u << m) << 48;  // out bit 1 = src bit m (weight byte 0 or 2)
    } else if (m < 4) {
      // out bit 0 = src bit 2m, out bit 1 = src bit 2m+1 (the code)
      q = (static_cast<uint64_t>(1u << (2 * m)) << 56) | (static_cast<uint64_t>(1u << (2 * m + 1)) << 48);
    }
    c.plane[m] = _mm512_set1_epi64(static_cast<long long>(q));
  }
  c.odd = _mm512_set1_epi8(static_cast<char>(0xAA));
  return c;
}

// Loads the packed bytes (Q) and the per-lane fp16 scales (dw) of the group
// at p; nu < 4 for a last partial group (masked loads, nothing past it read).
// kVbmi: one VPERMT2B gathers Q; else four 16-byte loads into the lanes.
template <Format F, bool kTail, bool kVbmi>
inline void gload(const uint8_t* p, int nu, const GConsts& c, __m512i& q, __m512& dw) {
  __m512i l0, l1;
  if constexpr (!kTail) {
    l0 = _mm512_loadu_si512(p);
    if constexpr (GGeo<F>::kGroupBytes == 72) {
      l1 = _mm512_zextsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 64)));
    } else {
      uint32_t v;
      std::memcpy(&v, p + 64, 4);
      l1 = _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(v)));
    }
  } else {
    const int span = gspan<F>(nu);  // < 64 for every partial group
    l0 = _mm512_maskz_loadu_epi8(span >= 64 ? ~__mmask64{0} : (__mmask64{1} << span) - 1, p);
    l1 = _mm512_setzero_si512();
  }
  if constexpr (kVbmi) {
    q = _mm512_permutex2var_epi8(l0, c.qidx, l1);
  } else {
    q = _mm512_setzero_si512();
    for (int u = 0; u < 4; ++u) {
      if (kTail && u >= nu) break;
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + gq_offset<F>(u, 0)));
      switch (u) {  // (the lane index must be a constant)
        case 0:
          q = _mm512_inserti32x4(q, v, 0);
          break;
        case 1:
          q = _mm512_inserti32x4(q, v, 1);
          break;
        case 2:
          q = _mm512_inserti32x4(q, v, 2);
          break;
        default:
          q = _mm512_inserti32x4(q, v, 3);
          break;
      }
    }
  }
  if constexpr (kDef<F>.code3_is_zero) {
    // code 3 -> 1 in every 2-bit field: clear bit 1 where bit 0 is set.
    q = _mm512_ternarylogic_epi64(q, _mm512_slli_epi16(q, 1), c.odd, 0x70);  // q & ~(shl(q) & 0xAA)
  }
  dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(l0, c.didx, l1)));
}

// Weight bytes of plane m of Q (see "Grouped layout"): Q1_0 2 * bit m,
// Q2_0 code m. Q1_0 plane 1 and Q2_0 plane 0: one VPAND; the others with kGf
// one GF2P8AFFINEQB, else a bit test or a shift and mask (the same bytes).
template <Format F, bool kGf>
inline __m512i gplane(__m512i q, int m, const GConsts& c) {
  // The one plane a single VPAND gives (Q1_0 plane 1: q & 2 = 2 * bit 1;
  // Q2_0 plane 0: q & 3): VPAND runs beside GF2P8AFFINEQB and VPDPBUSD,
  // which share two pipes on Zen 5.
  constexpr int kAndPlane = kDef<F>.family == Family::kSign ? 1 : 0;
  if (m == kAndPlane) {
    return _mm512_and_si512(q, _mm512_set1_epi8(kDef<F>.family == Family::kSign ? 2 : 3));
  }
  if constexpr (kGf) {
    return _mm512_gf2p8affine_epi64_epi8(q, c.plane[m], 0);
  } else if constexpr (kDef<F>.family == Family::kSign) {
    return _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(q, _mm512_set1_epi8(static_cast<char>(1u << m))),
                                 _mm512_set1_epi8(2));
  } else {
    // 16-bit shifts: the low two bits of each byte come from that byte (2m <= 6).
    return _mm512_and_si512(_mm512_srl_epi16(q, _mm_cvtsi32_si128(2 * m)), _mm512_set1_epi8(3));
  }
}

// The canonical 16-lane reduction (internal.h): (i, i+8), (i, i+4),
// (i, i+2), (0, 1), written out (not _mm512_reduce_add_ps, whose order is
// the compiler's).
inline float reduce16(__m512 v) {
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
  const __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
  return _mm_cvtss_f32(_mm_add_ss(a2, _mm_movehdup_ps(a2)));
}

// reduce16 of four vectors at once, into y[0..3]: the same pairs in the same
// order for each (float addition is commutative, so which operand comes first
// does not change a bit), with the four rows side by side in one register
// instead of four horizontal chains and four scalar stores.
inline void reduce16x4(__m512 v0, __m512 v1, __m512 v2, __m512 v3, float* y) {
  // (i, i+8): 256-bit halves of two rows per register.
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x44), _mm512_shuffle_f32x4(v0, v1, 0xEE));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, 0x44), _mm512_shuffle_f32x4(v2, v3, 0xEE));
  // (i, i+4): 128-bit chunk r = row r.
  const __m512 a4 = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xDD));
  // (i, i+2), then (0, 1), within each chunk.
  const __m512 a2 = _mm512_add_ps(a4, _mm512_permute_ps(a4, 0x0E));
  const __m512 a1 = _mm512_add_ps(a2, _mm512_permute_ps(a2, 0x01));
  _mm_storeu_ps(y, _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, a1)));
}

// The end of an R-row x C-column micro-kernel: row i of column j0 + k is
// reduce16(out[i][k]), written to y[(j0 + k) * y_ld + row + i].
template <int R, int C>
inline void store_rows(const __m512 (&out)[R][C], float* y, int64_t y_ld, int64_t j0, int64_t row) {
  if constexpr (R == 4) {
    for (int k = 0; k < C; ++k) reduce16x4(out[0][k], out[1][k], out[2][k], out[3][k], y + (j0 + k) * y_ld + row);
  } else {
    for (int i = 0; i < R; ++i)
      for (int k = 0; k < C; ++k) y[(j0 + k) * y_ld + row + i] = reduce16(out[i][k]);
  }
}

// Prepared grouped activations of column j: X planes, lane negsums, lane scales.
struct GCol {
  const int8_t* x;
  const int32_t* neg;
  const float* dl;
};

// Per-column strides of the grouped layout (see prepare_cols_grouped).
inline int64_t g_groups(int64_t cols, int elems) { return (cols / elems + 3) / 4; }

// R rows x C columns over all groups of the rows. y is [n][rows]. Every
// (row, column) pair gets exactly the canonical operations, whatever R, C.
template <Format F, bool kGf, bool kVbmi, int R, int C>
void gmicro(const uint8_t* row0, size_t stride, int64_t units, const QuantAct& a, int64_t j0, float* y, int64_t y_ld,
            int64_t r, const GConsts& c) {
  constexpr int P = GGeo<F>::kPlanes, GB = GGeo<F>::kGroupBytes;
  const int64_t ng = (units + 3) / 4, full = units / 4;
  const int64_t xs = ng * 4 * GGeo<F>::kElems, ls = ng * 16;  // column strides
  __m512 out[R][C];
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < C; ++k) out[i][k] = _mm512_setzero_ps();
  GCol col[C];
  for (int k = 0; k < C; ++k) col[k] = GCol{a.qp + (j0 + k) * xs, a.lane_neg + (j0 + k) * ls, a.lane_d + (j0 + k) * ls};
  auto body = [&](int64_t g, auto tail) {
    __m512i q[R];
    __m512 dw[R];
    for (int i = 0; i < R; ++i) {
      const uint8_t* p = row0 + static_cast<size_t>(i) * stride + static_cast<size_t>(g) * GB;
      if constexpr (!decltype(tail)::value) {
        _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchL2Bytes), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchL2Bytes + 64), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchL1Bytes), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchL1Bytes + 64), _MM_HINT_T0);
      }
      gload<F, decltype(tail)::value, kVbmi>(p, static_cast<int>(units - 4 * g), c, q[i], dw[i]);
    }
    __m512i acc[R][C];
    for (int k = 0; k < C; ++k) {
      const __m512i nv = _mm512_load_si512(col[k].neg + g * 16);
      for (int i = 0; i < R; ++i) acc[i][k] = nv;
    }
    for (int m = 0; m < P; ++m) {
      __m512i wv[R];
      for (int i = 0; i < R; ++i) wv[i] = gplane<F, kGf>(q[i], m, c);
      for (int k = 0; k < C; ++k) {
        __m512i xv = _mm512_load_si512(col[k].x + g * (P * 64) + m * 64);
        // One load per plane and column, kept in a register for the R
        // VPDPBUSDs: GCC otherwise folds it into each of them (R loads of
        // the same line; the load ports then bound the batch kernels).
        __asm__("" : "+v"(xv));
        for (int i = 0; i < R; ++i) acc[i][k] = _mm512_dpbusd_epi32(acc[i][k], wv[i], xv);
      }
    }
    // Canonical: lane = fma(fl(isum * dx), dw, lane).
    for (int k = 0; k < C; ++k) {
      const __m512 dl = _mm512_load_ps(col[k].dl + g * 16);
      for (int i = 0; i < R; ++i)
        out[i][k] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[i][k]), dl), dw[i], out[i][k]);
    }
  };
  for (int64_t g = 0; g < full; ++g) body(g, std::false_type{});
  if (full < ng) body(full, std::true_type{});
  store_rows(out, y, y_ld, j0, r);
}

// Cache blocking for batches: a block of kRowBlock rows of weights (<= 54
// KiB at 6144 columns) stays in L1/L2 while every column tile passes over
// it, and within a tile the loop runs register blocks of kBC columns over
// all the block's rows, so those columns' activations (kBC x ~2.5 KiB at
// 2048 columns) stay in L1 while the rows pass. (Rows outer, columns inner
// re-read a whole tile of activations, ~160 KiB, from L2 for every two
// rows: L2 bandwidth then capped N >= 32 at ~40% of the int8 peak on Zen 5;
// columns outer measured +30-45% there.) A tile of kColTile columns'
// activations (<= ~0.5 MiB) stays in L2.
constexpr int64_t kRowBlock = 32;
constexpr int64_t kColTile = 64;

// Rows [rb, re) of columns [j, j + C): register blocks of R rows, then 1.
template <Format F, bool kGf, bool kVbmi, int R, int C>
void grows(const uint8_t* base, size_t st, int64_t units, const QuantAct& a, int64_t j, float* y, int64_t y_ld,
           int64_t rb, int64_t re, const GConsts& c) {
  int64_t r = rb;
  for (; r + R <= re; r += R) gmicro<F, kGf, kVbmi, R, C>(base + r * st, st, units, a, j, y, y_ld, r, c);
  for (; r < re; ++r) gmicro<F, kGf, kVbmi, 1, C>(base + r * st, st, units, a, j, y, y_ld, r, c);
}

// Register block of the batch path: kBR rows x kBC columns (2 x 6: 12 int32
// and 12 fp32 accumulators, the two rows' packed weights and scales, one
// expanded plane per row and one activation vector: 31 of the 32 zmm).
// Measured on Zen 5 (1 thread, weights in L2): 2 x 6 ran Q1_0 ~11% and Q2_0
// ~3% faster than 2 x 4; 3 x 4 was between; 2 x 8, 3 x 6 and 4 x 4 spill and
// ran Q1_0 10-20% slower than 2 x 4.
constexpr int kBR = 2, kBC = 6;

template <Format F, bool kGf, bool kVbmi>
void rows_grouped(const MatrixView& w, const QuantAct& a, int64_t n, float* y, int64_t r0, int64_t r1) {
  static const GConsts c = make_gconsts<F>();
  const int64_t units = w.cols / GGeo<F>::kElems;
  const auto* base = static_cast<const uint8_t*>(w.data);
  const size_t st = w.row_stride;
  if (n == 1) {
    // Four rows at a time: four independent VPDPBUSD chains per plane and
    // the activation loads shared (measured faster than one or two rows).
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) gmicro<F, kGf, kVbmi, 4, 1>(base + r * st, st, units, a, 0, y, w.rows, r, c);
    for (; r + 2 <= r1; r += 2) gmicro<F, kGf, kVbmi, 2, 1>(base + r * st, st, units, a, 0, y, w.rows, r, c);
    if (r < r1) gmicro<F, kGf, kVbmi, 1, 1>(base + r * st, st, units, a, 0, y, w.rows, r, c);
    return;
  }
  // Batches: row blocks, column tiles, then column blocks of kBC (then 4,
  // 2, 1 for the rest) each over all the block's rows (see kRowBlock).
  for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
    const int64_t re = rb + kRowBlock < r1 ? rb + kRowBlock : r1;
    for (int64_t jt = 0; jt < n; jt += kColTile) {
      const int64_t je = jt + kColTile < n ? jt + kColTile : n;
      int64_t j = jt;
      for (; j + kBC <= je; j += kBC) grows<F, kGf, kVbmi, kBR, kBC>(base, st, units, a, j, y, w.rows, rb, re, c);
      if constexpr (kBC > 4) {
        if (j + 4 <= je) {
          grows<F, kGf, kVbmi, kBR, 4>(base, st, units, a, j, y, w.rows, rb, re, c);
          j += 4;
        }
      }
      if constexpr (kBC > 2) {
        if (j + 2 <= je) {
          grows<F, kGf, kVbmi, kBR, 2>(base, st, units, a, j, y, w.rows, rb, re, c);
          j += 2;
        }
      }
      if (j < je) grows<F, kGf, kVbmi, kBR, 1>(base, st, units, a, j, y, w.rows, rb, re, c);
    }
  }
}

template <Format F>
void rows_grouped_dispatch(const MatrixView& w, const QuantAct& a, int64_t n, float* y, int64_t r0, int64_t r1) {
  if (use_gfni() && use_vbmi()) return rows_grouped<F, true, true>(w, a, n, y, r0, r1);
  if (use_gfni()) return rows_grouped<F, true, false>(w, a, n, y, r0, r1);
  return rows_grouped<F, false, false>(w, a, n, y, r0, r1);
}

// ---- Packed row-quad layout (load-time repacked weights) ----------------------------------
#include "kernels/avx512_packed.inc"
#include "kernels/avx512_tile.inc"

// ---- Q8_0 weights: natural activation order, 256-bit VNNI ------------------------------

void rows_q8(const MatrixView& w, const QuantAct& a, int64_t n, float* y, int64_t r0, int64_t r1) {
  const int64_t nb = w.cols / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_stride;
    for (int64_t j = 0; j < n; ++j) {
      const int8_t* xq = a.q + j * a.cols;
      const float* xd = a.d + j * (a.cols / 32);
      __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * 34;
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * 32));
        const __m256i aw = _mm256_sign_epi8(wv, wv);
        const __m256i sx = _mm256_sign_epi8(xv, wv);
        const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx);
        const __m256 sc = _mm256_set1_ps(lut_fp16(blk) * xd[b]);
        if (b & 1) {
          acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sc, acc1);
        } else {
          acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sc, acc0);
        }
      }
      const __m256 s8 = _mm256_add_ps(acc0, acc1);
      __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
      s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
      s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
      y[j * w.rows + r] = _mm_cvtss_f32(s4);
    }
  }
}

// ---- Float weights ---------------------------------------------------------------------

inline __m512 load16_f32(const uint8_t* p) { return _mm512_loadu_ps(reinterpret_cast<const float*>(p)); }
inline __m512 load16_f16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16_bf16(const uint8_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int kEs, __m512 (*Load)(const uint8_t*), float (*Scalar)(const uint8_t*)>
void rows_float(const MatrixView& w, const float* x, int64_t n, float* y, int64_t r0, int64_t r1) {
  const int64_t cols = w.cols;
  const int64_t c64 = cols & ~int64_t{63};
  const int64_t c16 = cols & ~int64_t{15};
  for (int64_t r = r0; r < r1; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_stride;
    for (int64_t j = 0; j < n; ++j) {
      const float* xj = x + j * cols;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      int64_t cc = 0;
      for (; cc < c64; cc += 64) {
        a0 = _mm512_fmadd_ps(Load(row + cc * kEs), _mm512_loadu_ps(xj + cc), a0);
        a1 = _mm512_fmadd_ps(Load(row + (cc + 16) * kEs), _mm512_loadu_ps(xj + cc + 16), a1);
        a2 = _mm512_fmadd_ps(Load(row + (cc + 32) * kEs), _mm512_loadu_ps(xj + cc + 32), a2);
        a3 = _mm512_fmadd_ps(Load(row + (cc + 48) * kEs), _mm512_loadu_ps(xj + cc + 48), a3);
      }
      for (; cc < c16; cc += 16) a0 = _mm512_fmadd_ps(Load(row + cc * kEs), _mm512_loadu_ps(xj + cc), a0);
      float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
      for (; cc < cols; ++cc) s += Scalar(row + cc * kEs) * xj[cc];
      y[j * w.rows + r] = s;
    }
  }
}

float scalar_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
float scalar_f16(const uint8_t* p) { return lut_fp16(p); }
float scalar_bf16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

// ---- Activation preparation -----------------------------------------------------------------

// Q8_0 quantization of one vector, bit-identical to quantize_act_ref: amax
// exact, d = amax / 127 (IEEE division), id = 1/d, q = cvtps2dq(x * id)
// (round to nearest even), d rounded through fp16 (vcvtps2ph, nearest even).
// Sixteen blocks at a time: their amax (per block, as before), then the two
// divisions and the fp16 rounding of d on one vector (each lane the same
// IEEE operation as the scalar form; `!=` is unordered-or-unequal as in C++),
// then the blocks' quants.
void quantize_act(const float* x, int64_t cols, int8_t* q, float* d) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const int64_t nb = cols / 32;
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int64_t cnt = nb - b0 < 16 ? nb - b0 : 16;
    alignas(64) float amax[16] = {}, id[16];
    for (int64_t k = 0; k < cnt; ++k) {
      const float* xb = x + 32 * (b0 + k);
      const __m512 m =
          _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(xb), sign), _mm512_and_ps(_mm512_loadu_ps(xb + 16), sign));
      amax[k] = _mm512_reduce_max_ps(m);
    }
    const __m512 dd = _mm512_div_ps(_mm512_load_ps(amax), _mm512_set1_ps(127.0f));
    const __mmask16 nz = _mm512_cmp_ps_mask(dd, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    _mm512_store_ps(id, _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), dd));
    const __m512 dh = _mm512_cvtph_ps(_mm512_cvtps_ph(dd, _MM_FROUND_TO_NEAREST_INT));
    _mm512_mask_storeu_ps(d + b0, static_cast<__mmask16>((1u << cnt) - 1), dh);
    for (int64_t k = 0; k < cnt; ++k) {
      const int64_t b = b0 + k;
      const __m512 vid = _mm512_set1_ps(id[k]);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * b), vid));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * b + 16), vid));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b + 16), _mm512_cvtsepi32_epi8(q1));
    }
  }
}

// out[m] lane k = in[k] lane m (a 4 x 4 transpose of 128-bit lanes).
inline void transpose_lanes4(const __m512i* in, __m512i* out) {
  const __m512i t0 = _mm512_shuffle_i64x2(in[0], in[1], 0x44), t1 = _mm512_shuffle_i64x2(in[0], in[1], 0xEE);
  const __m512i t2 = _mm512_shuffle_i64x2(in[2], in[3], 0x44), t3 = _mm512_shuffle_i64x2(in[2], in[3], 0xEE);
  out[0] = _mm512_shuffle_i64x2(t0, t2, 0x88);
  out[1] = _mm512_shuffle_i64x2(t0, t2, 0xDD);
  out[2] = _mm512_shuffle_i64x2(t1, t3, 0x88);
  out[3] = _mm512_shuffle_i64x2(t1, t3, 0xDD);
}

// Grouped activation layout of columns [j0, j1) for weight family fam (see
// "Grouped layout" above): per column, ng = ceil(units / 4) groups of
// X[planes][64] (a.qp, column stride ng * 4 * E bytes), lane negsums
// (a.lane_neg) and lane scales (a.lane_d), both ng * 16 per column; the lanes
// of a last partial group past the row are zero.
void prepare_cols_grouped(Family fam, int64_t j0, int64_t j1, QuantAct& a) {
  const int64_t cols = a.cols;
  const bool q1 = fam == Family::kSign;
  const int E = q1 ? 128 : 64, W = q1 ? 32 : 16, P = q1 ? 8 : 4;
  const int64_t units = cols / E, ng = g_groups(cols, E);
  const int64_t xs = ng * 4 * E, ls = ng * 16;
  // Transposes of one unit: output byte o (plane o/16, packed byte o%16).
  alignas(64) uint8_t t0[64], t1[64];
  for (int o = 0; o < 64; ++o) {
    if (q1) {
      t0[o] = static_cast<uint8_t>(8 * (o % 16) + o / 16);      // planes 0..3
      t1[o] = static_cast<uint8_t>(8 * (o % 16) + 4 + o / 16);  // planes 4..7
    } else {
      t0[o] = static_cast<uint8_t>(4 * (o % 16) + o / 16);  // planes 0..3
      t1[o] = 0;
    }
  }
  const __m512i i0 = _mm512_load_si512(t0), i1 = _mm512_load_si512(t1);
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t j = j0; j < j1; ++j) {
    const int8_t* q = a.q + j * cols;
    const float* d = a.d + j * (cols / 32);
    int8_t* x = a.qp + j * xs;
    int32_t* neg = a.lane_neg + j * ls;
    float* dl = a.lane_d + j * ls;
    // Padding of a partial last group.
    std::memset(x + units * E, 0, static_cast<size_t>(xs - units * E));
    const int64_t lanes = units * E / W;
    std::memset(neg + lanes, 0, static_cast<size_t>(ls - lanes) * sizeof(int32_t));
    std::memset(dl + lanes, 0, static_cast<size_t>(ls - lanes) * sizeof(float));
    // Whole groups with VBMI: the four units' plane-major transposes, a 4 x 4
    // transpose of their 128-bit lanes into the P plane vectors (stored
    // whole), and the lanes' quant sums from those planes (lane L of plane m
    // holds 4 of lane L's W quants, so the P planes' VPDPBUSDs with ones sum
    // exactly the lane's chunk). Then the units of a last partial group (or
    // every unit without VBMI) one at a time below.
    int64_t u_done = 0;
    if (use_vbmi()) {
      const int64_t full = units / 4;
      for (int64_t g = 0; g < full; ++g) {
        __m512i lo[4], hi[4];  // unit 4g + k: planes 0..3 / 4..7, 16 bytes each
        for (int k = 0; k < 4; ++k) {
          const int8_t* qu = q + (4 * g + k) * E;
          if (q1) {
            const __m512i s0 = _mm512_loadu_si512(qu), s1 = _mm512_loadu_si512(qu + 64);
            lo[k] = _mm512_permutex2var_epi8(s0, i0, s1);
            hi[k] = _mm512_permutex2var_epi8(s0, i1, s1);
          } else {
            lo[k] = _mm512_permutexvar_epi8(i0, _mm512_loadu_si512(qu));
          }
        }
        __m512i pl[8];
        transpose_lanes4(lo, pl);
        if (q1) transpose_lanes4(hi, pl + 4);
        int8_t* xg = x + g * (P * 64);
        __m512i sum = _mm512_setzero_si512();
        for (int m = 0; m < P; ++m) {
          _mm512_storeu_si512(xg + m * 64, pl[m]);
          sum = _mm512_dpbusd_epi32(sum, ones, pl[m]);
        }
        _mm512_storeu_si512(neg + g * 16, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
      }
      u_done = full * 4;
    }
    for (int64_t u = u_done; u < units; ++u) {
      int8_t* xg = x + (u / 4) * (P * 64) + (u % 4) * 16;
      if (!use_vbmi()) {
        // Same bytes, one at a time: plane m, packed byte i of unit u.
        const int8_t* qu = q + u * E;
        for (int m = 0; m < P; ++m)
          for (int i = 0; i < 16; ++i) xg[m * 64 + i] = qu[q1 ? 8 * i + m : 4 * i + m];
      } else if (q1) {
        const __m512i s0 = _mm512_loadu_si512(q + u * 128), s1 = _mm512_loadu_si512(q + u * 128 + 64);
        const __m512i a0 = _mm512_permutex2var_epi8(s0, i0, s1), a1 = _mm512_permutex2var_epi8(s0, i1, s1);
        alignas(64) int8_t b0[64], b1[64];
        _mm512_store_si512(b0, a0);
        _mm512_store_si512(b1, a1);
        for (int m = 0; m < 4; ++m) {
          std::memcpy(xg + m * 64, b0 + 16 * m, 16);
          std::memcpy(xg + (m + 4) * 64, b1 + 16 * m, 16);
        }
      } else {
        const __m512i a0 = _mm512_permutexvar_epi8(i0, _mm512_loadu_si512(q + u * 64));
        alignas(64) int8_t b0[64];
        _mm512_store_si512(b0, a0);
        for (int m = 0; m < 4; ++m) std::memcpy(xg + m * 64, b0 + 16 * m, 16);
      }
    }
    // Lane sums (negated) of W consecutive quants (the units not done above), and lane scales.
    for (int64_t c0 = u_done * E; c0 < units * E; c0 += 64) {
      alignas(64) int32_t s4[16];
      _mm512_store_si512(s4, _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(q + c0)));
      const int per = W / 4;  // dwords per lane
      for (int l = 0; l < 16 / per; ++l) {
        int32_t sum = 0;
        for (int t = 0; t < per; ++t) sum += s4[l * per + t];
        neg[c0 / W + l] = -sum;
      }
    }
    if (q1) {
      std::memcpy(dl, d, static_cast<size_t>(lanes) * sizeof(float));  // W = 32: one lane per sub-block
    } else {
      for (int64_t l = 0; l < lanes; ++l) dl[l] = d[l * W / 32];
    }
  }
}

void prepare_setup(Format f, int64_t n, int64_t cols, QuantAct& a) {
  init_once();
  a.resize(n, cols);
  if (avx512_amx_for(n) && amx_supports(f)) amx_setup(a);
  a.lut_ready = a.want_lut && f == Format::kQ1_0 && use_vbmi();
}

void prepare_cols(Format f, const float* x, int64_t j0, int64_t j1, QuantAct& a) {
  const int64_t cols = a.cols;
  for (int64_t j = j0; j < j1; ++j) quantize_act(x + j * cols, cols, a.q + j * cols, a.d + j * (cols / 32));
  if (a.amx_ready) {
    amx_fill_columns(f, a, j0, j1);
    return;
  }
  const Family fam = format_def(f).family;  // (every Q2_0 layout runs per 64-weight unit, as g64)
  if ((fam != Family::kSign && fam != Family::kCode2) || (a.lut_ready && a.lut_only))
    return;  // (the tables are built from q by rows_tile)
  prepare_cols_grouped(fam, j0, j1, a);
}

void prepare(Format f, const float* x, int64_t n, int64_t cols, QuantAct& a) {
  prepare_setup(f, n, cols, a);
  prepare_cols(f, x, 0, n, a);
}

void rows(const MatrixView& w, const float* x, const QuantAct* a, int64_t n, float* y, int64_t r0, int64_t r1) {
  init_once();
  if (a != nullptr && a->amx_ready) {
    amx_rows(w, *a, n, y, r0, r1);
    return;
  }
  if (w.packing == Packing::kAvx512RowQuad && w.packed != nullptr && a != nullptr && w.format != Format::kQ8_0) {
    return rows_packed_dispatch(w, *a, n, y, r0, r1);
  }
  if (w.packing == Packing::kTile16 && w.packed != nullptr && a != nullptr && w.format == Format::kQ1_0) {
    return rows_tile(w, *a, n, y, r0, r1);
  }
  visit_format(w.format, [&](auto fc) {
    constexpr Format F = fc.value;
    if constexpr (F == Format::kF32) {
      rows_float<4, load16_f32, scalar_f32>(w, x, n, y, r0, r1);
    } else if constexpr (F == Format::kF16) {
      rows_float<2, load16_f16, scalar_f16>(w, x, n, y, r0, r1);
    } else if constexpr (F == Format::kBF16) {
      rows_float<2, load16_bf16, scalar_bf16>(w, x, n, y, r0, r1);
    } else if constexpr (F == Format::kQ8_0) {
      rows_q8(w, *a, n, y, r0, r1);
    } else if constexpr (kHasUnits<F>) {
      rows_grouped_dispatch<F>(w, *a, n, y, r0, r1);
    }
  });
}

// ---- Float vector helpers ---------------------------------------------------------------------

float dot_f32(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  if (i + 16 <= n) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    i += 16;
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

float dot_f16_f32(const uint16_t* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i))),
                         _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i + 16))),
                         _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) {
    s0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i))),
                         _mm512_loadu_ps(b + i), s0);
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    s1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, a + i)), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

void axpy_f32(float alpha, const float* x, float* y, int64_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

void axpy_f16(float alpha, const uint16_t* x, float* y, int64_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 xv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, xv, _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 xv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i));
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, xv, _mm512_maskz_loadu_ps(m, y + i)));
  }
}

void f32_to_f16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT));
  }
}

}  // namespace

AmxMode set_avx512_amx(AmxMode mode) {
  const AmxMode prev = g_amx_mode;
  g_amx_mode = mode;
  return prev;
}

AmxMode avx512_amx_mode() { return g_amx_mode; }

bool avx512_amx_for(int64_t n) {
  if (n < kAmxMinCols || g_amx_mode == AmxMode::kOff) return false;
  if (g_amx_mode == AmxMode::kAuto && !amx_wins(n)) return false;
  return amx_usable();
}

bool avx512_amx_in_use() {
  switch (g_amx_mode) {
    case AmxMode::kOff:
      return false;
    case AmxMode::kOn:
      return amx_usable();
    case AmxMode::kAuto:
      return kAmxWinsSomewhere && amx_usable();
  }
  return false;
}

bool avx512_vbmi_in_use() { return g_use_gfni && core::cpu_features().avx512vbmi; }

// The hooks only flip flags: they run on CPUs without AVX-512 too (the tier
// tests call them everywhere), so they must not touch init_once(), whose
// table setup is AVX-512 code (it raised SIGILL on an AVX2-only Zen 3).
bool set_avx512_gfni(bool enabled) {
  const bool prev = g_use_gfni;
  g_use_gfni = enabled;
  return prev;
}

const TierOps* avx512_ops() {
  static const TierOps ops{prepare,  rows,       dot_f32,       dot_f16_f32,  axpy_f32,
                           axpy_f16, f32_to_f16, prepare_setup, prepare_cols, kX86TierFormats};
  return &ops;
}

}  // namespace bonsai::kernels::detail

#else  // not x86-64 (or built without the tier's flags): tier absent

#include <utility>

namespace bonsai::kernels::detail {
bool set_avx512_gfni(bool) { return false; }
namespace {
AmxMode g_amx_mode = AmxMode::kAuto;  // kept so the switch reads back what was set
}  // namespace
AmxMode set_avx512_amx(AmxMode mode) { return std::exchange(g_amx_mode, mode); }
AmxMode avx512_amx_mode() { return g_amx_mode; }
bool avx512_amx_for(int64_t) { return false; }
bool avx512_amx_in_use() { return false; }
bool avx512_vbmi_in_use() { return false; }
const TierOps* avx512_ops() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
