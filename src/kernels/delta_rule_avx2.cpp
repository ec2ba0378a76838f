// AVX2 kernel of the gated delta rule step (delta_rule.h): the 16 lanes of
// the reference's partial sums as two 8-float accumulators (lanes 0-7 and
// 8-15), multiplies and adds kept apart (no fma) so every rounding is the
// reference's, and the reference's fold done with vector adds in the same
// pairing. Compiled with the tier's ISA flags (src/kernels/CMakeLists.txt);
// serves the AVX2 and AVX-512 tiers.
#include "kernels/delta_rule_internal.h"

#if defined(__x86_64__) && defined(__AVX2__)

#include <immintrin.h>

namespace bonsai::kernels::detail {
namespace {

// fold16 of delta_rule.h on lanes 0-7 (lo) and 8-15 (hi).
inline float fold(__m256 lo, __m256 hi) {
  const __m256 t = _mm256_add_ps(lo, hi);                                               // a_l + a_{l+8}
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));  // + a_{l+4}
  const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));                                  // + a_{l+2}
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 0x55)));                      // a_0 + a_1
}

void delta_rule_avx2(float* S, const float* q, const float* k, const float* v, float g, float beta, float scale,
                     float* o, int64_t d) {
  const __m256 vg = _mm256_set1_ps(g);
  for (int64_t i = 0; i < d; ++i) {
    float* row = S + i * d;
    __m256 a0 = _mm256_setzero_ps();
    __m256 a1 = _mm256_setzero_ps();
    for (int64_t j = 0; j < d; j += 16) {
      const __m256 r0 = _mm256_mul_ps(_mm256_loadu_ps(row + j), vg);
      const __m256 r1 = _mm256_mul_ps(_mm256_loadu_ps(row + j + 8), vg);
      _mm256_storeu_ps(row + j, r0);
      _mm256_storeu_ps(row + j + 8, r1);
      a0 = _mm256_add_ps(a0, _mm256_mul_ps(r0, _mm256_loadu_ps(k + j)));
      a1 = _mm256_add_ps(a1, _mm256_mul_ps(r1, _mm256_loadu_ps(k + j + 8)));
    }
    const __m256 delta = _mm256_set1_ps((v[i] - fold(a0, a1)) * beta);
    a0 = _mm256_setzero_ps();
    a1 = _mm256_setzero_ps();
    for (int64_t j = 0; j < d; j += 16) {
      const __m256 r0 = _mm256_add_ps(_mm256_loadu_ps(row + j), _mm256_mul_ps(delta, _mm256_loadu_ps(k + j)));
      const __m256 r1 = _mm256_add_ps(_mm256_loadu_ps(row + j + 8), _mm256_mul_ps(delta, _mm256_loadu_ps(k + j + 8)));
      _mm256_storeu_ps(row + j, r0);
      _mm256_storeu_ps(row + j + 8, r1);
      a0 = _mm256_add_ps(a0, _mm256_mul_ps(r0, _mm256_loadu_ps(q + j)));
      a1 = _mm256_add_ps(a1, _mm256_mul_ps(r1, _mm256_loadu_ps(q + j + 8)));
    }
    o[i] = fold(a0, a1) * scale;
  }
}

}  // namespace

DeltaRuleFn avx2_delta_rule() { return delta_rule_avx2; }

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
DeltaRuleFn avx2_delta_rule() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
