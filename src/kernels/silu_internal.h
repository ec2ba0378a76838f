// Internal interface between silu.cpp (dispatch and the scalar reference)
// and the tier kernels silu_avx2.cpp, silu_neon.cpp. The public side is
// silu.h.
#pragma once

#include <cstdint>

namespace bonsai::kernels::detail {

// silu_mul's signature (silu.h).
using SiluMulFn = void (*)(const float* g, const float* u, float* out, int64_t n);

// The constants of silu.h's sequence, shared by every tier.
inline constexpr float kSiluLo = -87.0f, kSiluHi = 88.0f;
inline constexpr float kSiluLog2e = 1.44269504088896341f;
inline constexpr float kSiluMagic = 12582912.0f;              // 1.5 * 2^23
inline constexpr float kSiluLn2Hi = 0.693145751953125f;       // 15 significant bits
inline constexpr float kSiluLn2Lo = 1.42860682030941723e-6f;  // ln 2 - kSiluLn2Hi
// 1/k! for k = 7 down to 2 (Horner order), then 1 and 1.
inline constexpr float kSiluC[6] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f};

// The scalar reference (the definition every tier reproduces).
void silu_mul_ref(const float* g, const float* u, float* out, int64_t n);

// The AVX2 kernel (any n; its tail runs the reference); nullptr when the
// tier is not compiled into this binary.
SiluMulFn avx2_silu_mul();
// The NEON kernel (the three ARM tiers; any n); nullptr when not built for
// arm64.
SiluMulFn neon_silu_mul();

}  // namespace bonsai::kernels::detail
