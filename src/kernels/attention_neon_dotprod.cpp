// The Q8_0-key scorer of the neon-dotprod and neon-i8mm tiers (attention.h):
// attention_neon_q8.inc with SDOT (vdotq_s32: four 4-byte dot products
// accumulated into int32 lanes, exact), the same bits as the reference and
// the baseline NEON scorer; the rest of the table (group step, row loads)
// is attention_neon.cpp's. Compiled with -march=armv8.2-a+dotprod
// (src/kernels/CMakeLists.txt) and used only on those tiers, whose CPU check
// includes HWCAP_ASIMDDP. Elsewhere this file defines an absent table.
//
// Instructions per product (aarch64-linux-gnu-objdump -d, GCC 12 -O3,
// 2026-12-06): 38 per 32-int8 block of 4 keys (12 LDR, 8 SDOT, the ADDP
// tree and the fp32 combine) for 128 products, 0.30 (the SMULL scorer:
// 0.47; AVX2: 0.23).
#include "kernels/attention_internal.h"

#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

namespace bonsai::kernels::detail {
namespace {

// Block b of Q8_0 key row kt against q's block (q0, q1): two SDOT into
// four int32 lanes.
struct SdotDot {
  static int32x4_t dot(const uint8_t* kt, int8x16_t q0, int8x16_t q1, int64_t b) {
    const int8x16_t k0 = vld1q_s8(reinterpret_cast<const int8_t*>(kt + 34 * b + 2));
    const int8x16_t k1 = vld1q_s8(reinterpret_cast<const int8_t*>(kt + 34 * b + 18));
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), k0, q0), k1, q1);
  }
};

#include "kernels/attention_neon_q8.inc"

}  // namespace

const AttnOps* neon_dotprod_attn_ops() {
  const AttnOps* base = neon_attn_ops();
  if (base == nullptr) return nullptr;
  static const AttnOps ops{base->name, base->head_dim_multiple, base->step, score_q8_neon_t<SdotDot>, base->load_rows};
  return &ops;
}

}  // namespace bonsai::kernels::detail

#else  // not arm64 (or built without dotprod): absent

namespace bonsai::kernels::detail {
const AttnOps* neon_dotprod_attn_ops() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
