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
//
// Q8_0 keys (-ctk q8_0) take an integer path instead of the fp32 rows, as
// ggml's CPU flash attention does (it quantizes q to K's vec_dot type): each
// query head's q is quantized once per task to Q8_0 blocks of 32 (see
// quantize_q8 below) and the score of key t is
//   isum_tb = sum_{i<32} qq_{32b+i} * kq_{t,32b+i}                (int32, exact)
//   s_t = ((isum_t0 * (dq_0 * dk_t0) + isum_t1 * (dq_1 * dk_t1)) + ...) * scale
// with each * and + one fp32 rounding in that order (no fma; the file is
// compiled with -ffp-contract=off). score_q8_ref defines it; every tier's
// scorer (16 keys per vector with VNNI on AVX-512, 8 with AVX2) returns the
// same bits, so a score depends on nothing but q and the key.
//
// On the AVX-512 tier (step_heads, through step_rows) the heads that see the same keys of a
// block — the GQA group of a query, and two queries' groups on every block
// but the diagonal one — go through the step together, 4 (else 2, 1) at a
// time: each K and V chunk is loaded once for all of them, while every head
// keeps exactly its own ops (its fma chains, reduction tree, softmax and PV
// order: chains16, hsum4of16 / hsum_finish, softmax_avx512, pv_group), so the
// bits do not depend on the grouping. When at most
// kDirectHeads heads share a block (decode) the K/V rows are read in place
// from the cache (f16 -> fp32 and q8_0 d * q in registers: the same values
// as the scratch), which saves the conversion's store and reload. The AVX2
// tier has the same group step (step_heads8) with 8-wide vectors and its own
// fp32 order; elsewhere (the reference tier, head dims not multiples of 8)
// each head runs the portable step (block_scalar / update_scalar).
#include "model/attention.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>  // is_same_v
#include <vector>

#include "core/fp16.h"  // fp16_to_fp32
#include "core/thread_pool.h"
#include "kernels/kernels.h"  // active_tier, dequantize_row

namespace bonsai::model {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Largest head dim of the Q8_0-key path (a larger one converts K rows to fp32).
constexpr int64_t kMaxHeadDim = 512;
// At most this many query heads of a task (tile queries x GQA group) read K/V
// rows in place on the AVX-512 and AVX2 paths; more convert each block once
// to fp32.
constexpr int64_t kDirectHeads = 4;

// Prefetches of the next key block's K and V rows spread over the current
// block's work, for decode (rows read in place). attention() points the
// calling thread's cursor (t_spread) at the next block's rows; the group
// step's inner loops call tick(n), which requests the next n cache lines
// (K's, then V's) into L2. Spread like this the misses overlap the block's
// arithmetic; issued in four bursts between the phases (the prefill path's
// scheme, prefetch_l2) they did not: on Zen 3 decode attention at depth
// 4096 with f16 K/V took about the sum of its compute time (rows in L2) and
// its memory time, and 1.3-1.4x less with the spread requests
// (bench/results/attention-avx2-2026-12-03-zen3-session16.txt).
// Hints only: no result depends on them. Lines the kernels did not reach
// are dropped when the cursor moves on.
struct SpreadPrefetch {
  uintptr_t p[2] = {0, 0};  // next line of K's rows, of V's rows (addresses)
  uintptr_t end[2] = {0, 0};
  int64_t left = 0;  // lines not yet requested (both ranges): tick's cheap exit when 0
  // [k, k + kbytes) and [v, v + vbytes) (null: none), from their first lines.
  void set(const uint8_t* k, size_t kbytes, const uint8_t* v, size_t vbytes) {
    const uint8_t* from[2] = {k, v};
    const size_t bytes[2] = {k ? kbytes : 0, v ? vbytes : 0};
    left = 0;
    for (int i = 0; i < 2; ++i) {
      end[i] = reinterpret_cast<uintptr_t>(from[i]) + bytes[i];
      p[i] = reinterpret_cast<uintptr_t>(from[i]) & ~uintptr_t{63};
      left += static_cast<int64_t>((end[i] - p[i] + 63) / 64);
    }
  }
  void clear() { set(nullptr, 0, nullptr, 0); }
  // Requests the next n lines (none once all are requested).
  void tick(int n) {
    if (left <= 0) return;
    left -= n;
    for (int i = 0; i < 2 && n > 0; ++i) {
      for (; n > 0 && p[i] < end[i]; --n, p[i] += 64) __builtin_prefetch(reinterpret_cast<const void*>(p[i]), 0, 2);
    }
  }
};
thread_local SpreadPrefetch t_spread;

// The softmax + V part of the step for scores s[0..nk) (already scaled):
// portable reference (std::exp, plain loops). s is overwritten.
void update_scalar(float* s, const float* v, int64_t nk, int64_t hd_v, float* state) {
  float mb = kNegInf;
  for (int64_t t = 0; t < nk; ++t) mb = std::max(mb, s[t]);
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

// One (query head, key block) step of the online softmax, portable (std::exp,
// plain loops): the kernel where neither SIMD group step applies.
//   q: [hd_k] query, k: [nk][hd_k] and v: [nk][hd_v] fp32 rows of the block,
//   1 <= nk <= kKeyBlock; state: [2 + hd_v] = m, l, acc (updated).
void block_scalar(const float* q, const float* k, const float* v, int64_t nk, int64_t hd_k, int64_t hd_v, float scale,
                  float* state) {
  float s[kKeyBlock];
  for (int64_t t = 0; t < nk; ++t) {
    const float* kt = k + t * hd_k;
    float d = 0.0f;
    for (int64_t i = 0; i < hd_k; ++i) d += q[i] * kt[i];
    s[t] = d * scale;
  }
  update_scalar(s, v, nk, hd_v, state);
}

// A query head's q quantized for Q8_0 keys: ggml's quantize_row_q8_0 per
// block of 32 (d = amax / 127, q = round-to-nearest-even(x * (1 / d)) with
// the unrounded d, d then rounded to fp16), plus each block's sum of q (the
// AVX-512 scorer's unsigned-operand correction). Scalar on every tier, so
// the integer parts are the same everywhere.
struct QuantQ {
  int8_t q[kMaxHeadDim];
  float d[kMaxHeadDim / 32];
  int32_t sum[kMaxHeadDim / 32];
};

inline int8_t round_i8(float v) {
  if (!(v == v)) return -128;  // NaN: as cvtps2dq's integer indefinite (kernels' round_to_i8)
  const float r = std::nearbyint(v);
  return static_cast<int8_t>(r > 127.0f ? 127.0f : (r < -128.0f ? -128.0f : r));
}

void quantize_q8(const float* x, int64_t hd, QuantQ& out) {
  for (int64_t b = 0; b < hd / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      out.q[32 * b + i] = round_i8(xb[i] * id);
      sum += out.q[32 * b + i];
    }
    out.d[b] = core::fp16_to_fp32(core::fp32_to_fp16(d));
    out.sum[b] = sum;
  }
}

// The score formula of the header comment for key row `k` (ggml block_q8_0
// x hd/32) from its block sums; every scorer ends in exactly these fp32 ops.
// (With the key row's block scales already converted: dk [nb].)
inline float combine_q8_dk(const int32_t* isum, const QuantQ& q, const float* dk, int64_t nb, float scale) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const float term = static_cast<float>(isum[b]) * (q.d[b] * dk[b]);
    acc = b == 0 ? term : acc + term;
  }
  return acc * scale;
}
inline float combine_q8(const int32_t* isum, const QuantQ& q, const uint8_t* k, int64_t nb, float scale) {
  float dk[kMaxHeadDim / 32];
  for (int64_t b = 0; b < nb; ++b) {
    uint16_t dh;
    std::memcpy(&dh, k + 34 * b, 2);
    dk[b] = core::fp16_to_fp32(dh);
  }
  return combine_q8_dk(isum, q, dk, nb, scale);
}

// Reference scorer: s[t] for keys t < nk of a block of Q8_0 rows (row_bytes
// apart) against each of the nq quantized query heads; s is [nq][kKeyBlock].
void score_q8_ref(const uint8_t* k, size_t row_bytes, int64_t nk, int64_t hd, const QuantQ* qs, int64_t nq, float scale,
                  float* s) {
  const int64_t nb = hd / 32;
  int32_t isum[kMaxHeadDim / 32];
  for (int64_t j = 0; j < nq; ++j) {
    for (int64_t t = 0; t < nk; ++t) {
      const uint8_t* kt = k + t * row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        const auto* kq = reinterpret_cast<const int8_t*>(kt + 34 * b + 2);
        int32_t acc = 0;
        for (int i = 0; i < 32; ++i) acc += int32_t{qs[j].q[32 * b + i]} * int32_t{kq[i]};
        isum[b] = acc;
      }
      s[j * kKeyBlock + t] = combine_q8(isum, qs[j], kt, nb, scale);
    }
  }
}

// A block of cache rows (or of fp32 scratch: format kF32) as attention() hands
// it to the group step (step_rows).
struct RowsRef {
  kernels::Format f;
  const uint8_t* p;
  size_t stride;  // bytes between rows
};

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

// The softmax part of an AVX-512 step for one head: s[0..32) scaled scores (-inf
// past nk) -> p (overwritten), state's m and l updated; returns corr.
BONSAI_AVX512 inline __m512 softmax_avx512(float* s, float* state) {
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
BONSAI_AVX512 inline __m512 hsum4of16(const __m512* d) {
  const __m512 e0 = _mm512_add_ps(_mm512_unpacklo_ps(d[0], d[1]), _mm512_unpackhi_ps(d[0], d[1]));
  const __m512 e1 = _mm512_add_ps(_mm512_unpacklo_ps(d[2], d[3]), _mm512_unpackhi_ps(d[2], d[3]));
  const __m512d a = _mm512_castps_pd(e0), b = _mm512_castps_pd(e1);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
}

// The last level: f[u] = hsum4of16 of keys 4u..4u+3 -> key u's sum in lane u.
BONSAI_AVX512 inline __m512 hsum_finish(const __m512* f) {
  const __m512 g0 = _mm512_add_ps(_mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 g1 = _mm512_add_ps(_mm512_shuffle_f32x4(f[2], f[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(f[2], f[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(g0, g1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(g0, g1, _MM_SHUFFLE(3, 1, 3, 1)));
}

#define BONSAI_AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma")))

// Block sum of one key (32 int8 at kq) against q's block (qb): exact int32.
// (k + 128) as the unsigned operand of vpdpbusd, minus 128 * sum(q).
BONSAI_AVX512VNNI inline int32_t isum_one_vnni(const uint8_t* kq, const int8_t* qb, int32_t qsum) {
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
BONSAI_AVX512VNNI void score_q8_avx512(const uint8_t* k, size_t row_bytes, int64_t nk, int64_t hd, const QuantQ* qs,
                                       int64_t nq, float scale, float* s) {
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
        const QuantQ& q = qs[j];
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
        float* sj = s + j * kKeyBlock + t0;
        __m512 acc = b == 0 ? term : _mm512_add_ps(_mm512_loadu_ps(sj), term);
        if (b == nb - 1) acc = _mm512_mul_ps(acc, vscale);
        _mm512_storeu_ps(sj, acc);
      }
    }
  }
  int32_t isum[kMaxHeadDim / 32];
  for (; t0 < nk; ++t0) {
    const uint8_t* kt = k + t0 * row_bytes;
    for (int64_t j = 0; j < nq; ++j) {
      for (int64_t b = 0; b < nb; ++b) isum[b] = isum_one_vnni(kt + 34 * b + 2, qs[j].q + 32 * b, qs[j].sum[b]);
      s[j * kKeyBlock + t0] = combine_q8(isum, qs[j], kt, nb, scale);
    }
  }
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

// Row sources of the group steps: row t's fp32 elements [16c, 16c + 16)
// (load16, AVX-512) or [8c, 8c + 8) (load8, AVX2).
struct RowsF32 {
  const float* p;
  int64_t stride;  // floats between rows
};
struct RowsF16 {
  const uint8_t* p;
  size_t stride;  // bytes between rows
};
struct RowsQ8 {  // ggml block_q8_0 rows
  const uint8_t* p;
  size_t stride;  // bytes between rows
};

BONSAI_AVX512 inline __m512 load16(const RowsF32& r, int64_t t, int64_t c) {
  return _mm512_loadu_ps(r.p + t * r.stride + 16 * c);
}
BONSAI_AVX512 inline __m512 load16(const RowsF16& r, int64_t t, int64_t c) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.p + t * r.stride + 32 * c)));
}
BONSAI_AVX512 inline __m512 load16(const RowsQ8& r, int64_t t, int64_t c) {
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
BONSAI_AVX512 inline void chains16(const float* const* q, int64_t hd_k, const KR& k, int64_t t0, __m512 (&f)[NQ][4]) {
  constexpr int KU = NQ <= 2 ? 8 : 4;
  const int64_t nc = hd_k / 16;
  SpreadPrefetch& pf = t_spread;
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
BONSAI_AVX512 void scores_group(const float* const* q, int64_t hd_k, const KR& k, int64_t nk, float scale, float* s) {
  static_assert(kKeyBlock == 32);
  const __m512 vscale = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(kNegInf);
  for (int64_t t0 = 0; t0 < kKeyBlock; t0 += 16) {
    if (t0 >= nk) {
#pragma GCC unroll 16
      for (int j = 0; j < NQ; ++j) _mm512_storeu_ps(s + j * kKeyBlock + t0, ninf);
      continue;
    }
    __m512 f[NQ][4];
    chains16<NQ>(q, hd_k, k, t0, f);
    const __mmask16 live = nk - t0 >= 16 ? __mmask16(0xffff) : __mmask16((1u << (nk - t0)) - 1u);
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) {
      _mm512_storeu_ps(s + j * kKeyBlock + t0,
                       _mm512_mask_mov_ps(ninf, live, _mm512_mul_ps(hsum_finish(f[j]), vscale)));
    }
  }
}

// The PV part for NQ heads at once over V chunks [c0, c0 + NC): per head j,
// acc_j = acc_j * corr_j, then acc_j = fma(p_jt, v_t, acc_j) for t ascending.
// p: [NQ][kKeyBlock]; acc[j]: head j's accumulator (hd_v floats).
template <int NQ, int NC, class VR>
BONSAI_AVX512 inline void pv_group(const float* p, int64_t nk, const VR& v, int64_t c0, const __m512* corr,
                                   float* const* acc) {
  __m512 a[NQ][NC];
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) a[j][c] = _mm512_mul_ps(_mm512_loadu_ps(acc[j] + 16 * (c0 + c)), corr[j]);
  }
  SpreadPrefetch& pf = t_spread;
  for (int64_t t = 0; t < nk; ++t) {
    pf.tick(NC < 4 ? 4 : NC);
    __m512 pt[NQ];
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) pt[j] = _mm512_set1_ps(p[j * kKeyBlock + t]);
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
BONSAI_AVX512 void pv_heads(const float* p, int64_t nk, const VR& v, int64_t hd_v, const __m512* corr,
                            float* const* acc) {
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
// and V. s: [NQ][kKeyBlock] scratch; head j's state at st + j * st_len.
template <int NQ, class KR, class VR>
BONSAI_AVX512 inline void step_heads(const float* const* q, const KR* k, const VR& v, int64_t nk, int64_t hd_k,
                                     int64_t hd_v, float scale, float* s, float* st, int64_t st_len) {
  if (k) scores_group<NQ>(q, hd_k, *k, nk, scale, s);
  __m512 corr[NQ];
  float* acc[NQ];
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
    corr[j] = softmax_avx512(s + j * kKeyBlock, st + j * st_len);
    acc[j] = st + j * st_len + 2;
  }
  pv_heads<NQ>(s, nk, v, hd_v, corr, acc);
}

// step_heads as the shared group step (step_rows below) calls it.
struct Avx512Heads {
  template <int NQ, class KR, class VR>
  BONSAI_AVX512 static void run(const float* const* q, const KR* k, const VR& v, int64_t nk, int64_t hd_k, int64_t hd_v,
                                float scale, float* s, float* st, int64_t st_len) {
    step_heads<NQ>(q, k, v, nk, hd_k, hd_v, scale, s, st, st_len);
  }
};
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

BONSAI_AVX2 inline __m256 load8(const RowsF32& r, int64_t t, int64_t c) {
  return _mm256_loadu_ps(r.p + t * r.stride + 8 * c);
}
BONSAI_AVX2 inline __m256 load8(const RowsF16& r, int64_t t, int64_t c) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.p + t * r.stride + 16 * c)));
}
// Q8_0 row t's block scale for chunk c (chunks 4b .. 4b + 3 share block b's).
BONSAI_AVX2 inline __m256 q8_scale8(const RowsQ8& r, int64_t t, int64_t c) {
  uint16_t dh;
  std::memcpy(&dh, r.p + t * r.stride + 34 * (c >> 2), 2);
  return _mm256_set1_ps(_cvtsh_ss(dh));
}
// d * q of chunk c (as q8_0_to_f32_avx2), with d = q8_scale8(r, t, c).
BONSAI_AVX2 inline __m256 q8_chunk8(const RowsQ8& r, int64_t t, int64_t c, __m256 d) {
  const __m128i q =
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r.p + t * r.stride + 34 * (c >> 2) + 2 + 8 * (c & 3)));
  return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
}

// The tree above for KU keys' 8-lane partials d[0..KU) -> key u's sum in lane
// u (KU = 8: all lanes; 4 and 2: the low 4 / 2 lanes hold the sums).
template <int KU>
BONSAI_AVX2 inline __m256 hsum_keys(const __m256* d) {
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
BONSAI_AVX2 inline void chains8(const float* const* q, int64_t nc, const KR& k, int64_t t0, __m256 (&a)[NQ][KU]) {
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
  SpreadPrefetch& pf = t_spread;
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
BONSAI_AVX2 inline void score_keys8(const float* const* q, int64_t nc, const KR& k, int64_t t0, int64_t nk, float scale,
                                    float* s) {
  __m256 a[NQ][KU];
  chains8<NQ, KU>(q, nc, k, t0, a);
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 live = _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(nk - t0)), _CMP_LT_OQ);
  const __m256 vscale = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(kNegInf);
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
      _mm256_storeu_ps(s + j * kKeyBlock + t0, r);
    } else if constexpr (KU >= 3) {
      _mm_storeu_ps(s + j * kKeyBlock + t0, _mm256_castps256_ps128(r));
    } else {
      _mm_storel_pi(reinterpret_cast<__m64*>(s + j * kKeyBlock + t0), _mm256_castps256_ps128(r));
    }
  }
}

// s[j][0..32) = head j's scaled scores of keys < nk (NQ heads, q rows at
// q[j]), -inf past them. Keys in groups of KU (8 for one head, 4 for two, 3
// then a last 2 for four); rows up to the group holding nk - 1 are read
// (their lanes are masked: each lane depends on its own key only), all
// inside the 32-key block.
template <int NQ, class KR>
BONSAI_AVX2 void scores_group8(const float* const* q, int64_t hd_k, const KR& k, int64_t nk, float scale, float* s) {
  static_assert(kKeyBlock == 32);
  constexpr int KU = NQ == 1 ? 8 : (NQ == 2 ? 4 : 3);
  constexpr int64_t kFull = kKeyBlock / KU * KU;  // keys in whole KU groups (30 for KU = 3)
  const int64_t nc = hd_k / 8;
  for (int64_t t0 = 0; t0 < kKeyBlock; t0 += KU) {
    if (t0 >= nk) {  // no live key from here on: every head's rest of the row is -inf
      for (int j = 0; j < NQ; ++j) std::fill(s + j * kKeyBlock + t0, s + (j + 1) * kKeyBlock, kNegInf);
      return;
    }
    if (t0 < kFull) {
      score_keys8<NQ, KU>(q, nc, k, t0, nk, scale, s);
    } else {
      static_assert(kKeyBlock - kFull == 0 || kKeyBlock - kFull == 2);
      score_keys8<NQ, 2>(q, nc, k, t0, nk, scale, s);  // the last 2 keys (KU = 3)
    }
  }
}

// The softmax part of an AVX2 step for one head: s[0..32) scaled scores (-inf
// past nk) -> p (overwritten), state's m and l updated; returns corr (all lanes).
BONSAI_AVX2 inline __m256 softmax_avx2(float* s, float* state) {
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
// p: [NQ][kKeyBlock]; acc[j]: head j's accumulator (hd_v floats). Q8_0 rows:
// c0 is a multiple of min(NC, 4), so chunks c .. c + min(NC, 4) - 1 share one
// block scale, converted once.
template <int NQ, int NC, class VR>
BONSAI_AVX2 inline void pv_group8(const float* p, int64_t nk, const VR& v, int64_t c0, const __m256* corr,
                                  float* const* acc) {
  __m256 a[NQ][NC];
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) a[j][c] = _mm256_mul_ps(_mm256_loadu_ps(acc[j] + 8 * (c0 + c)), corr[j]);
  }
  // Value chunk c of key t (Q8_0: d is the run's current block scale,
  // converted at the first chunk of each block of the run).
  [[maybe_unused]] __m256 d;
  auto value = [&](int64_t t, int c) BONSAI_AVX2 {
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
  SpreadPrefetch& pf = t_spread;
  for (int64_t t = 0; t < nk; ++t) {
    pf.tick(2);
    if constexpr (NQ <= NC) {
      __m256 pt[NQ];
#pragma GCC unroll 16
      for (int j = 0; j < NQ; ++j) pt[j] = _mm256_broadcast_ss(p + j * kKeyBlock + t);
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
        const __m256 pt = _mm256_broadcast_ss(p + j * kKeyBlock + t);
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
BONSAI_AVX2 void pv_heads8(const float* p, int64_t nk, const VR& v, int64_t hd_v, const __m256* corr,
                           float* const* acc) {
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
BONSAI_AVX2 inline void step_heads8(const float* const* q, const KR* k, const VR& v, int64_t nk, int64_t hd_k,
                                    int64_t hd_v, float scale, float* s, float* st, int64_t st_len) {
  if (k) scores_group8<NQ>(q, hd_k, *k, nk, scale, s);
  __m256 corr[NQ];
  float* acc[NQ];
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
    corr[j] = softmax_avx2(s + j * kKeyBlock, st + j * st_len);
    acc[j] = st + j * st_len + 2;
  }
  pv_heads8<NQ>(s, nk, v, hd_v, corr, acc);
}

// step_heads8 as the shared group step (step_rows below) calls it.
struct Avx2Heads {
  template <int NQ, class KR, class VR>
  BONSAI_AVX2 static void run(const float* const* q, const KR* k, const VR& v, int64_t nk, int64_t hd_k, int64_t hd_v,
                              float scale, float* s, float* st, int64_t st_len) {
    step_heads8<NQ>(q, k, v, nk, hd_k, hd_v, scale, s, st, st_len);
  }
};

// ---- The group step's row-type dispatch and head grouping, shared by the
// tiers: Heads::run<NQ> (Avx512Heads, Avx2Heads) is the tier's step for NQ
// heads. nh heads of one key block go 4 (else 2, 1) at a time; the rows'
// types are chosen at run time; k null: Q8_0 keys, the scores already in s
// (-inf past nk). s: [nh][kKeyBlock] scratch; head j's state at st + j * st_len.
template <class Heads, class KR, class VR>
void step_group(const float* const* q, int64_t nh, const KR* k, const VR& v, int64_t nk, int64_t hd_k, int64_t hd_v,
                float scale, float* s, float* st, int64_t st_len) {
  int64_t j = 0;
  for (; j + 4 <= nh; j += 4) {
    Heads::template run<4>(q + j, k, v, nk, hd_k, hd_v, scale, s + j * kKeyBlock, st + j * st_len, st_len);
  }
  if (j + 2 <= nh) {
    Heads::template run<2>(q + j, k, v, nk, hd_k, hd_v, scale, s + j * kKeyBlock, st + j * st_len, st_len);
    j += 2;
  }
  if (j < nh) Heads::template run<1>(q + j, k, v, nk, hd_k, hd_v, scale, s + j * kKeyBlock, st + j * st_len, st_len);
}

template <class Heads, class KR>
void step_v(const float* const* q, int64_t nh, const KR* k, const RowsRef& v, int64_t nk, int64_t hd_k, int64_t hd_v,
            float scale, float* s, float* st, int64_t st_len) {
  switch (v.f) {
    case kernels::Format::kF16:
      return step_group<Heads>(q, nh, k, RowsF16{v.p, v.stride}, nk, hd_k, hd_v, scale, s, st, st_len);
    case kernels::Format::kQ8_0:
      return step_group<Heads>(q, nh, k, RowsQ8{v.p, v.stride}, nk, hd_k, hd_v, scale, s, st, st_len);
    default:
      return step_group<Heads>(
          q, nh, k, RowsF32{reinterpret_cast<const float*>(v.p), static_cast<int64_t>(v.stride / sizeof(float))}, nk,
          hd_k, hd_v, scale, s, st, st_len);
  }
}

template <class Heads>
void step_rows(const float* const* q, int64_t nh, const RowsRef* k, const RowsRef& v, int64_t nk, int64_t hd_k,
               int64_t hd_v, float scale, float* s, float* st, int64_t st_len) {
  if (!k) return step_v<Heads, RowsF32>(q, nh, nullptr, v, nk, hd_k, hd_v, scale, s, st, st_len);
  if (k->f == kernels::Format::kF16) {
    const RowsF16 kr{k->p, k->stride};
    return step_v<Heads>(q, nh, &kr, v, nk, hd_k, hd_v, scale, s, st, st_len);
  }
  const RowsF32 kr{reinterpret_cast<const float*>(k->p), static_cast<int64_t>(k->stride / sizeof(float))};
  return step_v<Heads>(q, nh, &kr, v, nk, hd_k, hd_v, scale, s, st, st_len);
}

// Block b of Q8_0 key row kt against q (aq = |q|, qv = q): |q| x sign(k, q)
// in int32 pairs of pairs, the block's 8 partial sums.
BONSAI_AVX2 inline __m256i q8_block_avx2(const uint8_t* kt, __m256i aq, __m256i qv, __m256i ones, int64_t b) {
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
BONSAI_AVX2 void score_q8_avx2(const uint8_t* k, size_t row_bytes, int64_t nk, int64_t hd, const QuantQ* qs, int64_t nq,
                               float scale, float* s) {
  const int64_t nb = hd / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 vscale = _mm256_set1_ps(scale);
  alignas(16) uint16_t dh[kMaxHeadDim / 32][8];
  int64_t t0 = 0;
  for (; t0 + 8 <= nk; t0 += 8) {
    const uint8_t* kg = k + t0 * row_bytes;
    for (int u = 0; u < 8; ++u) {
      for (int64_t b = 0; b < nb; ++b) std::memcpy(&dh[b][u], kg + u * row_bytes + 34 * b, 2);
    }
    for (int64_t j = 0; j < nq; ++j) {
      const QuantQ& q = qs[j];
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
      _mm256_storeu_ps(s + j * kKeyBlock + t0, _mm256_mul_ps(acc, vscale));
    }
  }
  int32_t isum[kMaxHeadDim / 32];
  float dk[kMaxHeadDim / 32];
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
      s[j * kKeyBlock + t0] = combine_q8_dk(isum, qs[j], dk, nb, scale);
    }
  }
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

// The group step of the fused path (step_rows<Heads>): the AVX-512
// or AVX2 tier's, or null where neither applies (attention() then runs the
// scalar per-head step, block_scalar / update_scalar).
using StepFn = void (*)(const float* const* q, int64_t group, const RowsRef* k, const RowsRef& v, int64_t nk,
                        int64_t hd_k, int64_t hd_v, float scale, float* s, float* st, int64_t st_len);

StepFn pick_step(int64_t hd_k, int64_t hd_v) {
#if defined(__x86_64__)
  if (use_avx512(hd_k, hd_v)) return step_rows<Avx512Heads>;
  if (use_avx2(hd_k, hd_v)) return step_rows<Avx2Heads>;
#else
  (void)hd_k, (void)hd_v;
#endif
  return nullptr;
}

// The Q8_0-key path's scorer (score_q8_ref's signature) of the active tier.
using ScoreQ8Fn = void (*)(const uint8_t* k, size_t row_bytes, int64_t nk, int64_t hd, const QuantQ* qs, int64_t nq,
                           float scale, float* s);

ScoreQ8Fn pick_score_q8(int64_t hd_k, int64_t hd_v) {
#if defined(__x86_64__)
  if (use_avx512(hd_k, hd_v)) return score_q8_avx512;
  if (use_avx2(hd_k, hd_v)) return score_q8_avx2;
#endif
  return score_q8_ref;
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
  std::vector<float> s;          // [tile queries * group][kKeyBlock] scores / probabilities (group step, Q8_0 keys)
  std::vector<QuantQ> qq;        // [tile queries * group] quantized q (Q8_0-key path)
  std::vector<const float*> qp;  // [tile queries * group] q rows of the task's heads
};

}  // namespace

const char* attention_kernel_name(int64_t head_dim_k, int64_t head_dim_v) {
  if (use_avx512(head_dim_k, head_dim_v)) return "avx512";
  return use_avx2(head_dim_k, head_dim_v) ? "avx2" : "scalar";
}

void attention_q8_scores(const float* q, const uint8_t* k_rows, size_t row_bytes, int64_t nk, int64_t hd, float scale,
                         float* s) {
  QuantQ qq;
  quantize_q8(q, hd, qq);
  pick_score_q8(hd, hd)(k_rows, row_bytes, nk, hd, &qq, 1, scale, s);
}

void attention(const ModelConfig& c, int64_t layer, std::span<const BatchToken> tok, std::span<KvCache* const> caches,
               const float* q, float* out, float scale, core::ThreadPool& pool, int64_t kvh_begin, int64_t kvh_end) {
  const int64_t n = static_cast<int64_t>(tok.size());
  const int64_t hd_k = c.head_dim_k, hd_v = c.head_dim_v;
  const int64_t n_head_kv = c.n_head_kv, group = c.n_head / c.n_head_kv;
  const int64_t q_stride = c.n_head * hd_k, o_stride = c.n_head * hd_v;
  const int64_t st_len = 2 + hd_v;
  const ScoreQ8Fn score_q8 = pick_score_q8(hd_k, hd_v);
  const StepFn step = pick_step(hd_k, hd_v);  // null: scalar per-head steps
  const bool fused = step != nullptr;         // the group's heads share each K/V load

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

  if (kvh_end < 0) kvh_end = n_head_kv;
  const int64_t n_kvh = kvh_end - kvh_begin;  // KV heads computed here
  if (n_kvh <= 0) return;
  // Tasks KV-head-major: consecutive tasks (one thread's chunk) walk the same
  // head's K/V rows for every tile, so those rows stay in cache between
  // tiles instead of all heads' rows passing through once per tile.
  const int64_t n_tiles = static_cast<int64_t>(tiles.size());
  pool.parallel_for(n_tiles * n_kvh, [&](int64_t b, int64_t e) {
    thread_local Scratch sc;
    if (sc.k.size() < static_cast<size_t>(kKeyBlock * hd_k)) sc.k.resize(kKeyBlock * hd_k);
    if (sc.v.size() < static_cast<size_t>(kKeyBlock * hd_v)) sc.v.resize(kKeyBlock * hd_v);
    if (sc.state.size() < static_cast<size_t>(kQueryTile * group * st_len)) {
      sc.state.resize(kQueryTile * group * st_len);
    }
    if (sc.s.size() < static_cast<size_t>(kQueryTile * group * kKeyBlock)) {
      sc.s.resize(kQueryTile * group * kKeyBlock);
      sc.qq.resize(kQueryTile * group);
      sc.qp.resize(kQueryTile * group);
    }
    for (int64_t task = b; task < e; ++task) {
      const Tile& tl = tiles[static_cast<size_t>(task % n_tiles)];
      const int64_t kvh = kvh_begin + task / n_tiles;
      const KvCache& kv = *caches[tok[tl.first].seq];
      const kernels::Format kf = row_format(kv.type_k()), vf = row_format(kv.type_v());
      const bool q8k = kv.type_k() == KvType::kQ8_0 && hd_k <= kMaxHeadDim;
      const int64_t p_first = tok[tl.first].pos;
      for (int64_t s = 0; s < tl.count * group; ++s) {
        float* st = sc.state.data() + s * st_len;
        st[0] = kNegInf;
        std::fill(st + 1, st + st_len, 0.0f);
      }
      for (int64_t qi = 0; qi < tl.count; ++qi) {
        for (int64_t g = 0; g < group; ++g) {
          sc.qp[qi * group + g] = q + (tl.first + qi) * q_stride + (kvh * group + g) * hd_k;
        }
      }
      if (q8k) {  // each query head's q quantized once for the whole key walk
        for (int64_t qi = 0; qi < tl.count; ++qi) {
          const float* qrow = q + (tl.first + qi) * q_stride + kvh * group * hd_k;
          for (int64_t g = 0; g < group; ++g) quantize_q8(qrow + g * hd_k, hd_k, sc.qq[qi * group + g]);
        }
      }
      // The group step reads K/V straight from the cache rows when at most
      // kDirectHeads query heads share the block (decode), and converts them
      // once to fp32 scratch otherwise (prefill tiles): the same values.
      const bool direct = fused && tl.count * group <= kDirectHeads;
      const bool direct_k = direct && kf != kernels::Format::kQ8_0;
      for (int64_t kb = 0; kb <= tl.last_pos; kb += kKeyBlock) {
        const int64_t nk_all = std::min(kKeyBlock, tl.last_pos + 1 - kb);
        // The next key block's K and V rows are requested into L2 while this
        // one is converted and applied: at long context the cache is read
        // from memory once per token, and without it each block waited for
        // its own misses (decode at depth 4096, 1.7B shape: 55% of the time
        // in the f16 -> f32 row conversion). Hints only; no result changes.
        // Decode (rows read in place: `direct`): the requests go out a few
        // lines at a time from the group step's inner loops (SpreadPrefetch).
        // Prefill: they are spread over the block's phases (K before this
        // block's K conversion and V after it; with Q8_0 keys, which are
        // not converted, K in two halves around V's conversion and V in two
        // halves around the scoring and the V update), so the misses in
        // flight never fill the core's miss queue at once: a burst of both
        // halves stalled on the prefetch instructions (perf, q8_0 at depth
        // 4096: 11% of the time on them; spread: tg64 28.2/22.9 -> 32.7/31.7).
        const bool k_conv = !q8k && !direct_k;
        const int64_t kn = kb + kKeyBlock;
        const int64_t nk_next = kn <= tl.last_pos ? std::min(kKeyBlock, tl.last_pos + 1 - kn) : 0;
        const size_t kbytes = static_cast<size_t>(nk_next) * kv.k_row_bytes();
        const size_t vbytes = static_cast<size_t>(nk_next) * kv.v_row_bytes();
        const uint8_t* k_next = nk_next > 0 ? kv.k_row(layer, kvh, kn) : nullptr;
        const uint8_t* v_next = nk_next > 0 ? kv.v_row(layer, kvh, kn) : nullptr;
        if (direct) {
          t_spread.set(k_next, kbytes, v_next, vbytes);
        } else {
          t_spread.clear();
        }
        if (k_next && !direct) prefetch_l2(k_next, k_conv ? kbytes : kbytes / 2);
        // One head's rows are contiguous, so the block is one row of nk_all * hd values.
        if (k_conv) load_rows(kf, kv.k_row(layer, kvh, kb), sc.k.data(), nk_all * hd_k);
        if (v_next && k_conv && !direct) prefetch_l2(v_next, vbytes);
        if (!direct) load_rows(vf, kv.v_row(layer, kvh, kb), sc.v.data(), nk_all * hd_v);
        if (k_next && !k_conv && !direct) prefetch_l2(k_next + kbytes / 2, kbytes - kbytes / 2);
        const int64_t qi0 = std::max<int64_t>(0, kb - p_first);  // first query reaching this block
        if (q8k) {
          // Scores of keys kb..kb+nk_all for the tile's queries that reach
          // this block (positions are consecutive: the first ones may not).
          score_q8(kv.k_row(layer, kvh, kb), kv.k_row_bytes(), nk_all, hd_k, sc.qq.data() + qi0 * group,
                   (tl.count - qi0) * group, scale, sc.s.data() + qi0 * group * kKeyBlock);
        }
        if (v_next && !k_conv && !direct) prefetch_l2(v_next, vbytes / 2);
        if (fused) {
          const RowsRef kref = direct_k ? RowsRef{kf, kv.k_row(layer, kvh, kb), kv.k_row_bytes()}
                                        : RowsRef{kernels::Format::kF32, reinterpret_cast<const uint8_t*>(sc.k.data()),
                                                  static_cast<size_t>(hd_k) * sizeof(float)};
          const RowsRef vref = direct ? RowsRef{vf, kv.v_row(layer, kvh, kb), kv.v_row_bytes()}
                                      : RowsRef{kernels::Format::kF32, reinterpret_cast<const uint8_t*>(sc.v.data()),
                                                static_cast<size_t>(hd_v) * sizeof(float)};
          // Two queries at a time where both see the whole block (every
          // block but the diagonal one), so their 2 x group heads share the
          // loads; the diagonal block one query at a time (nk differs).
          for (int64_t qi = qi0; qi < tl.count;) {
            const int64_t nk = std::min(kKeyBlock, p_first + qi + 1 - kb);
            const int64_t n_q = nk == kKeyBlock && qi + 1 < tl.count ? 2 : 1;
            float* srow = sc.s.data() + qi * group * kKeyBlock;
            if (q8k && nk < kKeyBlock) {
              for (int64_t j = 0; j < n_q * group; ++j) {
                std::fill(srow + j * kKeyBlock + nk, srow + (j + 1) * kKeyBlock, kNegInf);
              }
            }
            step(sc.qp.data() + qi * group, n_q * group, q8k ? nullptr : &kref, vref, nk, hd_k, hd_v, scale, srow,
                 sc.state.data() + qi * group * st_len, st_len);
            qi += n_q;
          }
        } else if (q8k) {
          for (int64_t qi = qi0; qi < tl.count; ++qi) {
            const int64_t nk = std::min(kKeyBlock, p_first + qi + 1 - kb);
            for (int64_t g = 0; g < group; ++g) {
              float* srow = sc.s.data() + (qi * group + g) * kKeyBlock;
              std::fill(srow + nk, srow + kKeyBlock, kNegInf);
              update_scalar(srow, sc.v.data(), nk, hd_v, sc.state.data() + (qi * group + g) * st_len);
            }
          }
        } else {
          for (int64_t qi = qi0; qi < tl.count; ++qi) {
            const int64_t nk = std::min(kKeyBlock, p_first + qi + 1 - kb);
            const float* qrow = q + (tl.first + qi) * q_stride + kvh * group * hd_k;
            for (int64_t g = 0; g < group; ++g) {
              block_scalar(qrow + g * hd_k, sc.k.data(), sc.v.data(), nk, hd_k, hd_v, scale,
                           sc.state.data() + (qi * group + g) * st_len);
            }
          }
        }
        if (v_next && !k_conv && !direct) prefetch_l2(v_next + vbytes / 2, vbytes - vbytes / 2);
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
