// silu_mul (silu.h): the scalar reference and the dispatch on the active
// tier. Compiled without ISA flags.
#include "kernels/silu.h"

#include <cassert>
#include <cstring>

#include "kernels/kernels.h"  // active_tier
#include "kernels/silu_internal.h"

namespace bonsai::kernels {

namespace detail {

void silu_mul_ref(const float* g, const float* u, float* out, int64_t n) {
  int32_t magic_bits;
  std::memcpy(&magic_bits, &kSiluMagic, 4);
  for (int64_t j = 0; j < n; ++j) {
    const float x = g[j];
    float t = -x;
    t = t > kSiluLo ? t : kSiluLo;  // (as MAXPS(t, lo): a NaN gives lo)
    t = t < kSiluHi ? t : kSiluHi;
    const float kb = t * kSiluLog2e + kSiluMagic;  // (two roundings: no fma here)
    const float kr = kb - kSiluMagic;
    int32_t kb_bits;
    std::memcpy(&kb_bits, &kb, 4);
    const int32_t e2 = kb_bits - magic_bits;  // n
    float r = t - kr * kSiluLn2Hi;
    r = r - kr * kSiluLn2Lo;
    float p = kSiluC[0];
    for (int c = 1; c < 6; ++c) p = p * r + kSiluC[c];
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t scale_bits = (e2 + 127) << 23;
    float scale;
    std::memcpy(&scale, &scale_bits, 4);
    const float e = p * scale;
    out[j] = x / (1.0f + e) * u[j];
  }
}

}  // namespace detail

void silu_mul(const float* g, const float* u, float* out, int64_t n) {
  assert(n >= 0);
  detail::SiluMulFn fn = nullptr;
  switch (active_tier()) {
    case Tier::kAvx2:
    case Tier::kAvx512:  // every AVX-512 CPU runs AVX2
      fn = detail::avx2_silu_mul();
      break;
    case Tier::kNeon:
    case Tier::kNeonDotprod:
    case Tier::kNeonI8mm:
      fn = detail::neon_silu_mul();
      break;
    case Tier::kReference:
      break;
  }
  (fn != nullptr ? fn : detail::silu_mul_ref)(g, u, out, n);
}

}  // namespace bonsai::kernels
