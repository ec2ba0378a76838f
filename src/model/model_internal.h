// Internal helpers shared by config.cpp and model.cpp (not part of the API).
#pragma once

#include <cstdint>
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

// YaRN correction dims [low, high] (ggml_rope_yarn_corr_dims) for config c.
void yarn_corr_dims(const ModelConfig& c, float dims[2]);

// RoPE angles at position `pos` as ggml_rope_cache_init computes them:
// out[i] = cos(theta_i) * mscale, out[n_rot/2 + i] = sin(theta_i) * mscale for
// i in [0, n_rot/2). corr_dims from yarn_corr_dims (ignored without YaRN).
void rope_angles(const ModelConfig& c, const float corr_dims[2], int32_t pos, float* out);

}  // namespace bonsai::model
