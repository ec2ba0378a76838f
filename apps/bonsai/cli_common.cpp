#include "apps/bonsai/cli_common.h"

#include <cstdlib>

namespace bonsai::app {

core::Expected<gguf::OpenOptions> open_options_from_cli(const std::string& flag) {
  gguf::OpenOptions options;
  std::string layout = flag;
  if (layout.empty()) {
    if (const char* env = std::getenv("BONSAI_Q2_LAYOUT"); env != nullptr) layout = env;
  }
  if (layout.empty()) return options;
  options.q2_layout = core::parse_q2_layout(layout);
  if (!options.q2_layout) {
    return core::fail(core::Errc::kInvalidArgument,
                      "unknown Q2_0 layout '" + layout +
                          "' (expected g64, g128-d-first or g128-qs-first)");
  }
  return options;
}

}  // namespace bonsai::app
