// Internal helpers shared by config.cpp and model.cpp (not part of the API).
#pragma once

#include <vector>

#include "core/error.h"
#include "model/config.h"

namespace bonsai::gguf {
class File;
}

namespace bonsai::model {

// Parses the config, appending every problem found to `errors` (the config
// is only meaningful when no error was added).
ModelConfig parse_config(const gguf::File& f, std::vector<core::Error>& errors);

// One error with the first error's code and all messages joined by "; ".
// `errors` must not be empty.
core::Error join_errors(const std::vector<core::Error>& errors);

}  // namespace bonsai::model
