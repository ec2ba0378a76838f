// The scalar reference of the gated delta rule step and its dispatch by the
// active tier (delta_rule.h). Compiled without ISA flags.
#include "kernels/delta_rule.h"

#include <cassert>

#include "kernels/delta_rule_internal.h"
#include "kernels/kernels.h"  // active_tier

namespace bonsai::kernels {

namespace detail {

namespace {

// delta_rule.h's fold of the 16 lanes (a is clobbered).
float fold16(float* a) {
  for (int64_t l = 0; l < 8; ++l) a[l] = a[l] + a[l + 8];
  for (int64_t l = 0; l < 4; ++l) a[l] = a[l] + a[l + 4];
  for (int64_t l = 0; l < 2; ++l) a[l] = a[l] + a[l + 2];
  return a[0] + a[1];
}

}  // namespace

void delta_rule_ref(float* S, const float* q, const float* k, const float* v, float g, float beta, float scale,
                    float* o, int64_t d) {
  float acc[kDeltaRuleLanes];
  for (int64_t i = 0; i < d; ++i) {
    float* row = S + i * d;
    for (float& a : acc) a = 0.0f;
    for (int64_t j = 0; j < d; ++j) {
      row[j] = row[j] * g;
      acc[j % kDeltaRuleLanes] = acc[j % kDeltaRuleLanes] + row[j] * k[j];
    }
    const float delta = (v[i] - fold16(acc)) * beta;
    for (float& a : acc) a = 0.0f;
    for (int64_t j = 0; j < d; ++j) {
      row[j] = row[j] + delta * k[j];
      acc[j % kDeltaRuleLanes] = acc[j % kDeltaRuleLanes] + row[j] * q[j];
    }
    o[i] = fold16(acc) * scale;
  }
}

}  // namespace detail

void delta_rule_step(float* S, const float* q, const float* k, const float* v, float g, float beta, float scale,
                     float* o, int64_t d) {
  assert(d >= 1);
  detail::DeltaRuleFn fn = nullptr;
  if (d % detail::kDeltaRuleLanes == 0) {
    switch (active_tier()) {
      case Tier::kAvx2:
      case Tier::kAvx512:  // every AVX-512 CPU runs AVX2; the state rows sit in L1/L2 either way
        fn = detail::avx2_delta_rule();
        break;
      case Tier::kNeon:
      case Tier::kNeonDotprod:
      case Tier::kNeonI8mm:
        fn = detail::neon_delta_rule();
        break;
      case Tier::kReference:
        break;
    }
  }
  (fn != nullptr ? fn : detail::delta_rule_ref)(S, q, k, v, g, beta, scale, o, d);
}

}  // namespace bonsai::kernels
