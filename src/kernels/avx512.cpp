// avx512 tier (placeholder until implemented): not built into this binary.
#include "kernels/internal.h"

namespace bonsai::kernels::detail {

const TierOps* avx512_ops() { return nullptr; }

}  // namespace bonsai::kernels::detail
