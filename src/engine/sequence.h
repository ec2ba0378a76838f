// Sequence: one stream of tokens and everything it needs to go on — the
// unit the scheduler runs (../shared/DESIGN.md, "Scheduler": "A Sequence is
// owned by the scheduler and holds everything one stream needs").
//
// A Sequence owns its KV cache (a block table over the model's model::KvPool,
// or a standalone cache), the tokens that cache holds, its sampler and RNG,
// the grammar matcher state, the text emitter and stop matcher, the limits
// and the result being built. It borrows the shared, immutable model,
// tokenizer and vocabulary trie (shared_ptr: they outlive it). It never runs
// the model: a driver (InferenceEngine::generate_request for one stream, the
// Scheduler for many in one Model::forward) asks it for its next input,
// runs that, and hands it the logits rows.
//
// Moves (one generation at a time; the same order for every driver, so a
// one-sequence scheduler is byte-identical to InferenceEngine::generate):
//   start(req)           validates; params / seed swapped in for this generation;
//   next_input(max)      up to `max` pending prompt tokens, or the last sampled token;
//   inputs_done(n)       after a forward that ran them: n tokens are in the cache;
//   accept_logits(row)   when the prompt completed or a decode token ran:
//                        samples, emits, maybe finishes;
//   finish()             the result; params / RNG restored, the cache parked.
// RNG semantics of start (as InferenceEngine's generate* family): without
// GenerateRequest::params or ::seed the sampler's RNG continues; with
// params only, the params are swapped for the call and the RNG continues;
// with a seed, the RNG restarts from it and the previous state is restored
// by finish().
//
// Not thread-safe: one driver at a time. Movable, not copyable.
#pragma once

#include <array>
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
#include "engine/logprobs.h"      // TokenLogprob
#include "engine/proposer.h"      // Proposer, ProposerFactory
#include "engine/rate_tracker.h"  // RequestRateTracker, RequestRateSummary
#include "engine/sampling.h"      // SamplingParams, Sampler
#include "engine/text_emitter.h"  // TextEmitter
#include "model/kv_cache.h"       // KvCache

namespace bonsai::model {
class Model;
}
namespace bonsai::tokenizer {
class Tokenizer;
}
namespace bonsai::structured {
class SharedTokenTrie;  // structured/vocab_trie.h
class GrammarState;     // structured/token_mask.h
class TokenTrie;
}  // namespace bonsai::structured

namespace bonsai::engine {

// Why generation ended. Names are OpenAI's finish_reason strings.
enum class FinishReason : uint8_t {
  kStop,       // EOS/EOG token or a stop string (with a grammar: EOS where the grammar
               // may end, even with ignore_eos; or a complete sentence nothing may follow)
  kLength,     // max_tokens reached, the context (KV cache) is full, or a grammar
               // allows no token although its sentence is incomplete (a dead end)
  kCancelled,  // the stream callback returned false, or the cancel flag was set
};
// "stop", "length", "cancelled".
const char* finish_reason_name(FinishReason r);

// Prompt tokens per forward() call in prefill (llama.cpp's default n_ubatch).
inline constexpr int64_t kPrefillChunk = 512;
// Prompt tokens per forward() while prompt logprobs are computed (every
// token's logits row is kept: 64 x 151,936 floats = 39 MB).
inline constexpr int64_t kPromptRowsChunk = 64;

// One streamed event: called once per sampled token (EOS included), in order.
struct TokenEvent {
  int32_t token = -1;     // sampled token id; -1 for the final flush event
  int32_t index = 0;      // 0-based index of the sampled token (count for the flush)
  std::string_view text;  // text released by this token (may be empty: held back
                          // by the UTF-8 / stop-string emitter); valid during the call
  // The sampled token's log probability and top alternatives when
  // SamplingParams::logprobs >= 0; nullptr otherwise, for a terminating
  // EOS and for the flush event. Valid during the call.
  const TokenLogprob* logprob = nullptr;
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
  int32_t cached_tokens = 0;      // prompt tokens reused from the cache (not recomputed)
  bool timed_out = false;         // ended by a deadline (finish_reason kLength; see Scheduler)
  // The stop string (SamplingParams::stop) that ended the generation
  // (finish_reason kStop); empty when none did (EOS, length, cancel).
  std::string stop_sequence;
  // Speculative decoding (llama.cpp server's timings.draft_n /
  // draft_n_accepted): proposed tokens verified, and of them accepted.
  int32_t draft_tokens = 0;
  int32_t draft_accepted = 0;
  // SamplingParams::logprobs >= 0: one entry per element of `tokens` (same
  // order; a terminating EOS has none). Empty otherwise.
  std::vector<TokenLogprob> logprobs;
  // SamplingParams::prompt_logprobs >= 0: one entry per prompt token; entry
  // i is prompt[i]'s log probability given prompt[0..i) (entry 0: NaN, no
  // context). Empty otherwise, and for a sibling choice started from another
  // choice's prompt logits (StartOptions::prompt_logits).
  std::vector<TokenLogprob> prompt_logprobs;
  // An embedding (start_embedding) that ran to its end (finish_reason
  // kStop): InferenceEngine::embed's vector, [n_embd]. Empty otherwise
  // (a generation, or an embedding cancelled or stopped by a deadline).
  std::vector<float> embedding;
};

// The general form every generate* maps onto (the scheduler builds one per
// choice of a job; the server reaches the engine only through the scheduler).
struct GenerateRequest {
  std::span<const int32_t> prompt;            // token ids incl. BOS if wanted; borrowed for the call
  std::optional<SamplingParams> params;       // set: generate_with_params semantics
  std::optional<uint64_t> seed;               // set: generate_with_seed semantics (applied after params)
  StreamCallback on_token;                    // optional
  const std::atomic<bool>* cancel = nullptr;  // optional; checked before each decode step
  RequestRateTracker* tracker = nullptr;      // optional; on_token is called per sampled token
};

// How start() sets up a stepwise generation (the scheduler's use).
struct StartOptions {
  // Reuse the longest prefix of the prompt the cache already holds (the
  // prompt cache): only the rest is computed. false: the cache is cleared
  // first, as every generate* does.
  bool reuse_prefix = false;
  // Logits [n_vocab] of the prompt's last token, computed earlier (a sibling
  // choice of the same prompt). When set and the cache holds the whole
  // prompt, nothing is recomputed: the first token is sampled from these.
  // Borrowed for the start() call only (copied).
  std::span<const float> prompt_logits;
};

// What every sequence of one model borrows (shared, immutable while they run).
struct SequenceModel {
  std::shared_ptr<const model::Model> model;              // non-null
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;  // non-null
  // The model's vocabulary trie for grammar-constrained sampling, built on
  // the first request with a grammar; non-null.
  std::shared_ptr<structured::SharedTokenTrie> token_trie;
};

// Speculative decoding (issue 29; ../shared/DESIGN.md, "Scheduler": a
// sequence's proposed tokens ride as extra rows of the step's one forward).
// Flag names are llama.cpp's (`--spec-type`, `--draft-max`, `--draft-min`,
// `--draft-p-min`); run, serve and the config file share them.
enum class SpecType : uint8_t {
  kNone,   // no speculation
  kNgram,  // prompt lookup: n-gram matches over the sequence's own prompt and output
  kDraft,  // a draft model (`-md FILE`; llama.cpp's name "draft"): SpecOptions::proposer
};
// "none", "ngram", "draft".
const char* spec_type_name(SpecType t);
// Parses "none" / "ngram" / "draft". Errors: kInvalidArgument naming the valid values.
core::Expected<SpecType> parse_spec_type(std::string_view name);

// How a sequence speculates. The proposer (prompt lookup) matches the last
// n tokens of the sequence (n = kNgramMax down to kNgramMin, the longest
// that occurs earlier wins, its latest occurrence) and proposes the tokens
// that followed that occurrence. How many are verified adapts per sequence
// (Sequence::propose, draft_length): a proposed token is run only while
// its expected tokens per cost beat the step's, so a sequence whose
// proposals stop being accepted stops speculating (and starts again when
// its proposals — still compared, for free, with what it samples — become
// good); and a driver's SpecGuard stops greedy sequences proposing where
// measured steps with proposals yield fewer tokens per second than without.
// No effect on a recurrent (qwen35) cache: it cannot roll back past a
// rejected token, so those sequences never speculate.
struct SpecOptions {
  // Off by default until a measurement shows it pays: prompt lookup on
  // stories260K ran at 0.885x of plain decode (7 pairs, the extra rows cost
  // ~1/3 of a step on a compute-bound toy model) and 0.95x on the 1.7B shape
  // (bench/results/spec-ngram-2026-12-06-zen3.txt); with SpecGuard, on Zen 5
  // under load, 0.958-0.971x (one stream), 0.923-0.950x (a repeating
  // prompt), 0.945-1.039x (8 streams): not >= 0.95x everywhere
  // (bench/results/spec-guard-2026-12-06-zen5.txt).
  SpecType type = SpecType::kNone;
  // Most tokens proposed per step (llama.cpp's --draft-max); 0 turns
  // speculation off. At most kMaxDraft.
  int32_t draft_max = 8;
  // Fewest tokens worth verifying (llama.cpp's --draft-min): a shorter
  // proposal is not run. >= 0.
  int32_t draft_min = 0;
  // Smallest draft-model probability of a proposed token (llama.cpp's
  // --draft-p-min): the draft model stops its proposal before a token its
  // softmax gives less. Prompt lookup proposes without probabilities, so it
  // does not use it. In [0, 1].
  float draft_p_min = 0.75f;
  // One more row's relative cost to assume instead of the driver's
  // measurement (Sequence::propose), for runs that must propose the same
  // way whatever the machine's speed (tests; no SpecGuard holds them back
  // either); < 0 (default): measured.
  double row_cost = -1;
  // SpecType::kDraft: makes each sequence's proposer (draft_model_proposer,
  // or a benchmark's); a sequence without one (unset, or its allocation
  // failed) does not speculate. Unused by the other types.
  ProposerFactory proposer;
  // Checks the ranges. Errors: kInvalidArgument naming the field.
  core::Expected<void> validate() const;
};
inline constexpr int32_t kMaxDraft = 64;
inline constexpr int32_t kNgramMax = 3;  // prompt lookup's longest n-gram (tokens)
inline constexpr int32_t kNgramMin = 1;  // and its shortest
// Relative cost of one extra row (time of the row / time of the step, per
// token the step yields) that a sampled sequence assumes: its proposal
// lengths depend only on its own acceptance, so a seeded request draws the
// same numbers under any load (greedy ones use the measured cost; their
// text does not depend on it).
inline constexpr double kSampledRowCost = 0.1;

// Proposals made and accepted (speculative decoding), summed by the driver.
struct SpecCounts {
  int64_t proposed = 0;  // proposed tokens verified (each one a forward row)
  int64_t accepted = 0;  // of which accepted (taken without a step of their own)
};
// A sequence whose proposer (SpecType::kDraft) does not pay stops asking it;
// every kProbeSteps-th decode step it still asks for one token, not run but
// compared with what is sampled, so the acceptance estimate can recover.
inline constexpr int32_t kProbeSteps = 16;

// Realized-throughput guard of greedy speculation (issue 29, "never
// slower"): one per driver (the scheduler, a single-stream engine), since
// extra rows slow the whole step and so every sequence in it. The cost
// model behind Sequence::propose (acceptance and a row's relative cost)
// can be wrong (on stories260K a row costs more than the model says and
// prompt lookup ran at 0.94x); the guard measures instead what each mode
// yields: output tokens per second of step time, as exponential moving
// averages (weight kWeight, the plain mean of the first 1 / kWeight
// samples) of the tokens and of the seconds of decode steps (no prompt
// tokens) in which greedy sequences ran proposed rows ("spec") or did not
// ("plain"). allow() says whether greedy sequences may propose in the next
// step: first kWarmup samples of each mode, taking turns, then spec only
// where its yield beats plain's by kMargin, with one step of the other
// mode when it has had no sample for kProbeEvery steps (the gap doubling
// with each such probe, up to kProbeMax, while the same mode keeps
// winning), so a change in either (the text turned repetitive, other
// load) can switch it back at a small cost.
// Each batch width (decoding sequences in the step, in powers of two) has
// its own averages and decision: a wider step yields differently. Greedy
// text does not depend on any of this (verification); sampled sequences
// never consult it (their proposal lengths depend on their own acceptance
// only, kSampledRowCost). Not thread-safe.
class SpecGuard {
 public:
  // Whether greedy sequences may propose in the next step, which has `rows`
  // decoding sequences; counts it.
  bool allow(int64_t rows);
  // After a decode step of `rows` decoding sequences (no prompt tokens)
  // that took `seconds` (forward and sampling) and produced `tokens` tokens
  // (each sequence's sampled one plus its accepted proposals); `speculated`:
  // a greedy sequence's proposal ran in it. seconds <= 0, tokens <= 0 or
  // rows <= 0: ignored.
  void record(int64_t rows, bool speculated, int64_t tokens, double seconds);
  // Tokens per second measured in each mode for steps of `rows` decoding
  // sequences (0: fewer than kWarmup samples).
  double spec_rate(int64_t rows) const { return widths_[width_of(rows)].spec.rate(); }
  double plain_rate(int64_t rows) const { return widths_[width_of(rows)].plain.rate(); }
  // Widths measured apart: rows 1, 2-3, 4-7, ..., >= 2^(kWidths - 1).
  static constexpr size_t kWidths = 8;
  static size_t width_of(int64_t rows);
  static constexpr double kWeight = 1.0 / 16;
  static constexpr int64_t kWarmup = 4;
  static constexpr int64_t kProbeEvery = 16;
  static constexpr int64_t kProbeMax = 128;
  static constexpr double kMargin = 0.02;

 private:
  struct Mode {
    double tokens = 0, seconds = 0;  // moving averages per step
    int64_t n = 0;                   // samples
    int64_t since = 0;               // steps of this width allowed since this mode's last sample
    double rate() const { return n >= kWarmup ? tokens / seconds : 0; }
  };
  struct Width {
    Mode spec, plain;
    bool spec_wins = false;     // the mode chosen at the last allow() after the warm-up
    int64_t gap = kProbeEvery;  // steps without a sample before the other mode is probed
  };
  std::array<Width, kWidths> widths_{};
};

// How many proposed tokens to verify (at most `room`, >= 0), for acceptance
// a (the chance each proposed token is taken, in [0, 1]) and one more row
// costing c = `row_cost` of a plain step (>= 0; infinite: none). From
// Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via
// Speculative Decoding" (Theorem 3.8 and its expected tokens per step): k
// proposed tokens yield E(k) = 1 + a + ... + a^k tokens for 1 + k c of a
// plain step's time. The (k+1)-th adds a^(k+1) tokens for c more, so it
// pays while its yield per cost beats the step's current one (not that of
// a single token, a plain step's):
//   a^(k+1) / c > E(k) / (1 + k c)  <=>  a^(k+1) (1 + k c) > c E(k).
int64_t draft_length(double acceptance, double row_cost, int64_t room);

// Prompt lookup: the tokens that followed the latest earlier occurrence of
// the last n tokens of `seq` (n from ngram_max down to ngram_min; the
// longest n with a match wins), at most `max_draft` of them; empty when
// nothing matches. Exposed for tests.
std::vector<int32_t> ngram_proposal(std::span<const int32_t> seq, int32_t ngram_min, int32_t ngram_max,
                                    int32_t max_draft);

// The checks an embedding input passes (InferenceEngine::embed and
// Sequence::start_embedding): 1..n_ctx tokens, every id in [0, n_vocab).
// Errors: kInvalidArgument (empty, an id outside the vocabulary, naming its
// index), kOutOfRange (longer than n_ctx).
core::Expected<void> check_embedding_input(std::span<const int32_t> tokens, int64_t n_ctx, int64_t n_vocab);

class Sequence {
 public:
  // An idle sequence over `cache` (its positions, if any, are `tokens`:
  // tokens.size() <= cache.size()) with `sampler` (params and RNG). Nothing
  // is validated here; start() / start_embedding() check a request.
  Sequence(SequenceModel shared, model::KvCache cache, Sampler sampler, std::vector<int32_t> tokens = {});
  Sequence(Sequence&&) noexcept;
  Sequence& operator=(Sequence&&) noexcept;
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;
  ~Sequence();

  // ---- A generation -------------------------------------------------------
  // Starts generating for `req` (see the file comment for params / seed).
  // With options.reuse_prefix the longest prefix of the prompt that the
  // cache holds is kept (the last prompt token is recomputed for its logits
  // unless options.prompt_logits gives them); otherwise the cache is cleared.
  // Errors, with nothing changed: kInvalidArgument (a generation is in
  // progress, empty prompt, id outside the vocabulary, invalid params,
  // logit_bias id outside the vocabulary, a grammar that does not compile),
  // kOutOfRange (prompt longer than the cache's n_ctx).
  core::Expected<void> start(const GenerateRequest& req, const StartOptions& options = {});
  bool active() const;    // between start() and finish()
  bool finished() const;  // active and done: call finish()
  // Tokens to run next (empty when finished): pending prompt tokens, at most
  // `max_prompt` (>= 1), or the one sampled token to decode. The first goes
  // at position next_pos(). Valid until the next non-const call. With a
  // recurrent (qwen35) cache in a KV pool, prompt chunks end at the next
  // block boundary, so the state can be snapshotted there (publish).
  std::span<const int32_t> next_input(int64_t max_prompt) const;
  int64_t next_pos() const;        // positions in the cache (= tokens().size())
  int64_t pending_prompt() const;  // prompt (or replay) tokens not yet in the cache
  // Records that the first `n` tokens of next_input ran (the cache holds
  // them). True when the logits of the last one are wanted (the prompt is
  // complete, or it was a decode token): pass them to accept_logits.
  bool inputs_done(int64_t n);
  // What inputs_done(n) will return for the first n tokens of next_input.
  bool logits_wanted(int64_t n) const;
  // Samples one token from `logits` ([n_vocab]) with this sequence's sampler,
  // streams it, and decides whether generation goes on (max_tokens, EOS,
  // stop strings, context, the cancel flag, the callback's answer).
  void accept_logits(std::span<const float> logits);

  // ---- Speculative decoding (SpecOptions) ------------------------------------
  // Sets how this sequence speculates (kept across generations; a new
  // sequence does not speculate until given options).
  void set_spec(const SpecOptions& spec);
  // Before a decode step: proposes tokens to verify after the last sampled
  // one, so next_input() returns [last, proposal...] (positions next_pos()
  // on) and the driver must want every one of those rows' logits. At most
  // `max_draft` (the room the driver has: KV, batch) and never beyond the
  // context or max_tokens; its length adapts to this sequence's measured
  // acceptance a: draft_length(a, row_cost, room) tokens (row_cost: the
  // relative cost of one more row, its time over the step's time per token
  // the step yields; infinite: none, a driver's SpecGuard holding greedy
  // sequences back; sampled sequences use kSampledRowCost instead).
  // With a proposer (SpecType::kDraft) its own time per token relative to
  // `step_s` (the driver's plain decode step in seconds; 0: unknown, not
  // counted) adds to row_cost, and only as many tokens as pay are asked for.
  // Returns the number proposed (0: a plain decode step). 0 while not
  // decoding (prompt pending, replaying, finished), for an embedding, a
  // recurrent cache or SpecType::kNone.
  int64_t propose(int64_t max_draft, double row_cost, double step_s = 0);
  int64_t proposed() const;  // the proposal's length now (0: none)
  // Drops all but the first `n` proposed tokens (the driver had less room).
  void trim_proposal(int64_t n);
  // After a forward that ran next_input() with a proposal (inputs_done(1 +
  // proposed())): `rows` is [1 + proposed()][n_vocab], row j the logits
  // after the last token and the first j proposed ones. Verifies in order:
  // row j's token is taken as accept_logits would take it (the grammar's
  // mask, stop strings, logprobs from the raw row, max_tokens, EOS), by
  // Sampler::verify against proposed token j; verification stops at the
  // first token that differs from the proposal (or where the generation
  // ends), so each position yields what plain decoding would have sampled
  // there (greedy: bit for bit, by batch invariance; sampled: the same
  // distribution). The cache and tokens are rolled back past the last
  // position whose token was taken. Returns the counts for this step.
  SpecCounts accept_rows(std::span<const float> rows);
  // Ends the generation now: kCancelled, or kLength with timed_out set (a
  // deadline). No effect when not active or already finished.
  void stop_now(FinishReason reason, bool timed_out = false);
  // Checks the request's cancel flag; true (and finished as kCancelled) if set.
  bool poll_cancel();
  // Preemption by recompute: gives back every KV position (the cache is
  // cleared; a paged cache's blocks return to the pool, published ones stay
  // in its prefix index) but keeps the generation: sampler, RNG, emitter and
  // tokens so far. next_input then replays the tokens that were in the
  // cache (logits not wanted), and decoding goes on from the last sampled
  // token. By batch invariance the recomputed KV is bit-identical, so the
  // continuation is exactly what it would have been. A recurrent state's
  // memory is freed too (allocated again when the sequence resumes).
  void suspend();
  bool replaying() const;     // replay after suspend() not complete yet
  bool is_embedding() const;  // active and started by start_embedding
  // The result of the finished (or stopped) generation; params / RNG
  // restored, the cache parked (a paged cache's blocks evictable). Inactive
  // after. Records nothing elsewhere (the driver keeps stats and metrics).
  GenerationResult finish();
  // Drops the generation without a result: params / RNG restored, the cache
  // keeps what it holds, parked.
  void abandon();

  // ---- Prompt logprobs (SamplingParams::prompt_logprobs >= 0) ------------
  // True while prompt tokens are pending: the driver asks forward() for the
  // logits of EVERY token it feeds (at most kPromptRowsChunk per forward)
  // and passes them to record_prompt_rows before inputs_done.
  bool wants_prompt_rows() const;
  // `rows`: [k][n_vocab] logits of the first k tokens of next_input.
  void record_prompt_rows(std::span<const float> rows);
  const std::vector<TokenLogprob>& prompt_logprobs() const;  // recorded so far

  // ---- An embedding ----------------------------------------------------------
  // Starts embedding `tokens` (the cache is cleared: every row is needed);
  // the driver feeds them as a prompt asking for every token's hidden row
  // (BatchToken::hidden) and passes those to record_hidden_rows before
  // inputs_done, which never wants logits. Once the last token ran the
  // sequence is finished() (kStop) and finish() returns the mean-pooled,
  // L2-normalised vector in GenerationResult::embedding, equal bit for bit
  // to InferenceEngine::embed(tokens) (after a suspend() the replayed rows
  // are not added twice). `cancel`: optional, as GenerateRequest::cancel.
  // Errors: kInvalidArgument (in progress, empty, id outside the
  // vocabulary), kOutOfRange (longer than the cache's n_ctx).
  core::Expected<void> start_embedding(std::span<const int32_t> tokens, const std::atomic<bool>* cancel = nullptr);
  bool wants_hidden_rows() const;
  // `rows`: [k][n_embd] final-normed hidden states of the first k tokens of next_input.
  void record_hidden_rows(std::span<const float> rows);

  // ---- The cache and its tokens ------------------------------------------
  // Length of the longest common prefix of `tokens` and the cache's tokens
  // from which the sequence can continue (model::KvCache::resumable: for a
  // recurrent qwen35 cache, all of it or 0).
  int64_t cached_prefix(std::span<const int32_t> tokens) const;
  // Makes positions [0, n) of `src`'s cache and tokens this sequence's (same
  // model dimensions and types; n <= src.next_pos(), n <= n_ctx). In one KV
  // pool the blocks are shared (copy-on-write on a later write); otherwise
  // rows are copied. Errors: kInvalidArgument (mismatch), kResourceExhausted.
  core::Expected<void> copy_prefix_from(const Sequence& src, int64_t n);
  // Takes from the KV pool's prefix index the longest cached prefix of what
  // this sequence computes next from position 0 (its prompt, or its replay
  // after suspend()), leaving at least the last prompt token to run when its
  // logits are wanted. Only while nothing is in the cache (a new or
  // suspended sequence). Returns the positions adopted (0: none, or a
  // standalone cache).
  int64_t adopt_cached_prefix();
  // Registers the cache's full blocks (and, with partial_last, its last
  // partial one) in the KV pool's prefix index, keyed by the tokens
  // (model::KvCache::publish; a recurrent cache also snapshots its state at
  // a block boundary, keeping the one at the prompt's last boundary). Cheap
  // when nothing new is full.
  void publish(bool partial_last = false);
  // Drops positions >= n (cache and tokens); claims a parked cache first. A
  // recurrent cache cannot rewind: 0 < n < next_pos() drops everything.
  void truncate(int64_t n);
  // Records that `tokens` now occupy positions [next_pos(), next_pos() + k)
  // of the cache (a driver that ran them outside the stepwise moves).
  void append_tokens(std::span<const int32_t> tokens);
  // Takes a parked cache back (it may have lost trailing blocks to
  // eviction while parked: the tokens follow).
  void claim();
  model::KvCache& kv_cache();
  const model::KvCache& kv_cache() const;
  const std::vector<int32_t>& tokens() const;  // the tokens in the cache, by position
  Sampler& sampler();
  const Sampler& sampler() const;
  int64_t n_ctx() const;  // the cache's capacity in positions

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace bonsai::engine
