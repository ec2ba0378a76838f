// NEON kernel of ssm_conv_step for K = 4 (ssm_conv.h), serving the neon,
// neon-dotprod and neon-i8mm tiers: 4 channels per step, VLD4Q splitting
// their interleaved taps into one vector per tap, then the reference's
// operations on 4 lanes (FMUL, then FADD in tap order from +0; no FMLA).
// Advanced SIMD is ARMv8.0-A's baseline: no flag. Built only on arm64;
// elsewhere this file defines an absent kernel.
#include "kernels/ssm_conv_internal.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

namespace bonsai::kernels::detail {
namespace {

void ssm_conv4_neon(const float* w, float* tail, int64_t tail_ld, const float* x, float* out, int64_t n) {
  float* t0 = tail;
  float* t1 = tail + tail_ld;
  float* t2 = tail + 2 * tail_ld;
  for (int64_t c = 0; c < n; c += 4) {
    const float32x4x4_t wt = vld4q_f32(w + 4 * c);  // val[k] = tap k of channels c .. c+3
    const float32x4_t v0 = vld1q_f32(t0 + c), v1 = vld1q_f32(t1 + c), v2 = vld1q_f32(t2 + c);
    const float32x4_t xv = vld1q_f32(x + c);
    float32x4_t acc = vaddq_f32(vdupq_n_f32(0.0f), vmulq_f32(wt.val[0], v0));
    acc = vaddq_f32(acc, vmulq_f32(wt.val[1], v1));
    acc = vaddq_f32(acc, vmulq_f32(wt.val[2], v2));
    acc = vaddq_f32(acc, vmulq_f32(wt.val[3], xv));
    vst1q_f32(t0 + c, v1);
    vst1q_f32(t1 + c, v2);
    vst1q_f32(t2 + c, xv);
    vst1q_f32(out + c, acc);
  }
}

}  // namespace

SsmConv4Fn neon_ssm_conv4() { return ssm_conv4_neon; }

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
SsmConv4Fn neon_ssm_conv4() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
