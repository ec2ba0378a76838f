// AVX2 tier of the Walsh-Hadamard transform (hadamard.h): the reference's
// butterflies on 8-float vectors. Stages h = 1, 2, 4 run inside a register
// (partner lanes swapped by a permute; the lower lane of each pair computes
// b + a, the upper a + (-b), which equal the reference's a + b and a - b
// exactly); stages h >= 8 pair whole vectors; the last stage also applies
// the scale (and the inverse's signs). Compiled with the tier's ISA flags
// (src/kernels/CMakeLists.txt) and only called when active_tier() is kAvx2.
#include "kernels/hadamard_internal.h"

#if defined(__x86_64__) && defined(__AVX2__)

#include <immintrin.h>

namespace bonsai::kernels::detail {
namespace {

// Stages h = 1, 2, 4 of one 8-float vector.
inline __m256 butterflies8(__m256 x) {
  const __m256 neg_odd = _mm256_castsi256_ps(_mm256_setr_epi32(0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN));
  const __m256 neg_hi2 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, INT32_MIN, INT32_MIN, 0, 0, INT32_MIN, INT32_MIN));
  const __m256 neg_hi4 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, 0, 0, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN));
  x = _mm256_add_ps(_mm256_permute_ps(x, 0xB1), _mm256_xor_ps(x, neg_odd));          // h = 1: lanes [1,0,3,2,...]
  x = _mm256_add_ps(_mm256_permute_ps(x, 0x4E), _mm256_xor_ps(x, neg_hi2));          // h = 2: lanes [2,3,0,1,...]
  x = _mm256_add_ps(_mm256_permute2f128_ps(x, x, 0x01), _mm256_xor_ps(x, neg_hi4));  // h = 4: halves swapped
  return x;
}

// x <- x * scale, then x * s for the inverse.
inline __m256 finish(__m256 x, __m256 scale, const float* s, bool inverse) {
  x = _mm256_mul_ps(x, scale);
  if (inverse && s != nullptr) x = _mm256_mul_ps(x, _mm256_loadu_ps(s));
  return x;
}

void hadamard_block(float* p, const float* s, int64_t block, __m256 scale, bool inverse) {
  for (int64_t j = 0; j < block; j += 8) {
    __m256 x = _mm256_loadu_ps(p + j);
    if (!inverse && s != nullptr) x = _mm256_mul_ps(x, _mm256_loadu_ps(s + j));
    x = butterflies8(x);
    if (block == 8) x = finish(x, scale, s != nullptr ? s + j : nullptr, inverse);
    _mm256_storeu_ps(p + j, x);
  }
  for (int64_t h = 8; h < block; h *= 2) {
    const bool last = 2 * h == block;
    for (int64_t i = 0; i < block; i += 2 * h) {
      for (int64_t j = i; j < i + h; j += 8) {
        const __m256 a = _mm256_loadu_ps(p + j);
        const __m256 b = _mm256_loadu_ps(p + j + h);
        __m256 lo = _mm256_add_ps(a, b);
        __m256 hi = _mm256_sub_ps(a, b);
        if (last) {
          lo = finish(lo, scale, s != nullptr ? s + j : nullptr, inverse);
          hi = finish(hi, scale, s != nullptr ? s + j + h : nullptr, inverse);
        }
        _mm256_storeu_ps(p + j, lo);
        _mm256_storeu_ps(p + j + h, hi);
      }
    }
  }
}

void hadamard_avx2(float* x, int64_t n, const float* signs, int64_t width, int64_t block, float scale, bool inverse) {
  if (block < 8) return hadamard_ref(x, n, signs, width, block, scale, inverse);
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int64_t c = 0; c < n; c += block) {
    hadamard_block(x + c, signs != nullptr ? signs + c % width : nullptr, block, vscale, inverse);
  }
}

}  // namespace

HadamardFn avx2_hadamard() { return hadamard_avx2; }

}  // namespace bonsai::kernels::detail

#else  // not x86-64 (or built without the tier's flags): tier absent

namespace bonsai::kernels::detail {
HadamardFn avx2_hadamard() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
