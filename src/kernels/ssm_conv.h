// One token of the qwen35 Gated DeltaNet's causal depthwise convolution
// (llama.cpp's ggml_ssm_conv, kernel width K, one filter per channel): for
// each channel c of a run of n channels,
//   out[c] = (((0 + w[c K] t_0[c]) + w[c K + 1] t_1[c]) + ...) + w[c K + K-1] x[c]
// with t_k the K-1 earlier inputs of the channel (oldest first), each product
// rounded, then added in tap order starting from +0 (no fma: kernels/ is
// compiled with -ffp-contract=off), so every tier gives the same bits for any
// n or alignment. The tail then moves by one token: t_k = t_{k+1}, t_{K-2} = x.
//
// Tiers: the AVX2 kernel (K = 4, 8 channels per step: the filters
// transposed with shuffles) serves the AVX2 and AVX-512 tiers, the NEON
// kernel (K = 4, VLD4Q's de-interleave) the three ARM tiers; every other K,
// the channels past the last whole step and the reference tier run the
// scalar reference. Single-threaded, no allocation, thread-safe on disjoint
// channels.
#pragma once

#include <cstdint>

namespace bonsai::kernels {

// One convolution step over channels [0, n) (above). w: [n][K] fp32 filters
// (GGUF's ssm_conv1d.weight rows, K taps each, oldest tap first); tail:
// K-1 rows of n inputs, row k at tail + k * tail_ld (row 0 the oldest),
// updated in place; x: [n] this token's inputs; out: [n] the sums (no
// activation). K >= 1 (K = 1: no tail, which may then be null; out = 0 + w
// x); tail_ld >= n when K > 1. Nothing overlaps except that out may be x.
// All pointers borrowed for the call. The caller checks the shapes (the
// model's config validation); outside them the behaviour is undefined (an
// assert in debug builds). A NaN input gives a NaN out, whose payload may
// differ between tiers.
void ssm_conv_step(const float* w, int64_t K, float* tail, int64_t tail_ld, const float* x, float* out, int64_t n);

}  // namespace bonsai::kernels
