// Internal interface between the delta-rule files: delta_rule.cpp (dispatch
// and the scalar reference), delta_rule_avx2.cpp and delta_rule_neon.cpp.
// The public side is delta_rule.h.
#pragma once

#include <cstdint>

namespace bonsai::kernels::detail {

// delta_rule_step's signature (delta_rule.h).
using DeltaRuleFn = void (*)(float* S, const float* q, const float* k, const float* v, float g, float beta, float scale,
                             float* o, int64_t d);

// Lanes of the partial sums (delta_rule.h "Arithmetic").
inline constexpr int64_t kDeltaRuleLanes = 16;

// The scalar reference (the definition every tier reproduces); any d >= 1.
void delta_rule_ref(float* S, const float* q, const float* k, const float* v, float g, float beta, float scale,
                    float* o, int64_t d);

// The AVX2 kernel (d a multiple of kDeltaRuleLanes); nullptr when the tier
// is not compiled into this binary.
DeltaRuleFn avx2_delta_rule();
// The NEON kernel (d a multiple of kDeltaRuleLanes; the three ARM tiers);
// nullptr when not built for arm64.
DeltaRuleFn neon_delta_rule();

}  // namespace bonsai::kernels::detail
