// AMX-INT8 GEMM for quantized weights (Q1_0 and the Q2_0 layouts), used by
// the AVX-512 tier for batches of >= kAmxMinCols activation vectors (prefill,
// batched decode) on CPUs with AMX (Sapphire Rapids and later). Compiled with
// its own ISA flags; intrinsics and internal-linkage helpers only.
//
// Arithmetic is internal.h's scheme, computed with tiles:
//   C[m][c] = sum_{t<32} A[m][t] * B[t][c]   (TDPBUSD, K = 32, exact int32)
// for weight rows m (16 per tile), activation columns c (16 per group) and
// one 32-value activation sub-block s. A holds the weights expanded to bytes
// (Q1_0: 2*bit; Q2_0: the 2-bit code), B the int8 activations in TDPBUSD's
// VNNI layout. The integer sum the reference uses is C - T (T = the
// column's sum of quants over the sub-block: 2*bit - 1 = +-1, code - 1 =
// the ternary value), so per block and column the fp32 read-out is
//   F = sum_k dx_k * C_k - sum_k dx_k * T_k,   y += dw * F,
// with the second sum precomputed per (block, column) by amx_prepare.
//
// The g128 Q2_0 layouts run per 64-weight half (the block's d, codes
// remapped 3 -> 1), exactly as a g64 block, so their results are
// bit-identical to the equivalent g64 matrix (blocks paired with equal d).
//
// Element order inside a sub-block (K index t): natural for Q1_0; for the
// Q2_0 layouts t holds element 4*(t%8) + t/8, which lets a broadcast qword
// of codes expand with one GF2P8AFFINEQB (each byte's code is bits
// 2*(t/8)..+1 of code byte t%8).
#include "kernels/internal.h"

#if defined(__x86_64__) && defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512VBMI__)

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "core/cpu_features.h"

namespace bonsai::kernels::detail {
namespace {

constexpr long kArchReqXcompPerm = 0x1023;  // linux/arch/x86/include/uapi/asm/prctl.h
constexpr long kXfeatureXtiledata = 18;

bool request_amx() {
  if (!core::cpu_features().amx_int8) return false;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// Tile configuration (palette 1): tmm0..3 = C (16 x 64 B), tmm4/5 = A
// (16 x 32 B), tmm6/7 = B (8 x 64 B).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

TileConfig make_config() {
  TileConfig c;
  std::memset(&c, 0, sizeof(c));
  c.palette_id = 1;
  for (int t : {0, 1, 2, 3}) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  for (int t : {4, 5}) {
    c.rows[t] = 16;
    c.colsb[t] = 32;
  }
  for (int t : {6, 7}) {
    c.rows[t] = 8;
    c.colsb[t] = 64;
  }
  return c;
}

enum Fam : int { kFamQ1 = 0, kFamG64 = 1, kFamG128D = 2, kFamG128Qs = 3 };

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

// Bytes of a row of nb units when rows are packed back to back.
template <int F>
inline size_t packed_row_bytes(int64_t nb) {
  return is_g128(F) ? static_cast<size_t>(nb / 2) * Geo<F>::kBytes : static_cast<size_t>(nb) * Geo<F>::kBytes;
}

struct Consts {
  __m512i gf;     // qword Q: out bits 0,1 = src bits 2*(Q%4), 2*(Q%4)+1
  __m512i two, remap;
  __m512i lo_idx;  // qword permute [q0 x4, q1 x4]
};

Consts make_consts() {
  Consts c;
  alignas(64) uint64_t g[8];
  for (int q = 0; q < 8; ++q) {
    const int l = q % 4;
    g[q] = (static_cast<uint64_t>(1u << (2 * l)) << 56) | (static_cast<uint64_t>(1u << (2 * l + 1)) << 48);
  }
  c.gf = _mm512_load_si512(g);
  c.two = _mm512_set1_epi8(2);
  c.remap = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2, 1));
  c.lo_idx = _mm512_setr_epi64(0, 0, 0, 0, 1, 1, 1, 1);
  return c;
}

// Expands one row's unit (qs: its sign/code bytes) into E bytes at dst (one
// sub-block per 32 bytes).
template <int F>
inline void expand_row(const uint8_t* qs, uint8_t* dst, const Consts& c) {
  if constexpr (F == kFamQ1) {
    uint64_t m0, m1;
    std::memcpy(&m0, qs, 8);
    std::memcpy(&m1, qs + 8, 8);
    _mm512_store_si512(dst, _mm512_maskz_mov_epi8(_cvtu64_mask64(m0), c.two));
    _mm512_store_si512(dst + 64, _mm512_maskz_mov_epi8(_cvtu64_mask64(m1), c.two));
  } else {
    const __m512i q = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    __m512i w = _mm512_gf2p8affine_epi64_epi8(_mm512_permutexvar_epi64(c.lo_idx, q), c.gf, 0);
    if constexpr (is_g128(F)) w = _mm512_shuffle_epi8(c.remap, w);  // code 3 -> 1 (value 0)
    _mm512_store_si512(dst, w);
  }
}

// Column groups whose y accumulators (16 x 16 floats each) stay in L1 while
// one 16-row tile streams its blocks once.
constexpr int kMaxGroupsPerPass = 4;
// Row tiles (of 16 rows) that advance together through the blocks.
constexpr int kTilesPerPass = 4;

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// One (block, group) step issues the block's kSubs tile products into C
// tiles tmm0..3 (one per sub-block; A alternates tmm4/5, B tmm6/7) and stores
// them to a cbuf half; the read-out of group g runs while the tile unit
// works on group g+1 (cbuf is double-buffered over groups).
// (Tile numbers must be literals: the intrinsics paste them into asm.)
#define BONSAI_AMX_SUB(K, TA, TB)                                             \
  if ((K) < kSubs) {                                                          \
    const int64_t gs_ = g * S + b * kSubs + (K);                              \
    _tile_loadd(TA, ascr + 32 * (K), E);                                      \
    _tile_loadd(TB, a.amx_b + gs_ * 512, 64);                                 \
    _tile_zero(K);                                                            \
    _tile_dpbusd(K, TA, TB);                                                  \
    _tile_stored(K, cb[K], 64);                                               \
  }

template <int F>
void rows_fam(const MatrixView& w, const QuantAct& a, int64_t n, float* y, int64_t r0, int64_t r1) {
  static const Consts c = make_consts();
  static const TileConfig cfg = make_config();
  constexpr int E = Geo<F>::kElems;
  constexpr int kSubs = E / 32;
  const int64_t nb = w.cols / E;
  const int64_t S = w.cols / 32;
  const int64_t G = a.amx_groups;
  // Up to kTilesPerPass row tiles advance block by block together, so each
  // block's B tiles (activations, kSubs x groups x 512 B) are loaded from L1
  // for every tile instead of streaming the whole B buffer per tile.
  alignas(64) uint8_t ascr_buf[kTilesPerPass][16 * 128];
  alignas(64) float dw_buf[kTilesPerPass][16];
  alignas(64) int32_t cbuf[2][4][256];
  alignas(64) float ybuf[kTilesPerPass][kMaxGroupsPerPass][16][16];
  _tile_loadconfig(&cfg);
  for (int64_t rp = r0; rp < r1; rp += 16 * kTilesPerPass) {
    const int64_t rp_end = rp + 16 * kTilesPerPass < r1 ? rp + 16 * kTilesPerPass : r1;
    const int nt = static_cast<int>((rp_end - rp + 15) / 16);
    std::memset(ascr_buf, 0, sizeof(ascr_buf));
    std::memset(dw_buf, 0, sizeof(dw_buf));
    for (int64_t g0 = 0; g0 < G; g0 += kMaxGroupsPerPass) {
      const int64_t g1 = g0 + kMaxGroupsPerPass < G ? g0 + kMaxGroupsPerPass : G;
      for (int t = 0; t < nt; ++t)
        for (int64_t g = g0; g < g1; ++g)
          for (int m = 0; m < 16; ++m) _mm512_store_ps(ybuf[t][g - g0][m], _mm512_setzero_ps());
      // Prefetch the next pass's rows (contiguous when the rows are packed),
      // a slice per block, while this pass computes.
      const int64_t next_end = rp_end + 16 * kTilesPerPass < r1 ? rp_end + 16 * kTilesPerPass : r1;
      const bool packed = w.row_stride == packed_row_bytes<F>(nb);
      const size_t pf_bytes = packed && g1 == G ? static_cast<size_t>(next_end - rp_end) * w.row_stride : 0;
      const size_t pf_step = (pf_bytes / static_cast<size_t>(nb) + 63) / 64 * 64;
      const uint8_t* pf_base = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(rp_end) * w.row_stride;
      for (int64_t b = 0; b < nb; ++b) {
        for (size_t o = static_cast<size_t>(b) * pf_step; o < pf_bytes && o < static_cast<size_t>(b + 1) * pf_step; o += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(pf_base + o), _MM_HINT_T0);
        }
        for (int t = 0; t < nt; ++t) {
          const int64_t rt = rp + 16 * t;
          const int mrows = static_cast<int>(rp_end - rt < 16 ? rp_end - rt : 16);
          for (int m = 0; m < mrows; ++m) {
            const uint8_t* rowm = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(rt + m) * w.row_stride;
            expand_row<F>(qs_at<F>(rowm, b), ascr_buf[t] + m * E, c);
            dw_buf[t][m] = half_to_float(d_at<F>(rowm, b));
          }
        }
        for (int t = 0; t < nt; ++t) {
          const uint8_t* ascr = ascr_buf[t];
          const float* dw = dw_buf[t];
          for (int64_t g = g0; g < g1; ++g) {
            int32_t(*cb)[256] = cbuf[g & 1];
            BONSAI_AMX_SUB(0, 4, 6)
            BONSAI_AMX_SUB(1, 5, 7)
            BONSAI_AMX_SUB(2, 4, 6)
            BONSAI_AMX_SUB(3, 5, 7)
            // F = -sum_k dx_k T_k + sum_k dx_k C_k, per row m (16 columns per vector).
            __m512 fa[16];
            const __m512 negh = _mm512_load_ps(a.amx_negh + (g * S + b) * 16);
            for (int m = 0; m < 16; ++m) fa[m] = negh;
            for (int k = 0; k < kSubs; ++k) {
              const __m512 dxv = _mm512_load_ps(a.amx_dx + (g * S + b * kSubs + k) * 16);
              for (int m = 0; m < 16; ++m) {
                fa[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[k] + 16 * m)), dxv, fa[m]);
              }
            }
            float(*yb)[16] = ybuf[t][g - g0];
            for (int m = 0; m < 16; ++m) {
              _mm512_store_ps(yb[m], _mm512_fmadd_ps(fa[m], _mm512_set1_ps(dw[m]), _mm512_load_ps(yb[m])));
            }
          }
        }
      }
      for (int t = 0; t < nt; ++t) {
        const int64_t rt = rp + 16 * t;
        const int mrows = static_cast<int>(rp_end - rt < 16 ? rp_end - rt : 16);
        for (int64_t g = g0; g < g1; ++g) {
          for (int cc = 0; cc < 16; ++cc) {
            const int64_t j = 16 * g + cc;
            if (j >= n) break;
            for (int m = 0; m < mrows; ++m) y[j * w.rows + rt + m] = ybuf[t][g - g0][m][cc];
          }
        }
      }
    }
  }
  _tile_release();
}

#undef BONSAI_AMX_SUB

}  // namespace

bool amx_usable() {
  static const bool ok = request_amx();
  return ok;
}

bool amx_supports(Format f) {
  return f == Format::kQ1_0 || f == Format::kQ2_0 || f == Format::kQ2_0G128D || f == Format::kQ2_0G128Qs;
}

void amx_setup(QuantAct& a) {
  const int64_t n = a.n, S = a.cols / 32;
  const int64_t G = (n + 15) / 16;
  a.resize_amx(G);
  // Padding columns of the last group: zero activations and scales.
  for (int64_t j = n; j < 16 * G; ++j) {
    const int64_t g = j / 16, cc = j % 16;
    for (int64_t s = 0; s < S; ++s) {
      int8_t* bt = a.amx_b + (g * S + s) * 512;
      for (int r = 0; r < 8; ++r) std::memset(bt + r * 64 + 4 * cc, 0, 4);
      a.amx_dx[(g * S + s) * 16 + cc] = 0.0f;
      a.amx_negh[(g * S + s) * 16 + cc] = 0.0f;
    }
  }
  a.amx_ready = true;
}

void amx_fill_columns(Format f, QuantAct& a, int64_t j0, int64_t j1) {
  const int64_t cols = a.cols, S = cols / 32;
  const bool natural = f == Format::kQ1_0;
  const int64_t subs = natural ? 4 : 2;  // sub-blocks per weight unit (g128: per half)
  // K-index t of a sub-block -> element offset within the sub-block.
  alignas(32) uint8_t perm[32];
  for (int t = 0; t < 32; ++t) perm[t] = static_cast<uint8_t>(natural ? t : 4 * (t % 8) + t / 8);
  const __m256i pv = _mm256_load_si256(reinterpret_cast<const __m256i*>(perm));
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t g = j / 16, cc = j % 16;
    float negh = 0.0f;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t gs = g * S + s;
      int8_t* bt = a.amx_b + gs * 512;
      const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + j * cols + 32 * s));
      const __m256i qp = _mm256_permutexvar_epi8(pv, qv);
      alignas(32) int32_t dw8[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(dw8), qp);
      for (int r = 0; r < 8; ++r) std::memcpy(bt + r * 64 + 4 * cc, &dw8[r], 4);
      // Sum of the 32 quants: sad of (q ^ 0x80) against 0, minus 32 * 128.
      const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(qv, bias), _mm256_setzero_si256());
      const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
      const int64_t tot = _mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1) - 32 * 128;
      const float dx = a.d[j * S + s];
      a.amx_dx[gs * 16 + cc] = dx;
      negh -= dx * static_cast<float>(tot);
      if (s % subs == subs - 1) {  // last sub-block of weight block s / subs
        a.amx_negh[(g * S + s / subs) * 16 + cc] = negh;
        negh = 0.0f;
      }
    }
  }
}

void amx_rows(const MatrixView& w, const QuantAct& a, int64_t n, float* y, int64_t r0, int64_t r1) {
  switch (w.format) {
    case Format::kQ1_0: return rows_fam<kFamQ1>(w, a, n, y, r0, r1);
    case Format::kQ2_0: return rows_fam<kFamG64>(w, a, n, y, r0, r1);
    case Format::kQ2_0G128D: return rows_fam<kFamG128D>(w, a, n, y, r0, r1);
    case Format::kQ2_0G128Qs: return rows_fam<kFamG128Qs>(w, a, n, y, r0, r1);
    default: return;
  }
}

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
bool amx_usable() { return false; }
bool amx_supports(Format) { return false; }
void amx_setup(QuantAct&) {}
void amx_fill_columns(Format, QuantAct&, int64_t, int64_t) {}
void amx_rows(const MatrixView&, const QuantAct&, int64_t, float*, int64_t, int64_t) {}
}  // namespace bonsai::kernels::detail

#endif
