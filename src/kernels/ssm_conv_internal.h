// Internal interface between ssm_conv.cpp (dispatch and the scalar
// reference) and the tier kernels ssm_conv_avx2.cpp, ssm_conv_neon.cpp. The
// public side is ssm_conv.h.
#pragma once

#include <cstdint>

namespace bonsai::kernels::detail {

// The K = 4 kernels' signature: ssm_conv_step with K = 4 for n a multiple
// of the kernel's lanes (below; the caller runs the rest on the reference).
using SsmConv4Fn = void (*)(const float* w, float* tail, int64_t tail_ld, const float* x, float* out, int64_t n);

// The scalar reference (the definition every tier reproduces); any K >= 1.
void ssm_conv_ref(const float* w, int64_t K, float* tail, int64_t tail_ld, const float* x, float* out, int64_t n);

// The AVX2 K = 4 kernel (8 channels per step); nullptr when the tier is not
// compiled into this binary.
SsmConv4Fn avx2_ssm_conv4();
// The NEON K = 4 kernel (4 channels per step; the three ARM tiers); nullptr
// when not built for arm64.
SsmConv4Fn neon_ssm_conv4();

// Channels per step of each K = 4 kernel.
inline constexpr int64_t kSsmConvAvx2Lanes = 8, kSsmConvNeonLanes = 4;

}  // namespace bonsai::kernels::detail
