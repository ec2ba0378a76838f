// NEON + i8mm tier (ARMv8.6-A Int8 matrix multiply, FEAT_I8MM: SMMLA, with
// SDOT; Neoverse V1/N2/V2, Graviton 3+, Cortex-A510/A710 and later, Apple
// M2+). Batched products (n >= 2 columns) of Q1_0 and the 2-bit code
// formats run two rows by two columns per SMMLA (vmmlaq_s32,
// neon_rows.inc rows_mmla); GEMV, Q8_0 (chunks of 4, narrower than SMMLA's
// 8) and odd rows / columns use SDOT as the dotprod tier. Bit-identical to
// the reference. Compiled with -march=armv8.6-a+i8mm (src/kernels/
// CMakeLists.txt) and chosen only where getauxval reports HWCAP_ASIMDDP and
// HWCAP2_I8MM (core::cpu_features().dotprod, .i8mm). Elsewhere this file
// defines an absent tier.
#include "kernels/internal.h"

#if defined(__aarch64__) && defined(__ARM_FEATURE_MATMUL_INT8) && defined(__ARM_FEATURE_DOTPROD)

#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace bonsai::kernels::detail {
namespace {

struct Isa {
  [[gnu::always_inline]] static int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x16_t q) { return vdotq_s32(acc, w, q); }
  static constexpr bool kMmla = true;
};

#include "kernels/neon_rows.inc"

}  // namespace

const TierOps* neon_i8mm_ops() { return make_ops(); }

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
const TierOps* neon_i8mm_ops() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
