// Internal helpers shared by config.cpp and model.cpp (not part of the API).
#pragma once

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "kernels/kernels.h"  // MatrixView, ActScratch
#include "model/config.h"

namespace bonsai::core {
class ThreadPool;
}

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

// Tokens per task for the cheap per-token steps of the forward pass.
inline constexpr int64_t kTokChunk = 4;

// Grows v to at least n elements (scratch buffers; never shrinks).
template <class T>
void grow(std::vector<T>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
}

// y = x / sqrt(mean(x^2) + eps) * w over n floats (RMSNorm, Zhang & Sennrich
// 2019; the sum in double as ggml_rms_norm). x and y may alias.
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);
// rms_norm of each of n rows of `dim` floats (x and y [n][dim], may alias),
// split over `pool` in kTokChunk runs of rows.
void rms_norm_rows(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps, core::ThreadPool& pool);

// Y[n][w.rows] = X[n][w.cols] W^T on `pool` (GEMV when n == 1, else GEMM);
// the activations are quantized into `act` for the quantized formats.
void matmul(const kernels::MatrixView& w, const float* x, int64_t n, float* y, core::ThreadPool& pool,
            kernels::ActScratch& act);

}  // namespace bonsai::model
