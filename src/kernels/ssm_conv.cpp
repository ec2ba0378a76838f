// ssm_conv_step (ssm_conv.h): the scalar reference and the dispatch on the
// active tier. Compiled without ISA flags.
#include "kernels/ssm_conv.h"

#include <cassert>

#include "kernels/kernels.h"  // active_tier
#include "kernels/ssm_conv_internal.h"

namespace bonsai::kernels {

namespace detail {

void ssm_conv_ref(const float* w, int64_t K, float* tail, int64_t tail_ld, const float* x, float* out, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const float* wc = w + c * K;
    const float xc = x[c];
    float acc = 0.0f;
    for (int64_t k = 0; k + 1 < K; ++k) acc += wc[k] * tail[k * tail_ld + c];
    acc += wc[K - 1] * xc;
    for (int64_t k = 0; k + 2 < K; ++k) tail[k * tail_ld + c] = tail[(k + 1) * tail_ld + c];
    if (K > 1) tail[(K - 2) * tail_ld + c] = xc;
    out[c] = acc;
  }
}

}  // namespace detail

void ssm_conv_step(const float* w, int64_t K, float* tail, int64_t tail_ld, const float* x, float* out, int64_t n) {
  assert(K >= 1 && n >= 0 && (K == 1 || tail_ld >= n));
  detail::SsmConv4Fn fn = nullptr;
  int64_t lanes = 1;
  if (K == 4) {
    switch (active_tier()) {
      case Tier::kAvx2:
      case Tier::kAvx512:  // every AVX-512 CPU runs AVX2
        fn = detail::avx2_ssm_conv4();
        lanes = detail::kSsmConvAvx2Lanes;
        break;
      case Tier::kNeon:
      case Tier::kNeonDotprod:
      case Tier::kNeonI8mm:
        fn = detail::neon_ssm_conv4();
        lanes = detail::kSsmConvNeonLanes;
        break;
      case Tier::kReference:
        break;
    }
  }
  int64_t done = 0;
  if (fn != nullptr) {
    done = n - n % lanes;
    fn(w, tail, tail_ld, x, out, done);
  }
  if (done < n) {
    detail::ssm_conv_ref(w + done * K, K, K > 1 ? tail + done : tail, tail_ld, x + done, out + done, n - done);
  }
}

}  // namespace bonsai::kernels
