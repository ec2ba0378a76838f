// One token of the gated delta rule for one value head: the recurrence of
// the qwen35 Gated DeltaNet layer (model/gated_delta_net.cpp; Yang, Kautz &
// Hatamizadeh 2024, "Gated Delta Networks", eq. 10; the order of
// ../shared/tools/qwen35_ref.py). With S the head's [d][d] fp32 state (row
// i: value dim, column j: key dim):
//   S <- g S;  delta = (v - S k) * beta;  S <- S + delta k^T;  o = (S q) * scale
// done row by row, two passes over each row.
//
// Arithmetic (every tier, bit for bit): for row i,
//   pass 1: r_j <- r_j * g, then lane (j mod 16) of a 16-lane fp32 sum takes
//           + r_j * k_j (j ascending, each * and + rounded once, no fma);
//           sk = fold(sum);  delta = (v_i - sk) * beta
//   pass 2: r_j <- r_j + delta * k_j, lane (j mod 16) takes + r_j * q_j;
//           o_i = fold(sum) * scale
// with the lanes a_0 .. a_15 starting at +0 and fold(a) the halving tree
//   a_l <- a_l + a_{l+8} (l < 8);  a_l <- a_l + a_{l+4} (l < 4);
//   a_l <- a_l + a_{l+2} (l < 2);  fold = a_0 + a_1.
// The 16 independent partial sums let a SIMD tier run the products without
// the scalar dependency chain of one running sum; the fixed fold makes
// every tier's result the same bits. The AVX2 kernel serves the AVX2 and
// AVX-512 tiers, the NEON kernel the three ARM tiers (d a multiple of 16);
// the reference serves every other case (the reference tier, other d).
//
// Error: each dot product is a sum of d rounded products in 16 chains of
// d/16 plus a 4-level tree, |err| <= ~(d/16 + 4) * 2^-24 * sum_j |r_j x_j|.
//
// Single-threaded, no allocation, thread-safe; the tier is
// kernels::active_tier().
#pragma once

#include <cstdint>

namespace bonsai::kernels {

// The delta-rule step above on one head.
//   S:     [d][d] fp32 state, row-major, updated in place.
//   q, k:  [d] query and key (already L2-normalised by the caller).
//   v:     [d] value.  g, beta, scale: the gate, the write strength and the
//          output scale.  o: [d] output (written).  d >= 1.
// All borrowed for the call; S must not alias q, k, v or o.
void delta_rule_step(float* S, const float* q, const float* k, const float* v, float g, float beta, float scale,
                     float* o, int64_t d);

}  // namespace bonsai::kernels
