// NEON kernel of the gated delta rule step (delta_rule.h), serving the neon,
// neon-dotprod and neon-i8mm tiers: the 16 lanes of the reference's partial
// sums as four 4-float accumulators (lanes 0-3, 4-7, 8-11, 12-15),
// multiplies and adds kept apart (FMUL then FADD, no FMLA) so every rounding
// is the reference's, and the reference's fold done with vector adds in the
// same pairing. Advanced SIMD is ARMv8.0-A's baseline: no flag. Built only
// on arm64; elsewhere this file defines an absent kernel.
//
// Instructions per state element (loops of aarch64-linux-gnu-objdump -d,
// GCC 12 -O3, against objdump -d of the x86 build's delta_rule_avx2.cpp.o,
// 2026-12-06): pass 1 26 per 16 floats (LDP/LDUR, 8 FMUL, 4 FADD, 4 STUR,
// loop), pass 2 35 (8 FMUL, 8 FADD, loads, stores, loop): 3.8 per element
// and token; AVX2 (loads folded into the arithmetic): 11 + 13 per 16, 1.5.
// The state (d x d fp32, 64 KiB at d = 128) is read and written twice per
// token, so both are bound by L1/L2 bandwidth more than by issue.
#include "kernels/delta_rule_internal.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

namespace bonsai::kernels::detail {
namespace {

// fold16 of delta_rule.h on lanes 0-3 (a0), 4-7 (a1), 8-11 (a2), 12-15 (a3).
inline float fold(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3) {
  const float32x4_t t0 = vaddq_f32(a0, a2);                           // a_l + a_{l+8}, l = 0..3
  const float32x4_t t1 = vaddq_f32(a1, a3);                           // l = 4..7
  const float32x4_t u = vaddq_f32(t0, t1);                            // + a_{l+4}
  const float32x2_t w = vadd_f32(vget_low_f32(u), vget_high_f32(u));  // + a_{l+2}
  return vget_lane_f32(w, 0) + vget_lane_f32(w, 1);                   // a_0 + a_1
}

void delta_rule_neon(float* S, const float* q, const float* k, const float* v, float g, float beta, float scale,
                     float* o, int64_t d) {
  const float32x4_t vg = vdupq_n_f32(g);
  for (int64_t i = 0; i < d; ++i) {
    float* row = S + i * d;
    float32x4_t a[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int64_t j = 0; j < d; j += 16) {
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) {
        const float32x4_t r = vmulq_f32(vld1q_f32(row + j + 4 * l), vg);
        vst1q_f32(row + j + 4 * l, r);
        a[l] = vaddq_f32(a[l], vmulq_f32(r, vld1q_f32(k + j + 4 * l)));
      }
    }
    const float32x4_t delta = vdupq_n_f32((v[i] - fold(a[0], a[1], a[2], a[3])) * beta);
    for (auto& x : a) x = vdupq_n_f32(0.0f);
    for (int64_t j = 0; j < d; j += 16) {
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) {
        const float32x4_t r = vaddq_f32(vld1q_f32(row + j + 4 * l), vmulq_f32(delta, vld1q_f32(k + j + 4 * l)));
        vst1q_f32(row + j + 4 * l, r);
        a[l] = vaddq_f32(a[l], vmulq_f32(r, vld1q_f32(q + j + 4 * l)));
      }
    }
    o[i] = fold(a[0], a[1], a[2], a[3]) * scale;
  }
}

}  // namespace

DeltaRuleFn neon_delta_rule() { return delta_rule_neon; }

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
DeltaRuleFn neon_delta_rule() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
