// NEON tier of the Walsh-Hadamard transform (hadamard.h), serving the neon,
// neon-dotprod and neon-i8mm tiers: the reference's butterflies on 4-float
// vectors. Stages h = 1, 2 run inside a register (partner lanes swapped by
// REV64 / EXT; the lower lane of each pair computes b + a, the upper a +
// (-b), which equal the reference's a + b and a - b exactly); stages h >= 4
// pair whole vectors; the last stage also applies the scale (and the
// inverse's signs). Advanced SIMD is ARMv8.0-A's baseline: no flag. Built
// only on arm64; elsewhere this file defines an absent tier.
//
// Instructions per element (loops of aarch64-linux-gnu-objdump -d, GCC 12
// -O3, against objdump -d of the x86 build's hadamard_avx2.cpp.o,
// 2026-12-06): the in-register stages 10 per 4 floats (LDR, REV64, EXT, 2
// EOR, 2 FADD, STR, loop; + FMUL with the forward signs: 13), each stage h
// >= 4 9 per 8 floats (2 LDR, FADD, FSUB, 2 STR, loop), the last 11 (+ the
// scale's 2 FMUL; inverse signs: 15). For B = 128: 2.5 + 4 x 1.1 + 1.4 =
// ~8.3 per element; AVX2: 1.6 (h = 1, 2, 4) + 3 x 0.56 + 0.69 = ~4.0. The
// transform is a small part of the matmul it feeds either way.
#include "kernels/hadamard_internal.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

namespace bonsai::kernels::detail {
namespace {

// Stages h = 1, 2 of one 4-float vector.
inline float32x4_t butterflies4(float32x4_t x) {
  const uint32x4_t neg_odd = {0u, 0x80000000u, 0u, 0x80000000u};
  const uint32x4_t neg_hi2 = {0u, 0u, 0x80000000u, 0x80000000u};
  // h = 1: lanes [1, 0, 3, 2] + (x with lanes 1, 3 negated).
  x = vaddq_f32(vrev64q_f32(x), vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(x), neg_odd)));
  // h = 2: lanes [2, 3, 0, 1] + (x with lanes 2, 3 negated).
  x = vaddq_f32(vextq_f32(x, x, 2), vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(x), neg_hi2)));
  return x;
}

// x <- x * scale, then x * s for the inverse.
inline float32x4_t finish(float32x4_t x, float32x4_t scale, const float* s, bool inverse) {
  x = vmulq_f32(x, scale);
  if (inverse && s != nullptr) x = vmulq_f32(x, vld1q_f32(s));
  return x;
}

void hadamard_block(float* p, const float* s, int64_t block, float32x4_t scale, bool inverse) {
  for (int64_t j = 0; j < block; j += 4) {
    float32x4_t x = vld1q_f32(p + j);
    if (!inverse && s != nullptr) x = vmulq_f32(x, vld1q_f32(s + j));
    x = butterflies4(x);
    if (block == 4) x = finish(x, scale, s != nullptr ? s + j : nullptr, inverse);
    vst1q_f32(p + j, x);
  }
  for (int64_t h = 4; h < block; h *= 2) {
    const bool last = 2 * h == block;
    for (int64_t i = 0; i < block; i += 2 * h) {
      for (int64_t j = i; j < i + h; j += 4) {
        const float32x4_t a = vld1q_f32(p + j);
        const float32x4_t b = vld1q_f32(p + j + h);
        float32x4_t lo = vaddq_f32(a, b);
        float32x4_t hi = vsubq_f32(a, b);
        if (last) {
          lo = finish(lo, scale, s != nullptr ? s + j : nullptr, inverse);
          hi = finish(hi, scale, s != nullptr ? s + j + h : nullptr, inverse);
        }
        vst1q_f32(p + j, lo);
        vst1q_f32(p + j + h, hi);
      }
    }
  }
}

void hadamard_neon(float* x, int64_t n, const float* signs, int64_t width, int64_t block, float scale, bool inverse) {
  if (block < 4) return hadamard_ref(x, n, signs, width, block, scale, inverse);
  const float32x4_t vscale = vdupq_n_f32(scale);
  for (int64_t c = 0; c < n; c += block) {
    hadamard_block(x + c, signs != nullptr ? signs + c % width : nullptr, block, vscale, inverse);
  }
}

}  // namespace

HadamardFn neon_hadamard() { return hadamard_neon; }

}  // namespace bonsai::kernels::detail

#else  // not arm64: tier absent

namespace bonsai::kernels::detail {
HadamardFn neon_hadamard() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
