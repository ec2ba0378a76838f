// AMX-INT8 GEMM for quantized weights (Q1_0 and the Q2_0 layouts), used by
// the AVX-512 tier for batches of >= kAmxMinCols activation vectors (prefill,
// batched decode) on CPUs with AMX (Sapphire Rapids and later). Compiled with
// its own ISA flags; intrinsics and internal-linkage helpers only.
//
// Arithmetic is internal.h's canonical order, so results are bit-identical
// to the VNNI paths and the reference for every n (batch invariance). Per
// canonical chunk c (32 weights of Q1_0, 16 of Q2_0; four per weight unit)
// one tile product gives, for weight rows m (16 per tile) and activation
// columns cc (16 per group),
//   C[m][cc] = sum_{t in chunk} A[m][t] * B[t][cc]   (TDPBUSD, exact int32)
// with A the weights expanded to bytes (Q1_0: 2*bit; Q2_0: the code, g128
// code 3 -> 1) and B the int8 quants in TDPBUSD's VNNI layout, both in
// natural element order. isum = C - T (T = the column's sum of the chunk's
// quants: 2*bit - 1 = +-1, code - 1 = the ternary value), exact. The
// read-out then runs the canonical fp32 operations, vectorised over the 16
// columns of a group:
//   lane[m][c mod 16] = fma(fl(float(isum) * dx_c), dw_m, lane[m][c mod 16])
// and after the last block the canonical 16-lane tree per (row, column).
// The lane of a chunk is its position in the row (16 * ... + c mod 16),
// never the tile, pass or thread, so any split gives the same bits.
// (This path cannot run on the development machines without AMX; its
// arithmetic is the reference's operation for operation by construction.)
//
// The g128 Q2_0 layouts run per 64-weight half (the block's d, codes
// remapped 3 -> 1), exactly as a g64 block, so their results are
// bit-identical to the equivalent g64 matrix (blocks paired with equal d).
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

// Tile configuration (palette 1): tmm0..3 = C (16 x 64 B, one per chunk of
// a unit), tmm4/5 = A (16 rows x one chunk of weight bytes: 32 B for Q1_0,
// 16 B for Q2_0), tmm6/7 = B (one chunk of K rows x 64 B: 8 / 4 rows).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

TileConfig make_config(int chunk_bytes) {
  TileConfig c;
  std::memset(&c, 0, sizeof(c));
  c.palette_id = 1;
  for (int t : {0, 1, 2, 3}) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  for (int t : {4, 5}) {
    c.rows[t] = 16;
    c.colsb[t] = static_cast<uint16_t>(chunk_bytes);
  }
  for (int t : {6, 7}) {
    c.rows[t] = static_cast<uint8_t>(chunk_bytes / 4);
    c.colsb[t] = 64;
  }
  return c;
}

// The kernels are templates over the Format (formats.h), geometry UnitGeo<F>.
// Packed weights and fp16 scale of unit b (a block; a 64-weight half for
// g128) of a row.

struct Consts {
  __m512i two, one;
  __m512i byte_idx;        // Q2: byte j <- packed byte j / 4
  __m512i lo_bit, hi_bit;  // Q2: bit 2 (j % 4) / 2 (j % 4) + 1 of byte j
};

Consts make_consts() {
  Consts c;
  alignas(64) uint8_t idx[64], lo[64], hi[64];
  for (int j = 0; j < 64; ++j) {
    idx[j] = static_cast<uint8_t>(j / 4);
    lo[j] = static_cast<uint8_t>(1u << (2 * (j % 4)));
    hi[j] = static_cast<uint8_t>(2u << (2 * (j % 4)));
  }
  c.two = _mm512_set1_epi8(2);
  c.one = _mm512_set1_epi8(1);
  c.byte_idx = _mm512_load_si512(idx);
  c.lo_bit = _mm512_load_si512(lo);
  c.hi_bit = _mm512_load_si512(hi);
  return c;
}

// Expands one row's unit (qs: its sign/code bytes) into E weight bytes at
// dst in natural element order (Q1_0: 2 * bit; Q2_0: code, g128 3 -> 1).
template <Format F>
inline void expand_row(const uint8_t* qs, uint8_t* dst, const Consts& c) {
  if constexpr (kDef<F>.family == Family::kSign) {
    uint64_t m0, m1;
    std::memcpy(&m0, qs, 8);
    std::memcpy(&m1, qs + 8, 8);
    _mm512_store_si512(dst, _mm512_maskz_mov_epi8(_cvtu64_mask64(m0), c.two));
    _mm512_store_si512(dst + 64, _mm512_maskz_mov_epi8(_cvtu64_mask64(m1), c.two));
  } else {
    const __m512i q = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    const __m512i b = _mm512_permutexvar_epi8(c.byte_idx, q);
    const __mmask64 lo = _mm512_test_epi8_mask(b, c.lo_bit), hi = _mm512_test_epi8_mask(b, c.hi_bit);
    __m512i w = _mm512_maskz_mov_epi8(lo, c.one);
    w = _mm512_mask_add_epi8(w, hi, w, c.two);                                         // code = lo + 2 hi
    if constexpr (kDef<F>.code3_is_zero) w = _mm512_mask_mov_epi8(w, lo & hi, c.one);  // 3 -> 1 (value 0)
    _mm512_store_si512(dst, w);
  }
}

// Column groups (of 16) whose lane accumulators (16 rows x 16 lanes x 16
// columns of fp32, 16 KiB per group) stay in L1 while a 16-row tile streams
// its blocks.
constexpr int kGroupsPerPass = 2;

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Chunk K (0..3) of the current unit for group g: A from the expanded rows,
// B from the activation tiles, C = A B into tmm K, stored to cb[K].
// (Tile numbers must be literals: the intrinsics paste them into asm.)
#define BONSAI_AMX_CHUNK(K, TA, TB)          \
  {                                          \
    _tile_loadd(TA, ascr + kChunk * (K), E); \
    _tile_loadd(TB, bchunk(g, b, K), 64);    \
    _tile_zero(K);                           \
    _tile_dpbusd(K, TA, TB);                 \
    _tile_stored(K, cb[K], 64);              \
  }

template <Format F>
void rows_fam(const MatrixView& w, const QuantAct& a, int64_t n, float* y, int64_t r0, int64_t r1) {
  static const Consts c = make_consts();
  constexpr int E = UnitGeo<F>::kElems;
  constexpr int kChunk = E / 4;  // weights per canonical chunk: 32 (Q1_0) or 16 (Q2_0)
  static const TileConfig cfg = make_config(kChunk);
  const int64_t nb = w.cols / E;
  const int64_t S = w.cols / 32, P16 = w.cols / 16;
  const int64_t G = a.amx_groups;
  // B tile of chunk k of unit b for group g: a sub-block's 8 x 64 B tile,
  // or (Q2_0) its rows 0-3 / 4-7 for the first / second 16 values.
  auto bchunk = [&](int64_t g, int64_t b, int k) -> const int8_t* {
    const int64_t e0 = b * E + k * kChunk;  // first element of the chunk
    return a.amx_b + (g * S + e0 / 32) * 512 + (e0 % 32) / 4 * 64;
  };
  alignas(64) uint8_t ascr[16 * 128];
  alignas(64) float dw[16];
  alignas(64) int32_t cb[4][256];
  alignas(64) float lanes[kGroupsPerPass][16][16][16];  // [group][row m][lane][column]
  _tile_loadconfig(&cfg);
  for (int64_t rt = r0; rt < r1; rt += 16) {
    const int mrows = static_cast<int>(r1 - rt < 16 ? r1 - rt : 16);
    for (int64_t g0 = 0; g0 < G; g0 += kGroupsPerPass) {
      const int64_t g1 = g0 + kGroupsPerPass < G ? g0 + kGroupsPerPass : G;
      std::memset(lanes, 0, sizeof(lanes));  // +0, the canonical start
      std::memset(ascr, 0, sizeof(ascr));
      std::memset(dw, 0, sizeof(dw));
      for (int64_t b = 0; b < nb; ++b) {
        for (int m = 0; m < mrows; ++m) {
          const uint8_t* rowm = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(rt + m) * w.row_stride;
          expand_row<F>(UnitGeo<F>::qs_at(rowm, b), ascr + m * E, c);
          dw[m] = half_to_float(UnitGeo<F>::d_at(rowm, b));
        }
        for (int64_t g = g0; g < g1; ++g) {
          BONSAI_AMX_CHUNK(0, 4, 6)
          BONSAI_AMX_CHUNK(1, 5, 7)
          BONSAI_AMX_CHUNK(2, 4, 6)
          BONSAI_AMX_CHUNK(3, 5, 7)
          float(*lg)[16][16] = lanes[g - g0];
          for (int k = 0; k < 4; ++k) {
            const int64_t ch = b * 4 + k;         // chunk index in the row
            const int64_t p0 = ch * kChunk / 16;  // its first 16-value piece
            __m512i t = _mm512_load_si512(a.amx_tsum + (g * P16 + p0) * 16);
            if constexpr (kChunk == 32) {
              t = _mm512_add_epi32(t, _mm512_load_si512(a.amx_tsum + (g * P16 + p0 + 1) * 16));
            }
            const __m512 dxv = _mm512_load_ps(a.amx_dx + (g * S + ch * kChunk / 32) * 16);
            float* lane_base = &lg[0][ch % 16][0];
            for (int m = 0; m < 16; ++m) {
              const __m512i isum = _mm512_sub_epi32(_mm512_load_si512(cb[k] + 16 * m), t);
              const __m512 tv = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), dxv);
              float* lp = lane_base + m * 256;
              _mm512_store_ps(lp, _mm512_fmadd_ps(tv, _mm512_set1_ps(dw[m]), _mm512_load_ps(lp)));
            }
          }
        }
      }
      // Canonical 16-lane tree per (row, column), 16 columns per vector.
      for (int64_t g = g0; g < g1; ++g) {
        for (int m = 0; m < mrows; ++m) {
          float(*lm)[16] = lanes[g - g0][m];
          __m512 a8[8], a4[4];
          for (int i = 0; i < 8; ++i) a8[i] = _mm512_add_ps(_mm512_load_ps(lm[i]), _mm512_load_ps(lm[i + 8]));
          for (int i = 0; i < 4; ++i) a4[i] = _mm512_add_ps(a8[i], a8[i + 4]);
          const __m512 sum = _mm512_add_ps(_mm512_add_ps(a4[0], a4[2]), _mm512_add_ps(a4[1], a4[3]));
          alignas(64) float out[16];
          _mm512_store_ps(out, sum);
          for (int cc = 0; cc < 16; ++cc) {
            const int64_t j = 16 * g + cc;
            if (j >= n) break;
            y[j * w.rows + rt + m] = out[cc];
          }
        }
      }
    }
  }
  _tile_release();
}

#undef BONSAI_AMX_CHUNK

}  // namespace

bool amx_usable() {
  static const bool ok = request_amx();
  return ok;
}

uint64_t amx_peak_loop(int64_t iters) {
  // tmm0..3: four independent int32 accumulators (16 x 64 B); tmm4/5: A
  // (16 rows x 64 B of u8); tmm6/7: B (16 rows x 64 B of s8): each TDPBUSD
  // is 16 x 16 x 64 multiply-adds, and the four chains cover its latency.
  TileConfig c;
  std::memset(&c, 0, sizeof(c));
  c.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  alignas(64) static thread_local uint8_t buf[16 * 64];
  std::memset(buf, 1, sizeof(buf));
  _tile_loadconfig(&c);
  _tile_loadd(4, buf, 64);
  _tile_loadd(5, buf, 64);
  _tile_loadd(6, buf, 64);
  _tile_loadd(7, buf, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  alignas(64) int32_t out[4][16 * 16];
  _tile_stored(0, out[0], 64);
  _tile_stored(1, out[1], 64);
  _tile_stored(2, out[2], 64);
  _tile_stored(3, out[3], 64);
  _tile_release();
  return static_cast<uint64_t>(out[0][0]) + static_cast<uint64_t>(out[1][17]) + static_cast<uint64_t>(out[2][34]) +
         static_cast<uint64_t>(out[3][255]);
}

bool amx_supports(Format f) {
  constexpr uint32_t kBits = family_bits(Family::kSign) | family_bits(Family::kCode2);  // rows_fam's formats
  return ((kBits >> static_cast<unsigned>(f)) & 1u) != 0;
}

void amx_setup(QuantAct& a) {
  const int64_t n = a.n, S = a.cols / 32, P16 = a.cols / 16;
  const int64_t G = (n + 15) / 16;
  a.resize_amx(G);
  // Padding columns of the last group: zero activations, sums and scales.
  for (int64_t j = n; j < 16 * G; ++j) {
    const int64_t g = j / 16, cc = j % 16;
    for (int64_t s = 0; s < S; ++s) {
      int8_t* bt = a.amx_b + (g * S + s) * 512;
      for (int r = 0; r < 8; ++r) std::memset(bt + r * 64 + 4 * cc, 0, 4);
      a.amx_dx[(g * S + s) * 16 + cc] = 0.0f;
    }
    for (int64_t p = 0; p < P16; ++p) a.amx_tsum[(g * P16 + p) * 16 + cc] = 0;
  }
  a.amx_ready = true;
}

void amx_fill_columns(Format /*f*/, QuantAct& a, int64_t j0, int64_t j1) {
  const int64_t cols = a.cols, S = cols / 32, P16 = cols / 16;
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t g = j / 16, cc = j % 16;
    const int8_t* q = a.q + j * cols;
    for (int64_t s = 0; s < S; ++s) {
      // B tile row r = quants 4r .. 4r+3 of the sub-block (natural order).
      int8_t* bt = a.amx_b + (g * S + s) * 512;
      for (int r = 0; r < 8; ++r) std::memcpy(bt + r * 64 + 4 * cc, q + 32 * s + 4 * r, 4);
      a.amx_dx[(g * S + s) * 16 + cc] = a.d[j * S + s];
    }
    for (int64_t p = 0; p < P16; ++p) {
      int32_t t = 0;
      for (int e = 0; e < 16; ++e) t += q[16 * p + e];
      a.amx_tsum[(g * P16 + p) * 16 + cc] = t;
    }
  }
}

void amx_rows(const MatrixView& w, const QuantAct& a, int64_t n, float* y, int64_t r0, int64_t r1) {
  visit_format(w.format, [&](auto fc) {
    if constexpr (kHasUnits<fc.value>) rows_fam<fc.value>(w, a, n, y, r0, r1);
  });
}

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
bool amx_usable() { return false; }
uint64_t amx_peak_loop(int64_t) { return 0; }
bool amx_supports(Format) { return false; }
void amx_setup(QuantAct&) {}
void amx_fill_columns(Format, QuantAct&, int64_t, int64_t) {}
void amx_rows(const MatrixView&, const QuantAct&, int64_t, float*, int64_t, int64_t) {}
}  // namespace bonsai::kernels::detail

#endif
