// The SwiGLU gate of the feed-forward layers and the qwen35 gated norm:
//   out_j = silu(g_j) * u_j,  silu(x) = x / (1 + e^-x)
// with e^-x computed by one fixed sequence of fp32 operations, so every tier
// gives the same bits (no libm call, no fma: kernels/ is compiled with
// -ffp-contract=off):
//   t = clamp(-x, -87, 88)             (a NaN x gives t = -87; the NaN still
//                                        reaches out_j through x / (...))
//   k = t * log2(e);  n = round-to-nearest-even(k), as (k + 1.5*2^23) - 1.5*2^23
//   r = (t - n * ln2_hi) - n * ln2_lo  (ln2 in two parts: n * ln2_hi is exact
//                                        for |n| <= 128; Cody & Waite 1980)
//   p = 1 + r + r^2/2! + ... + r^7/7!  (Horner, |r| <= ln2/2: the truncation
//                                        error r^8/8! < 2^-27)
//   e = p * 2^n                          (2^n built from its exponent bits;
//                                        n in [-126, 127] by the clamp)
//   out_j = (x / (1 + e)) * u_j
// Against the exact silu(x) * u: within ~4 ulp for |x| <= 87 (kernels_silu_test
// measures it); past the clamp silu(x) is x or a value below 2^-120 * |x|,
// where std::exp's would be x or -0. The libm version it replaces (glibc expf,
// scalar, one call per element) was ~5% of a decode step of the 1.7B shape.
//
// Tiers: the AVX2 kernel serves the AVX2 and AVX-512 tiers (8 lanes), the
// NEON kernel the three ARM tiers (4 lanes), the reference the reference
// tier; the result never depends on the tier, the
// length or the alignment. Single-threaded, no allocation, thread-safe.
#pragma once

#include <cstdint>

namespace bonsai::kernels {

// out[j] = silu(g[j]) * u[j] for j < n (above). g, u, out: [n] fp32,
// borrowed for the call; out may be g or u (elementwise), no other overlap.
// n >= 0.
void silu_mul(const float* g, const float* u, float* out, int64_t n);

}  // namespace bonsai::kernels
