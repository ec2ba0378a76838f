// NEON tier of the attention kernels (attention.h): arm64 Advanced SIMD
// (ARMv8.0-A, no flag needed), serving the neon, neon-dotprod and
// neon-i8mm tiers (attention.cpp). The Q8_0-key integer dots use SMULL +
// SADALP here; the dotprod and i8mm tiers take this table with SDOT's
// scorer (attention_neon_dotprod.cpp): exact in int32 either way, the same
// bits. Built only on arm64; elsewhere this file defines an absent tier.
//
// Group step (step_heads4, through step_rows): the structure of the AVX2
// tier's step with 4-wide vectors and this tier's own fp32 order. The heads
// that see the same keys of a block go through it together, 4 (else 2, 1)
// at a time, sharing each K and V load; every head keeps its own ops, so the
// bits do not depend on the grouping, nor on whether K/V rows are read in
// place (f16 -> fp32 and q8_0 d * q in registers) or from fp32 scratch.
//   score of key t: lane l = q[l] * k[l], then fma(q[4c + l], k[4c + l], .)
//     for the 4-wide chunks c = 1, 2, ... in order; the lanes reduced by
//     (l0 + l1) + (l2 + l3) (two FADDP levels, hsum_keys4), then * scale;
//   softmax: the block max, exp_neg_f32x4 (the AVX2 tier's Cephes expf),
//     l = the 32 p summed by a fixed tree (softmax_neon);
//   PV: acc = acc * corr, then acc = fma(p_t, v_t, acc) for t ascending.
// Results differ from the reference and the x86 tiers by fp32 order only,
// within tests/model/attention_test.cpp's bound; the Q8_0-key scores are the
// reference's bits (score_q8_neon_t, attention_neon_q8.inc).
//
// Instructions per product (static counts of the loops in
// aarch64-linux-gnu-objdump -d of GCC 12 -O3 code and objdump -d of the x86
// build's attention_avx2.cpp.o, 2026-12-06; qemu cannot time them and nobody
// has run them on ARM hardware yet), F16 K/V rows, 4 heads per group:
//   scores (scores_group4<4>): per 4-wide chunk of 4 keys 8 LDR (4 keys, 4
//     heads' q), 4 FCVTL, 16 FMLA, 2 address/loop and 5 for the prefetch
//     cursor's check = 37 for 64 products, 0.58 per product (F32 rows: no
//     FCVTL, 0.52; one head, 8 keys: 1.3); AVX2 score_keys8<4, 3>: 26 for
//     96, 0.27;
//   PV (pv_group4<4, 4>, 8 keys per loop trip as unrolled): 315 for 512
//     products, 0.62 (16 FMLA by element per key, 4 LDR d + 4 FCVTL per
//     key, the p of 4 keys in one LDR q per head); AVX2 pv_group8<4, 3>: 29
//     for 96, 0.30;
//   Q8_0 scores (score_q8_neon_t<SmullDot>, 4 keys): 60 per 32-int8 block
//     of 4 keys (8 SMULL/SMULL2 pairs, 16 SADALP/SADDLP, the ADDP tree and
//     the fp32 combine) for 128 products, 0.47; with SDOT
//     (attention_neon_dotprod.cpp) see there; AVX2 (8 keys): 59 for 256,
//     0.23.
// So the NEON step retires ~2.1-2.3x the AVX2 step's instructions per
// product (4 lanes against 8); a Neoverse N1/V1-class core issues 2 (V1: 4)
// 128-bit FMLA per cycle, so the step is compute-bound at about half (V1:
// about the same as) an AVX2 Zen 3 core's rate. To be measured on ARM
// hardware (bench/README.md, "ARM tiers").
#include "kernels/attention_internal.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>  // is_same_v

namespace bonsai::kernels::detail {
namespace {

// fp16 bits -> fp32 (FCVTL), one value in every lane.
inline float32x4_t f16_dup(uint16_t h) { return vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))); }

void f16_to_f32_neon(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src + i));
    vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
    vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
  }
  for (; i < n; ++i) dst[i] = core::fp16_to_fp32(src[i]);
}

// 16 int8 -> four fp32 vectors times d (exact: |q| <= 128, d an fp16 value).
inline void q8x16_to_f32(int8x16_t q, float32x4_t d, float32x4_t* out) {
  const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
  out[0] = vmulq_f32(d, vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))));
  out[1] = vmulq_f32(d, vcvtq_f32_s32(vmovl_high_s16(lo)));
  out[2] = vmulq_f32(d, vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))));
  out[3] = vmulq_f32(d, vcvtq_f32_s32(vmovl_high_s16(hi)));
}

// ggml block_q8_0 rows (fp16 d, int8 qs[32]) -> d * q (exact in fp32).
void q8_0_to_f32_neon(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
    uint16_t dh;
    std::memcpy(&dh, src, 2);
    const float32x4_t d = f16_dup(dh);
    float32x4_t f[8];
    q8x16_to_f32(vld1q_s8(reinterpret_cast<const int8_t*>(src + 2)), d, f);
    q8x16_to_f32(vld1q_s8(reinterpret_cast<const int8_t*>(src + 18)), d, f + 4);
    for (int i = 0; i < 8; ++i) vst1q_f32(dst + 4 * i, f[i]);
  }
}

// e^x for x <= 0, 4 lanes: the AVX2 tier's Cephes expf (x = n ln2 + r,
// degree-6 polynomial in r, 2^n built in the exponent bits; n >= -126 after
// the clamp, so the result is a normal number). x < -87 (incl. -inf) -> 0.
inline float32x4_t exp_neg_f32x4(float32x4_t x) {
  const float32x4_t lo = vdupq_n_f32(-87.0f);
  const uint32x4_t keep = vcgeq_f32(x, lo);
  x = vmaxq_f32(x, lo);
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vreinterpretq_f32_u32(vandq_u32(keep, vreinterpretq_u32_f32(vmulq_f32(p, vreinterpretq_f32_s32(e)))));
}

// ---- Row sources: row t's start (row), then its fp32 elements [4c, 4c + 4)
// (load4) or, for Q8_0 rows, chunks 4g .. 4g + 3 (q8_group4) ----
inline const float* row(const RowsF32& r, int64_t t) { return r.p + t * r.stride; }
inline const uint16_t* row(const RowsF16& r, int64_t t) {
  return reinterpret_cast<const uint16_t*>(r.p + t * r.stride);
}
inline const uint8_t* row(const RowsQ8& r, int64_t t) { return r.p + t * r.stride; }
inline float32x4_t load4(const float* row, int64_t c) { return vld1q_f32(row + 4 * c); }
inline float32x4_t load4(const uint16_t* row, int64_t c) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(row + 4 * c)));
}
// d * q of chunk c of a Q8_0 row (as q8_0_to_f32_neon; block c / 8).
inline float32x4_t load4(const uint8_t* row, int64_t c) {
  const uint8_t* b = row + 34 * (c >> 3);
  uint16_t dh;
  int32_t w;
  std::memcpy(&dh, b, 2);
  std::memcpy(&w, b + 2 + 4 * (c & 7), 4);
  const int16x8_t h = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(w)));
  return vmulq_f32(f16_dup(dh), vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))));
}
// Chunks 4g .. 4g + 3 of a Q8_0 row (16 int8 of block g / 2) -> out[0..4).
inline void q8_group4(const uint8_t* row, int64_t g, float32x4_t* out) {
  const uint8_t* b = row + 34 * (g >> 1);
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  q8x16_to_f32(vld1q_s8(reinterpret_cast<const int8_t*>(b + 2 + 16 * (g & 1))), f16_dup(dh), out);
}

// The lane tree (l0 + l1) + (l2 + l3) of four keys' partials d[0..4) -> key
// u's sum in lane u (FADDP pairs adjacent lanes of each operand in order).
inline float32x4_t hsum_keys4(const float32x4_t* d) {
  return vpaddq_f32(vpaddq_f32(d[0], d[1]), vpaddq_f32(d[2], d[3]));
}

// Keys t0 .. t0 + KU - 1 against NQ heads: a[j][u] = head j's 4 lane
// partials of key t0 + u (the chain in the header). Per chunk the KU key
// vectors are loaded once and each head's q chunk streams through one
// register: NQ x KU + KU + 1 registers live (25 at NQ = 2, KU = 8).
template <int NQ, int KU, class KR>
inline void chains4(const float* const* q, int64_t nc, const KR& k, int64_t t0, float32x4_t (&a)[NQ][KU]) {
  decltype(row(k, 0)) kp[KU];
#pragma GCC unroll 16
  for (int u = 0; u < KU; ++u) kp[u] = row(k, t0 + u);
  {
    float32x4_t kv[KU];
#pragma GCC unroll 16
    for (int u = 0; u < KU; ++u) kv[u] = load4(kp[u], 0);
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) {
      const float32x4_t qc = vld1q_f32(q[j]);
#pragma GCC unroll 16
      for (int u = 0; u < KU; ++u) a[j][u] = vmulq_f32(qc, kv[u]);
    }
  }
  SpreadPrefetch& pf = spread_prefetch();
  for (int64_t c = 1; c < nc; ++c) {
    pf.tick(1);
    float32x4_t kv[KU];
#pragma GCC unroll 16
    for (int u = 0; u < KU; ++u) kv[u] = load4(kp[u], c);
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) {
      const float32x4_t qc = vld1q_f32(q[j] + 4 * c);
#pragma GCC unroll 16
      for (int u = 0; u < KU; ++u) a[j][u] = vfmaq_f32(a[j][u], qc, kv[u]);
    }
  }
}

// s[j][0..32) = head j's scaled scores of keys < nk (NQ heads, q rows at
// q[j]), -inf past them. Keys in groups of KU (8 for one or two heads, 4
// for four); rows up to the group holding nk - 1 are read (their lanes are
// masked: each lane depends on its own key only), all inside the 32-key
// block (the AVX-512 tier reads groups of 16).
template <int NQ, class KR>
void scores_group4(const float* const* q, int64_t hd_k, const KR& k, int64_t nk, float scale, float* s) {
  static_assert(kAttnKeyBlock % 8 == 0);
  constexpr int KU = NQ <= 2 ? 8 : 4;
  const int64_t nc = hd_k / 4;
  const float32x4_t vscale = vdupq_n_f32(scale), ninf = vdupq_n_f32(kAttnNegInf);
  const float32x4_t lane = {0.0f, 1.0f, 2.0f, 3.0f};
  for (int64_t t0 = 0; t0 < kAttnKeyBlock; t0 += KU) {
    if (t0 >= nk) {  // no live key from here on: every head's rest of the row is -inf
      for (int j = 0; j < NQ; ++j) std::fill(s + j * kAttnKeyBlock + t0, s + (j + 1) * kAttnKeyBlock, kAttnNegInf);
      return;
    }
    float32x4_t a[NQ][KU];
    chains4<NQ, KU>(q, nc, k, t0, a);
#pragma GCC unroll 4
    for (int g = 0; g < KU; g += 4) {
      const uint32x4_t live = vcltq_f32(lane, vdupq_n_f32(static_cast<float>(nk - t0 - g)));
#pragma GCC unroll 16
      for (int j = 0; j < NQ; ++j) {
        const float32x4_t r = vmulq_f32(hsum_keys4(&a[j][g]), vscale);
        vst1q_f32(s + j * kAttnKeyBlock + t0 + g, vbslq_f32(live, r, ninf));
      }
    }
  }
}

// The softmax part of a NEON step for one head: s[0..32) scaled scores (-inf
// past nk) -> p (overwritten), state's m and l updated; returns corr (all
// lanes). l: the 8 vectors summed pairwise ((0+1)+(2+3))+((4+5)+(6+7)),
// then the lanes by FADDP (l0 + l1) + (l2 + l3).
inline float32x4_t softmax_neon(float* s, float* state) {
  static_assert(kAttnKeyBlock == 32);
  float32x4_t sv[8];
  for (int i = 0; i < 8; ++i) sv[i] = vld1q_f32(s + 4 * i);
  const float32x4_t m01 = vmaxq_f32(vmaxq_f32(sv[0], sv[1]), vmaxq_f32(sv[2], sv[3]));
  const float32x4_t m23 = vmaxq_f32(vmaxq_f32(sv[4], sv[5]), vmaxq_f32(sv[6], sv[7]));
  const float m_new = std::max(state[0], vmaxvq_f32(vmaxq_f32(m01, m23)));
  const float32x4_t mv = vdupq_n_f32(m_new);
  const float32x4_t corr = exp_neg_f32x4(vdupq_n_f32(state[0] - m_new));  // 0 on the first block
  for (int i = 0; i < 8; ++i) {
    sv[i] = exp_neg_f32x4(vsubq_f32(sv[i], mv));  // masked keys: exp(-inf) = 0
    vst1q_f32(s + 4 * i, sv[i]);
  }
  const float32x4_t l4 = vaddq_f32(vaddq_f32(vaddq_f32(sv[0], sv[1]), vaddq_f32(sv[2], sv[3])),
                                   vaddq_f32(vaddq_f32(sv[4], sv[5]), vaddq_f32(sv[6], sv[7])));
  const float32x4_t h = vpaddq_f32(l4, l4);
  const float l = vgetq_lane_f32(vpaddq_f32(h, h), 0);
  state[0] = m_new;
  state[1] = state[1] * vgetq_lane_f32(corr, 0) + l;  // (no fma: -ffp-contract=off)
  return corr;
}

// One key's PV update for NQ heads over V chunks [c0, c0 + NC): a[j][c] =
// fma(p_j, v_t chunk c0 + c, a[j][c]), p_j lane L of p[j] (FMLA by element).
// Q8_0 rows with NC a multiple of 4 convert 16 int8 at a time (c0 is then
// a multiple of 4).
template <int NQ, int NC, int L, class VR>
inline void pv_key(float32x4_t (&a)[NQ][NC], const VR& v, int64_t t, int64_t c0, const float32x4_t* p) {
  const auto* vr = row(v, t);
  if constexpr (std::is_same_v<VR, RowsQ8> && NC % 4 == 0) {
#pragma GCC unroll 4
    for (int c = 0; c < NC; c += 4) {
      float32x4_t vv[4];
      q8_group4(vr, (c0 + c) / 4, vv);
#pragma GCC unroll 4
      for (int cc = 0; cc < 4; ++cc) {
#pragma GCC unroll 16
        for (int j = 0; j < NQ; ++j) a[j][c + cc] = vfmaq_laneq_f32(a[j][c + cc], vv[cc], p[j], L);
      }
    }
  } else {
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) {
      const float32x4_t vv = load4(vr, c0 + c);
#pragma GCC unroll 16
      for (int j = 0; j < NQ; ++j) a[j][c] = vfmaq_laneq_f32(a[j][c], vv, p[j], L);
    }
  }
}

// The PV part for NQ heads at once over V chunks [c0, c0 + NC): per head j,
// acc_j = acc_j * corr_j, then acc_j = fma(p_jt, v_t, acc_j) for t ascending.
// p: [NQ][kAttnKeyBlock]; acc[j]: head j's accumulator (hd_v floats). Keys
// go 4 at a time with the p of 4 keys in one register per head, the last nk
// % 4 one at a time with p broadcast (the same fma with the same p: the
// same bits).
template <int NQ, int NC, class VR>
inline void pv_group4(const float* p, int64_t nk, const VR& v, int64_t c0, const float32x4_t* corr, float* const* acc) {
  float32x4_t a[NQ][NC];
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) a[j][c] = vmulq_f32(vld1q_f32(acc[j] + 4 * (c0 + c)), corr[j]);
  }
  SpreadPrefetch& pf = spread_prefetch();
  int64_t t = 0;
  for (; t + 4 <= nk; t += 4) {
    pf.tick(8);
    float32x4_t p4[NQ];
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) p4[j] = vld1q_f32(p + j * kAttnKeyBlock + t);
    pv_key<NQ, NC, 0>(a, v, t, c0, p4);
    pv_key<NQ, NC, 1>(a, v, t + 1, c0, p4);
    pv_key<NQ, NC, 2>(a, v, t + 2, c0, p4);
    pv_key<NQ, NC, 3>(a, v, t + 3, c0, p4);
  }
  for (; t < nk; ++t) {
    float32x4_t pt[NQ];
#pragma GCC unroll 16
    for (int j = 0; j < NQ; ++j) pt[j] = vld1q_dup_f32(p + j * kAttnKeyBlock + t);
    pv_key<NQ, NC, 0>(a, v, t, c0, pt);
  }
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) vst1q_f32(acc[j] + 4 * (c0 + c), a[j][c]);
  }
}

// pv_group4 over all hd_v / 4 chunks in runs of 16 / NQ (16 accumulators:
// FMLA's 4-cycle latency on 2-4 pipes wants >= 8-16 independent chains),
// then runs of 8, 4, 2, 1 (Q8_0 rows: hd_v a multiple of 32, so runs of 4,
// 8 or 16 chunks at multiples of 4). Each accumulator's fma chain is the
// same whatever the runs.
template <int NQ, class VR>
void pv_heads4(const float* p, int64_t nk, const VR& v, int64_t hd_v, const float32x4_t* corr, float* const* acc) {
  constexpr int kRun = 16 / NQ;
  const int64_t ncv = hd_v / 4;
  int64_t c = 0;
  for (; ncv - c >= kRun; c += kRun) pv_group4<NQ, kRun>(p, nk, v, c, corr, acc);
  if constexpr (kRun > 8) {
    if (ncv - c >= 8) pv_group4<NQ, 8>(p, nk, v, c, corr, acc), c += 8;
  }
  if constexpr (kRun > 4) {
    if (ncv - c >= 4) pv_group4<NQ, 4>(p, nk, v, c, corr, acc), c += 4;
  }
  if (ncv - c >= 2) pv_group4<NQ, 2>(p, nk, v, c, corr, acc), c += 2;
  if (c < ncv) pv_group4<NQ, 1>(p, nk, v, c, corr, acc);
}

template <int NQ, class KR, class VR>
inline void step_heads4(const float* const* q, const KR* k, const VR& v, int64_t nk, int64_t hd_k, int64_t hd_v,
                        float scale, float* s, float* st, int64_t st_len) {
  if (k) scores_group4<NQ>(q, hd_k, *k, nk, scale, s);
  float32x4_t corr[NQ];
  float* acc[NQ];
#pragma GCC unroll 16
  for (int j = 0; j < NQ; ++j) {
    corr[j] = softmax_neon(s + j * kAttnKeyBlock, st + j * st_len);
    acc[j] = st + j * st_len + 2;
  }
  pv_heads4<NQ>(s, nk, v, hd_v, corr, acc);
}

// step_heads4 as the shared group step (step_rows) calls it.
struct NeonHeads {
  template <int NQ, class KR, class VR>
  static void run(const float* const* q, const KR* k, const VR& v, int64_t nk, int64_t hd_k, int64_t hd_v, float scale,
                  float* s, float* st, int64_t st_len) {
    step_heads4<NQ>(q, k, v, nk, hd_k, hd_v, scale, s, st, st_len);
  }
};

// Block b of Q8_0 key row kt against q's block (q0, q1: its 32 int8): the
// products by SMULL/SMULL2 (|q k| <= 128 * 128 fits int16), widened and
// added pairwise into int32 by SADALP: 4 partial lanes, exact.
struct SmullDot {
  static int32x4_t dot(const uint8_t* kt, int8x16_t q0, int8x16_t q1, int64_t b) {
    const int8x16_t k0 = vld1q_s8(reinterpret_cast<const int8_t*>(kt + 34 * b + 2));
    const int8x16_t k1 = vld1q_s8(reinterpret_cast<const int8_t*>(kt + 34 * b + 18));
    int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(k0), vget_low_s8(q0)));
    acc = vpadalq_s16(acc, vmull_high_s8(k0, q0));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(k1), vget_low_s8(q1)));
    return vpadalq_s16(acc, vmull_high_s8(k1, q1));
  }
};

#include "kernels/attention_neon_q8.inc"

// n values of consecutive rows of format f -> fp32 (AttnLoadRowsFn).
void load_rows(Format f, const uint8_t* src, float* dst, int64_t n) {
  if (f == Format::kF16) return f16_to_f32_neon(reinterpret_cast<const uint16_t*>(src), dst, n);
  if (f == Format::kQ8_0) return q8_0_to_f32_neon(src, dst, n);
  dequantize_row(f, src, dst, n);
}

}  // namespace

const AttnOps* neon_attn_ops() {
  static const AttnOps ops{"neon", 4, step_rows<NeonHeads>, score_q8_neon_t<SmullDot>, load_rows};
  return &ops;
}

}  // namespace bonsai::kernels::detail

#else  // not arm64: tier absent

namespace bonsai::kernels::detail {
const AttnOps* neon_attn_ops() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
