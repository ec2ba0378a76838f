// Causal grouped-query attention over the KV caches, tiled over queries and
// keys with an online softmax (Milakov & Gimelshein 2018, "Online normalizer
// calculation for softmax"; the FlashAttention tiling of Dao et al. 2022).
//
// Batch invariance (DESIGN.md, Numerics): a query's output depends only on
// its own q, its position and its sequence's cached K/V. Keys are visited in
// blocks of kKeyBlock positions aligned to position 0, always in increasing
// order, and each (query head, key block) step runs the same function whether
// the query came alone (decode) or inside a prefill tile, so the result is bit
// identical however queries were grouped or the prompt was chunked.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/attention.h"  // kAttnKeyBlock
#include "model/batch.h"        // BatchToken
#include "model/config.h"       // ModelConfig
#include "model/kv_cache.h"     // KvCache

namespace bonsai::core {
class ThreadPool;
}

namespace bonsai::model {

// Keys per block of the online softmax (absolute positions [32b, 32b+32)).
inline constexpr int64_t kKeyBlock = kernels::kAttnKeyBlock;
// Queries of one sequence processed together per task (they share each K/V
// block read); does not change any result.
inline constexpr int64_t kQueryTile = 32;

// For every token i of `tok` and query head h (KV head h / (n_head/n_head_kv)):
//   s_t = (q_ih . k_t) * scale,  t = 0..pos_i  (the sequence's cached keys)
//   out_ih = sum_t softmax(s)_t v_t
// q:   [n][n_head * head_dim_k] floats (RoPE applied), token i's row at i.
// out: [n][n_head * head_dim_v] floats, written.
// The cache rows 0..pos_i of layer `layer` of caches[tok[i].seq] must hold
// the keys/values (forward() writes a ubatch's rows before calling this).
// Runs (tile of one sequence's consecutive tokens) x KV head tasks on `pool`.
// Only KV heads [kvh_begin, kvh_end) (and their query heads) are computed;
// kvh_end < 0 means n_head_kv. A head's result does not depend on the range
// (the fused decode step runs one range per pool task, inline).
void attention(const ModelConfig& c, int64_t layer, std::span<const BatchToken> tok, std::span<KvCache* const> caches,
               const float* q, float* out, float scale, core::ThreadPool& pool, int64_t kvh_begin = 0,
               int64_t kvh_end = -1);

// Which inner kernel attention() uses for these head dims under the active
// kernels tier: "avx512" (head dims multiples of 16, AVX-512 tier), "avx2"
// (head dims multiples of 8, AVX2 tier: AVX2 + FMA + F16C), "neon" (head dims
// multiples of 4, the three ARM tiers) or "scalar". Each
// kernel has its own fp32 order (results differ between kernels, within the
// bound model_attention_test states) and is batch invariant by itself.
// For tests and logs.
const char* attention_kernel_name(int64_t head_dim_k, int64_t head_dim_v);

// The Q8_0-key scores of the active kernels tier (attention.cpp's header
// comment gives the formula): q [hd] floats is quantized to Q8_0 blocks, then
// s[t] = score of q against key row t for t < nk (rows of ggml block_q8_0 x
// hd/32, row_bytes apart, 1 <= nk <= kKeyBlock, hd a multiple of 32, <= 512).
// Every tier returns the same bits (tests memcmp them). For tests.
void attention_q8_scores(const float* q, const uint8_t* k_rows, size_t row_bytes, int64_t nk, int64_t hd, float scale,
                         float* s);

}  // namespace bonsai::model
