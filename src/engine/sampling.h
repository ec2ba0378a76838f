// Sampling parameters and the sampler: turns one logits vector into one token.
//
// The chain follows llama.cpp's default sampler chain (common/sampling.cpp,
// src/llama-sampling.cpp), restricted to the stages we support, in this order:
//
//   0. logit_bias  each (id, bias) pair is added to that token's logit
//                  (OpenAI `logit_bias`; llama.cpp puts its logit-bias
//                  sampler first as well).
//   1. penalties   over the last `repeat_last_n` tokens of the history:
//                  repeat_penalty (llama.cpp / CTRL paper: a logit > 0 is
//                  divided by it, a logit <= 0 multiplied), then
//                  logit -= count * frequency_penalty + (count > 0) * presence_penalty
//                  (OpenAI's definition, as llama.cpp applies it).
//   2. greedy      if temperature <= 0: the arg-max of the penalised logits
//                  (lowest id on ties); no RNG draw. Stages 3-7 are skipped.
//   3. top_k       keep the k largest logits (k <= 0 or k >= n_vocab: off).
//   4. top_p       softmax of the survivors (at temperature 1, as llama.cpp
//                  does: temperature comes later), keep the smallest prefix
//                  of the sorted list whose probability sum is >= top_p
//                  (top_p >= 1: off). At least one token is kept.
//   5. min_p       keep tokens whose probability (softmax of the survivors,
//                  temperature 1) is >= min_p * the largest probability
//                  (min_p <= 0: off). At least one token is kept.
//   6. temperature the survivors' logits are divided by `temperature`.
//   7. sample      p_i = softmax(survivors); one uniform u in [0, 1) from the
//                  RNG (Rng::next_double); the first token in sorted order
//                  whose cumulative probability exceeds u is chosen (the last
//                  survivor if rounding leaves u above the total).
//
// Sorted order everywhere is: logit descending, then token id ascending — a
// strict total order, so the result does not depend on the sort algorithm or
// the standard library. Every non-greedy sample consumes exactly one
// next_double() (= one xoshiro256** output), even when one candidate is left,
// so the RNG progression depends only on the number of sampled tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"  // core::Expected

namespace bonsai::structured {
class Grammar;  // structured/grammar.h
}

namespace bonsai::engine {

// Default seed of an engine that was given none (fixed, so runs repeat).
inline constexpr uint64_t kDefaultSeed = 0x5EED;

// What a generate* call samples with. Field names and defaults follow
// llama.cpp's common_params_sampling; the OpenAI fields (presence/frequency
// penalty, max_tokens, stop, seed) keep OpenAI's meaning.
struct SamplingParams {
  float temperature = 0.8f;        // <= 0: greedy (arg-max)
  int32_t top_k = 40;              // <= 0: off
  float top_p = 0.95f;             // >= 1: off; must be in (0, 1]
  float min_p = 0.05f;             // <= 0: off; must be in [0, 1]
  float repeat_penalty = 1.0f;     // 1.0: off; must be > 0
  int32_t repeat_last_n = 64;      // window of past tokens the penalties see; 0: off, -1: all
  float presence_penalty = 0.0f;   // OpenAI: subtracted once if the token occurred in the window
  float frequency_penalty = 0.0f;  // OpenAI: subtracted once per occurrence in the window
  uint64_t seed = kDefaultSeed;    // RNG seed (used by reseed; see InferenceEngine)
  int32_t max_tokens = -1;         // tokens to sample at most; < 0: until EOS or the context is full
  std::vector<std::string> stop;   // stop strings (UTF-8); the text never contains them
  bool ignore_eos = false;         // true: EOS/EOG tokens do not end generation
  // OpenAI logit_bias: (token id, bias in [-100, 100]) pairs added to the
  // logits before the penalties (stage 0). -100 / +100 effectively ban /
  // force a token. Repeated ids add up. Ids outside the vocabulary are
  // refused by InferenceEngine::start (kInvalidArgument naming the id); the
  // chain itself skips them.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Constrained decoding (llama.cpp's `grammar`, OpenAI's response_format /
  // tool_choice, compiled by the caller with Grammar::parse): when set, every
  // sampled token keeps the text a prefix of a sentence of the grammar, and
  // EOS/EOG is allowed only where the sentence may end. The mask is applied by
  // InferenceEngine before stage 0 (disallowed logits become -inf), per
  // sequence; each generation gets its own matcher state. Immutable, shared
  // by the requests (and n > 1 choices) that use it. nullptr: unconstrained.
  std::shared_ptr<const structured::Grammar> grammar;
  // Log probabilities (vLLM's SamplingParams names; engine/logprobs.h says
  // what the values are: log-softmax of the RAW logits, before stage 0).
  // < 0: off. k in [0, kMaxTopLogprobs]: every sampled token's log
  // probability plus the k most likely tokens' (GenerationResult::logprobs,
  // TokenEvent::logprob). Sampling is unaffected.
  int32_t logprobs = -1;
  // Same for every prompt token (echo): GenerationResult::prompt_logprobs.
  // The whole prompt is then computed (no prompt-cache reuse) so that every
  // position has logits; a sibling choice (n > 1) fed choice 0's prompt
  // logits gets none (the prompt's values are the same for every choice).
  int32_t prompt_logprobs = -1;

  // Checks ranges (NaN, negative temperature is allowed = greedy, top_p in
  // (0,1], min_p in [0,1], repeat_penalty > 0, repeat_last_n >= -1, empty stop
  // strings, logit_bias values in [-100, 100], logprobs / prompt_logprobs
  // <= kMaxTopLogprobs). Errors: kInvalidArgument naming the field and the valid range.
  core::Expected<void> validate() const;
};

// What one request (an HTTP body, server/openai.h) says about sampling,
// field by field; an unset field keeps the defaults it is applied to (the
// model's, or the command line's). The request's side of SamplingParams:
// the same names (OpenAI's / llama.cpp's), parsed into here once and merged
// by apply_overrides (prepare_completion, engine/completion.h). Range checks
// are SamplingParams::validate's, after the merge.
struct SamplingOverrides {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repeat_penalty;
  std::optional<float> presence_penalty;
  std::optional<float> frequency_penalty;
  std::optional<uint64_t> seed;  // the request's seed (the server fills in its default or a fresh one)
  std::optional<int32_t> max_tokens;
  std::optional<std::vector<std::string>> stop;
  std::optional<bool> ignore_eos;
  std::optional<std::vector<std::pair<int32_t, float>>> logit_bias;   // (token id, bias)
  std::optional<std::shared_ptr<const structured::Grammar>> grammar;  // constrained decoding (nullptr: none)
  std::optional<int32_t> logprobs;                                    // top alternatives per sampled token (< 0: off)
  std::optional<int32_t> prompt_logprobs;                             // same per prompt token (echo; < 0: off)
};

// `defaults` with every field `over` sets replaced by its value. No checks
// (SamplingParams::validate checks the result; logit_bias ids against a
// vocabulary are the caller's).
SamplingParams apply_overrides(SamplingParams defaults, const SamplingOverrides& over);

// xoshiro256** 1.0 (Blackman & Vigna, https://prng.di.unimi.it/xoshiro256starstar.c),
// seeded by running splitmix64 (Vigna, https://prng.di.unimi.it/splitmix64.c)
// from the 64-bit seed to fill the four state words. Specified bit for bit,
// so a seed gives the same stream on every platform and standard library.
class Rng {
 public:
  struct State {
    uint64_t s[4];
    bool operator==(const State&) const = default;
  };

  explicit Rng(uint64_t seed = kDefaultSeed) { reseed(seed); }
  void reseed(uint64_t seed);
  // Next raw 64-bit output of xoshiro256**.
  uint64_t next_u64();
  // Uniform double in [0, 1): (next_u64() >> 11) * 2^-53.
  double next_double();
  State state() const { return state_; }
  void set_state(const State& s) { state_ = s; }

 private:
  State state_;
};

// One surviving candidate of the chain: token id, its (penalised, tempered)
// logit and its probability among the survivors. For a tiny temperature the
// tempered logit may be +-inf in float; `p` is always finite (it is computed
// from the differences to the top logit when the quotient overflows).
struct Candidate {
  int32_t id = 0;
  float logit = 0.0f;
  float p = 0.0f;
};

// Applies stage 0 (logit_bias) in place. `logits`: [n_vocab].
void apply_logit_bias(std::span<float> logits, const SamplingParams& params);

// Applies stage 1 (penalties) in place. `logits`: [n_vocab]; `history`: the
// tokens so far (prompt + generated), of which the last repeat_last_n count.
// History ids outside [0, n_vocab) are ignored.
void apply_penalties(std::span<float> logits, std::span<const int32_t> history, const SamplingParams& params);

// Stages 3-6 on already-penalised logits: the survivors in sorted order with
// their tempered logits and final probabilities (summing to 1). Requires
// temperature > 0. Exposed for tests and for logprobs.
std::vector<Candidate> filter_candidates(std::span<const float> logits, const SamplingParams& params);

// Arg-max (lowest id on ties). `logits` must not be empty.
int32_t argmax(std::span<const float> logits);

// Stage 7: walks the cumulative distribution of `c` (filter_candidates'
// output, sorted) with the uniform draw `u` in [0, 1): the first candidate
// whose cumulative p (summed in double) exceeds u, else the last one.
int32_t walk(std::span<const Candidate> c, double u);

// The rejection rule of Sampler::verify on an explicit distribution: `c`
// (filter_candidates' output, sorted, p summing to 1), the proposed token
// `proposal`, and the two uniform draws in [0, 1): u_accept (accepted iff
// u_accept < p(proposal)) and u_resample (walked over c without the
// proposal, its p renormalised by 1 - p(proposal); unused when accepted).
// Returns the token taken. Exposed for the statistical test.
int32_t verify_point_proposal(std::span<const Candidate> c, int32_t proposal, double u_accept, double u_resample);

// Stage 7 for temperature-only parameters (top_k off or >= n_vocab, top_p
// 1, min_p 0) without sorting the vocabulary: the token that
// filter_candidates(logits, params) followed by the cumulative walk with
// the uniform draw `u` returns, exactly, or -1 when it cannot tell cheaply
// (a NaN or non-finite maximum, or `u` beyond the mass of the candidates
// within e^-38 of the top: then run the reference). `temp` > 0. `scratch`:
// grown as needed (n keys, n key copies, n doubles). Why the result is the
// reference's: see sampling.cpp. Exposed for tests.
struct TemperedScratch {
  std::vector<uint32_t> keys, tmp;
  std::vector<double> e;
};
int32_t sample_tempered(std::span<const float> logits, float temp, double u, TemperedScratch& scratch);

// The sampler: SamplingParams plus the RNG. One per engine replica; not
// thread-safe (an engine is used by one caller at a time).
class Sampler {
 public:
  explicit Sampler(SamplingParams params = {}) : params_(std::move(params)), rng_(params_.seed) {}

  const SamplingParams& params() const { return params_; }
  // Replaces the parameters and KEEPS the RNG state (params.seed is not applied).
  void set_params(SamplingParams params) { params_ = std::move(params); }
  // Restarts the RNG from `seed` and records it in params().seed.
  void reseed(uint64_t seed) {
    params_.seed = seed;
    rng_.reseed(seed);
  }
  Rng& rng() { return rng_; }
  const Rng& rng() const { return rng_; }

  // Runs the whole chain (see the file comment, stages 0-7) on a copy of `logits`
  // ([n_vocab]) with `history` for the penalties; returns the token id.
  // `logits` must not be empty.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);

  // Speculative verification of one proposed token `proposal` against the
  // target distribution of `logits` ([n_vocab], raw) and `history` (as
  // sample()); returns the token this position takes, which equals
  // `proposal` exactly when it is accepted.
  // Greedy (temperature <= 0): sample()'s arg-max; no RNG draw.
  // Sampled: the rejection rule of Leviathan, Kalman & Matias, "Fast
  // Inference from Transformers via Speculative Decoding" (ICML 2023,
  // https://arxiv.org/abs/2211.17192, Algorithm 1) and Chen et al.,
  // "Accelerating Large Language Model Decoding with Speculative Sampling"
  // (2023, https://arxiv.org/abs/2302.01318), for a deterministic proposer
  // (its distribution q is a point mass on `proposal`): with p the chain's
  // final distribution (stages 0-6, filter_candidates), accept with
  // probability min(1, p(x) / q(x)) = p(x) — one draw u = next_double(),
  // accepted iff u < p(x) — and on rejection sample from
  // norm(max(0, p - q)) = p with x removed and renormalised (a second
  // draw, walked over the survivors in sorted order without x). The
  // returned token is then distributed exactly as p. RNG use: one draw per
  // verified proposal, plus one when it is rejected. A proposal outside
  // the vocabulary or outside the survivors has p(x) = 0 (always rejected).
  int32_t verify(std::span<const float> logits, std::span<const int32_t> history, int32_t proposal);

 private:
  SamplingParams params_;
  Rng rng_;
  std::vector<float> scratch_;  // penalised copy of the logits, reused
  TemperedScratch tempered_;    // temperature-only sampling (sample_tempered), reused
};

}  // namespace bonsai::engine
