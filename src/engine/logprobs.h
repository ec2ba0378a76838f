// Log probabilities of tokens (OpenAI `logprobs` / `top_logprobs`, the legacy
// completions `logprobs`, `echo` with logprobs) and the embedding pooling of
// /v1/embeddings.
//
// What the values are: the log-softmax of the model's RAW logits for one
// position, log p_i = l_i - log(sum_j exp(l_j)), before anything the sampler
// does (logit_bias, penalties, top_k / top_p / min_p, temperature, grammar
// masks). So they describe the model, not the sampling settings, and equal
// `bonsai logits` output run through a log-softmax. (vLLM's default
// "raw_logprobs"; llama-server reports post-sampling probabilities instead.)
// The normaliser is accumulated in double; results are rounded to float.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

namespace bonsai::engine {

// Most alternatives per position (OpenAI's top_logprobs limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

// One position's answer: the chosen token's log probability and the
// `top.size()` most likely tokens with theirs (largest first, ties: lower
// id first). `logprob` is NaN for the first prompt token (no context
// predicts it; the server prints null, as OpenAI does).
struct TokenLogprob {
  int32_t token = -1;
  float logprob = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::pair<int32_t, float>> top;  // (id, log probability)
};

// log(sum_i exp(logits[i])) in double: max + log(sum exp(l - max)). NaN
// logits are skipped; an empty row or all -inf gives -inf.
double log_sum_exp(std::span<const float> logits);

// The log-softmax of `logits` ([n_vocab]) written to `out` (same size).
void log_softmax(std::span<const float> logits, std::span<float> out);

// `token`'s log probability under `logits` ([n_vocab]) and the `top_n`
// (clamped to [0, n_vocab]) most likely tokens. `token` must be in
// [0, n_vocab). Cost: two passes over the row, no allocation beyond `top`.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int32_t top_n);

// Mean of `rows` rows of `hidden` ([rows][dim], accumulated in double),
// then scaled to unit L2 norm (a zero vector stays zero). The embedding of
// /v1/embeddings is this over every token's final-normed hidden state.
std::vector<float> mean_pool_l2(std::span<const float> hidden, int64_t rows, int64_t dim);

// mean_pool_l2 in two moves, for rows that arrive in pieces (the scheduler's
// chunked prefill): pool_add_rows adds `rows` ([k][acc.size()]) to `acc`,
// row after row, in double; pool_finish divides by `rows` (the total added)
// and L2-normalises. Adding the rows in their order, in any number of
// calls, then pool_finish gives mean_pool_l2 of all of them bit for bit
// (mean_pool_l2 is these two calls).
void pool_add_rows(std::span<double> acc, std::span<const float> rows);
std::vector<float> pool_finish(std::span<double> acc, int64_t rows);

}  // namespace bonsai::engine
