// AVX2 tier (AVX2 + FMA + F16C). Compiled with its own ISA flags
// (src/kernels/CMakeLists.txt) and only called when kernels.cpp's CPUID check
// passes. Intrinsics and internal-linkage helpers only (see internal.h).
//
// Quantized weights (Q1_0, Q2_0 layouts) follow internal.h's canonical
// order exactly, bit-identical to the reference tier, with the "pair
// layout": two consecutive weight units (Q1_0 blocks, Q2_0 g64 blocks or
// g128 halves) per 256-bit vector Q (unit b in the low 128 bits, b+1 in the
// high), and the activations laid out so that plane m of Q (bit m of each
// packed byte for Q1_0, code m for Q2_0) meets the matching quants. Q1_0
// planes take one PSHUFB each (a 16-entry bit table indexed by the low or
// high nibble of every byte; was AND + MIN), Q2_0 codes one shift + AND.
// Dword lane L of a pair is then exactly one canonical chunk (32 weights
// of Q1_0, 16 of Q2_0), chunk 8p + L of the row, and pairs alternate
// between two fp32 accumulators (canonical lanes 0-7 and 8-15; the pair
// loop is unrolled by two so that both stay in registers). The g128
// layouts run per 64-weight half with codes remapped 3 -> 1 (value 0), so
// they equal their g64 twin bit for bit.
// GEMV runs two rows at a time; batches one row x up to four columns, rows
// blocked by 32 against column tiles of 64 (same operations per column, so
// batch invariant).
// On CPUs with AVX-VNNI (Alder Lake and later client parts without AVX-512)
// the integer sums use VPDPBUSD instead of PMADDUBSW + PMADDWD (the code in
// avx2_rows.inc is compiled twice; same integer sums, bit-identical
// results). Q8_0 weights: natural order, the canonical Q8_0 order.
// PTQ1_0 blocks are decoded to int8 digits in registers (avx2_trit.inc) and
// meet the natural-order quants; same canonical order, bit-identical.
// Q1_0 matrices packed as avx2-tile16 (packing_for gives them to this tier on
// CPUs without AVX-VNNI) run the table-lookup kernel of avx2_tile.inc
// instead, on tables built from the natural-order quants; bit-identical.
#include "core/cpu_features.h"  // cpu_features
#include "kernels/internal.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace bonsai::kernels::detail {
namespace {

alignas(64) float g_fp16_lut[65536];

bool g_has_vnni = false;  // CPUID says AVX-VNNI (VEX-encoded VPDPBUSD)
bool g_use_vnni = true;   // test hook (set_avx2_vnni)

void init_tables() {
  g_has_vnni = core::cpu_features().avx_vnni;
  for (int i = 0; i < 65536; i += 8) {
    alignas(16) uint16_t h[8];
    for (int k = 0; k < 8; ++k) h[k] = static_cast<uint16_t>(i + k);
    _mm256_store_ps(g_fp16_lut + i, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h))));
  }
}

void init_once() {
  static const bool done = (init_tables(), true);
  (void)done;
}

// Products use VPDPBUSD (the vnni namespace below) when the CPU has AVX-VNNI.
bool use_vnni() {
  init_once();
  return g_has_vnni && g_use_vnni;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

inline float lut_fp16(const uint8_t* p) { return g_fp16_lut[load_u16(p)]; }

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The 1- and 2-bit kernels are templates over the Format (formats.h), their
// geometry UnitGeo<F>: unit b of a row (a block; a 64-weight half for g128)
// has its packed weights at UnitGeo<F>::qs_at and its fp16 scale at d_at.

struct Consts {
  __m256i nib;     // 0x0F in every byte
  __m256i tab[4];  // Q1: PSHUFB table of plane m: byte n (0..15) = (n >> m) & 1, both lanes
  __m256i three8, one16, two16, odd;
};

Consts make_consts() {
  Consts c;
  c.nib = _mm256_set1_epi8(0x0F);
  for (int m = 0; m < 4; ++m) {
    alignas(32) uint8_t t[32];
    for (int n = 0; n < 32; ++n) t[n] = static_cast<uint8_t>(((n & 15) >> m) & 1);
    c.tab[m] = _mm256_load_si256(reinterpret_cast<const __m256i*>(t));
  }
  c.three8 = _mm256_set1_epi8(3);
  c.one16 = _mm256_set1_epi16(1);
  c.two16 = _mm256_set1_epi16(2);
  c.odd = _mm256_set1_epi8(static_cast<char>(0xAA));
  return c;
}

// Loads the packed bytes of a pair of units (b, b+1) of a row into Q (unit
// b in the low 128 bits, b+1 in the high; `half`: only unit b exists, the
// high half is zero) and their scales into the lanes (0-3: b, 4-7: b+1; 0
// for a missing unit). g128 codes are remapped 3 -> 1 (value 0).
// Formats whose block is two units (the g128 layouts, PQ2_0) keep a pair in
// one block: its 32 packed bytes are contiguous and share one scale, so the
// pair is one 256-bit load and one broadcast (never `half`: such rows have an
// even number of units). Same bytes and scales as the unit-wise loads.
template <Format F>
inline void pload(const uint8_t* row, int64_t b, bool half, const Consts& c, __m256i& q, __m256& dw) {
  if constexpr (UnitGeo<F>::kPerBlock == 2) {
    (void)half;
    const uint8_t* blk = row + static_cast<size_t>(b >> 1) * UnitGeo<F>::kBytes;
    q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + UnitGeo<F>::kQs));
    if constexpr (kDef<F>.code3_is_zero) q = _mm256_andnot_si256(_mm256_and_si256(_mm256_slli_epi16(q, 1), c.odd), q);
    dw = _mm256_broadcast_ss(&g_fp16_lut[load_u16(blk + UnitGeo<F>::kD)]);
    return;
  }
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(UnitGeo<F>::qs_at(row, b)));
  const __m128i hi =
      half ? _mm_setzero_si128() : _mm_loadu_si128(reinterpret_cast<const __m128i*>(UnitGeo<F>::qs_at(row, b + 1)));
  q = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  if constexpr (kDef<F>.code3_is_zero) {
    // Clear bit 1 of every 2-bit field whose bit 0 is set (3 -> 1).
    q = _mm256_andnot_si256(_mm256_and_si256(_mm256_slli_epi16(q, 1), c.odd), q);
  }
  const float d0 = lut_fp16(UnitGeo<F>::d_at(row, b)), d1 = half ? 0.0f : lut_fp16(UnitGeo<F>::d_at(row, b + 1));
  dw = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(d0)), _mm_set1_ps(d1), 1);
}

// The packed weights of a pair, split for plane extraction: Q1_0 keeps the
// low and high nibble of every byte (each a PSHUFB index), Q2_0 the bytes.
struct PQ {
  __m256i a, b;
};

template <Format F>
inline PQ psplit(__m256i q, const Consts& c) {
  if constexpr (kDef<F>.family == Family::kSign) {
    return PQ{_mm256_and_si256(q, c.nib), _mm256_and_si256(_mm256_srli_epi16(q, 4), c.nib)};
  } else {
    return PQ{q, q};
  }
}

// Weight bytes of plane m of Q: Q1_0 bit m (0/1; one PSHUFB of a nibble,
// cheaper than AND + MIN), Q2_0 code m (0..3; one shift + AND).
template <Format F>
inline __m256i pplane(const PQ& q, int m, const Consts& c) {
  if constexpr (kDef<F>.family == Family::kSign) {
    return _mm256_shuffle_epi8(c.tab[m & 3], m < 4 ? q.a : q.b);
  } else {
    // 16-bit shifts: the low two bits of each byte come from that byte (2m <= 6).
    return _mm256_and_si256(_mm256_srli_epi16(q.a, 2 * m), c.three8);
  }
}

namespace plain {
#define BONSAI_AVX2_VNNI 0
#include "kernels/avx2_rows.inc"
#undef BONSAI_AVX2_VNNI
}  // namespace plain

// Same code with VPDPBUSD; only called when CPUID says AVX-VNNI.
#pragma GCC push_options
#pragma GCC target("avxvnni")
namespace vnni {
#define BONSAI_AVX2_VNNI 1
#include "kernels/avx2_rows.inc"
#undef BONSAI_AVX2_VNNI
}  // namespace vnni
#pragma GCC pop_options

#include "kernels/avx2_tile.inc"
#include "kernels/avx2_trit.inc"

void rows_q8(const MatrixView& w, const QuantAct& a, int64_t n, float* y, int64_t r0, int64_t r1) {
  const int64_t nb = w.cols / 32;
  const __m256i one16 = _mm256_set1_epi16(1);
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
        // |w| * sign(w) x: pmaddubsw pairs are at most 2 * 128 * 127, no saturation.
        const __m256i s =
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv)), one16);
        const __m256 sc = _mm256_set1_ps(lut_fp16(blk) * xd[b]);
        if (b & 1) {
          acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sc, acc1);
        } else {
          acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sc, acc0);
        }
      }
      y[j * w.rows + r] = hsum8(_mm256_add_ps(acc0, acc1));
    }
  }
}

inline __m256 load8_f32(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
inline __m256 load8_f16(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8_bf16(const uint8_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
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

template <int kEs, __m256 (*Load)(const uint8_t*), float (*Scalar)(const uint8_t*)>
void rows_float(const MatrixView& w, const float* x, int64_t n, float* y, int64_t r0, int64_t r1) {
  const int64_t cols = w.cols;
  const int64_t c32 = cols & ~int64_t{31};
  const int64_t c8 = cols & ~int64_t{7};
  for (int64_t r = r0; r < r1; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_stride;
    for (int64_t j = 0; j < n; ++j) {
      const float* xj = x + j * cols;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      int64_t cc = 0;
      for (; cc < c32; cc += 32) {
        a0 = _mm256_fmadd_ps(Load(row + cc * kEs), _mm256_loadu_ps(xj + cc), a0);
        a1 = _mm256_fmadd_ps(Load(row + (cc + 8) * kEs), _mm256_loadu_ps(xj + cc + 8), a1);
        a2 = _mm256_fmadd_ps(Load(row + (cc + 16) * kEs), _mm256_loadu_ps(xj + cc + 16), a2);
        a3 = _mm256_fmadd_ps(Load(row + (cc + 24) * kEs), _mm256_loadu_ps(xj + cc + 24), a3);
      }
      for (; cc < c8; cc += 8) a0 = _mm256_fmadd_ps(Load(row + cc * kEs), _mm256_loadu_ps(xj + cc), a0);
      float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
      for (; cc < cols; ++cc) s += Scalar(row + cc * kEs) * xj[cc];
      y[j * w.rows + r] = s;
    }
  }
}

// Q8_0 quantization bit-identical to quantize_act_ref (see avx512.cpp).
void quantize_act(const float* x, int64_t cols, int8_t* q, float* d) {
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + 32 * b;
    const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8), v2 = _mm256_loadu_ps(xb + 16),
                 v3 = _mm256_loadu_ps(xb + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, sign), _mm256_and_ps(v1, sign)),
                             _mm256_max_ps(_mm256_and_ps(v2, sign), _mm256_and_ps(v3, sign)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float dd = amax / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), _mm256_permutevar8x32_epi32(p, perm));
    d[b] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(dd), _MM_FROUND_TO_NEAREST_INT)));
  }
}

void prepare(Format f, const float* x, int64_t n, int64_t cols, QuantAct& a) {
  init_once();
  a.resize(n, cols);
  // Q1_0 weights packed as avx2-tile16 read tables built from q and d alone
  // (avx2_tile.inc); when every matrix of the product is (lut_only), the
  // pair layout below is not built.
  a.lut_ready = a.want_lut && f == Format::kQ1_0;
  const bool pair_layout = !(a.lut_ready && a.lut_only);
  // (Every Q2_0 layout runs per 64-weight unit, as g64.)
  const Family fam = format_def(f).family;
  // Pair layout (see "Pair layout" above): per column, np pairs of
  // X[planes][32] (byte 16h + i of plane m: element 8i + m (Q1_0) or
  // 4i + m (Q2_0) of unit 2p + h), then per chunk its negated quant sum and
  // its activation scale. A missing second unit of a last pair is zero.
  const bool q1 = fam == Family::kSign;
  const int E = q1 ? 128 : 64, W = q1 ? 32 : 16, P = q1 ? 8 : 4;
  const int64_t units = cols / E, np = (units + 1) / 2;
  const int64_t xs = np * P * 32, ls = np * 8, chunks = cols / W;
  for (int64_t j = 0; j < n; ++j) {
    int8_t* q = a.q + j * cols;
    float* d = a.d + j * (cols / 32);
    quantize_act(x + j * cols, cols, q, d);
    if (fam == Family::kTrit) {
      // PTQ1_0 reads q in natural order (avx2_trit.inc) and its own lane order.
      trit_lanes(q, d, cols, a.lane_neg + j * ls, a.lane_d + j * ls);
      continue;
    }
    if ((fam != Family::kSign && fam != Family::kCode2) || !pair_layout) continue;
    int8_t* xp = a.qp + j * xs;
    int32_t* neg = a.lane_neg + j * ls;
    float* dl = a.lane_d + j * ls;
    std::memset(xp, 0, static_cast<size_t>(xs));
    for (int64_t u = 0; u < units; ++u) {
      int8_t* xu = xp + (u / 2) * (P * 32) + (u % 2) * 16;
      const int8_t* qu = q + u * E;
      for (int m = 0; m < P; ++m)
        for (int i = 0; i < 16; ++i) xu[m * 32 + i] = qu[q1 ? 8 * i + m : 4 * i + m];
    }
    for (int64_t ch = 0; ch < ls; ++ch) {
      int32_t sum = 0;
      if (ch < chunks)
        for (int e = 0; e < W; ++e) sum += q[ch * W + e];
      neg[ch] = -sum;
      dl[ch] = ch < chunks ? d[ch * W / 32] : 0.0f;
    }
  }
}

void rows(const MatrixView& w, const float* x, const QuantAct* a, int64_t n, float* y, int64_t r0, int64_t r1) {
  init_once();
  visit_format(w.format, [&](auto fc) {
    constexpr Format F = fc.value;
    if constexpr (F == Format::kF32) {
      rows_float<4, load8_f32, scalar_f32>(w, x, n, y, r0, r1);
    } else if constexpr (F == Format::kF16) {
      rows_float<2, load8_f16, scalar_f16>(w, x, n, y, r0, r1);
    } else if constexpr (F == Format::kBF16) {
      rows_float<2, load8_bf16, scalar_bf16>(w, x, n, y, r0, r1);
    } else if constexpr (F == Format::kQ8_0) {
      rows_q8(w, *a, n, y, r0, r1);
    } else if constexpr (kDef<F>.family == Family::kTrit) {
      rows_trit(w, *a, n, y, r0, r1);
    } else if constexpr (kHasUnits<F>) {
      // (Rows past kAvx2TileMaxUnits are never so packed; the guard keeps a
      // hand-made view off the kernel's fixed-size scale array.)
      if (F == Format::kQ1_0 && w.packing == Packing::kAvx2Tile16 && w.packed != nullptr && a->lut_ready &&
          w.cols / 128 <= kAvx2TileMaxUnits) {
        rows_tile_avx2(w, *a, n, y, r0, r1);
        return;
      }
      // (Without tables, a packed matrix's stored bytes: prepare then built the pair layout.)
      if (use_vnni()) {
        vnni::rows_fam<F>(w, *a, n, y, r0, r1);
      } else {
        plain::rows_fam<F>(w, *a, n, y, r0, r1);
      }
    }
  });
}

float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  float s = hsum8(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

float dot_f16_f32(const uint16_t* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i))),
                         _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 8))),
                         _mm256_loadu_ps(b + i + 8), s1);
  }
  float s = hsum8(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += g_fp16_lut[a[i]] * b[i];
  return s;
}

void axpy_f32(float alpha, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * x[i];
}

void axpy_f16(float alpha, const uint16_t* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * g_fp16_lut[x[i]];
}

void f32_to_f16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) {
    dst[i] = static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(src[i]), _MM_FROUND_TO_NEAREST_INT), 0));
  }
}

// The float helpers may run before any gemv (LUT for scalar tails).
float dot_f16_f32_entry(const uint16_t* a, const float* b, int64_t n) {
  init_once();
  return dot_f16_f32(a, b, n);
}
void axpy_f16_entry(float alpha, const uint16_t* x, float* y, int64_t n) {
  init_once();
  axpy_f16(alpha, x, y, n);
}

}  // namespace

bool set_avx2_vnni(bool enabled) {
  init_once();
  const bool prev = g_use_vnni;
  g_use_vnni = enabled;
  return prev;
}

bool avx2_vnni_in_use() { return use_vnni(); }

// tdecode's four vectors hold a block's digits in weight order (R_k byte i =
// weight 32 k + i), which is PQ2_0's order too: PMADDUBSW by bytes (1, 4)
// and PMADDWD by words (1, 16) make each dword t0 + 4 t1 + 16 t2 + 64 t3 of
// four consecutive weights (<= 170), i.e. PQ2_0 byte i of R_k = byte 8 k + i;
// two saturating packs (no value saturates) and one dword permutation put
// the 32 bytes in order. ~35 instructions per block against the scalar
// form's ~150 (bench/results/ptq1-load-2026-12-07-zen5.txt).
void transcode_ptq1_0_row_avx2(const uint8_t* src, uint8_t* dst, int64_t blocks) {
  static const TritConsts c = make_trit_consts();
  const __m256i m14 = _mm256_set1_epi16(0x0401);       // bytes (1, 4)
  const __m256i m116 = _mm256_set1_epi32(0x00100001);  // words (1, 16)
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* in = src + b * 28;
    uint8_t* out = dst + b * 34;
    // The file's pages stream from the page cache: 2 KiB ahead took the 27B
    // repack from ~4.1 to ~3.1 s (bench/results/ptq1-load-2026-12-07-zen5.txt).
    _mm_prefetch(reinterpret_cast<const char*>(in + 2048), _MM_HINT_T0);
    __m256i t[4];
    tdecode(in, c, t);
    __m256i d[4];
    for (int k = 0; k < 4; ++k) d[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(t[k], m14), m116);
    // Per 128-bit half: packs gives [d0 | d1] and [d2 | d3] words, packus
    // [d0 d1 d2 d3] bytes, dwords 0..3 from the low halves, 4..7 the high.
    const __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(d[0], d[1]), _mm256_packs_epi32(d[2], d[3]));
    std::memcpy(out, in + 26, 2);  // d: the file's fp16 bits
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2), _mm256_permutevar8x32_epi32(bytes, order));
  }
}

const TierOps* avx2_ops() {
  static const TierOps ops{prepare,        rows,       dot_f32, dot_f16_f32_entry, axpy_f32,
                           axpy_f16_entry, f32_to_f16, nullptr, nullptr,           kAvx2TierFormats};
  return &ops;
}

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
bool set_avx2_vnni(bool) { return false; }
bool avx2_vnni_in_use() { return false; }
void transcode_ptq1_0_row_avx2(const uint8_t* src, uint8_t* dst, int64_t blocks) {
  transcode_ptq1_0_row_scalar(src, dst, blocks);  // (never chosen: tier_supported(kAvx2) is false here)
}
const TierOps* avx2_ops() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
