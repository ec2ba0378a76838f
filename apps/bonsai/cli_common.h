// Helpers shared by the CLI's subcommands.
#pragma once

#include <string>

#include "core/error.h"
#include "gguf/gguf.h"  // gguf::OpenOptions

namespace bonsai::app {

// GGUF open options from the `--q2-layout` value (`flag`), else env
// BONSAI_Q2_LAYOUT, else none (the reader detects the layout). Errors:
// kInvalidArgument "unknown Q2_0 layout 'X' (expected g64, g128-d-first or
// g128-qs-first)".
core::Expected<gguf::OpenOptions> open_options_from_cli(const std::string& flag);

}  // namespace bonsai::app
