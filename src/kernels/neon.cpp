// neon tier (placeholder until implemented): not built into this binary.
#include "kernels/internal.h"

namespace bonsai::kernels::detail {

const TierOps* neon_ops() { return nullptr; }

}  // namespace bonsai::kernels::detail
