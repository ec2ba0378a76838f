// NEON kernel of silu_mul (silu.h), serving the neon, neon-dotprod and
// neon-i8mm tiers: the reference's sequence on 4 lanes, each operation the
// same IEEE operation (FMUL then FADD, no FMLA; FDIV), the clamp as
// compare-and-select (FMAX would return a NaN where the reference's compare
// gives the bound), the tail (n mod 4) on the reference. Advanced SIMD is
// ARMv8.0-A's baseline: no flag. Built only on arm64; elsewhere this file
// defines an absent kernel.
#include "kernels/silu_internal.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

#include <cstring>

namespace bonsai::kernels::detail {
namespace {

void silu_mul_neon(const float* g, const float* u, float* out, int64_t n) {
  int32_t magic_bits;
  std::memcpy(&magic_bits, &kSiluMagic, 4);
  const float32x4_t lo = vdupq_n_f32(kSiluLo), hi = vdupq_n_f32(kSiluHi);
  const float32x4_t log2e = vdupq_n_f32(kSiluLog2e), magic = vdupq_n_f32(kSiluMagic);
  const float32x4_t ln2hi = vdupq_n_f32(kSiluLn2Hi), ln2lo = vdupq_n_f32(kSiluLn2Lo);
  const float32x4_t one = vdupq_n_f32(1.0f);
  const int32x4_t mbits = vdupq_n_s32(magic_bits), bias = vdupq_n_s32(127);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float32x4_t x = vld1q_f32(g + j);
    float32x4_t t = vnegq_f32(x);
    t = vbslq_f32(vcgtq_f32(t, lo), t, lo);  // t > lo ? t : lo (a NaN gives lo)
    t = vbslq_f32(vcltq_f32(t, hi), t, hi);  // t < hi ? t : hi
    const float32x4_t kb = vaddq_f32(vmulq_f32(t, log2e), magic);
    const float32x4_t kr = vsubq_f32(kb, magic);
    const int32x4_t e2 = vsubq_s32(vreinterpretq_s32_f32(kb), mbits);
    float32x4_t r = vsubq_f32(t, vmulq_f32(kr, ln2hi));
    r = vsubq_f32(r, vmulq_f32(kr, ln2lo));
    float32x4_t p = vdupq_n_f32(kSiluC[0]);
    for (int c = 1; c < 6; ++c) p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(kSiluC[c]));
    p = vaddq_f32(vmulq_f32(p, r), one);
    p = vaddq_f32(vmulq_f32(p, r), one);
    const float32x4_t scale = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(e2, bias), 23));
    const float32x4_t e = vmulq_f32(p, scale);
    const float32x4_t s = vdivq_f32(x, vaddq_f32(one, e));
    vst1q_f32(out + j, vmulq_f32(s, vld1q_f32(u + j)));
  }
  if (j < n) silu_mul_ref(g + j, u + j, out + j, n - j);
}

}  // namespace

SiluMulFn neon_silu_mul() { return silu_mul_neon; }

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
SiluMulFn neon_silu_mul() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
