// AVX2 tier of the attention kernels (attention.h): AVX2 + FMA + F16C.
// Compiled with the tier's ISA flags (src/kernels/CMakeLists.txt) and only
// called when active_tier() is kAvx2.
//
// Group step (step_heads8, through step_rows): the structure of the AVX-512
// tier's step with 8-wide vectors and this tier's own fp32 order. The heads
// that see the same keys of a block go through it together, 4 (else 2, 1)
// at a time, sharing each K and V load; every head keeps its own ops, so
// the bits do not depend on the grouping, nor on whether K/V rows are read
// in place (f16 -> fp32 and q8_0 d * q in registers) or from fp32 scratch.
#include "kernels/attention_internal.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>  // is_same_v

namespace bonsai::kernels::detail {
namespace {

void f16_to_f32_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = core::fp16_to_fp32(src[i]);
}

// ggml block_q8_0 rows (fp16 d, int8 qs[32]) -> d * q (exact in fp32), AVX2.
void q8_0_to_f32_avx2(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
    uint16_t dh;
    std::memcpy(&dh, src, 2);
    const __m256 d = _mm256_set1_ps(core::fp16_to_fp32(dh));
    for (int j = 0; j < 4; ++j) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 2 + 8 * j));
      _mm256_storeu_ps(dst + 8 * j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
    }
  }
}

// e^x for x <= 0, 8 lanes: the same Cephes expf as exp_neg_ps512 (x = n ln2 + r,
// degree-6 polynomial in r), 2^n built in the exponent bits (n >= -126 after
// the clamp, so the result is a normal number). x < -87 (incl. -inf) -> 0.
inline __m256 exp_neg_ps256(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// ---- Group step (AVX2 + FMA + F16C): the tier's counterpart of step_heads ----
// The same structure as the AVX-512 group step above, with 8-wide vectors
// and the AVX2 tier's own fp32 order: a key's score is the fma chain over
// its 8-wide chunks in order (lane l: q[l] * k[l], then fma(q[8c + l],
// k[8c + l], .)), reduced by one fixed tree
//   ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
// (hsum_keys: 8, 4 or 2 keys at once, every key's sum from its own lanes
// only) and multiplied by scale; softmax_avx2 and pv_group8's order for the
// rest. Heads that see the same keys share each K and V load; each keeps its
// own ops, so the bits do not depend on how many heads share the call, nor
// on whether the rows were read in place (f16 -> fp32 and q8_0 d * q in
// registers) or from the fp32 scratch (the same values).

inline __m256 load8(const RowsF32& r, int64_t t, int64_t c) { return _mm256_loadu_ps(r.p + t * r.stride + 8 * c); }
inline __m256 load8(const RowsF16& r, int64_t t, int64_t c) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.p + t * r.stride + 16 * c)));
}
// Q8_0 row t's block scale for chunk c (chunks 4b .. 4b + 3 share block b's).
inline __m256 q8_scale8(const RowsQ8& r, int64_t t, int64_t c) {
  uint16_t dh;
  std::memcpy(&dh, r.p + t * r.stride + 34 * (c >> 2), 2);
  return _mm256_set1_ps(_cvtsh_ss(dh));
}
// d * q of chunk c (as q8_0_to_f32_avx2), with d = q8_scale8(r, t, c).
inline __m256 q8_chunk8(const RowsQ8& r, int64_t t, int64_t c, __m256 d) {
  const __m128i q =
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r.p + t * r.stride + 34 * (c >> 2) + 2 + 8 * (c & 3)));
  return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
}

// The tree above for KU keys' 8-lane partials d[0..KU) -> key u's sum in lane
// u (KU = 8: all lanes; 4 and 2: the low 4 / 2 lanes hold the sums).
template <int KU>
inline __m256 hsum_keys(const __m256* d) {
  if constexpr (KU == 8) {
    const __m256 h01 = _mm256_hadd_ps(d[0], d[1]), h23 = _mm256_hadd_ps(d[2], d[3]);
    const __m256 h45 = _mm256_hadd_ps(d[4], d[5]), h67 = _mm256_hadd_ps(d[6], d[7]);
    const __m256 a = _mm256_hadd_ps(h01, h23);  // [k0..k3 low-half sums | k0..k3 high-half sums]
    const __m256 b = _mm256_hadd_ps(h45, h67);  // same for k4..k7
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  } else {
    const __m256 h01 = _mm256_hadd_ps(d[0], d[1]);
    const __m256 h23 = KU == 4 ? _mm256_hadd_ps(d[2], d[3]) : h01;
    const __m256 a = _mm256_hadd_ps(h01, h23);
    return _mm256_castps128_ps256(_mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)));
  }
}

// Keys t0 .. t0 + KU - 1 against NQ heads: a[j][u] = head j's 8 lane
// partials of key t0 + u (the chain above). Per chunk the KU key vectors are
// loaded once and each head's q chunk streams through one register, so
// NQ x KU + KU + 1 registers are live (16 at NQ = 4, KU = 3): q is not
// folded into the fmas as memory operands (one load per fma: the loads, not
// the fmas, bounded the loop).
template <int NQ, int KU, class KR>
inline void chains8(const float* const* q, int64_t nc, const KR& k, int64_t t0, __m256 (&a)[NQ][KU]) {
  {
    __m256 kv[KU];
#pragma GCC unroll 16
    for (int u = 0; u < KU; ++u) kv[u] = load8(k, t0 + u, 0);
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) {
      const __m256 qc = _mm256_loadu_ps(q[j]);
#pragma GCC unroll 16
      for (int u = 0; u < KU; ++u) a[j][u] = _mm256_mul_ps(qc, kv[u]);
    }
  }
  SpreadPrefetch& pf = spread_prefetch();
  for (int64_t c = 1; c < nc; ++c) {
    pf.tick(1);
    __m256 kv[KU];
#pragma GCC unroll 16
    for (int u = 0; u < KU; ++u) kv[u] = load8(k, t0 + u, c);
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) {
      const __m256 qc = _mm256_loadu_ps(q[j] + 8 * c);
#pragma GCC unroll 16
      for (int u = 0; u < KU; ++u) a[j][u] = _mm256_fmadd_ps(qc, kv[u], a[j][u]);
    }
  }
}

// s[j][t0 .. t0 + KU) (KU = 3: 4 floats stored, the 4th overwritten by the
// next group) = head j's scaled scores, -inf for keys >= nk.
template <int NQ, int KU, class KR>
inline void score_keys8(const float* const* q, int64_t nc, const KR& k, int64_t t0, int64_t nk, float scale, float* s) {
  __m256 a[NQ][KU];
  chains8<NQ, KU>(q, nc, k, t0, a);
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 live = _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(nk - t0)), _CMP_LT_OQ);
  const __m256 vscale = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(kAttnNegInf);
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
    __m256 r;
    if constexpr (KU == 3) {
      const __m256 d[4] = {a[j][0], a[j][1], a[j][2], a[j][2]};
      r = hsum_keys<4>(d);
    } else {
      r = hsum_keys<KU>(a[j]);
    }
    r = _mm256_blendv_ps(ninf, _mm256_mul_ps(r, vscale), live);
    if constexpr (KU == 8) {
      _mm256_storeu_ps(s + j * kAttnKeyBlock + t0, r);
    } else if constexpr (KU >= 3) {
      _mm_storeu_ps(s + j * kAttnKeyBlock + t0, _mm256_castps256_ps128(r));
    } else {
      _mm_storel_pi(reinterpret_cast<__m64*>(s + j * kAttnKeyBlock + t0), _mm256_castps256_ps128(r));
    }
  }
}

// s[j][0..32) = head j's scaled scores of keys < nk (NQ heads, q rows at
// q[j]), -inf past them. Keys in groups of KU (8 for one head, 4 for two, 3
// then a last 2 for four); rows up to the group holding nk - 1 are read
// (their lanes are masked: each lane depends on its own key only), all
// inside the 32-key block.
template <int NQ, class KR>
void scores_group8(const float* const* q, int64_t hd_k, const KR& k, int64_t nk, float scale, float* s) {
  static_assert(kAttnKeyBlock == 32);
  constexpr int KU = NQ == 1 ? 8 : (NQ == 2 ? 4 : 3);
  constexpr int64_t kFull = kAttnKeyBlock / KU * KU;  // keys in whole KU groups (30 for KU = 3)
  const int64_t nc = hd_k / 8;
  for (int64_t t0 = 0; t0 < kAttnKeyBlock; t0 += KU) {
    if (t0 >= nk) {  // no live key from here on: every head's rest of the row is -inf
      for (int j = 0; j < NQ; ++j) std::fill(s + j * kAttnKeyBlock + t0, s + (j + 1) * kAttnKeyBlock, kAttnNegInf);
      return;
    }
    if (t0 < kFull) {
      score_keys8<NQ, KU>(q, nc, k, t0, nk, scale, s);
    } else {
      static_assert(kAttnKeyBlock - kFull == 0 || kAttnKeyBlock - kFull == 2);
      score_keys8<NQ, 2>(q, nc, k, t0, nk, scale, s);  // the last 2 keys (KU = 3)
    }
  }
}

// The softmax part of an AVX2 step for one head: s[0..32) scaled scores (-inf
// past nk) -> p (overwritten), state's m and l updated; returns corr (all lanes).
inline __m256 softmax_avx2(float* s, float* state) {
  __m256 sv[4];
  for (int i = 0; i < 4; ++i) sv[i] = _mm256_loadu_ps(s + 8 * i);
  const __m256 mx = _mm256_max_ps(_mm256_max_ps(sv[0], sv[1]), _mm256_max_ps(sv[2], sv[3]));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float m_new = std::max(state[0], _mm_cvtss_f32(m4));
  const __m256 mv = _mm256_set1_ps(m_new);
  const __m256 corr = exp_neg_ps256(_mm256_set1_ps(state[0] - m_new));  // 0 on the first block
  for (int i = 0; i < 4; ++i) {
    sv[i] = exp_neg_ps256(_mm256_sub_ps(sv[i], mv));  // masked keys: exp(-inf) = 0
    _mm256_storeu_ps(s + 8 * i, sv[i]);
  }
  // The lane sum of the 32 p by hsum_keys' tree.
  const __m256 lsum = _mm256_add_ps(_mm256_add_ps(sv[0], sv[1]), _mm256_add_ps(sv[2], sv[3]));
  const __m256 h = _mm256_hadd_ps(lsum, lsum);
  const __m256 h2 = _mm256_hadd_ps(h, h);
  const float l = _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
  state[0] = m_new;
  state[1] = _mm_cvtss_f32(_mm_add_ss(_mm_mul_ss(_mm_set_ss(state[1]), _mm256_castps256_ps128(corr)), _mm_set_ss(l)));
  return corr;
}

// The PV part for NQ heads at once over V chunks [c0, c0 + NC): per head j,
// acc_j = acc_j * corr_j, then acc_j = fma(p_jt, v_t, acc_j) for t ascending.
// p: [NQ][kAttnKeyBlock]; acc[j]: head j's accumulator (hd_v floats). Q8_0 rows:
// c0 is a multiple of min(NC, 4), so chunks c .. c + min(NC, 4) - 1 share one
// block scale, converted once.
template <int NQ, int NC, class VR>
inline void pv_group8(const float* p, int64_t nk, const VR& v, int64_t c0, const __m256* corr, float* const* acc) {
  __m256 a[NQ][NC];
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) a[j][c] = _mm256_mul_ps(_mm256_loadu_ps(acc[j] + 8 * (c0 + c)), corr[j]);
  }
  // Value chunk c of key t (Q8_0: d is the run's current block scale,
  // converted at the first chunk of each block of the run).
  [[maybe_unused]] __m256 d;
  auto value = [&](int64_t t, int c) {
    if constexpr (std::is_same_v<VR, RowsQ8>) {
      if (c % (NC < 4 ? NC : 4) == 0) d = q8_scale8(v, t, c0 + c);
      return q8_chunk8(v, t, c0 + c, d);
    } else {
      return load8(v, t, c0 + c);
    }
  };
  // Per key, whichever of the NQ p broadcasts and the NC value chunks are
  // fewer is held in registers and the other streamed through one, so at
  // most NQ x NC + min(NQ, NC) + 2 registers are live (no spills at 12
  // accumulators: 4 heads x 3 chunks, 2 x 6, 1 x 12).
  SpreadPrefetch& pf = spread_prefetch();
  for (int64_t t = 0; t < nk; ++t) {
    pf.tick(2);
    if constexpr (NQ <= NC) {
      __m256 pt[NQ];
#pragma GCC unroll 16
      for (int j = 0; j < NQ; ++j) pt[j] = _mm256_broadcast_ss(p + j * kAttnKeyBlock + t);
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) {
        const __m256 vv = value(t, c);
#pragma GCC unroll 16
        for (int j = 0; j < NQ; ++j) a[j][c] = _mm256_fmadd_ps(pt[j], vv, a[j][c]);
      }
    } else {
      __m256 vv[NC];
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) vv[c] = value(t, c);
#pragma GCC unroll 16
      for (int j = 0; j < NQ; ++j) {
        const __m256 pt = _mm256_broadcast_ss(p + j * kAttnKeyBlock + t);
#pragma GCC unroll 16
        for (int c = 0; c < NC; ++c) a[j][c] = _mm256_fmadd_ps(pt, vv[c], a[j][c]);
      }
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(acc[j] + 8 * (c0 + c), a[j][c]);
  }
}

// pv_group8 over all hd_v / 8 chunks in runs of NC. F32 / F16 rows: runs of
// 12 / NQ chunks (12 accumulators: with 8, each fma chain's latency bounded
// the loop), the rest in runs of 8 / 4 / 2 / 1 no longer than 12 / NQ (16
// chunks, four heads: 3, 3, 3, 3, 2, 2). Q8_0 rows: runs of 8 / NQ (a run
// never straddles a 4-chunk block: one scale per block), then halves. Each
// accumulator's fma chain is the same whatever the runs: same bits.
template <int NQ, class VR>
void pv_heads8(const float* p, int64_t nk, const VR& v, int64_t hd_v, const __m256* corr, float* const* acc) {
  constexpr bool kQ8 = std::is_same_v<VR, RowsQ8>;
  constexpr int kRun = kQ8 ? 8 / NQ : 12 / NQ;
  constexpr int kPow2 = kRun >= 8 ? 8 : (kRun >= 4 ? 4 : (kRun >= 2 ? 2 : 1));  // largest power of 2 <= kRun
  const int64_t ncv = hd_v / 8;
  int64_t c = 0;
  for (; ncv - c >= kRun && (kQ8 || ncv - c != kRun + 1); c += kRun) pv_group8<NQ, kRun>(p, nk, v, c, corr, acc);
  if constexpr (kPow2 >= 8) {
    if (ncv - c >= 8) pv_group8<NQ, 8>(p, nk, v, c, corr, acc), c += 8;
  }
  if constexpr (kPow2 >= 4) {
    if (ncv - c >= 4) pv_group8<NQ, 4>(p, nk, v, c, corr, acc), c += 4;
  }
  if constexpr (kPow2 >= 2) {
    while (ncv - c >= 2) pv_group8<NQ, 2>(p, nk, v, c, corr, acc), c += 2;
  }
  if (c < ncv) pv_group8<NQ, 1>(p, nk, v, c, corr, acc);
}

template <int NQ, class KR, class VR>
inline void step_heads8(const float* const* q, const KR* k, const VR& v, int64_t nk, int64_t hd_k, int64_t hd_v,
                        float scale, float* s, float* st, int64_t st_len) {
  if (k) scores_group8<NQ>(q, hd_k, *k, nk, scale, s);
  __m256 corr[NQ];
  float* acc[NQ];
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
    corr[j] = softmax_avx2(s + j * kAttnKeyBlock, st + j * st_len);
    acc[j] = st + j * st_len + 2;
  }
  pv_heads8<NQ>(s, nk, v, hd_v, corr, acc);
}

// step_heads8 as the shared group step (step_rows below) calls it.
struct Avx2Heads {
  template <int NQ, class KR, class VR>
  static void run(const float* const* q, const KR* k, const VR& v, int64_t nk, int64_t hd_k, int64_t hd_v, float scale,
                  float* s, float* st, int64_t st_len) {
    step_heads8<NQ>(q, k, v, nk, hd_k, hd_v, scale, s, st, st_len);
  }
};

// Block b of Q8_0 key row kt against q (aq = |q|, qv = q): |q| x sign(k, q)
// in int32 pairs of pairs, the block's 8 partial sums.
inline __m256i q8_block_avx2(const uint8_t* kt, __m256i aq, __m256i qv, __m256i ones, int64_t b) {
  const __m256i kv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kt + 34 * b + 2));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(kv, qv)), ones);
}

// score_q8_ref with AVX2, the same bits. Integer part: per key and block,
// |q| (unsigned) times k with q's sign (vpsignb) by vpmaddubsw (pairs,
// |sum| <= 2 * 127 * 127, no saturation), vpmaddwd with ones; exact int32
// sums in any order. Eight keys at a time: per block, the eight keys' 8
// partial lanes are summed by a vphaddd tree that leaves key t0 + u's block
// sum in lane u, and combine_q8's fp32 steps run lane-wise (the keys' block
// scales converted 8 at a time, once for all heads). Keys past the last
// whole group of 8 are scored one at a time. (Before: a horizontal sum and
// a scalar combine per key and head.)
void score_q8_avx2(const uint8_t* k, size_t row_bytes, int64_t nk, int64_t hd, const AttnQ8Query* qs, int64_t nq,
                   float scale, float* s) {
  const int64_t nb = hd / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 vscale = _mm256_set1_ps(scale);
  alignas(16) uint16_t dh[kAttnQ8MaxHeadDim / 32][8];
  int64_t t0 = 0;
  for (; t0 + 8 <= nk; t0 += 8) {
    const uint8_t* kg = k + t0 * row_bytes;
    for (int u = 0; u < 8; ++u) {
      for (int64_t b = 0; b < nb; ++b) std::memcpy(&dh[b][u], kg + u * row_bytes + 34 * b, 2);
    }
    for (int64_t j = 0; j < nq; ++j) {
      const AttnQ8Query& q = qs[j];
      __m256 acc = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.q + 32 * b));
        const __m256i aq = _mm256_sign_epi8(qv, qv);
        __m256i p[8];
        for (int u = 0; u < 8; ++u) p[u] = q8_block_avx2(kg + u * row_bytes, aq, qv, ones, b);
        const __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
        const __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
        const __m256i x = _mm256_hadd_epi32(h01, h23), y = _mm256_hadd_epi32(h45, h67);
        const __m256i isum =
            _mm256_add_epi32(_mm256_permute2x128_si256(x, y, 0x20), _mm256_permute2x128_si256(x, y, 0x31));
        const __m256 dk = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh[b])));
        const __m256 term = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_set1_ps(q.d[b]), dk));
        acc = b == 0 ? term : _mm256_add_ps(acc, term);
      }
      _mm256_storeu_ps(s + j * kAttnKeyBlock + t0, _mm256_mul_ps(acc, vscale));
    }
  }
  int32_t isum[kAttnQ8MaxHeadDim / 32];
  float dk[kAttnQ8MaxHeadDim / 32];
  for (; t0 < nk; ++t0) {
    const uint8_t* kt = k + t0 * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      uint16_t d16;
      std::memcpy(&d16, kt + 34 * b, 2);
      dk[b] = _cvtsh_ss(d16);
    }
    for (int64_t j = 0; j < nq; ++j) {
      for (int64_t b = 0; b < nb; ++b) {
        const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs[j].q + 32 * b));
        const __m256i p32 = q8_block_avx2(kt, _mm256_sign_epi8(qv, qv), qv, ones, b);
        __m128i x = _mm_add_epi32(_mm256_castsi256_si128(p32), _mm256_extracti128_si256(p32, 1));
        x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
        x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));
        isum[b] = _mm_cvtsi128_si32(x);
      }
      s[j * kAttnKeyBlock + t0] = combine_q8_dk(isum, qs[j], dk, nb, scale);
    }
  }
}

// n values of consecutive rows of format f -> fp32 (AttnLoadRowsFn).
void load_rows(Format f, const uint8_t* src, float* dst, int64_t n) {
  if (f == Format::kF16) return f16_to_f32_f16c(reinterpret_cast<const uint16_t*>(src), dst, n);
  if (f == Format::kQ8_0) return q8_0_to_f32_avx2(src, dst, n);
  dequantize_row(f, src, dst, n);
}

}  // namespace

const AttnOps* avx2_attn_ops() {
  static const AttnOps ops{"avx2", 8, step_rows<Avx2Heads>, score_q8_avx2, load_rows};
  return &ops;
}

}  // namespace bonsai::kernels::detail

#else  // not x86-64 (or built without the tier's flags): tier absent

namespace bonsai::kernels::detail {
const AttnOps* avx2_attn_ops() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
