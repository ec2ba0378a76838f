// AVX-512 tier of the attention kernels (attention.h). Compiled with the
// tier's ISA flags (src/kernels/CMakeLists.txt) and only called when
// active_tier() is kAvx512 (whose CPU check includes AVX512 F/BW/VL/VNNI).
//
// Group step (step_heads, through step_rows): the heads that see the same
// keys of a block — the GQA group of a query, and two queries' groups on
// every block but the diagonal one — go through the step together, 4 (else
// 2, 1) at a time: each K and V chunk is loaded once for all of them, while
// every head keeps exactly its own ops (its fma chains, reduction tree,
// softmax and PV order: chains16, hsum4of16 / hsum_finish, softmax_avx512,
// pv_group), so the bits do not depend on the grouping. K/V rows may be
// read in place from the cache (f16 -> fp32 and q8_0 d * q in registers:
// the same values as the fp32 scratch).
#include "kernels/attention_internal.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace bonsai::kernels::detail {
namespace {

// e^x for x <= 0 (Cephes expf: x = n ln2 + r, degree-6 polynomial in r,
// result scaled by 2^n; relative error ~2 ulp). x < -87 (incl. -inf) -> 0.
inline __m512 exp_neg_ps512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

// The softmax part of an AVX-512 step for one head: s[0..32) scaled scores (-inf
// past nk) -> p (overwritten), state's m and l updated; returns corr.
inline __m512 softmax_avx512(float* s, float* state) {
  __m512 s0 = _mm512_loadu_ps(s), s1 = _mm512_loadu_ps(s + 16);
  const float mb = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
  const float m_new = std::max(state[0], mb);
  const __m512 mv = _mm512_set1_ps(m_new);
  const __m512 corr = exp_neg_ps512(_mm512_set1_ps(state[0] - m_new));  // 0 on the first block
  s0 = exp_neg_ps512(_mm512_sub_ps(s0, mv));                            // masked keys: exp(-inf) = 0
  s1 = exp_neg_ps512(_mm512_sub_ps(s1, mv));
  _mm512_storeu_ps(s, s0);
  _mm512_storeu_ps(s + 16, s1);
  state[0] = m_new;
  state[1] = state[1] * _mm512_cvtss_f32(corr) + _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  return corr;
}

// The lane reduction of a key's score on the AVX-512 tier: one fixed tree,
//   per 128-bit quarter (l0+l2)+(l1+l3), then quarters (q0+q1)+(q2+q3),
// computed for 16 keys at once in two parts. Every output element comes from
// one input vector (unpack/shuffle pick, add combines the same key's
// partials), so key u's sum depends on its own 16 lane partials alone, not on
// the other keys in the vector (nor on whether they exist: masked rows).
// hsum4of16: the first two levels for four keys (d[0..4): their 16-lane
// partials) -> per 128-bit quarter, the four keys' sums over that quarter.
inline __m512 hsum4of16(const __m512* d) {
  const __m512 e0 = _mm512_add_ps(_mm512_unpacklo_ps(d[0], d[1]), _mm512_unpackhi_ps(d[0], d[1]));
  const __m512 e1 = _mm512_add_ps(_mm512_unpacklo_ps(d[2], d[3]), _mm512_unpackhi_ps(d[2], d[3]));
  const __m512d a = _mm512_castps_pd(e0), b = _mm512_castps_pd(e1);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
}

// The last level: f[u] = hsum4of16 of keys 4u..4u+3 -> key u's sum in lane u.
inline __m512 hsum_finish(const __m512* f) {
  const __m512 g0 = _mm512_add_ps(_mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 g1 = _mm512_add_ps(_mm512_shuffle_f32x4(f[2], f[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(f[2], f[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(g0, g1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(g0, g1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Block sum of one key (32 int8 at kq) against q's block (qb): exact int32.
// (k + 128) as the unsigned operand of vpdpbusd, minus 128 * sum(q).
inline int32_t isum_one_vnni(const uint8_t* kq, const int8_t* qb, int32_t qsum) {
  const __m256i k = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kq)), _mm256_set1_epi8(-128));
  const __m256i d =
      _mm256_dpbusd_epi32(_mm256_setzero_si256(), k, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb)));
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));
  return _mm_cvtsi128_si32(x) - 128 * qsum;
}

// score_q8_ref with AVX-512 VNNI, the same bits. Sixteen keys at a time:
// per block b, eight vectors each hold block b of two keys (t, t+4 | t+8,
// t+12 pattern below), vpdpbusd gives 8 partial lanes per key, and a fixed
// unpack/add tree leaves key t0+i's block sum in lane i, so the fp32 part
// (combine_q8's ops, lane-wise) needs no per-key horizontal reduction. Keys
// past the last whole group of 16 are scored one at a time.
void score_q8_avx512(const uint8_t* k, size_t row_bytes, int64_t nk, int64_t hd, const AttnQ8Query* qs, int64_t nq,
                     float scale, float* s) {
  const int64_t nb = hd / 32;
  const __m512i bias = _mm512_set1_epi8(-128);
  const __m512i didx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(static_cast<int32_t>(row_bytes)));
  const __m512 vscale = _mm512_set1_ps(scale);
  int64_t t0 = 0;
  for (; t0 + 16 <= nk; t0 += 16) {
    const uint8_t* kg = k + t0 * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      // P[j] = [key r_j block b | key r_j + 4 block b], r = 0,1,2,3,8,9,10,11.
      __m512i P[8];
      for (int j = 0; j < 8; ++j) {
        const int64_t r = j < 4 ? j : j + 4;
        const uint8_t* lo = kg + r * row_bytes + 34 * b + 2;
        const uint8_t* hi = lo + 4 * row_bytes;
        const __m512i x =
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo))),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)), 1);
        P[j] = _mm512_xor_si512(x, bias);
      }
      // The 16 keys' fp16 d of block b (dword gather, low half kept).
      const __m512i dw = _mm512_i32gather_epi32(didx, kg + 34 * b, 1);
      const __m512 dk = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw));
      for (int64_t j = 0; j < nq; ++j) {
        const AttnQ8Query& q = qs[j];
        const __m512i qb = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.q + 32 * b)));
        __m512i D[8];
        for (int u = 0; u < 8; ++u) D[u] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), P[u], qb);
        // Per 128-bit quarter: [a0+a2, b0+b2, a1+a3, b1+b3] of the pair (a, b).
        __m512i E[4];
        for (int u = 0; u < 4; ++u) {
          E[u] = _mm512_add_epi32(_mm512_unpacklo_epi32(D[2 * u], D[2 * u + 1]),
                                  _mm512_unpackhi_epi32(D[2 * u], D[2 * u + 1]));
        }
        // Per quarter: the four keys' sums over that quarter's 4 lanes.
        const __m512i F0 = _mm512_add_epi32(_mm512_unpacklo_epi64(E[0], E[1]), _mm512_unpackhi_epi64(E[0], E[1]));
        const __m512i F1 = _mm512_add_epi32(_mm512_unpacklo_epi64(E[2], E[3]), _mm512_unpackhi_epi64(E[2], E[3]));
        // Quarters 0+1 (the low key of each P) and 2+3 (the high key): lanes = keys t0..t0+15.
        const __m512i S = _mm512_add_epi32(_mm512_shuffle_i32x4(F0, F1, _MM_SHUFFLE(2, 0, 2, 0)),
                                           _mm512_shuffle_i32x4(F0, F1, _MM_SHUFFLE(3, 1, 3, 1)));
        const __m512i isum = _mm512_sub_epi32(S, _mm512_set1_epi32(128 * q.sum[b]));
        const __m512 term = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(_mm512_set1_ps(q.d[b]), dk));
        float* sj = s + j * kAttnKeyBlock + t0;
        __m512 acc = b == 0 ? term : _mm512_add_ps(_mm512_loadu_ps(sj), term);
        if (b == nb - 1) acc = _mm512_mul_ps(acc, vscale);
        _mm512_storeu_ps(sj, acc);
      }
    }
  }
  int32_t isum[kAttnQ8MaxHeadDim / 32];
  for (; t0 < nk; ++t0) {
    const uint8_t* kt = k + t0 * row_bytes;
    for (int64_t j = 0; j < nq; ++j) {
      for (int64_t b = 0; b < nb; ++b) isum[b] = isum_one_vnni(kt + 34 * b + 2, qs[j].q + 32 * b, qs[j].sum[b]);
      s[j * kAttnKeyBlock + t0] = combine_q8(isum, qs[j], kt, nb, scale);
    }
  }
}

// Row conversion to fp32 scratch (exact; kernels::dequantize_row is scalar
// for F16 and was most of the cost at long context).
void f16_to_f32_avx512(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = core::fp16_to_fp32(src[i]);
}

// ggml block_q8_0 rows (fp16 d, int8 qs[32]) -> d * q (exact in fp32).
void q8_0_to_f32_avx512(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
    uint16_t dh;
    std::memcpy(&dh, src, 2);
    const __m512 d = _mm512_set1_ps(core::fp16_to_fp32(dh));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 18));
    _mm512_storeu_ps(dst, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0))));
    _mm512_storeu_ps(dst + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1))));
  }
}

// ---- Group step (AVX-512): the query heads of one KV head share each K/V load ----
// Per head, the ops of the tier's step (below: the fma chains of chains16,
// the hsum4of16 / hsum_finish tree, softmax_avx512, pv_group's order) do not
// depend on which other heads share the call, so every head gets the bits it
// would get alone; only the loads are shared: each K chunk feeds
// two heads' score chains and each V chunk every head's accumulators. K and V
// may also be read straight from the cache rows (fp16 -> fp32 and q8_0 d * q
// are exact, the values load_rows would have stored), which attention() does
// when few queries share the block (decode): converting to scratch first only
// cost a store and a reload.

inline __m512 load16(const RowsF32& r, int64_t t, int64_t c) { return _mm512_loadu_ps(r.p + t * r.stride + 16 * c); }
inline __m512 load16(const RowsF16& r, int64_t t, int64_t c) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.p + t * r.stride + 32 * c)));
}
inline __m512 load16(const RowsQ8& r, int64_t t, int64_t c) {
  const uint8_t* b = r.p + t * r.stride + 34 * (c >> 1);
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<int16_t>(dh)));
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * (c & 1)));
  return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));  // as q8_0_to_f32_avx512
}

// Scores of NQ heads (q rows at q[j]) against keys t0 .. t0+15. Key t's
// partials: lane l = q[l] * k[l], then fma(q[16c + l], k[16c + l], .) for the
// 16-wide chunks c = 1, 2, ... in order. KU keys at a time, so the NQ x KU
// chains stay in registers; each group of 4 keys is reduced right away by the
// tree's first two levels (hsum4of16) instead of keeping all 16 keys' chains
// (NQ x 16 registers: they spilled). f[j][u]: head j, keys t0 + 4u .. + 3.
template <int NQ, class KR>
inline void chains16(const float* const* q, int64_t hd_k, const KR& k, int64_t t0, __m512 (&f)[NQ][4]) {
  constexpr int KU = NQ <= 2 ? 8 : 4;
  const int64_t nc = hd_k / 16;
  SpreadPrefetch& pf = spread_prefetch();
  for (int h = 0; h < 16; h += KU) {
    __m512 a[NQ][KU];
    __m512 qc[NQ];
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) qc[j] = _mm512_loadu_ps(q[j]);
#pragma GCC unroll 16
    for (int u = 0; u < KU; ++u) {
      const __m512 kv = load16(k, t0 + h + u, 0);
#pragma GCC unroll 16
      for (int j = 0; j < NQ; ++j) a[j][u] = _mm512_mul_ps(qc[j], kv);
    }
    for (int64_t c = 1; c < nc; ++c) {
      pf.tick(2);
#pragma GCC unroll 16
      for (int j = 0; j < NQ; ++j) qc[j] = _mm512_loadu_ps(q[j] + 16 * c);
#pragma GCC unroll 16
      for (int u = 0; u < KU; ++u) {
        const __m512 kv = load16(k, t0 + h + u, c);
#pragma GCC unroll 16
        for (int j = 0; j < NQ; ++j) a[j][u] = _mm512_fmadd_ps(qc[j], kv, a[j][u]);
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) {
#pragma GCC unroll 16
      for (int u = 0; u < KU; u += 4) f[j][(h + u) / 4] = hsum4of16(&a[j][u]);
    }
  }
}

// s[j][0..32) = head j's scaled scores of keys < nk (chains16, the tree
// finished by hsum_finish, then * scale), -inf past them. Rows up to the
// 16-key group holding nk - 1 are read (masked lanes; each lane depends on
// its own key only).
template <int NQ, class KR>
void scores_group(const float* const* q, int64_t hd_k, const KR& k, int64_t nk, float scale, float* s) {
  static_assert(kAttnKeyBlock == 32);
  const __m512 vscale = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(kAttnNegInf);
  for (int64_t t0 = 0; t0 < kAttnKeyBlock; t0 += 16) {
    if (t0 >= nk) {
#pragma GCC unroll 16
      for (int j = 0; j < NQ; ++j) _mm512_storeu_ps(s + j * kAttnKeyBlock + t0, ninf);
      continue;
    }
    __m512 f[NQ][4];
    chains16<NQ>(q, hd_k, k, t0, f);
    const __mmask16 live = nk - t0 >= 16 ? __mmask16(0xffff) : __mmask16((1u << (nk - t0)) - 1u);
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) {
      _mm512_storeu_ps(s + j * kAttnKeyBlock + t0,
                       _mm512_mask_mov_ps(ninf, live, _mm512_mul_ps(hsum_finish(f[j]), vscale)));
    }
  }
}

// The PV part for NQ heads at once over V chunks [c0, c0 + NC): per head j,
// acc_j = acc_j * corr_j, then acc_j = fma(p_jt, v_t, acc_j) for t ascending.
// p: [NQ][kAttnKeyBlock]; acc[j]: head j's accumulator (hd_v floats).
template <int NQ, int NC, class VR>
inline void pv_group(const float* p, int64_t nk, const VR& v, int64_t c0, const __m512* corr, float* const* acc) {
  __m512 a[NQ][NC];
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) a[j][c] = _mm512_mul_ps(_mm512_loadu_ps(acc[j] + 16 * (c0 + c)), corr[j]);
  }
  SpreadPrefetch& pf = spread_prefetch();
  for (int64_t t = 0; t < nk; ++t) {
    pf.tick(NC < 4 ? 4 : NC);
    __m512 pt[NQ];
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) pt[j] = _mm512_set1_ps(p[j * kAttnKeyBlock + t]);
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) {
      const __m512 vv = load16(v, t, c0 + c);
#pragma GCC unroll 16
      for (int j = 0; j < NQ; ++j) a[j][c] = _mm512_fmadd_ps(pt[j], vv, a[j][c]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(acc[j] + 16 * (c0 + c), a[j][c]);
  }
}

template <int NQ, class VR>
void pv_heads(const float* p, int64_t nk, const VR& v, int64_t hd_v, const __m512* corr, float* const* acc) {
  const int64_t ncv = hd_v / 16;
  int64_t c = 0;
  if constexpr (NQ <= 2) {
    for (; c + 8 <= ncv; c += 8) pv_group<NQ, 8>(p, nk, v, c, corr, acc);
  }
  for (; c + 4 <= ncv; c += 4) pv_group<NQ, 4>(p, nk, v, c, corr, acc);
  if (c + 2 <= ncv) pv_group<NQ, 2>(p, nk, v, c, corr, acc), c += 2;
  if (c < ncv) pv_group<NQ, 1>(p, nk, v, c, corr, acc);
}

// One key block step for NQ query heads that reach the same keys (nk): the
// GQA group of one query, or of two queries whose positions both pass the
// block (step_rows below takes them 4, else 2, 1 at a time). Scores from
// q[j] against k, or already in s when k is null (Q8_0 keys); then softmax
// and V. s: [NQ][kAttnKeyBlock] scratch; head j's state at st + j * st_len.
template <int NQ, class KR, class VR>
inline void step_heads(const float* const* q, const KR* k, const VR& v, int64_t nk, int64_t hd_k, int64_t hd_v,
                       float scale, float* s, float* st, int64_t st_len) {
  if (k) scores_group<NQ>(q, hd_k, *k, nk, scale, s);
  __m512 corr[NQ];
  float* acc[NQ];
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
    corr[j] = softmax_avx512(s + j * kAttnKeyBlock, st + j * st_len);
    acc[j] = st + j * st_len + 2;
  }
  pv_heads<NQ>(s, nk, v, hd_v, corr, acc);
}

// step_heads as the shared group step (step_rows below) calls it.
struct Avx512Heads {
  template <int NQ, class KR, class VR>
  static void run(const float* const* q, const KR* k, const VR& v, int64_t nk, int64_t hd_k, int64_t hd_v, float scale,
                  float* s, float* st, int64_t st_len) {
    step_heads<NQ>(q, k, v, nk, hd_k, hd_v, scale, s, st, st_len);
  }
};

// n values of consecutive rows of format f -> fp32 (AttnLoadRowsFn).
void load_rows(Format f, const uint8_t* src, float* dst, int64_t n) {
  if (f == Format::kF16) return f16_to_f32_avx512(reinterpret_cast<const uint16_t*>(src), dst, n);
  if (f == Format::kQ8_0) return q8_0_to_f32_avx512(src, dst, n);
  dequantize_row(f, src, dst, n);
}

}  // namespace

const AttnOps* avx512_attn_ops() {
  static const AttnOps ops{"avx512", 16, step_rows<Avx512Heads>, score_q8_avx512, load_rows};
  return &ops;
}

}  // namespace bonsai::kernels::detail

#else  // not x86-64 (or built without the tier's flags): tier absent

namespace bonsai::kernels::detail {
const AttnOps* avx512_attn_ops() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
