// AVX-512 tier of the Walsh-Hadamard transform (hadamard.h): the AVX2
// tier's structure on 16-float vectors (stages h = 1, 2, 4, 8 inside a
// register, h >= 16 between vectors; same exact-equality argument).
// Compiled with the tier's ISA flags (src/kernels/CMakeLists.txt) and only
// called when active_tier() is kAvx512.
#include "kernels/hadamard_internal.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512DQ__)

#include <immintrin.h>

namespace bonsai::kernels::detail {
namespace {

// Sign-bit mask of the lanes whose bit h is set (the upper lane of each pair).
inline __m512 upper_lanes(int h) {
  alignas(64) int32_t m[16];
  for (int i = 0; i < 16; ++i) m[i] = (i & h) != 0 ? INT32_MIN : 0;
  return _mm512_castsi512_ps(_mm512_load_si512(m));
}

// Stages h = 1, 2, 4, 8 of one 16-float vector.
inline __m512 butterflies16(__m512 x, const __m512 (&neg)[4]) {
  x = _mm512_add_ps(_mm512_permute_ps(x, 0xB1), _mm512_xor_ps(x, neg[0]));                           // h = 1
  x = _mm512_add_ps(_mm512_permute_ps(x, 0x4E), _mm512_xor_ps(x, neg[1]));                           // h = 2
  x = _mm512_add_ps(_mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)), _mm512_xor_ps(x, neg[2]));  // h = 4
  x = _mm512_add_ps(_mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)), _mm512_xor_ps(x, neg[3]));  // h = 8
  return x;
}

inline __m512 finish(__m512 x, __m512 scale, const float* s, bool inverse) {
  x = _mm512_mul_ps(x, scale);
  if (inverse && s != nullptr) x = _mm512_mul_ps(x, _mm512_loadu_ps(s));
  return x;
}

void hadamard_block(float* p, const float* s, int64_t block, __m512 scale, bool inverse, const __m512 (&neg)[4]) {
  for (int64_t j = 0; j < block; j += 16) {
    __m512 x = _mm512_loadu_ps(p + j);
    if (!inverse && s != nullptr) x = _mm512_mul_ps(x, _mm512_loadu_ps(s + j));
    x = butterflies16(x, neg);
    if (block == 16) x = finish(x, scale, s != nullptr ? s + j : nullptr, inverse);
    _mm512_storeu_ps(p + j, x);
  }
  for (int64_t h = 16; h < block; h *= 2) {
    const bool last = 2 * h == block;
    for (int64_t i = 0; i < block; i += 2 * h) {
      for (int64_t j = i; j < i + h; j += 16) {
        const __m512 a = _mm512_loadu_ps(p + j);
        const __m512 b = _mm512_loadu_ps(p + j + h);
        __m512 lo = _mm512_add_ps(a, b);
        __m512 hi = _mm512_sub_ps(a, b);
        if (last) {
          lo = finish(lo, scale, s != nullptr ? s + j : nullptr, inverse);
          hi = finish(hi, scale, s != nullptr ? s + j + h : nullptr, inverse);
        }
        _mm512_storeu_ps(p + j, lo);
        _mm512_storeu_ps(p + j + h, hi);
      }
    }
  }
}

void hadamard_avx512(float* x, int64_t n, const float* signs, int64_t width, int64_t block, float scale, bool inverse) {
  if (block < 16) {
    const HadamardFn narrower = avx2_hadamard();
    return (narrower != nullptr ? narrower : hadamard_ref)(x, n, signs, width, block, scale, inverse);
  }
  const __m512 neg[4] = {upper_lanes(1), upper_lanes(2), upper_lanes(4), upper_lanes(8)};
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t c = 0; c < n; c += block) {
    hadamard_block(x + c, signs != nullptr ? signs + c % width : nullptr, block, vscale, inverse, neg);
  }
}

}  // namespace

HadamardFn avx512_hadamard() { return hadamard_avx512; }

}  // namespace bonsai::kernels::detail

#else  // not x86-64 (or built without the tier's flags): tier absent

namespace bonsai::kernels::detail {
HadamardFn avx512_hadamard() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
