// Makes a test binary honour BONSAI_KERNEL as the `bonsai` commands do
// (kernels::init_tier_from_env), so that a suite can be run with each tier
// forced (scripts/test-arm64.sh runs the goldens once per ARM tier).
// Include it in one translation unit of the test binary: the tier is set
// before main (static initialisation). A bad name or a tier this CPU lacks
// prints the error and exits 2 (as the CLI's usage error), so a forced run
// never silently tests another tier.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "kernels/kernels.h"

namespace bonsai::test {

inline const bool kKernelFromEnv = [] {
  const auto r = kernels::init_tier_from_env();
  if (!r.has_value()) {
    std::fprintf(stderr, "BONSAI_KERNEL: %s\n", r.error().message.c_str());
    std::exit(2);
  }
  return true;
}();

}  // namespace bonsai::test
