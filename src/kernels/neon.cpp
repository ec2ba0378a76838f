// NEON tier (arm64 Advanced SIMD, baseline ARMv8.0-A: no dotprod needed).
// The products of neon_rows.inc with dot4 made of SMULL/SMULL2 + SADDLP +
// ADDP (exact int16 products, widened pairwise): bit-identical to the
// reference (internal.h). Built only on arm64; elsewhere this file defines
// an absent tier.
//
// Instructions per weight (static counts of the loops in
// aarch64-linux-gnu-objdump -d of GCC 12 -O3 code, Q1_0, 2026-12-06;
// qemu cannot time them, and nobody has run them on ARM hardware yet):
//   neon (this file), rows_dot: per 128-weight block 62 instructions expand
//     the sign bits (8 x TBL + CMTST + BSL) and load the scale, shared by
//     up to 4 columns, then 65 per column (16 SMULL/SMULL2, 16 SADDLP, 12
//     ADDP/ADD, 8 loads, the scaling): GEMV ~1.0 per weight, 4 columns
//     ~0.63 per weight and column;
//   neon-dotprod: the same expansion, 8 SDOT per column and block: 179
//     instructions per block for 4 columns, ~0.35 per weight and column;
//   neon-i8mm, rows_mmla (2 rows x 2 columns): 43 per 32-weight chunk (4
//     SMMLA, the ZIP1/ZIP2 pairing, one FMUL + FMLA for the 4 outputs) plus
//     ~79 to expand two rows' block: ~0.49 per weight and column, no better
//     than SDOT's 4 columns (the per-chunk fp32 scaling of the canonical
//     order costs as much as the products).
// The AVX2 tier's pair-layout kernel (avx2_rows.inc pmicro, same objdump
// count): 94 instructions per 256 weights and column (0.37; VPDPBUSD: 0.31;
// 1 row x 4 columns: 0.29). Expected roofline ratio (Q1_0 = 0.14 bytes per
// weight): a core retiring ~2 ASIMD instructions per cycle at ~2.5-3 GHz
// runs the NEON GEMV at ~5 G weights/s = ~0.7 GB/s of weights, about 0.1
// of one core's share of DRAM bandwidth (~5-10 GB/s on Graviton/Ampere
// class servers): compute-bound, as the AVX2 tier without VNNI is on Zen 3;
// dotprod ~2x that. To be measured: bench/README.md, "ARM tiers".
#include "kernels/internal.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace bonsai::kernels::detail {
namespace {

struct Isa {
  [[gnu::always_inline]] static int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x16_t q) {
    // |w * q| <= 128 * 128 fits int16; SADDLP widens pairs to int32.
    const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(q)));
    const int32x4_t hi = vpaddlq_s16(vmull_high_s8(w, q));
    return vaddq_s32(acc, vpaddq_s32(lo, hi));
  }
  static constexpr bool kMmla = false;
};

#include "kernels/neon_rows.inc"

}  // namespace

const TierOps* neon_ops() { return make_ops(); }

}  // namespace bonsai::kernels::detail

#else

namespace bonsai::kernels::detail {
const TierOps* neon_ops() { return nullptr; }
}  // namespace bonsai::kernels::detail

#endif
