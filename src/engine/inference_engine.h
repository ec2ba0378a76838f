// InferenceEngine: one replica of a model that turns prompts into tokens.
//
// A replica borrows the shared, immutable model (weights are views into one
// mapping) and tokenizer, and owns what is per caller: one engine::Sequence
// (its KV cache and tokens, the sampler with its RNG, the generation in
// progress; sequence.h), the forward-pass workspace, and its stats. The
// stepwise API below forwards to that Sequence; generate_request drives it
// alone, exactly as the Scheduler drives many. Replicas
// are used by one thread at a time (EnginePool hands them out); different
// replicas may run concurrently and share the compute threads of one
// core::ThreadPool (core::global_pool() unless EngineOptions::pool says
// otherwise), so N replicas never oversubscribe the cores.
//
// Determinism: the same file, prompt, SamplingParams and seed give the same
// tokens whatever the thread count (the forward pass is deterministic per
// the model part's contract; sampling is specified in sampling.h).
//
// RNG semantics (the seed design's, exactly):
//   generate              engine params, engine RNG; the RNG advances.
//   generate_with_params  the given params for this call only; the engine's
//                         RNG continues (params.seed is NOT applied) and
//                         advances; the engine's params are restored after.
//   generate_with_seed    engine params; the RNG restarts from `seed` for this
//                         call, and the engine's previous RNG state is
//                         restored after (the call leaves no trace).
// Every generate* clears the KV cache first (no state leaks between calls).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"           // core::Expected
#include "engine/engine_stats.h"  // EngineStats
#include "engine/logprobs.h"      // TokenLogprob
#include "engine/rate_tracker.h"  // RequestRateTracker, RequestRateAggregator
#include "engine/sampling.h"      // SamplingParams, Sampler
#include "engine/sequence.h"      // Sequence, GenerateRequest, GenerationResult, FinishReason
#include "kernels/kernels.h"      // kernels::Tier

namespace bonsai::core {
class ThreadPool;
}
namespace bonsai::model {
class Model;
class KvCache;
class KvPool;
enum class KvType : uint8_t;  // model/kv_cache.h
}  // namespace bonsai::model
namespace bonsai::tokenizer {
class Tokenizer;
}

namespace bonsai::structured {
class SharedTokenTrie;  // structured/vocab_trie.h
}

namespace bonsai::engine {

// Construction options of one replica.
struct EngineOptions {
  // KV-cache capacity in positions (prompt + generated). 0: the model's
  // context_length, capped at kDefaultMaxSeqLen to bound memory.
  int64_t max_seq_len = 0;
  // Pool the forward passes run on; nullptr: core::global_pool(). Borrowed:
  // must outlive the engine.
  core::ThreadPool* pool = nullptr;
  // Default parameters (and seed) of generate / generate_with_seed.
  SamplingParams params;
  // KV-cache element type: false = F16 (default, as llama.cpp), true = F32.
  bool kv_f32 = false;
  // -ctk / -ctv: K and V cache types (model::KvType; {} is kF16). kv_f32 overrides both.
  model::KvType kv_type_k{};
  model::KvType kv_type_v{};
  // The model's vocabulary trie for grammar-constrained sampling
  // (SamplingParams::grammar), shared by every replica of one model and built
  // on the first request with a grammar. nullptr: this replica makes its own.
  std::shared_ptr<structured::SharedTokenTrie> token_trie;
  // The model's shared KV block pool (one budget for every replica; see
  // model::KvPool). nullptr: the replica gets a standalone cache of
  // max_seq_len positions. Set: its types must be the K/V types above and
  // the cache grows block by block up to max_seq_len positions; a forward
  // that finds the pool full fails with kResourceExhausted.
  std::shared_ptr<model::KvPool> kv_pool;
  // Speculative decoding of generate_request (prompt lookup by default;
  // `run --spec-type none` turns it off): see engine::SpecOptions. One
  // more row's relative cost is measured from this replica's decode steps
  // (kSampledRowCost until then). Invalid ranges: create() fails with
  // kInvalidArgument.
  SpecOptions spec;
};
inline constexpr int64_t kDefaultMaxSeqLen = 4096;
class InferenceEngine {
 public:
  // Builds a replica: allocates the KV cache and workspace. `model` and
  // `tokenizer` are shared with other replicas and must be non-null.
  // Errors: kInvalidArgument (null model/tokenizer, invalid params or
  // max_seq_len < 0), kResourceExhausted (cache allocation failed).
  static core::Expected<InferenceEngine> create(std::shared_ptr<const model::Model> model,
                                                std::shared_ptr<const tokenizer::Tokenizer> tokenizer,
                                                EngineOptions options = {});

  InferenceEngine(InferenceEngine&&) noexcept;
  InferenceEngine& operator=(InferenceEngine&&) noexcept;
  InferenceEngine(const InferenceEngine&) = delete;
  InferenceEngine& operator=(const InferenceEngine&) = delete;
  ~InferenceEngine();

  // ---- Generation (see the file comment for the RNG semantics) ----------
  // Errors: kInvalidArgument (empty prompt, id outside the vocabulary,
  // invalid params), kOutOfRange (prompt longer than max_seq_len()), or the
  // model's forward error. Engine params and RNG are restored as the
  // semantics say even on error. A cancelled call is a
  // success with finish_reason kCancelled.
  core::Expected<GenerationResult> generate(std::span<const int32_t> prompt);
  core::Expected<GenerationResult> generate_with_params(std::span<const int32_t> prompt, const SamplingParams& params);
  core::Expected<GenerationResult> generate_with_seed(std::span<const int32_t> prompt, uint64_t seed);
  core::Expected<GenerationResult> generate_streaming(std::span<const int32_t> prompt, const StreamCallback& on_token);
  core::Expected<GenerationResult> generate_request(const GenerateRequest& request);
  // Generates for each prompt in turn, exactly as that many generate() calls
  // (the RNG advances across them). Stops at the first error.
  core::Expected<std::vector<GenerationResult>> batch_generate(std::span<const std::vector<int32_t>> prompts);

  // ---- Low-level steps (what generate* is made of) ------------------------
  // Runs `tokens` at positions pos..pos+n-1 (pos <= current position; the
  // cache is truncated to pos first) and returns the logits of the last one:
  // [n_vocab], valid until the next call. Long inputs run in chunks of
  // kPrefillChunk tokens (bounded workspace). Errors: kInvalidArgument
  // (empty tokens, pos beyond the current position, id outside the
  // vocabulary, or for a recurrent qwen35 model a pos other than 0 or the
  // current position: its state cannot rewind), kOutOfRange (pos + n >
  // max_seq_len()), the model's errors;
  // on error the cache holds positions [0, pos) at most.
  core::Expected<std::span<const float>> prefill_from_pos(std::span<const int32_t> tokens, int64_t pos);
  // Runs one token at the current position; returns its logits [n_vocab].
  core::Expected<std::span<const float>> decode_step(int32_t token);
  // Samples from `logits` with the current params and RNG; the penalties see
  // the tokens the cache holds (prompt + generated so far).
  int32_t sample(std::span<const float> logits);
  // Clears the KV cache and the token history (not the RNG, params or stats).
  void reset();
  // Position of the next token (= tokens in the cache).
  int64_t position() const;

  // ---- Stepwise generation (the replica's Sequence; sequence.h) -----------
  // One generation at a time per replica, in the moves of engine::Sequence
  // (a driver may interleave several replicas' in one Model::forward):
  //   start(req)           params / seed swapped in as generate_request does;
  //   next_input(max)      the tokens to run next: up to `max` pending prompt
  //                        tokens, or the last sampled token (decode);
  //   inputs_done(n)       after a forward that ran them: n tokens are in the cache;
  //   accept_logits(row)   when the last input ran was the prompt's last token
  //                        or a decode token: samples, emits, maybe finishes;
  //   finish()             the result; params / RNG restored.
  // generate_request is exactly this loop with one sequence, as the
  // Scheduler's is with many, so a one-sequence scheduler is byte-identical
  // to calling the engine. Not thread-safe (one driver at a time). Errors of
  // start: those of generate_request. finish() also records the engine's
  // stats and metrics.
  core::Expected<void> start(const GenerateRequest& request, const StartOptions& options = {});
  bool active() const;    // between start() and finish()
  bool finished() const;  // active and done: call finish()
  // Tokens to run next (empty when finished): pending prompt tokens, at most
  // `max_prompt` (>= 1), or the one sampled token to decode. The first goes
  // at position next_pos(). Valid until the next call on this engine.
  std::span<const int32_t> next_input(int64_t max_prompt) const;
  int64_t next_pos() const;
  // Prompt tokens not yet in the cache (0 once decoding).
  int64_t pending_prompt() const;
  // Records that the first `n` tokens of next_input ran (the cache holds
  // them). Returns true when logits of the last one are wanted (the prompt
  // is complete, or it was a decode token): pass them to accept_logits.
  bool inputs_done(int64_t n);
  // What inputs_done(n) will return for the first n tokens of next_input
  // (so a driver can mark the batch row that needs logits beforehand).
  bool logits_wanted(int64_t n) const;
  // Preemption by recompute: gives back every KV position (the cache is
  // cleared; a paged cache's blocks return to the pool) but keeps the
  // generation: sampler, RNG, emitter and tokens so far. The following
  // next_input calls replay the tokens that were in the cache (prompt and
  // generated ones, as prompt-like chunks whose logits are not wanted), then
  // decoding goes on from the last sampled token. By batch invariance the
  // recomputed KV is bit-identical, so the continuation is exactly what it
  // would have been. No effect when not active or finished.
  void suspend();
  bool replaying() const;  // replay after suspend() not complete yet
  // Samples one token from `logits` ([n_vocab]), streams it, and decides
  // whether generation goes on (max_tokens, EOS, stop strings, context,
  // the cancel flag, the callback's answer).
  void accept_logits(std::span<const float> logits);
  // Ends the generation now: kCancelled, or kLength with timed_out set
  // (a deadline). No effect when already finished.
  void stop_now(FinishReason reason, bool timed_out = false);
  // Checks the request's cancel flag; true (and finished as kCancelled) if set.
  bool poll_cancel();
  // The result of the finished (or stopped) generation; params and RNG are
  // restored, stats and metrics recorded. The engine is inactive after.
  GenerationResult finish();
  // Drops the generation without a result (an error elsewhere): params and
  // RNG restored, no stats recorded. The cache keeps what it holds (parked
  // in its KV pool: evictable while the replica is idle).
  void abandon();
  // Prompt logprobs (SamplingParams::prompt_logprobs >= 0): true while
  // prompt tokens are pending, so the driver asks forward() for the logits
  // of EVERY token it feeds (not only the last) and passes them to
  // record_prompt_rows before inputs_done. Drivers should then feed at most
  // kPromptRowsChunk tokens per forward (rows x n_vocab floats).
  bool wants_prompt_rows() const;
  // `rows`: [k][n_vocab] logits of the first k tokens of next_input (k =
  // rows.size() / n_vocab), computed by a forward that ran them; row j
  // gives the log probability of the prompt token after token j. Call
  // before inputs_done(k). No effect unless wants_prompt_rows().
  void record_prompt_rows(std::span<const float> rows);
  // The prompt logprobs recorded so far (complete once the prompt ran; what
  // finish() returns as GenerationResult::prompt_logprobs).
  const std::vector<TokenLogprob>& prompt_logprobs() const;
  // Length of the longest common prefix of `tokens` and the cache's tokens
  // (what start() with reuse_prefix could skip, before its cap).
  int64_t cached_prefix(std::span<const int32_t> tokens) const;
  // Makes positions [0, n) of `src`'s cache and token history this
  // replica's (same model, n <= src.position(), n <= max_seq_len()); the
  // rest of this cache is dropped. Replicas of one KV pool share the blocks
  // (copy-on-write of a shared partial block on the next write); otherwise
  // rows are copied. For n > 1 choices: one prefill, forked.
  core::Expected<void> copy_prefix_from(const InferenceEngine& src, int64_t n);
  // This replica's KV cache (the scheduler passes it to Model::forward).
  model::KvCache& kv_cache();
  const model::KvCache& kv_cache() const;
  int64_t kv_cache_blocks() const;              // KV blocks the cache holds now (model::KvCache::blocks)
  const std::vector<int32_t>& history() const;  // tokens in the cache, by position

  // ---- Embeddings -----------------------------------------------------------
  // The embedding of `tokens` (/v1/embeddings): every token's final hidden
  // state after the output norm (Model::forward_hidden), mean-pooled over the
  // tokens and L2-normalised (mean_pool_l2): [n_embd] floats. Runs in
  // kPrefillChunk slices on this replica's cache, which then holds `tokens`
  // (a later start() may reuse them as a cached prefix; a paged cache is
  // parked again, as after a generation). Not during a
  // generation. Errors: kInvalidArgument (empty, ids outside the vocabulary,
  // a generation in progress), kOutOfRange (longer than max_seq_len()), the
  // model's forward errors.
  core::Expected<std::vector<float>> embed(std::span<const int32_t> tokens);

  // ---- Stepwise embedding (what the scheduler drives) -------------------
  // embed() in the stepwise moves, so that an embedding's tokens share the
  // scheduler's forward steps: start_embedding(tokens) clears the cache (no
  // prefix is reused: every token's hidden row is needed); next_input /
  // next_pos / pending_prompt / suspend / stop_now / poll_cancel work as for
  // a generation's prompt; the driver asks forward() for the hidden row of
  // every token it feeds (BatchToken::hidden) and passes them to
  // record_hidden_rows before inputs_done, which never wants logits. Once
  // the last token ran the embedding is finished() (kStop) and finish()
  // returns it in GenerationResult::embedding, equal bit for bit to
  // embed(tokens) (rows are pooled in position order, in double, as
  // mean_pool_l2; after a suspend() the replayed rows are not added twice).
  // No sampling, no stats or request metrics; the cache then holds
  // `tokens`, parked, as after embed(). `cancel`: optional, as
  // GenerateRequest::cancel. Errors: those of embed().
  core::Expected<void> start_embedding(std::span<const int32_t> tokens, const std::atomic<bool>* cancel = nullptr);
  // An embedding is in progress and has tokens left to run.
  bool wants_hidden_rows() const;
  // `rows`: [k][n_embd] final-normed hidden states of the first k tokens of
  // next_input, from a forward that ran them. No effect unless wants_hidden_rows().
  void record_hidden_rows(std::span<const float> rows);

  // ---- State and introspection ------------------------------------------
  const SamplingParams& params() const;
  void set_params(SamplingParams params);  // keeps the RNG state
  void reseed(uint64_t seed);              // restarts the RNG
  Rng::State rng_state() const;
  void set_rng_state(const Rng::State& s);
  const EngineStats& stats() const;
  void reset_stats();
  // Every finished generate* is also recorded here when set (shared with the
  // pool/server; thread-safe). nullptr: none.
  void set_metrics(std::shared_ptr<RequestRateAggregator> metrics);
  kernels::Tier kernel_tier() const;  // the tier the forward pass runs on
  int64_t max_seq_len() const;        // KV-cache capacity in positions
  int64_t n_vocab() const;
  const model::Model& model() const;
  const tokenizer::Tokenizer& tokenizer() const;
  std::shared_ptr<const model::Model> model_ptr() const;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_ptr() const;
  size_t kv_cache_bytes() const;  // allocated bytes of this replica's cache
  // What a Sequence of this model borrows (model, tokenizer, vocabulary
  // trie), for drivers that make their own sequences (the Scheduler).
  SequenceModel sequence_model() const;
  // The aggregator set by set_metrics (nullptr: none).
  const std::shared_ptr<RequestRateAggregator>& metrics() const;

 private:
  struct Impl;
  explicit InferenceEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bonsai::engine
