// Attention steps for model/attention.cpp's tiled online softmax: the
// scores of a key block, the softmax update, the value accumulation (PV),
// K/V row loads and the integer scores of Q8_0 keys, with a scalar reference
// (attention_ref.cpp), AVX2 / AVX-512 tiers (attention_avx2.cpp,
// attention_avx512.cpp) and a NEON one for the three ARM tiers
// (attention_neon.cpp), chosen by the products' tier (active_tier(), so
// BONSAI_KERNEL governs attention too).
//
// The algorithm (tiling, key order, masking, which KV format takes which
// path) stays in model/attention.cpp; these are the per-block steps it calls.
// A step's ops for one query head never depend on how many heads share the
// call, nor on whether K/V rows are read in place or from fp32 scratch, so
// each kernel is batch invariant by itself. Kernels differ from each other in
// fp32 order (results differ by tier, within the bound
// tests/model/attention_test.cpp states), except the Q8_0-key scores, which
// are the same bits on every tier.
//
// State of one query head (the online softmax, per key block):
//   m' = max(m, max_t s_t),  c = exp(m - m'),  p_t = exp(s_t - m')
//   l' = l c + sum_t p_t,    acc' = acc c + sum_t p_t v_t      (t ascending)
// laid out as float[2 + hd_v] = {m, l, acc[hd_v]}; m starts at -inf, l and
// acc at 0.
//
// Q8_0 keys take an integer path, as ggml's CPU flash attention does (it
// quantizes q to K's vec_dot type): each query head's q is quantized once
// to Q8_0 blocks of 32 (attn_quantize_q8) and the score of key t is
//   isum_tb = sum_{i<32} qq_{32b+i} * kq_{t,32b+i}                (int32, exact)
//   s_t = ((isum_t0 * (dq_0 * dk_t0) + isum_t1 * (dq_1 * dk_t1)) + ...) * scale
// with each * and + one fp32 rounding in that order (no fma; src/kernels is
// compiled with -ffp-contract=off). The reference scorer defines it; every
// tier's scorer (16 keys per vector with VNNI on AVX-512, 8 with AVX2, 4
// with NEON) returns the same bits, so a score depends on nothing but q and the key.
//
// Thread safety: every function is safe to call from many threads; the
// prefetch cursor (attn_prefetch_spread) is per thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"  // Format

namespace bonsai::kernels {

// Keys per block of the online softmax (absolute positions [32b, 32b + 32)).
inline constexpr int64_t kAttnKeyBlock = 32;
// Largest head dim of the Q8_0-key path (a larger one converts K rows to fp32).
inline constexpr int64_t kAttnQ8MaxHeadDim = 512;

// A query head's q quantized for Q8_0 keys: ggml's quantize_row_q8_0 per
// block of 32 (d = amax / 127, q = round-to-nearest-even(x * (1 / d)) with
// the unrounded d, d then rounded to fp16), plus each block's sum of q (the
// AVX-512 scorer's unsigned-operand correction). Blocks past hd / 32 are
// not written.
struct AttnQ8Query {
  int8_t q[kAttnQ8MaxHeadDim];
  float d[kAttnQ8MaxHeadDim / 32];
  int32_t sum[kAttnQ8MaxHeadDim / 32];
};

// Quantizes x [hd] floats (hd a multiple of 32, <= kAttnQ8MaxHeadDim) into
// out. Scalar on every tier, so the integer parts are the same everywhere.
void attn_quantize_q8(const float* x, int64_t hd, AttnQ8Query& out);

// A block of K or V rows as the group step reads them: row t at p + t *
// stride (bytes), each row one head's head-dim values in format f (kF32,
// kF16 or kQ8_0: cache rows read in place, or kF32 scratch). Borrowed: the
// rows must outlive the call.
struct AttnRows {
  Format f;
  const uint8_t* p;
  size_t stride;  // bytes between rows
};

// One (query head, key block) step of the reference kernel (std::exp, plain
// loops), where no SIMD group step applies.
//   q: [hd_k] query, k: [nk][hd_k] and v: [nk][hd_v] fp32 rows of the block,
//   1 <= nk <= kAttnKeyBlock; state: [2 + hd_v] = m, l, acc (updated).
void attn_block_ref(const float* q, const float* k, const float* v, int64_t nk, int64_t hd_k, int64_t hd_v, float scale,
                    float* state);
// The softmax + V part of attn_block_ref for scores s[0 .. nk) (already
// scaled; s is overwritten with the p_t), v: [nk][hd_v] fp32 rows, state as
// above. The reference kernel's step for Q8_0 keys, whose scores come from
// AttnScoreQ8Fn.
void attn_update_ref(float* s, const float* v, int64_t nk, int64_t hd_v, float* state);

// The group step of a SIMD tier: one key block for nh query heads that see
// the same keys t < nk (1 <= nk <= kAttnKeyBlock). q[j]: head j's query
// ([hd_k] floats); k: the block's K rows, or null when the scores are
// already in s (Q8_0 keys: head j's scaled scores at s[j * kAttnKeyBlock],
// -inf from nk on); v: the block's V rows. s: [nh][kAttnKeyBlock] scratch
// (overwritten); head j's state at st + j * st_len (st_len >= 2 + hd_v).
// Heads go through 4 (else 2, 1) at a time sharing each K/V load; every
// head's result is the one it gets alone.
using AttnStepFn = void (*)(const float* const* q, int64_t nh, const AttnRows* k, const AttnRows& v, int64_t nk,
                            int64_t hd_k, int64_t hd_v, float scale, float* s, float* st, int64_t st_len);
// Q8_0-key scores: s[j * kAttnKeyBlock + t] = score of qs[j] against key
// row t (ggml block_q8_0 x hd / 32, row_bytes apart) for t < nk (1 <= nk <=
// kAttnKeyBlock) and j < nq, by the formula in this header's comment;
// s[j * kAttnKeyBlock + t] for t >= nk is not written. hd a multiple of 32,
// <= kAttnQ8MaxHeadDim.
using AttnScoreQ8Fn = void (*)(const uint8_t* k, size_t row_bytes, int64_t nk, int64_t hd, const AttnQ8Query* qs,
                               int64_t nq, float scale, float* s);
// n values of consecutive rows of format f (kF32, kF16 or kQ8_0; n a
// multiple of the format's block) at src -> dst [n] fp32. Exact: fp16 ->
// fp32 and Q8_0's d * q are representable.
using AttnLoadRowsFn = void (*)(Format f, const uint8_t* src, float* dst, int64_t n);

// The attention kernels of the active tier for head dims hd_k, hd_v.
struct AttnKernels {
  // "avx512" (AVX-512 tier, head dims multiples of 16), "avx2" (AVX2 tier,
  // multiples of 8; also the AVX-512 tier's for multiples of 8 that are not
  // of 16), "neon" (the ARM tiers, multiples of 4) or "scalar" (every other
  // case). Static storage.
  const char* name;
  AttnStepFn step;           // the SIMD group step; null for "scalar" (use attn_block_ref / attn_update_ref)
  AttnScoreQ8Fn score_q8;    // never null (the reference scorer for "scalar")
  AttnLoadRowsFn load_rows;  // never null; the tier's conversions whatever the head dims
};
AttnKernels attn_kernels(int64_t hd_k, int64_t hd_v);

// Software prefetch of the next key block while this one is computed.
// attn_prefetch_spread points the calling thread's cursor at [k, k + kbytes)
// and [v, v + vbytes) (null: none; all null: clear); the SIMD group steps'
// inner loops then request those cache lines into L2 a few at a time (K's
// first), so the misses overlap the block's arithmetic. Lines not requested
// when the cursor is moved again are dropped. Hints only: no result depends
// on them. Notes on the scheme: bench/results/notes-attention.md.
void attn_prefetch_spread(const uint8_t* k, size_t kbytes, const uint8_t* v, size_t vbytes);
// Requests the cache lines of [p, p + bytes) into L2 now (read, moderate
// locality). A hint: never faults.
void attn_prefetch_l2(const uint8_t* p, size_t bytes);

}  // namespace bonsai::kernels
