// InferenceEngine: one replica of a model that turns prompts into tokens.
//
// A replica borrows the shared, immutable model (weights are views into one
// mapping) and tokenizer, and owns what is per caller: the KV cache, the
// forward-pass workspace, the sampler with its RNG, and its stats. Replicas
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
#include "engine/rate_tracker.h"  // RequestRateTracker, RequestRateAggregator
#include "engine/sampling.h"      // SamplingParams, Sampler
#include "kernels/kernels.h"      // kernels::Tier

namespace bonsai::core {
class ThreadPool;
}
namespace bonsai::model {
class Model;
}
namespace bonsai::tokenizer {
class Tokenizer;
}

namespace bonsai::engine {

// Why generation ended. Names are OpenAI's finish_reason strings.
enum class FinishReason : uint8_t {
  kStop,       // EOS/EOG token or a stop string
  kLength,     // max_tokens reached, or the context (KV cache) is full
  kCancelled,  // the stream callback returned false, or the cancel flag was set
};
// "stop", "length", "cancelled".
const char* finish_reason_name(FinishReason r);

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
};
inline constexpr int64_t kDefaultMaxSeqLen = 4096;
// Prompt tokens per forward() call in prefill (llama.cpp's default n_ubatch).
inline constexpr int64_t kPrefillChunk = 512;

// One streamed event: called once per sampled token (EOS included), in order.
struct TokenEvent {
  int32_t token = -1;     // sampled token id; -1 for the final flush event
  int32_t index = 0;      // 0-based index of the sampled token (count for the flush)
  std::string_view text;  // text released by this token (may be empty: held back
                          // by the UTF-8 / stop-string emitter); valid during the call
};
// Return false to cancel: generation stops before the next decode step and
// the result's finish_reason is kCancelled. After the last token, if text
// is still held (e.g. a partial stop-string match when max_tokens ends the
// answer), one more event with token == -1 releases it; its return value is
// ignored. The concatenation of every event's text == GenerationResult::text.
using StreamCallback = std::function<bool(const TokenEvent&)>;

// What one generate* call returns.
struct GenerationResult {
  std::vector<int32_t> tokens;  // sampled ids, excluding a terminating EOS/EOG token (the token
                                // that completed a stop string IS included)
  std::string text;             // detokenized tokens, stop string and after removed
  FinishReason finish_reason = FinishReason::kStop;
  int32_t prompt_tokens = 0;      // prompt length
  int32_t completion_tokens = 0;  // tokens sampled, a terminating EOS included
  double prompt_ms = 0;           // prefill time
  double gen_ms = 0;              // decode + sampling time
  RequestRateSummary rate;        // TTFT / ITL / tokens/s of this call
};

// The general form every generate* maps onto (the server uses it directly).
struct GenerateRequest {
  std::span<const int32_t> prompt;       // token ids incl. BOS if wanted; borrowed for the call
  std::optional<SamplingParams> params;  // set: generate_with_params semantics
  std::optional<uint64_t> seed;          // set: generate_with_seed semantics (applied after params)
  StreamCallback on_token;               // optional
  const std::atomic<bool>* cancel = nullptr;  // optional; checked before each decode step
  RequestRateTracker* tracker = nullptr;      // optional; on_token is called per sampled token
};

class InferenceEngine {
 public:
  // Builds a replica: allocates the KV cache and workspace. `model` and
  // `tokenizer` are shared with other replicas and must be non-null.
  // Errors: kInvalidArgument (null model/tokenizer, invalid params or
  // max_seq_len < 0), kResourceExhausted (cache allocation failed).
  static core::Expected<InferenceEngine> create(
      std::shared_ptr<const model::Model> model,
      std::shared_ptr<const tokenizer::Tokenizer> tokenizer, EngineOptions options = {});

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
  core::Expected<GenerationResult> generate_with_params(std::span<const int32_t> prompt,
                                                        const SamplingParams& params);
  core::Expected<GenerationResult> generate_with_seed(std::span<const int32_t> prompt,
                                                      uint64_t seed);
  core::Expected<GenerationResult> generate_streaming(std::span<const int32_t> prompt,
                                                      const StreamCallback& on_token);
  core::Expected<GenerationResult> generate_request(const GenerateRequest& request);
  // Generates for each prompt in turn, exactly as that many generate() calls
  // (the RNG advances across them). Stops at the first error.
  core::Expected<std::vector<GenerationResult>> batch_generate(
      std::span<const std::vector<int32_t>> prompts);

  // ---- Low-level steps (what generate* is made of) ------------------------
  // Runs `tokens` at positions pos..pos+n-1 (pos <= current position; the
  // cache is truncated to pos first) and returns the logits of the last one:
  // [n_vocab], valid until the next call. Long inputs run in chunks of
  // kPrefillChunk tokens (bounded workspace). Errors: kInvalidArgument
  // (empty tokens, pos beyond the current position, id outside the
  // vocabulary), kOutOfRange (pos + n > max_seq_len()), the model's errors;
  // on error the cache holds positions [0, pos) at most.
  core::Expected<std::span<const float>> prefill_from_pos(std::span<const int32_t> tokens,
                                                          int64_t pos);
  // Runs one token at the current position; returns its logits [n_vocab].
  core::Expected<std::span<const float>> decode_step(int32_t token);
  // Samples from `logits` with the current params and RNG; the penalties see
  // the tokens the cache holds (prompt + generated so far).
  int32_t sample(std::span<const float> logits);
  // Clears the KV cache and the token history (not the RNG, params or stats).
  void reset();
  // Position of the next token (= tokens in the cache).
  int64_t position() const;

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

 private:
  struct Impl;
  explicit InferenceEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bonsai::engine
