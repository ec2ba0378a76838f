// AVX-512 tier (F, BW, VL, DQ + VNNI; GFNI used when present). Compiled with
// its own ISA flags (src/kernels/CMakeLists.txt) and only called when
// kernels.cpp's CPUID check passes. This file uses intrinsics and its own
// internal-linkage helpers only (see internal.h for why).
//
// Quantized weights (see internal.h for the arithmetic, which is exactly the
// reference's up to fp32 summation order):
//   Activations are quantized to Q8_0 (bit-identical to the reference) and
//   then rearranged per weight block so that a block's packed weights can be
//   expanded to one byte per weight with a broadcast and one GF2P8AFFINEQB
//   (or a bit test) per 64 weights -- no byte shuffles of the weights:
//   * Q1_0: the 16 sign bytes are broadcast to all four 128-bit lanes; byte
//     p of the first half-vector X0 holds element 8*(p%16) + p/16 and byte p
//     of X1 element 8*(p%16) + 4 + p/16, so "bit p/16 (resp. p/16+4) of byte
//     p%16" is that element's sign bit. The weight byte is 2*bit, and the
//     int32 accumulator starts at -(sum of the lane's quants), giving
//     sum_j (2*bit_j - 1) * q_j exactly.
//   * Q2_0 g64: the 16 code bytes are broadcast; byte p holds element
//     4*(p%16) + p/16, whose code is bits 2*(p/16)..+1 of byte p%16. The
//     weight byte is the code c (0..3) and the accumulator starts at -sum q,
//     giving sum (c - 1) q (g64: code 3 -> +2, as the reference).
//   * Q2_0 g128 (both byte orders): each 64-weight half (16 code bytes, the
//     block's d) runs exactly as a g64 block, codes remapped 3 -> 1 (value
//     0) by a 16-byte table shuffle, so results are bit-identical to the
//     equivalent g64 matrix (blocks paired with equal d).
//   In every layout each 32-bit lane (4 bytes, and for two half-vectors the
//   same lane of both) lies in one 32-value activation sub-block, so the
//   int32 lane sums are scaled by a per-lane activation scale vector and the
//   weight block's fp16 scale, accumulating in fp32.
// With GFNI and AVX512_VBMI (Ice Lake and later) GEMV and small batches take
// the grouped path instead (see "Grouped layout" below): four weight units
// per vector, so the fp32 scaling runs once per four units; GEMV runs four
// rows at a time, small batches one row x up to four columns. Without them
// the per-block scheme above runs (GEMV four rows at a time, small batches
// two rows x up to four columns). Both prefetch the weight stream in
// software (L2 4 KiB, L1 1 KiB ahead). Batches of n >= kAmxMinCols go to the
// AMX tiles (amx.cpp) when the CPU and OS allow.
// Float weights (F32/F16/BF16) use FMA on fp32 directly.
#include "kernels/internal.h"

#if defined(__x86_64__) && defined(__AVX512VNNI__)

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace bonsai::kernels::detail {
namespace {

// ---- Small helpers (internal linkage) ------------------------------------------------

alignas(64) float g_fp16_lut[65536];  // fp16 bits -> float, filled once by init_once()

bool g_has_gfni = false;   // CPUID says GFNI
bool g_has_vbmi = false;   // CPUID says AVX512_VBMI (vpermb, for activation prep)
bool g_use_gfni = true;    // test hook (set_avx512_gfni)
bool g_use_amx = true;     // test hook (set_avx512_amx)
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
  g_has_gfni = __builtin_cpu_supports("gfni");
  g_has_vbmi = __builtin_cpu_supports("avx512vbmi");
}

// The grouped GEMV / small-batch path (needs GFNI and AVX512_VBMI; the test
// hook set_avx512_gfni(false) turns it off with the rest of the GFNI use).
bool use_grouped() { return g_has_gfni && g_has_vbmi && g_use_gfni; }

void init_once() {
  static const bool done = (init_tables(), true);
  (void)done;
}

inline float lut_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return g_fp16_lut[h];
}

// Weight format families by activation layout.
enum Fam : int { kFamQ1 = 0, kFamG64 = 1, kFamG128D = 2, kFamG128Qs = 3, kFamQ8 = 4 };

// Geometry of one weight block ("unit") per family.
template <int F>
struct Geo;
template <>
struct Geo<kFamQ1> {
  static constexpr int kElems = 128, kBytes = 18, kQs = 2, kD = 0;
};
template <>
struct Geo<kFamG64> {
  static constexpr int kElems = 64, kBytes = 18, kQs = 2, kD = 0;
};
// The g128 layouts iterate over 64-weight halves as units; kBytes is the
// whole block's size (see qs_at / d_at).
template <>
struct Geo<kFamG128D> {
  static constexpr int kElems = 64, kBytes = 34, kQs = 2, kD = 0;
};
template <>
struct Geo<kFamG128Qs> {
  static constexpr int kElems = 64, kBytes = 34, kQs = 0, kD = 32;
};

inline constexpr bool is_g128(int f) { return f == kFamG128D || f == kFamG128Qs; }

// Packed weights of unit b (a block; a 64-weight half for g128) of a row.
template <int F>
inline const uint8_t* qs_at(const uint8_t* row, int64_t b) {
  if constexpr (is_g128(F)) {
    return row + static_cast<size_t>(b >> 1) * Geo<F>::kBytes + Geo<F>::kQs + (b & 1) * 16;
  } else {
    return row + static_cast<size_t>(b) * Geo<F>::kBytes + Geo<F>::kQs;
  }
}
// fp16 scale of unit b of a row.
template <int F>
inline const uint8_t* d_at(const uint8_t* row, int64_t b) {
  if constexpr (is_g128(F)) {
    return row + static_cast<size_t>(b >> 1) * Geo<F>::kBytes + Geo<F>::kD;
  } else {
    return row + static_cast<size_t>(b) * Geo<F>::kBytes + Geo<F>::kD;
  }
}

// Constants for weight expansion.
struct Consts {
  __m512i gf0, gf1;      // GF2P8AFFINE matrices for half-vectors X0 / X1
  __m512i pat0, pat1;    // bit-test patterns (non-GFNI Q1 path)
  __m512i sh0, sh1;      // per-16-bit-word right shifts (non-GFNI Q2 paths)
  __m512i two, three, remap;
};

template <int F>
Consts make_consts() {
  Consts c;
  alignas(64) uint64_t g0[8], g1[8];
  alignas(64) uint8_t p0[64], p1[64];
  alignas(64) uint16_t s0[32], s1[32];
  for (int q = 0; q < 8; ++q) {
    if constexpr (F == kFamQ1) {
      const int l = q / 2;  // 16-byte group
      g0[q] = static_cast<uint64_t>(1u << l) << 48;        // out bit 1 = src bit l
      g1[q] = static_cast<uint64_t>(1u << (l + 4)) << 48;  // out bit 1 = src bit l+4
    } else {  // Q2 (g128 units are 64-weight halves, laid out as g64)
      const int l = q / 2;  // 16-byte group
      g0[q] = (static_cast<uint64_t>(1u << (2 * l)) << 56) | (static_cast<uint64_t>(1u << (2 * l + 1)) << 48);
      g1[q] = g0[q];
    }
  }
  for (int p = 0; p < 64; ++p) {
    p0[p] = static_cast<uint8_t>(1u << (p / 16));
    p1[p] = static_cast<uint8_t>(1u << (p / 16 + 4));
  }
  for (int k = 0; k < 32; ++k) {
    const int p = 2 * k;  // byte index of the word
    const int l = p / 16;
    s0[k] = static_cast<uint16_t>(2 * l);
    s1[k] = s0[k];
  }
  c.gf0 = _mm512_load_si512(g0);
  c.gf1 = _mm512_load_si512(g1);
  c.pat0 = _mm512_load_si512(p0);
  c.pat1 = _mm512_load_si512(p1);
  c.sh0 = _mm512_load_si512(s0);
  c.sh1 = _mm512_load_si512(s1);
  c.two = _mm512_set1_epi8(2);
  c.three = _mm512_set1_epi8(3);
  c.remap = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2, 1));
  return c;
}

// Expands the packed weights of one unit (qs: its 16 sign/code bytes) into
// u8 weight bytes w0 (and w1 for Q1_0's 128-weight blocks) matching the
// activation layout described above.
template <int F, bool kGf>
inline void expand(const uint8_t* qs, const Consts& c, __m512i& w0, __m512i& w1) {
  if constexpr (F == kFamQ1) {
    const __m512i bq = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    if constexpr (kGf) {
      w0 = _mm512_gf2p8affine_epi64_epi8(bq, c.gf0, 0);
      w1 = _mm512_gf2p8affine_epi64_epi8(bq, c.gf1, 0);
    } else {
      w0 = _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bq, c.pat0), c.two);
      w1 = _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bq, c.pat1), c.two);
    }
  } else {
    const __m512i bq = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    if constexpr (kGf) {
      w0 = _mm512_gf2p8affine_epi64_epi8(bq, c.gf0, 0);
    } else {
      w0 = _mm512_and_si512(_mm512_srlv_epi16(bq, c.sh0), c.three);
    }
    if constexpr (is_g128(F)) w0 = _mm512_shuffle_epi8(c.remap, w0);  // code 3 -> 1 (value 0)
    w1 = w0;
  }
}

// Integer lane sums of one block against column j's prepared activations.
template <int F>
inline __m512i block_dot(__m512i w0, __m512i w1, const int8_t* xq, const int32_t* neg) {
  __m512i acc = _mm512_dpbusd_epi32(_mm512_load_si512(neg), w0, _mm512_load_si512(xq));
  if constexpr (Geo<F>::kElems == 128) acc = _mm512_dpbusd_epi32(acc, w1, _mm512_load_si512(xq + 64));
  return acc;
}

// R rows x C columns over all blocks of the rows. y is [n][rows].
template <int F, bool kGf, int R, int C>
void micro(const uint8_t* row0, size_t stride, int64_t nb, const QuantAct& a, int64_t j0, float* y,
           int64_t y_ld, int64_t r, const Consts& c) {
  constexpr int E = Geo<F>::kElems;
  const int64_t cols = a.cols;
  __m512 out[R][C];
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < C; ++k) out[i][k] = _mm512_setzero_ps();
  const int8_t* xq[C];
  const int32_t* ng[C];
  const float* ld[C];
  for (int k = 0; k < C; ++k) {
    xq[k] = a.qp + (j0 + k) * cols;
    ng[k] = a.lane_neg + (j0 + k) * (cols / 4);
    ld[k] = a.lane_d + (j0 + k) * (cols / 4);
  }
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < R; ++i) {
      const uint8_t* rowi = row0 + static_cast<size_t>(i) * stride;
      const uint8_t* dp = d_at<F>(rowi, b);
      _mm_prefetch(reinterpret_cast<const char*>(dp + kPrefetchL2Bytes), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(dp + kPrefetchL1Bytes), _MM_HINT_T0);
      __m512i w0, w1;
      expand<F, kGf>(qs_at<F>(rowi, b), c, w0, w1);
      const __m512 dw = _mm512_set1_ps(lut_fp16(dp));
      for (int k = 0; k < C; ++k) {
        const __m512i acc = block_dot<F>(w0, w1, xq[k] + b * E, ng[k] + b * 16);
        const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_load_ps(ld[k] + b * 16));
        out[i][k] = _mm512_fmadd_ps(t, dw, out[i][k]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < C; ++k) y[(j0 + k) * y_ld + r + i] = _mm512_reduce_add_ps(out[i][k]);
}

template <int F, bool kGf>
void rows_fam(const MatrixView& w, const QuantAct& a, int64_t n, float* y, int64_t r0, int64_t r1) {
  static const Consts c = make_consts<F>();
  const int64_t nb = w.cols / Geo<F>::kElems;
  const auto* base = static_cast<const uint8_t*>(w.data);
  const size_t st = w.row_stride;
  int64_t r = r0;
  if (n == 1) {
    // Four rows at a time share the activation loads and give the core four
    // independent accumulation chains (measured faster than 2 or 8).
    for (; r + 4 <= r1; r += 4) micro<F, kGf, 4, 1>(base + r * st, st, nb, a, 0, y, w.rows, r, c);
    for (; r + 2 <= r1; r += 2) micro<F, kGf, 2, 1>(base + r * st, st, nb, a, 0, y, w.rows, r, c);
    for (; r < r1; ++r) micro<F, kGf, 1, 1>(base + r * st, st, nb, a, 0, y, w.rows, r, c);
    return;
  }
  // Small batches (AMX takes n >= kAmxMinCols where available): two rows x
  // up to four columns per pass, so each expanded weight block feeds 4-8
  // dot products.
  for (; r + 2 <= r1; r += 2) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) micro<F, kGf, 2, 4>(base + r * st, st, nb, a, j, y, w.rows, r, c);
    if (j + 2 <= n) {
      micro<F, kGf, 2, 2>(base + r * st, st, nb, a, j, y, w.rows, r, c);
      j += 2;
    }
    if (j < n) micro<F, kGf, 2, 1>(base + r * st, st, nb, a, j, y, w.rows, r, c);
  }
  for (; r < r1; ++r) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) micro<F, kGf, 1, 4>(base + r * st, st, nb, a, j, y, w.rows, r, c);
    for (; j < n; ++j) micro<F, kGf, 1, 1>(base + r * st, st, nb, a, j, y, w.rows, r, c);
  }
}

// ---- Grouped layout (GFNI + VBMI): four weight units per vector -------------------------
//
// The GEMV / small-batch path on CPUs with GFNI and AVX512_VBMI. Four
// consecutive units of a row (Q1_0 blocks, Q2_0 g64 blocks, or g128
// 64-weight halves) form a group; one VPERMT2B gathers their 4 x 16 packed
// bytes into Q (unit u in 128-bit lane u, its packed bytes in order) and one
// VPERMT2W + VCVTPH2PS their four fp16 scales into a lane vector. Each dword
// lane of the accumulator is then one (unit, lane-chunk) pair:
//   * Q1_0 (8 bit planes m): plane m's weight byte p = 2 * bit m of Q byte p
//     (one GF2P8AFFINEQB), the weight of element 8*(p%16) + m of unit p/16;
//     lane L (= 4u + k) sums the 32 elements of sub-block k of unit u.
//   * Q2_0 (4 code planes c): plane c's byte p = code c of Q byte p (one
//     GF2P8AFFINEQB), the code of element 4*(p%16) + c of unit p/16; lane L
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

template <int F>
struct GGeo;
template <>
struct GGeo<kFamQ1> {
  static constexpr int kPlanes = 8, kElems = 128, kGroupBytes = 72;
};
template <>
struct GGeo<kFamG64> {
  static constexpr int kPlanes = 4, kElems = 64, kGroupBytes = 72;
};
template <>
struct GGeo<kFamG128D> {
  static constexpr int kPlanes = 4, kElems = 64, kGroupBytes = 68;
};
template <>
struct GGeo<kFamG128Qs> {
  static constexpr int kPlanes = 4, kElems = 64, kGroupBytes = 68;
};

// Byte offset (from the group start) of packed byte j of unit u, and of
// unit u's fp16 scale.
template <int F>
constexpr int gq_offset(int u, int j) {
  if constexpr (F == kFamG128D) return 34 * (u / 2) + 2 + 16 * (u % 2) + j;
  if constexpr (F == kFamG128Qs) return 34 * (u / 2) + 16 * (u % 2) + j;
  return 18 * u + 2 + j;
}
template <int F>
constexpr int gd_offset(int u) {
  if constexpr (F == kFamG128D) return 34 * (u / 2);
  if constexpr (F == kFamG128Qs) return 34 * (u / 2) + 32;
  return 18 * u;
}
// Bytes a group of nu units spans (nu <= 4; even for g128).
template <int F>
constexpr int gspan(int nu) {
  return is_g128(F) ? 34 * (nu / 2) : 18 * nu;
}

struct GConsts {
  __m512i qidx;      // VPERMT2B index: Q byte p <- group byte gq_offset(p/16, p%16)
  __m512i didx;      // VPERMT2W index: word w < 16 <- scale of unit w/4
  __m512i plane[8];  // GF2P8AFFINEQB matrices, one per plane
  __m512i odd;       // 0xAA in every byte (g128 remap)
};

template <int F>
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
    if constexpr (F == kFamQ1) {
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
template <int F, bool kTail>
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
  q = _mm512_permutex2var_epi8(l0, c.qidx, l1);
  if constexpr (is_g128(F)) {
    // code 3 -> 1 in every 2-bit field: clear bit 1 where bit 0 is set.
    q = _mm512_ternarylogic_epi64(q, _mm512_slli_epi16(q, 1), c.odd, 0x70);  // q & ~(shl(q) & 0xAA)
  }
  dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(l0, c.didx, l1)));
}

// Prepared grouped activations of column j: X planes, lane negsums, lane scales.
struct GCol {
  const int8_t* x;
  const int32_t* neg;
  const float* dl;
};

// Per-column strides of the grouped layout (see prepare_cols_grouped).
inline int64_t g_groups(int64_t cols, int elems) { return (cols / elems + 3) / 4; }

// R rows x C columns over all groups of the rows. y is [n][rows].
template <int F, int R, int C>
void gmicro(const uint8_t* row0, size_t stride, int64_t units, const QuantAct& a, int64_t j0, float* y,
            int64_t y_ld, int64_t r, const GConsts& c) {
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
      gload<F, decltype(tail)::value>(p, static_cast<int>(units - 4 * g), c, q[i], dw[i]);
    }
    __m512i acc[R][C];
    for (int k = 0; k < C; ++k) {
      const __m512i nv = _mm512_load_si512(col[k].neg + g * 16);
      for (int i = 0; i < R; ++i) acc[i][k] = nv;
    }
    for (int m = 0; m < P; ++m) {
      __m512i wv[R];
      for (int i = 0; i < R; ++i) wv[i] = _mm512_gf2p8affine_epi64_epi8(q[i], c.plane[m], 0);
      for (int k = 0; k < C; ++k) {
        const __m512i xv = _mm512_load_si512(col[k].x + g * (P * 64) + m * 64);
        for (int i = 0; i < R; ++i) acc[i][k] = _mm512_dpbusd_epi32(acc[i][k], wv[i], xv);
      }
    }
    for (int k = 0; k < C; ++k) {
      const __m512 dl = _mm512_load_ps(col[k].dl + g * 16);
      for (int i = 0; i < R; ++i)
        out[i][k] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[i][k]), dl), dw[i], out[i][k]);
    }
  };
  for (int64_t g = 0; g < full; ++g) body(g, std::false_type{});
  if (full < ng) body(full, std::true_type{});
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < C; ++k) y[(j0 + k) * y_ld + r + i] = _mm512_reduce_add_ps(out[i][k]);
}

template <int F>
void rows_grouped(const MatrixView& w, const QuantAct& a, int64_t n, float* y, int64_t r0, int64_t r1) {
  static const GConsts c = make_gconsts<F>();
  const int64_t units = w.cols / GGeo<F>::kElems;
  const auto* base = static_cast<const uint8_t*>(w.data);
  const size_t st = w.row_stride;
  int64_t r = r0;
  if (n == 1) {
    // Four rows at a time: four independent VPDPBUSD chains per plane and
    // the activation loads shared (measured faster than one or two rows).
    for (; r + 4 <= r1; r += 4) gmicro<F, 4, 1>(base + r * st, st, units, a, 0, y, w.rows, r, c);
    for (; r + 2 <= r1; r += 2) gmicro<F, 2, 1>(base + r * st, st, units, a, 0, y, w.rows, r, c);
    if (r < r1) gmicro<F, 1, 1>(base + r * st, st, units, a, 0, y, w.rows, r, c);
    return;
  }
  // Small batches: each expanded plane feeds up to four columns.
  for (; r < r1; ++r) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) gmicro<F, 1, 4>(base + r * st, st, units, a, j, y, w.rows, r, c);
    if (j + 2 <= n) {
      gmicro<F, 1, 2>(base + r * st, st, units, a, j, y, w.rows, r, c);
      j += 2;
    }
    if (j < n) gmicro<F, 1, 1>(base + r * st, st, units, a, j, y, w.rows, r, c);
  }
}

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
void quantize_act(const float* x, int64_t cols, int8_t* q, float* d) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b);
    const __m512 v1 = _mm512_loadu_ps(x + 32 * b + 16);
    const __m512 m = _mm512_max_ps(_mm512_and_ps(v0, sign), _mm512_and_ps(v1, sign));
    const float amax = _mm512_reduce_max_ps(m);
    const float dd = amax / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b + 16), _mm512_cvtsepi32_epi8(q1));
    d[b] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(dd), _MM_FROUND_TO_NEAREST_INT)));
  }
}

// Element index held at byte p (0..127) of a block's rearranged activations.
inline int perm_index(int fam, int p) {
  const int h = p / 64, pp = p % 64;
  switch (fam) {
    case kFamQ1: return 8 * (pp % 16) + 4 * h + pp / 16;
    default: return 4 * (p % 16) + p / 16;  // 64-element blocks (g64, g128 halves)
  }
}

// Activation sub-block (of 32) of dword lane l of a block.
inline int lane_sub(int fam, int l) {
  switch (fam) {
    case kFamQ1: return l % 4;
    default: return (l % 4) / 2;  // g64, g128 halves
  }
}

int family_of(Format f) {
  switch (f) {
    case Format::kQ1_0: return kFamQ1;
    case Format::kQ2_0:
    case Format::kQ2_0G128D:  // g128 runs per 64-weight half, as g64
    case Format::kQ2_0G128Qs: return kFamG64;
    default: return kFamQ8;
  }
}


// Grouped activation layout of columns [j0, j1) for weight family fam (see
// "Grouped layout" above): per column, ng = ceil(units / 4) groups of
// X[planes][64] (a.qp, column stride ng * 4 * E bytes), lane negsums
// (a.lane_neg) and lane scales (a.lane_d), both ng * 16 per column; the lanes
// of a last partial group past the row are zero.
void prepare_cols_grouped(int fam, int64_t j0, int64_t j1, QuantAct& a) {
  const int64_t cols = a.cols;
  const bool q1 = fam == kFamQ1;
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
    for (int64_t u = 0; u < units; ++u) {
      int8_t* xg = x + (u / 4) * (P * 64) + (u % 4) * 16;
      if (q1) {
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
    // Lane sums (negated) of W consecutive quants, and lane scales.
    for (int64_t c0 = 0; c0 < units * E; c0 += 64) {
      alignas(64) int32_t s4[16];
      _mm512_store_si512(s4, _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(q + c0)));
      const int per = W / 4;  // dwords per lane
      for (int l = 0; l < 16 / per; ++l) {
        int32_t sum = 0;
        for (int t = 0; t < per; ++t) sum += s4[l * per + t];
        neg[c0 / W + l] = -sum;
      }
    }
    for (int64_t l = 0; l < lanes; ++l) dl[l] = d[l * W / 32];
  }
}

void prepare_setup(Format f, int64_t n, int64_t cols, QuantAct& a) {
  init_once();
  a.resize(n, cols);
  if (n >= kAmxMinCols && g_use_amx && amx_supports(f) && amx_usable()) amx_setup(a);
}

void prepare_cols(Format f, const float* x, int64_t j0, int64_t j1, QuantAct& a) {
  const int64_t cols = a.cols;
  for (int64_t j = j0; j < j1; ++j) quantize_act(x + j * cols, cols, a.q + j * cols, a.d + j * (cols / 32));
  if (a.amx_ready) {
    amx_fill_columns(f, a, j0, j1);
    return;
  }
  const int fam = family_of(f);
  if (fam == kFamQ8) return;
  if (use_grouped()) {
    prepare_cols_grouped(fam, j0, j1, a);
    return;
  }
  const int E = fam == kFamG64 ? 64 : 128;
  // Byte permutation of a block (E elements) and per-lane sub-block index.
  alignas(64) uint8_t idx[128];
  alignas(64) int32_t lsub[16];
  for (int p = 0; p < E; ++p) idx[p] = static_cast<uint8_t>(perm_index(fam, p));
  for (int l = 0; l < 16; ++l) lsub[l] = lane_sub(fam, l);
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i lsubv = _mm512_load_si512(lsub);
  for (int64_t j = j0; j < j1; ++j) {
    const int8_t* q = a.q + j * cols;
    const float* d = a.d + j * (cols / 32);
    int8_t* qp = a.qp + j * cols;
    int32_t* neg = a.lane_neg + j * (cols / 4);
    float* ld = a.lane_d + j * (cols / 4);
    for (int64_t b = 0; b < cols / E; ++b) {
      const int8_t* src = q + b * E;
      int8_t* dst = qp + b * E;
      __m512i x0, x1 = _mm512_setzero_si512();
      if (g_has_vbmi && g_use_gfni) {
        // Two-source byte permutes over the block's (up to) 128 bytes.
        const __m512i s0 = _mm512_loadu_si512(src);
        const __m512i s1 = E == 128 ? _mm512_loadu_si512(src + 64) : s0;
        x0 = _mm512_permutex2var_epi8(s0, _mm512_load_si512(idx), s1);
        if (E == 128) x1 = _mm512_permutex2var_epi8(s0, _mm512_load_si512(idx + 64), s1);
      } else {
        for (int p = 0; p < E; ++p) dst[p] = src[idx[p]];
        x0 = _mm512_loadu_si512(dst);
        if (E == 128) x1 = _mm512_loadu_si512(dst + 64);
      }
      _mm512_storeu_si512(dst, x0);
      if (E == 128) _mm512_storeu_si512(dst + 64, x1);
      // Lane sums of the quants (both halves share lanes), negated.
      const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, x0), ones, x1);
      _mm512_storeu_si512(neg + b * 16, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
      // Lane scales: d[b * E/32 + lane_sub(l)].
      const __m512 dv = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << (E / 32)) - 1), d + b * (E / 32));
      _mm512_storeu_ps(ld + b * 16, _mm512_permutexvar_ps(lsubv, dv));
    }
  }
}

void prepare(Format f, const float* x, int64_t n, int64_t cols, QuantAct& a) {
  prepare_setup(f, n, cols, a);
  prepare_cols(f, x, 0, n, a);
}

void rows(const MatrixView& w, const float* x, const QuantAct* a, int64_t n, float* y, int64_t r0,
          int64_t r1) {
  init_once();
  if (a != nullptr && a->amx_ready) {
    amx_rows(w, *a, n, y, r0, r1);
    return;
  }
  const bool gf = g_has_gfni && g_use_gfni;
  if (use_grouped()) {
    switch (w.format) {
      case Format::kQ1_0: return rows_grouped<kFamQ1>(w, *a, n, y, r0, r1);
      case Format::kQ2_0: return rows_grouped<kFamG64>(w, *a, n, y, r0, r1);
      case Format::kQ2_0G128D: return rows_grouped<kFamG128D>(w, *a, n, y, r0, r1);
      case Format::kQ2_0G128Qs: return rows_grouped<kFamG128Qs>(w, *a, n, y, r0, r1);
      default: break;
    }
  }
  switch (w.format) {
    case Format::kF32: return rows_float<4, load16_f32, scalar_f32>(w, x, n, y, r0, r1);
    case Format::kF16: return rows_float<2, load16_f16, scalar_f16>(w, x, n, y, r0, r1);
    case Format::kBF16: return rows_float<2, load16_bf16, scalar_bf16>(w, x, n, y, r0, r1);
    case Format::kQ8_0: return rows_q8(w, *a, n, y, r0, r1);
    case Format::kQ1_0:
      return gf ? rows_fam<kFamQ1, true>(w, *a, n, y, r0, r1) : rows_fam<kFamQ1, false>(w, *a, n, y, r0, r1);
    case Format::kQ2_0:
      return gf ? rows_fam<kFamG64, true>(w, *a, n, y, r0, r1)
                        : rows_fam<kFamG64, false>(w, *a, n, y, r0, r1);
    case Format::kQ2_0G128D:
      return gf ? rows_fam<kFamG128D, true>(w, *a, n, y, r0, r1)
                        : rows_fam<kFamG128D, false>(w, *a, n, y, r0, r1);
    case Format::kQ2_0G128Qs:
      return gf ? rows_fam<kFamG128Qs, true>(w, *a, n, y, r0, r1)
                        : rows_fam<kFamG128Qs, false>(w, *a, n, y, r0, r1);
  }
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
    _mm256_mask_storeu_epi16(dst + i, m,
                             _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT));
  }
}

}  // namespace

bool set_avx512_amx(bool enabled) {
  const bool prev = g_use_amx;
  g_use_amx = enabled;
  return prev;
}

bool set_avx512_gfni(bool enabled) {
  init_once();
  const bool prev = g_use_gfni;
  g_use_gfni = enabled;
  return prev;
}

const TierOps* avx512_ops() {
  static const TierOps ops{prepare,  rows,     dot_f32,       dot_f16_f32, axpy_f32,
                           axpy_f16, f32_to_f16, prepare_setup, prepare_cols};
  return &ops;
}

}  // namespace bonsai::kernels::detail

#else  // not x86-64 (or built without the tier's flags): tier absent

namespace bonsai::kernels::detail {
bool set_avx512_gfni(bool) { return false; }
bool set_avx512_amx(bool) { return false; }
const TierOps* avx512_ops() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
