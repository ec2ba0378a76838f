// The fast Walsh-Hadamard transform of the Bonsai 2 fold (model/hadamard.h;
// definition: ../shared/fixtures/README.md "The Bonsai 2 Hadamard fold").
// H_B is the normalised Sylvester Walsh-Hadamard matrix of size B (a power of
// two): H[r][c] = (-1)^popcount(r & c) / sqrt(B); symmetric, orthogonal and
// its own inverse.
//
// Arithmetic (every tier, bit for bit): each consecutive B-chunk is
// transformed in place by the radix-2 butterflies of the Sylvester
// recursion, stages h = 1, 2, 4, ..., B/2, each pair (j, j + h) with j's bit
// h clear becoming (a + b, a - b) in fp32, then every element is multiplied
// by scale = (float)(1 / sqrt((double)B)). A sign is applied as a multiply by
// +1.0f / -1.0f (exact). Each output is therefore a fixed sequence of fp32
// operations whatever the order the pairs are visited in, so the SIMD tiers
// (AVX2, AVX-512, NEON for the three ARM tiers) equal the scalar reference
// exactly. Against the exact product H_B·x the error is that of log2(B)
// rounded additions and one rounded scale: |err| <= ~(log2(B) + 1) · 2^-24 ·
// sqrt(B) · max|x| per element (the test checks it against a float64 O(n^2)
// product).
//
// Single-threaded, no allocation, thread-safe; the tier is kernels::active_tier().
#pragma once

#include <cstdint>
#include <span>

namespace bonsai::kernels {

// x <- T(x) = H_B (s ⊙ x) on each consecutive block-chunk: the activation
// transform before a matmul with a folded weight (y = W' · T(x)).
//   x:     rows of n = signs.size() floats, concatenated (x.size() a multiple
//          of n); with empty `signs` (sign_mode identity: all +1) any length
//          that is a multiple of block.
//   signs: [n] of +1.0f / -1.0f (element i multiplies x_i of each row), n a
//          multiple of block; borrowed for the call.
//   block: B, a power of two >= 1.
// Preconditions are the caller's (model::read_hadamard_fold validated them);
// they are asserted, not reported.
void hadamard_rotate(std::span<float> x, std::span<const float> signs, int64_t block);

// x <- s ⊙ (H_B x) on each block-chunk: the inverse of hadamard_rotate
// (H_B is its own inverse and s ⊙ s = 1), applied to a row looked up from a
// rotated token_embd. Same shapes and preconditions as hadamard_rotate.
void hadamard_unrotate(std::span<float> x, std::span<const float> signs, int64_t block);

}  // namespace bonsai::kernels
