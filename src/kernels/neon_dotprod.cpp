// NEON + dotprod tier (ARMv8.2-A DotProd, FEAT_DotProd: SDOT; Cortex-A55/A76
// and later, Neoverse N1/V1, Graviton 2+, Apple M1+). The products of
// neon_rows.inc with dot4 = SDOT (vdotq_s32: four 4-byte dot products
// accumulated into int32 lanes, exact): bit-identical to the reference.
// Compiled with -march=armv8.2-a+dotprod (src/kernels/CMakeLists.txt) and
// chosen only where getauxval(AT_HWCAP) has HWCAP_ASIMDDP
// (core::cpu_features().dotprod). Elsewhere this file defines an absent tier.
#include "kernels/internal.h"

#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)

#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace bonsai::kernels::detail {
namespace {

struct Isa {
  [[gnu::always_inline]] static int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x16_t q) { return vdotq_s32(acc, w, q); }
  static constexpr bool kMmla = false;
};

#include "kernels/neon_rows.inc"

}  // namespace

const TierOps* neon_dotprod_ops() { return make_ops(); }

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
const TierOps* neon_dotprod_ops() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
