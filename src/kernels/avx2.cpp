// avx2 tier (placeholder until implemented): not built into this binary.
#include "kernels/internal.h"

namespace bonsai::kernels::detail {

const TierOps* avx2_ops() { return nullptr; }

}  // namespace bonsai::kernels::detail
