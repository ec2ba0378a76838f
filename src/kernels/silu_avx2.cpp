// AVX2 kernel of silu_mul (silu.h): the reference's sequence on 8 lanes, each
// operation the same IEEE operation (multiplies and adds kept apart, no fma;
// MAXPS / MINPS pick the bound for a NaN as the reference's compares do), the
// tail (n mod 8) on the reference. Compiled with -mavx2 only
// (src/kernels/CMakeLists.txt); serves the AVX2 and AVX-512 tiers.
#include "kernels/silu_internal.h"

#if defined(__x86_64__) && defined(__AVX2__)

#include <immintrin.h>

#include <cstring>

namespace bonsai::kernels::detail {
namespace {

void silu_mul_avx2(const float* g, const float* u, float* out, int64_t n) {
  int32_t magic_bits;
  std::memcpy(&magic_bits, &kSiluMagic, 4);
  const __m256 lo = _mm256_set1_ps(kSiluLo), hi = _mm256_set1_ps(kSiluHi);
  const __m256 log2e = _mm256_set1_ps(kSiluLog2e), magic = _mm256_set1_ps(kSiluMagic);
  const __m256 ln2hi = _mm256_set1_ps(kSiluLn2Hi), ln2lo = _mm256_set1_ps(kSiluLn2Lo);
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  const __m256i mbits = _mm256_set1_epi32(magic_bits), bias = _mm256_set1_epi32(127);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_loadu_ps(g + j);
    __m256 t = _mm256_xor_ps(x, sign);  // -x
    t = _mm256_max_ps(t, lo);           // (t NaN: lo, the second operand)
    t = _mm256_min_ps(t, hi);
    const __m256 kb = _mm256_add_ps(_mm256_mul_ps(t, log2e), magic);
    const __m256 kr = _mm256_sub_ps(kb, magic);
    const __m256i e2 = _mm256_sub_epi32(_mm256_castps_si256(kb), mbits);
    __m256 r = _mm256_sub_ps(t, _mm256_mul_ps(kr, ln2hi));
    r = _mm256_sub_ps(r, _mm256_mul_ps(kr, ln2lo));
    __m256 p = _mm256_set1_ps(kSiluC[0]);
    for (int c = 1; c < 6; ++c) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kSiluC[c]));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
    const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, bias), 23));
    const __m256 e = _mm256_mul_ps(p, scale);
    const __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(s, _mm256_loadu_ps(u + j)));
  }
  if (j < n) silu_mul_ref(g + j, u + j, out + j, n - j);
}

}  // namespace

SiluMulFn avx2_silu_mul() { return silu_mul_avx2; }

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
SiluMulFn avx2_silu_mul() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
