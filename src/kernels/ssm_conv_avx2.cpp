// AVX2 kernel of ssm_conv_step for K = 4 (ssm_conv.h): 8 channels per step,
// their 8 x 4 filter taps transposed into one vector per tap (four 128-bit
// lane permutes, four unpacks, four shuffles), then the reference's
// operations on 8 lanes (multiply, then add in tap order from +0; no fma).
// Compiled with -mavx2 only (src/kernels/CMakeLists.txt); serves the AVX2
// and AVX-512 tiers.
#include "kernels/ssm_conv_internal.h"

#if defined(__x86_64__) && defined(__AVX2__)

#include <immintrin.h>

namespace bonsai::kernels::detail {
namespace {

void ssm_conv4_avx2(const float* w, float* tail, int64_t tail_ld, const float* x, float* out, int64_t n) {
  float* t0 = tail;
  float* t1 = tail + tail_ld;
  float* t2 = tail + 2 * tail_ld;
  for (int64_t c = 0; c < n; c += 8) {
    // a = channels c, c+1 (4 taps each), b = c+2, c+3, d = c+4, c+5, e = c+6, c+7.
    const __m256 a = _mm256_loadu_ps(w + 4 * c), b = _mm256_loadu_ps(w + 4 * c + 8);
    const __m256 d = _mm256_loadu_ps(w + 4 * c + 16), e = _mm256_loadu_ps(w + 4 * c + 24);
    const __m256 p0 = _mm256_permute2f128_ps(a, d, 0x20);  // [c   | c+4]
    const __m256 p1 = _mm256_permute2f128_ps(a, d, 0x31);  // [c+1 | c+5]
    const __m256 p2 = _mm256_permute2f128_ps(b, e, 0x20);  // [c+2 | c+6]
    const __m256 p3 = _mm256_permute2f128_ps(b, e, 0x31);  // [c+3 | c+7]
    const __m256 u0 = _mm256_unpacklo_ps(p0, p1);          // taps 0, 1 of c, c+1 (per lane)
    const __m256 u1 = _mm256_unpackhi_ps(p0, p1);          // taps 2, 3
    const __m256 u2 = _mm256_unpacklo_ps(p2, p3);
    const __m256 u3 = _mm256_unpackhi_ps(p2, p3);
    const __m256 w0 = _mm256_shuffle_ps(u0, u2, 0x44);  // tap 0 of c .. c+7
    const __m256 w1 = _mm256_shuffle_ps(u0, u2, 0xEE);
    const __m256 w2 = _mm256_shuffle_ps(u1, u3, 0x44);
    const __m256 w3 = _mm256_shuffle_ps(u1, u3, 0xEE);
    const __m256 v0 = _mm256_loadu_ps(t0 + c), v1 = _mm256_loadu_ps(t1 + c), v2 = _mm256_loadu_ps(t2 + c);
    const __m256 xv = _mm256_loadu_ps(x + c);
    __m256 acc = _mm256_add_ps(_mm256_setzero_ps(), _mm256_mul_ps(w0, v0));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(w1, v1));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(w2, v2));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(w3, xv));
    _mm256_storeu_ps(t0 + c, v1);
    _mm256_storeu_ps(t1 + c, v2);
    _mm256_storeu_ps(t2 + c, xv);
    _mm256_storeu_ps(out + c, acc);
  }
}

}  // namespace

SsmConv4Fn avx2_ssm_conv4() { return ssm_conv4_avx2; }

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
SsmConv4Fn avx2_ssm_conv4() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
