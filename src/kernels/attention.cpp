// Dispatch of the attention kernels (attention.h) by the active tier, and
// the per-thread prefetch cursor the tiers' group steps advance. Compiled
// without ISA flags: it only picks a table.
#include "kernels/attention.h"

#include "kernels/attention_internal.h"

namespace bonsai::kernels {

namespace detail {
namespace {
constinit thread_local SpreadPrefetch t_spread;
}  // namespace
SpreadPrefetch& spread_prefetch() { return t_spread; }
}  // namespace detail

namespace {

// The attention table of tier t; the reference one where t has none (the
// reference tier, or a tier not built into this binary).
const detail::AttnOps* attn_ops_of(Tier t) {
  const detail::AttnOps* ops = nullptr;
  switch (t) {
    case Tier::kAvx2:
      ops = detail::avx2_attn_ops();
      break;
    case Tier::kAvx512:
      ops = detail::avx512_attn_ops();
      break;
    case Tier::kNeon:
      ops = detail::neon_attn_ops();
      break;
    case Tier::kNeonDotprod:
    case Tier::kNeonI8mm:  // (its CPU check includes dotprod)
      ops = detail::neon_dotprod_attn_ops();
      break;
    case Tier::kReference:
      break;
  }
  return ops ? ops : detail::reference_attn_ops();
}

}  // namespace

AttnKernels attn_kernels(int64_t hd_k, int64_t hd_v) {
  const Tier tier = active_tier();
  const detail::AttnOps& ops = *attn_ops_of(tier);
  const auto fits = [&](const detail::AttnOps& o) {
    const int64_t m = o.head_dim_multiple;
    return m > 0 && hd_k % m == 0 && hd_v % m == 0;
  };
  if (fits(ops)) return {ops.name, ops.step, ops.score_q8, ops.load_rows};
  // Head dims the AVX-512 kernels do not take (multiples of 8, not 16, e.g.
  // stories260K's 8) run the AVX2 kernels, which every AVX-512 CPU has,
  // instead of the scalar reference: the choice still depends only on the
  // tier and the head dims, so it is the same for every batch.
  if (tier == Tier::kAvx512) {
    if (const detail::AttnOps* narrow = attn_ops_of(Tier::kAvx2); narrow != &ops && fits(*narrow))
      return {narrow->name, narrow->step, narrow->score_q8, narrow->load_rows};
  }
  return {"scalar", nullptr, detail::attn_score_q8_ref, ops.load_rows};
}

void attn_prefetch_spread(const uint8_t* k, size_t kbytes, const uint8_t* v, size_t vbytes) {
  detail::t_spread.set(k, kbytes, v, vbytes);
}

void attn_prefetch_l2(const uint8_t* p, size_t bytes) {
  const auto first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const auto last = reinterpret_cast<uintptr_t>(p) + bytes;
  for (uintptr_t a = first; a < last; a += 64) __builtin_prefetch(reinterpret_cast<const void*>(a), 0, 2);
}

}  // namespace bonsai::kernels
