// Tiled causal GQA attention with an online softmax; see attention.h.
//
// One task = (tile of up to kQueryTile consecutive tokens of one sequence) x
// (one KV head). The task walks the key blocks 0, 32, 64, ... up to its last
// query's position; each block of K and V rows is converted once to fp32
// scratch (exact for f16 and q8_0: fp16 -> fp32 is exact and d * q fits in
// fp32's 24-bit mantissa) and then applied to every query of the tile and
// every query head of the group. Per (query head, block) the state update is
//   m' = max(m, max_t s_t),  c = exp(m - m'),  p_t = exp(s_t - m')
//   l' = l c + sum_t p_t,    acc' = acc c + sum_t p_t v_t      (t ascending)
// and at the end out = acc * (1 / l). Only keys t <= pos enter; rows past a
// query's position are never read for it.
#include "model/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/fp16.h"  // fp16_to_fp32
#include "core/thread_pool.h"
#include "kernels/kernels.h"  // active_tier, dequantize_row

namespace bonsai::model {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One (query head, key block) step of the online softmax.
//   q: [hd_k] query, k: [nk][hd_k] and v: [nk][hd_v] fp32 rows of the block,
//   1 <= nk <= kKeyBlock; state: [2 + hd_v] = m, l, acc (updated).
using BlockFn = void (*)(const float* q, const float* k, const float* v, int64_t nk, int64_t hd_k, int64_t hd_v,
                         float scale, float* state);

// Portable reference of the step (std::exp, plain loops).
void block_scalar(const float* q, const float* k, const float* v, int64_t nk, int64_t hd_k, int64_t hd_v, float scale,
                  float* state) {
  float s[kKeyBlock];
  float mb = kNegInf;
  for (int64_t t = 0; t < nk; ++t) {
    const float* kt = k + t * hd_k;
    float d = 0.0f;
    for (int64_t i = 0; i < hd_k; ++i) d += q[i] * kt[i];
    s[t] = d * scale;
    mb = std::max(mb, s[t]);
  }
  const float m_new = std::max(state[0], mb);
  const float corr = std::exp(state[0] - m_new);  // 0 on the first block (m = -inf)
  float l = 0.0f;
  for (int64_t t = 0; t < nk; ++t) {
    s[t] = std::exp(s[t] - m_new);
    l += s[t];
  }
  state[0] = m_new;
  state[1] = state[1] * corr + l;
  float* acc = state + 2;
  for (int64_t i = 0; i < hd_v; ++i) acc[i] *= corr;
  for (int64_t t = 0; t < nk; ++t) {
    const float* vt = v + t * hd_v;
    for (int64_t i = 0; i < hd_v; ++i) acc[i] += s[t] * vt[i];
  }
}

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics (set1, reduce_*) start from _mm512_undefined_ps,
// which -Wuninitialized flags when compiled under a target attribute.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define BONSAI_AVX512 __attribute__((target("avx512f,avx512dq,fma")))
#define BONSAI_AVX2 __attribute__((target("avx2,fma,f16c")))

// e^x for x <= 0 (Cephes expf: x = n ln2 + r, degree-6 polynomial in r,
// result scaled by 2^n; relative error ~2 ulp). x < -87 (incl. -inf) -> 0.
BONSAI_AVX512 inline __m512 exp_neg_ps512(__m512 x) {
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

// score of one key: sum over 16-wide chunks c of q_c * k_c (fma chain in
// chunk order), then the fixed reduction tree of _mm512_reduce_add_ps.
BONSAI_AVX512 inline float dot_chain(const float* q, const float* kt, int64_t nc) {
  __m512 d = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(kt));
  for (int64_t c = 1; c < nc; ++c) d = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), _mm512_loadu_ps(kt + 16 * c), d);
  return _mm512_reduce_add_ps(d);
}

// acc[0..16*NC) = acc * corr + sum_t p_t v_t[0..16*NC), t ascending.
template <int NC>
BONSAI_AVX512 inline void pv_chunks(const float* p, int64_t nk, const float* v, int64_t hd_v, __m512 corr, float* acc) {
  __m512 a[NC];
  for (int j = 0; j < NC; ++j) a[j] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * j), corr);
  for (int64_t t = 0; t < nk; ++t) {
    const __m512 pt = _mm512_set1_ps(p[t]);
    const float* vt = v + t * hd_v;
    for (int j = 0; j < NC; ++j) a[j] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(vt + 16 * j), a[j]);
  }
  for (int j = 0; j < NC; ++j) _mm512_storeu_ps(acc + 16 * j, a[j]);
}

// The step with AVX-512; head dims multiples of 16.
BONSAI_AVX512 void block_avx512(const float* q, const float* k, const float* v, int64_t nk, int64_t hd_k, int64_t hd_v,
                                float scale, float* state) {
  static_assert(kKeyBlock == 32);
  alignas(64) float s[kKeyBlock];
  const int64_t nc = hd_k / 16;
  int64_t t = 0;
  for (; t + 4 <= nk; t += 4) {  // four independent chains for ILP; same per-key arithmetic
    const float* kt = k + t * hd_k;
    s[t] = dot_chain(q, kt, nc) * scale;
    s[t + 1] = dot_chain(q, kt + hd_k, nc) * scale;
    s[t + 2] = dot_chain(q, kt + 2 * hd_k, nc) * scale;
    s[t + 3] = dot_chain(q, kt + 3 * hd_k, nc) * scale;
  }
  for (; t < nk; ++t) s[t] = dot_chain(q, k + t * hd_k, nc) * scale;
  for (; t < kKeyBlock; ++t) s[t] = kNegInf;
  __m512 s0 = _mm512_load_ps(s), s1 = _mm512_load_ps(s + 16);
  const float mb = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
  const float m_new = std::max(state[0], mb);
  const __m512 mv = _mm512_set1_ps(m_new);
  const __m512 corr = exp_neg_ps512(_mm512_set1_ps(state[0] - m_new));  // 0 on the first block
  s0 = exp_neg_ps512(_mm512_sub_ps(s0, mv));                            // masked keys: exp(-inf) = 0
  s1 = exp_neg_ps512(_mm512_sub_ps(s1, mv));
  _mm512_store_ps(s, s0);
  _mm512_store_ps(s + 16, s1);
  state[0] = m_new;
  state[1] = state[1] * _mm512_cvtss_f32(corr) + _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  float* acc = state + 2;
  int64_t j = 0;
  const int64_t ncv = hd_v / 16;
  for (; j + 8 <= ncv; j += 8) pv_chunks<8>(s, nk, v + 16 * j, hd_v, corr, acc + 16 * j);
  if (j + 4 <= ncv) pv_chunks<4>(s, nk, v + 16 * j, hd_v, corr, acc + 16 * j), j += 4;
  if (j + 2 <= ncv) pv_chunks<2>(s, nk, v + 16 * j, hd_v, corr, acc + 16 * j), j += 2;
  if (j < ncv) pv_chunks<1>(s, nk, v + 16 * j, hd_v, corr, acc + 16 * j);
}
// Row conversion to fp32 scratch (exact; kernels::dequantize_row is scalar
// for F16 and was most of the cost at long context).
BONSAI_AVX512 void f16_to_f32_avx512(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = core::fp16_to_fp32(src[i]);
}

// ggml block_q8_0 rows (fp16 d, int8 qs[32]) -> d * q (exact in fp32).
BONSAI_AVX512 void q8_0_to_f32_avx512(const uint8_t* src, float* dst, int64_t n) {
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
#pragma GCC diagnostic pop

BONSAI_AVX2 void f16_to_f32_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = core::fp16_to_fp32(src[i]);
}

// ggml block_q8_0 rows (fp16 d, int8 qs[32]) -> d * q (exact in fp32), AVX2.
BONSAI_AVX2 void q8_0_to_f32_avx2(const uint8_t* src, float* dst, int64_t n) {
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
BONSAI_AVX2 inline __m256 exp_neg_ps256(__m256 x) {
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

// Partial score of one key: sum over 8-wide chunks c of q_c * k_c (fma chain
// in chunk order), 8 lanes left to reduce.
BONSAI_AVX2 inline __m256 dot8_chain(const float* q, const float* kt, int64_t nc) {
  __m256 d = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(kt));
  for (int64_t c = 1; c < nc; ++c) d = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), _mm256_loadu_ps(kt + 8 * c), d);
  return d;
}

// The lane reduction of every key, one fixed tree:
//   ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
// hsum8 (one key) and hsum8x8 (eight keys at once, transposed with hadd)
// compute exactly that tree, so a key's score does not depend on which of
// the two reduced it (float + is commutative bit for bit).
BONSAI_AVX2 inline float hsum8(__m256 d) {
  const __m256 h = _mm256_hadd_ps(d, d);   // [0+1, 2+3, 0+1, 2+3 | 4+5, 6+7, ..]
  const __m256 h2 = _mm256_hadd_ps(h, h);  // [(01)+(23) x4 | (45)+(67) x4]
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
}
BONSAI_AVX2 inline __m256 hsum8x8(const __m256 d[8]) {
  const __m256 h01 = _mm256_hadd_ps(d[0], d[1]), h23 = _mm256_hadd_ps(d[2], d[3]);
  const __m256 h45 = _mm256_hadd_ps(d[4], d[5]), h67 = _mm256_hadd_ps(d[6], d[7]);
  const __m256 a = _mm256_hadd_ps(h01, h23);  // [k0..k3 low-half sums | k0..k3 high-half sums]
  const __m256 b = _mm256_hadd_ps(h45, h67);  // same for k4..k7
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// acc[0..8*NC) = acc * corr + sum_t p_t v_t[0..8*NC), t ascending.
template <int NC>
BONSAI_AVX2 inline void pv_chunks8(const float* p, int64_t nk, const float* v, int64_t hd_v, __m256 corr, float* acc) {
  __m256 a[NC];
  for (int j = 0; j < NC; ++j) a[j] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * j), corr);
  for (int64_t t = 0; t < nk; ++t) {
    const __m256 pt = _mm256_broadcast_ss(p + t);
    const float* vt = v + t * hd_v;
    for (int j = 0; j < NC; ++j) a[j] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 8 * j), a[j]);
  }
  for (int j = 0; j < NC; ++j) _mm256_storeu_ps(acc + 8 * j, a[j]);
}

// The step with AVX2 + FMA; head dims multiples of 8. Scores of keys 8b..8b+7
// are reduced together when all eight are present, else one by one; both
// give the same bits (see hsum8), so the result does not depend on nk's
// alignment, i.e. on how far the query's position reaches into the block.
BONSAI_AVX2 void block_avx2(const float* q, const float* k, const float* v, int64_t nk, int64_t hd_k, int64_t hd_v,
                            float scale, float* state) {
  static_assert(kKeyBlock == 32);
  alignas(32) float s[kKeyBlock];
  const int64_t nc = hd_k / 8;
  const __m256 sc = _mm256_set1_ps(scale);
  int64_t t = 0;
  for (; t + 8 <= nk; t += 8) {
    const float* kt = k + t * hd_k;
    __m256 d[8];
    for (int u = 0; u < 8; ++u) d[u] = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(kt + u * hd_k));
    for (int64_t c = 1; c < nc; ++c) {
      const __m256 qc = _mm256_loadu_ps(q + 8 * c);
      for (int u = 0; u < 8; ++u) d[u] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kt + u * hd_k + 8 * c), d[u]);
    }
    _mm256_store_ps(s + t, _mm256_mul_ps(hsum8x8(d), sc));
  }
  for (; t < nk; ++t) {
    // Same product as a lane of the 8-key path: (reduced dot) * scale, one rounding each.
    const __m256 one = _mm256_set1_ps(hsum8(dot8_chain(q, k + t * hd_k, nc)));
    s[t] = _mm_cvtss_f32(_mm256_castps256_ps128(_mm256_mul_ps(one, sc)));
  }
  for (; t < kKeyBlock; ++t) s[t] = kNegInf;
  __m256 sv[4];
  for (int i = 0; i < 4; ++i) sv[i] = _mm256_load_ps(s + 8 * i);
  const __m256 mx = _mm256_max_ps(_mm256_max_ps(sv[0], sv[1]), _mm256_max_ps(sv[2], sv[3]));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float m_new = std::max(state[0], _mm_cvtss_f32(m4));
  const __m256 mv = _mm256_set1_ps(m_new);
  const __m256 corr = exp_neg_ps256(_mm256_set1_ps(state[0] - m_new));  // 0 on the first block
  for (int i = 0; i < 4; ++i) {
    sv[i] = exp_neg_ps256(_mm256_sub_ps(sv[i], mv));  // masked keys: exp(-inf) = 0
    _mm256_store_ps(s + 8 * i, sv[i]);
  }
  const __m256 lsum = _mm256_add_ps(_mm256_add_ps(sv[0], sv[1]), _mm256_add_ps(sv[2], sv[3]));
  const __m128 l_corr = _mm_mul_ss(_mm_set_ss(state[1]), _mm256_castps256_ps128(corr));
  state[0] = m_new;
  state[1] = _mm_cvtss_f32(_mm_add_ss(l_corr, _mm_set_ss(hsum8(lsum))));
  float* acc = state + 2;
  int64_t j = 0;
  const int64_t ncv = hd_v / 8;
  for (; j + 8 <= ncv; j += 8) pv_chunks8<8>(s, nk, v + 8 * j, hd_v, corr, acc + 8 * j);
  if (j + 4 <= ncv) pv_chunks8<4>(s, nk, v + 8 * j, hd_v, corr, acc + 8 * j), j += 4;
  if (j + 2 <= ncv) pv_chunks8<2>(s, nk, v + 8 * j, hd_v, corr, acc + 8 * j), j += 2;
  if (j < ncv) pv_chunks8<1>(s, nk, v + 8 * j, hd_v, corr, acc + 8 * j);
}
#endif

// n values of consecutive cache rows of type f -> fp32 (exact).
void load_rows(kernels::Format f, const uint8_t* src, float* dst, int64_t n) {
#if defined(__x86_64__)
  const kernels::Tier tier = kernels::active_tier();
  if (tier == kernels::Tier::kAvx512 && f == kernels::Format::kF16) {
    return f16_to_f32_avx512(reinterpret_cast<const uint16_t*>(src), dst, n);
  }
  if (tier == kernels::Tier::kAvx512 && f == kernels::Format::kQ8_0) return q8_0_to_f32_avx512(src, dst, n);
  if (tier == kernels::Tier::kAvx2 && f == kernels::Format::kF16) {
    return f16_to_f32_f16c(reinterpret_cast<const uint16_t*>(src), dst, n);
  }
  if (tier == kernels::Tier::kAvx2 && f == kernels::Format::kQ8_0) return q8_0_to_f32_avx2(src, dst, n);
#endif
  kernels::dequantize_row(f, src, dst, n);
}

bool use_avx512(int64_t hd_k, int64_t hd_v) {
#if defined(__x86_64__)
  return kernels::active_tier() == kernels::Tier::kAvx512 && hd_k % 16 == 0 && hd_v % 16 == 0;
#else
  (void)hd_k, (void)hd_v;
  return false;
#endif
}

bool use_avx2(int64_t hd_k, int64_t hd_v) {
#if defined(__x86_64__)
  return kernels::active_tier() == kernels::Tier::kAvx2 && hd_k % 8 == 0 && hd_v % 8 == 0;
#else
  (void)hd_k, (void)hd_v;
  return false;
#endif
}

BlockFn pick_block_fn(int64_t hd_k, int64_t hd_v) {
#if defined(__x86_64__)
  if (use_avx512(hd_k, hd_v)) return block_avx512;
  if (use_avx2(hd_k, hd_v)) return block_avx2;
#endif
  return block_scalar;
}

kernels::Format row_format(KvType t) {
  switch (t) {
    case KvType::kF16:
      return kernels::Format::kF16;
    case KvType::kF32:
      return kernels::Format::kF32;
    case KvType::kQ8_0:
      return kernels::Format::kQ8_0;
  }
  return kernels::Format::kF32;
}

// A run of consecutive tokens of one sequence: tok[first .. first+count).
struct Tile {
  int64_t first = 0;
  int64_t count = 0;
  int64_t last_pos = 0;  // position of its last token (cost ~ last_pos)
};

// Requests the cache lines of [p, p + bytes) into L2 (read, moderate
// locality: they are converted once, right after). A hint: never faults.
inline void prefetch_l2(const uint8_t* p, size_t bytes) {
  const auto first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const auto last = reinterpret_cast<uintptr_t>(p) + bytes;
  for (uintptr_t a = first; a < last; a += 64) __builtin_prefetch(reinterpret_cast<const void*>(a), 0, 2);
}

// Per-thread scratch, grown on demand.
struct Scratch {
  std::vector<float> k, v, state;
};

}  // namespace

const char* attention_kernel_name(int64_t head_dim_k, int64_t head_dim_v) {
  if (use_avx512(head_dim_k, head_dim_v)) return "avx512";
  return use_avx2(head_dim_k, head_dim_v) ? "avx2" : "scalar";
}

void attention(const ModelConfig& c, int64_t layer, std::span<const BatchToken> tok, std::span<KvCache* const> caches,
               const float* q, float* out, float scale, core::ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(tok.size());
  const int64_t hd_k = c.head_dim_k, hd_v = c.head_dim_v;
  const int64_t n_head_kv = c.n_head_kv, group = c.n_head / c.n_head_kv;
  const int64_t q_stride = c.n_head * hd_k, o_stride = c.n_head * hd_v;
  const int64_t st_len = 2 + hd_v;
  const BlockFn block = pick_block_fn(hd_k, hd_v);

  // Tiles: maximal runs of adjacent tokens of one sequence (their positions
  // are consecutive, forward() checked), cut every kQueryTile tokens; the
  // longest-context tiles first so the pool's tail is short.
  thread_local std::vector<Tile> tiles_tls;
  std::vector<Tile>& tiles = tiles_tls;  // the caller's, also inside the workers' lambda
  tiles.clear();
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && j - i < kQueryTile && tok[j].seq == tok[i].seq) ++j;
    tiles.push_back({i, j - i, tok[j - 1].pos});
    i = j;
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& a, const Tile& b) { return a.last_pos > b.last_pos; });

  pool.parallel_for(static_cast<int64_t>(tiles.size()) * n_head_kv, [&](int64_t b, int64_t e) {
    thread_local Scratch sc;
    if (sc.k.size() < static_cast<size_t>(kKeyBlock * hd_k)) sc.k.resize(kKeyBlock * hd_k);
    if (sc.v.size() < static_cast<size_t>(kKeyBlock * hd_v)) sc.v.resize(kKeyBlock * hd_v);
    if (sc.state.size() < static_cast<size_t>(kQueryTile * group * st_len)) {
      sc.state.resize(kQueryTile * group * st_len);
    }
    for (int64_t task = b; task < e; ++task) {
      const Tile& tl = tiles[static_cast<size_t>(task / n_head_kv)];
      const int64_t kvh = task % n_head_kv;
      const KvCache& kv = *caches[tok[tl.first].seq];
      const kernels::Format kf = row_format(kv.type_k()), vf = row_format(kv.type_v());
      const int64_t p_first = tok[tl.first].pos;
      for (int64_t s = 0; s < tl.count * group; ++s) {
        float* st = sc.state.data() + s * st_len;
        st[0] = kNegInf;
        std::fill(st + 1, st + st_len, 0.0f);
      }
      for (int64_t kb = 0; kb <= tl.last_pos; kb += kKeyBlock) {
        const int64_t nk_all = std::min(kKeyBlock, tl.last_pos + 1 - kb);
        // The next key block's K and V rows are requested into L2 while this
        // one is converted and applied: at long context the cache is read
        // from memory once per token, and without it each block waited for
        // its own misses (decode at depth 4096, 1.7B shape: 55% of the time
        // in the f16 -> f32 row conversion). Hints only; no result changes.
        // K's requests go out before this block's K conversion and V's after
        // it, so the misses in flight never fill the core's miss queue at once.
        const int64_t kn = kb + kKeyBlock;
        const int64_t nk_next = kn <= tl.last_pos ? std::min(kKeyBlock, tl.last_pos + 1 - kn) : 0;
        if (nk_next > 0) prefetch_l2(kv.k_row(layer, kvh, kn), static_cast<size_t>(nk_next) * kv.k_row_bytes());
        // One head's rows are contiguous, so the block is one row of nk_all * hd values.
        load_rows(kf, kv.k_row(layer, kvh, kb), sc.k.data(), nk_all * hd_k);
        if (nk_next > 0) prefetch_l2(kv.v_row(layer, kvh, kn), static_cast<size_t>(nk_next) * kv.v_row_bytes());
        load_rows(vf, kv.v_row(layer, kvh, kb), sc.v.data(), nk_all * hd_v);
        for (int64_t qi = 0; qi < tl.count; ++qi) {
          const int64_t pos = p_first + qi;
          if (pos < kb) continue;
          const int64_t nk = std::min(kKeyBlock, pos + 1 - kb);
          const float* qrow = q + (tl.first + qi) * q_stride + kvh * group * hd_k;
          for (int64_t g = 0; g < group; ++g) {
            block(qrow + g * hd_k, sc.k.data(), sc.v.data(), nk, hd_k, hd_v, scale,
                  sc.state.data() + (qi * group + g) * st_len);
          }
        }
      }
      for (int64_t qi = 0; qi < tl.count; ++qi) {
        float* orow = out + (tl.first + qi) * o_stride + kvh * group * hd_v;
        for (int64_t g = 0; g < group; ++g) {
          const float* st = sc.state.data() + (qi * group + g) * st_len;
          const float inv_l = 1.0f / st[1];
          for (int64_t i = 0; i < hd_v; ++i) orow[g * hd_v + i] = st[2 + i] * inv_l;
        }
      }
    }
  });
}

}  // namespace bonsai::model
