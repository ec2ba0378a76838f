// Scheduler: continuous batching of one model's requests as Sequences
// (../shared/DESIGN.md, "Scheduler": the unit is a sequence, not a replica).
//
// One step-loop thread per loaded model. HTTP (or any) threads submit a
// CompletionJob and read its events from a JobHandle; they never run the
// model. Each choice of a job is one engine::Sequence (sequence.h) owned by
// the loop: its own KV cache (a block table over the model's KvPool), its
// own sampler and RNG (the request's params, seeded params.seed + choice),
// grammar state, emitter and limits. The EnginePool the scheduler is made
// over lends it only what every sequence borrows (model, tokenizer,
// vocabulary trie, metrics, KV types and pool); its replicas stay free for
// library callers, and closing it (unload, shutdown) stops admission.
// Each step:
//   1. queued jobs that were cancelled leave the queue; jobs still queued at
//      their deadline fail with kTimeout (the server's 503 + Retry-After);
//      with the EnginePool closed every queued job fails with
//      kResourceExhausted (running ones finish);
//   2. queued jobs are admitted in arrival order while fewer than
//      SchedulerOptions::max_sequences sequences live (-np / --parallel,
//      independent of the replica count) and the KV pool can give the
//      blocks of the prompt; with the prompt cache on, a new sequence adopts
//      the longest prefix of its prompt held in the KV pool's prefix index
//      (blocks keyed by their tokens and every token before them, whoever
//      computed them: model::KvPool), so only the rest is computed;
//   3. live sequences whose cancel flag is set stop (kCancelled); those past
//      their deadline stop with kLength and timed_out (what was produced is
//      the answer);
//   4. plan -> forward -> apply: one model::Batch gathers the next token of
//      every decoding sequence plus chunks of pending prompts, at most
//      `batch_size` tokens in all and as many prompt tokens as the
//      step-time budget allows (StepCost; none in the occasional step that
//      measures the decode step alone; decode tokens always go; prompt
//      chunks share what is left, shortest pending prompt first, the oldest
//      pending prompt keeping half), Model::forward runs once, and each
//      sequence whose prompt completed or that decoded samples from its own
//      logits row;
//      a decoding sequence may add proposed tokens (speculative decoding,
//      SpecOptions) as extra rows after its token, all wanting logits, as
//      many as its acceptance pays for against the measured cost of a row
//      (StepCost: r R / D per token the step yields, r a proposal row's
//      time) and the batch and KV leave room for; apply verifies them
//      (Sequence::accept_rows: greedy text is bit-identical to plain
//      decoding, by batch invariance; sampled text keeps the target
//      distribution) and rolls the KV back past the first rejection;
//   5. blocks that became full are published in the prefix index at once;
//      a finished sequence publishes its last, partial block too, and its
//      blocks go back to the pool (published ones stay cached, evictable
//      least recently used first).
// Recurrent states (qwen35): each running sequence holds one (allocated on
// its first forward, freed when it is preempted or ends); a new sequence
// also waits while one more would exceed SchedulerOptions::state_budget_bytes.
// Their prompt cache is the KvPool's state snapshots at block boundaries
// (model::KvPool), which adopt and publish use like the KV blocks.
// KV budget (the model's KvPool): a new sequence is admitted only when the
// pool can give the blocks its prompt needs (free or evictable cached
// blocks, less what admitted prompts still have to take), and never while a
// preempted sequence waits; otherwise it waits in the queue
// (SchedulerOptions::max_queue bounds it: 503 + Retry-After). Before each
// step every running sequence gets the block for its next token, oldest
// first; when the pool is full the youngest running sequence is preempted
// by recompute (Sequence::suspend: it publishes what it computed, its blocks
// go back, its sampler / RNG / text stay) and resumes, oldest first, when its
// tokens fit again: it re-adopts what the prefix index still holds of them
// and replays the rest as a prompt. Batch invariance makes its continuation
// bit-identical, so a running sequence never fails for lack of KV.
// A job with n > 1 choices computes its prompt once: choice 0 prefills;
// the other choices start when its prompt logits exist, sharing its prompt
// blocks (copy-on-write) and sampling from those logits.
//
// Embeddings (submit_embedding): each input of the job is one sequence,
// admitted like a choice (the same queue, KV admission, deadline and
// cancellation rules); its tokens are fed as prompt chunks in the same
// steps (every row's final hidden state wanted: BatchToken::hidden) and its
// kDone carries the mean-pooled, L2-normalised vector (equal to
// InferenceEngine::embed). An embedding adopts and publishes nothing (every
// token's row is needed; its input is not a conversation to continue).
//
// Cancellation: JobHandle::cancel() wakes the loop; the job stops within one
// step whether queued, prefilling or decoding.
//
// Concurrency: mu_ guards incoming_ and stop_; the queue, the live
// sequences and the logits/workspace buffers belong to the loop thread. Stats
// are atomics. A JobHandle has its own mutex for its event list.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"               // core::Error, Expected
#include "engine/engine_pool.h"       // EnginePool, EngineLease
#include "engine/inference_engine.h"  // GenerationResult
#include "engine/sampling.h"          // SamplingParams
#include "engine/sequence.h"          // Sequence, SequenceModel

namespace bonsai::core {
class ThreadPool;
}
namespace bonsai::model {
class Model;
class KvPool;
}  // namespace bonsai::model

namespace bonsai::engine {

// Construction options of a Scheduler.
struct SchedulerOptions {
  // Most tokens in one forward step (llama.cpp's -b / --batch-size): every
  // decoding sequence's token plus prompt chunks. A long prompt advances by
  // at most this many tokens per step, so running streams keep their pace.
  // >= 1; values < 1 are treated as kPrefillChunk.
  int64_t batch_size = kPrefillChunk;
  // Step-time budget in milliseconds (`serve --step-budget-ms`): prompt
  // chunks are sized so a step that carries decoding streams lasts about
  // this long, from what StepCost learned of this machine. 0 (default):
  // twice the measured decode step, so running streams' inter-token latency
  // stays within 2x of what it is without prompts beside them. A step with
  // no decoding stream aims at max(budget, kSoloStepSeconds), so a request
  // that arrives meanwhile waits at most about that long for its turn.
  // batch_size still caps every step.
  double step_budget_ms = 0;
  // Reuse cached prompt prefixes across requests (llama.cpp's cache_prompt).
  bool prompt_cache = true;
  // Compute threads of the forward passes; nullptr: core::global_pool().
  // Borrowed: must outlive the scheduler.
  core::ThreadPool* pool = nullptr;
  // Called on the loop thread after every forward step with the number of
  // tokens and of sequences in it (metrics). Must be thread-safe and fast:
  // while it runs the loop is held (no sequence steps, nothing is admitted,
  // no cancellation or deadline is swept; requests still queue), which tests use to order events around
  // a running generation (server_http_test's StepGate).
  std::function<void(int64_t tokens, int64_t sequences)> on_step;
  // Live sequences at most (llama.cpp's -np / --parallel, vLLM's
  // max_num_seqs): queued jobs are admitted while fewer run (each also
  // needs KV room). Independent of the pool's replica count. <= 0: the
  // pool's size.
  int max_sequences = 0;
  // Jobs that may wait in the queue (not yet fully admitted); submit refuses
  // more with kResourceExhausted (the server's 503 + Retry-After). 0: no bound.
  size_t max_queue = 0;
  // The model's KV block pool (BuiltPool::kv_pool): every sequence's cache
  // draws its blocks from it, and it holds the prefix index. nullptr: the
  // replicas' pool when their caches are paged, else a pool the scheduler
  // makes of the replicas' budget (replicas x n_ctx positions, their K/V
  // types). Admission waits for KV room, running sequences preempt the
  // youngest when it is full, and KV stats come from it.
  std::shared_ptr<model::KvPool> kv_pool;
  // Recurrent-state memory (hybrid models, qwen35): bytes the states of the
  // running sequences may take together (each model::KvCache::
  // recurrent_bytes, ~157 MB for a 27B). A new (or preempted) sequence
  // waits in the queue while one more state would exceed it; with nothing
  // running one is always admitted. 0: no bound beyond max_sequences. No
  // effect for a model without recurrent layers.
  uint64_t state_budget_bytes = 0;
  // Speculative decoding (`--spec-type`, `--draft-max`, `--draft-min`,
  // `--draft-p-min`; engine::SpecOptions): a decoding sequence's proposed
  // tokens are extra rows of the step, verified in apply (Sequence::
  // accept_rows). Validated at construction (invalid: speculation off).
  SpecOptions spec;
};

// Longest a step without decoding streams aims to last (seconds): the wait
// of a request that arrives during a long prompt, before its own prompt runs.
inline constexpr double kSoloStepSeconds = 0.5;
// Prompt tokens of a step before StepCost has measured a prompt token.
inline constexpr int64_t kInitialPromptChunk = 64;

// What the scheduler learns of this machine's step times (issue 28: prompt
// chunks sized in time, not tokens; issue 29: what a proposal row costs),
// and the prompt tokens a step may carry.
// Model: a step with R one-token decode rows, K proposal rows (speculative
// tokens verified in the step) and P prompt tokens takes
//   t = D + K * r + P * c
// with D the decode step (exponential moving average, weight 1/4, of steps
// with neither prompt tokens nor proposals; also the fixed part of a step
// without rows: the weights are streamed once either way; 0 until
// measured), r the marginal seconds per proposal row (the same average of
// (t - D) / K, at least t / (20 K), over prompt-free steps with proposals)
// and c the marginal seconds per prompt token (the same average of
// (t - D - K r) / P, at least t / (20 P), over steps with prompt tokens;
// the K rows counted as prompt tokens while r is unknown). All three adapt
// to whatever regime the machine is in (memory- or compute-bound, other
// load). While D is unknown, a prompt-free step with proposals is taken as
// a D sample, so D is measured even where every step carries proposals
// (sampled sequences propose by their own acceptance, whatever the load).
// (Before r, every prompt-free step was a D sample: D grew with the
// proposals, so a row's cost relative to the step came out too low and
// sequences proposed more than paid.) D is kept fresh under steady load by
// asking for a step without prompt tokens (want_decode_sample) when none
// ran for kDecodeSampleEvery steps or the row count moved by more than a
// quarter since the last one; a step with proposals answers that request
// too (it samples r against the D known), so no prompt waits for a step
// without proposals, and D itself moves with the steps that have none
// (SpecGuard's probes, sequences with nothing to propose).
// Not thread-safe (the loop thread's).
class StepCost {
 public:
  // One forward step of `decode_rows` decode rows, `proposal_rows` rows of
  // proposed tokens beyond them and `prompt_tokens` prompt tokens that took
  // `seconds` (model::Model::forward and the sampling).
  void record(int64_t decode_rows, int64_t prompt_tokens, double seconds, int64_t proposal_rows = 0);
  double decode_step_seconds() const { return decode_s_; }  // D; 0 until measured
  double token_seconds() const { return token_s_; }         // c; 0 until measured
  double row_seconds() const { return row_s_; }             // r; 0 until measured
  // What a proposal row costs as far as known: r, or a prompt token's c
  // until a proposal row was timed; 0 while neither is measured.
  double proposal_row_seconds() const { return row_s_ > 0 ? row_s_ : token_s_; }
  // The time a step with `decode_rows` rows aims at: budget_s when > 0,
  // else 2 D (0 while D is unknown); with no rows at least kSoloStepSeconds.
  double target_seconds(int64_t decode_rows, double budget_s) const;
  // Prompt tokens such a step may add: (target - D) / c, at least 1, at most
  // `cap`; min(cap, kInitialPromptChunk) while c (or, with rows, D) is unknown.
  int64_t prompt_allowance(int64_t decode_rows, double budget_s, int64_t cap) const;
  // Whether a step with `decode_rows` rows should carry no prompt token, so
  // that D (or, with proposals, r) is measured for about this many rows (see
  // the class comment).
  bool want_decode_sample(int64_t decode_rows) const;
  // Steps between two decode-only samples under steady load, at most.
  static constexpr int64_t kDecodeSampleEvery = 16;

 private:
  double decode_s_ = 0;
  double token_s_ = 0;
  double row_s_ = 0;
  int64_t steps_since_decode_ = 0;  // steps recorded since the last decode-only one
  int64_t decode_rows_ = 0;         // rows of the last decode-only step
};

// What one submitted request asks for.
struct CompletionJob {
  std::vector<int32_t> prompt;  // token ids (BOS included when wanted); non-empty
  SamplingParams params;        // validated by the caller (submit re-checks); choice i samples with params.seed + i
  int n = 1;                    // choices, >= 1
  // Batched prompts (OpenAI /v1/completions' `prompt` array): when
  // non-empty, exactly n prompts, each non-empty; choice i runs prompts[i]
  // (`prompt` is then unused) as its own sequence: no sibling shares
  // another's prompt logits, every choice consults the prompt cache, and
  // prompt logprobs are each choice's own.
  std::vector<std::vector<int32_t>> prompts;
  // llama-server's per-request cache_prompt. false: the job neither adopts
  // prefix blocks from the model's prompt cache nor publishes its own into
  // it (its blocks are freed when it ends, preempted ones recomputed);
  // siblings of one job still share choice 0's prompt. Only meaningful while
  // SchedulerOptions::prompt_cache is on (off: no job uses the cache).
  bool cache_prompt = true;
  // Still queued at the deadline: kFailed with kTimeout. Running past it:
  // the choice ends with finish_reason kLength and timed_out = true.
  Clock::time_point deadline = Clock::time_point::max();
  Clock::time_point submitted = Clock::now();  // TTFT / queue time are measured from here
};

// What one embedding request asks for (/v1/embeddings).
struct EmbeddingJob {
  // Token ids per input (BOS included when wanted); at least one input,
  // each non-empty and at most n_ctx tokens. Input i is the job's choice i.
  std::vector<std::vector<int32_t>> inputs;
  // Still queued at the deadline: kFailed with kTimeout. Running past it:
  // the input ends with finish_reason kLength, timed_out and no embedding.
  Clock::time_point deadline = Clock::time_point::max();
  Clock::time_point submitted = Clock::now();
};

// One event of a job. Per choice, kText events come in order and a kDone
// ends the choice; kFailed ends the whole job (no more events follow).
struct JobEvent {
  enum class Kind { kText, kDone, kFailed };
  Kind kind = Kind::kText;
  int choice = 0;
  std::string text;   // kText: released text (never empty)
  uint64_t step = 0;  // kText: the scheduler step (1-based, SchedulerStats::steps) that sampled it
  // kText with SamplingParams::logprobs >= 0: the log probabilities of the
  // tokens whose text this event releases (in order; a token whose text is
  // held back comes with the event that releases it; tokens never released,
  // e.g. a stop string's, are only in the kDone result's logprobs).
  std::vector<TokenLogprob> logprobs;
  // The first kText of a choice with SamplingParams::prompt_logprobs >= 0:
  // the prompt's log probabilities (GenerationResult::prompt_logprobs; the
  // same for every choice), so a stream can echo the prompt before the answer.
  std::vector<TokenLogprob> prompt_logprobs;
  // kDone. An embedding job's: result.embedding ([n_embd]) when the input
  // ran to its end (finish_reason kStop), result.prompt_tokens its length.
  GenerationResult result;
  // kFailed: kTimeout (still queued at the deadline), kCancelled (cancelled,
  // or the scheduler stopped), kResourceExhausted (the engine pool closed:
  // the model is unloading or the server shutting down), or an engine error.
  core::Error error;
};

class Scheduler;

// The link between a submitter and its job. Thread-safe; shared by the
// submitting thread and the scheduler loop (shared_ptr).
class JobHandle {
 public:
  // The job stops within one step (queued: it leaves the queue and gets a
  // kFailed kCancelled; running: its choices end with kCancelled).
  void cancel();
  bool cancelled() const { return cancel_.load(std::memory_order_relaxed); }
  // Waits until at least one event is there or `until` passes; appends the
  // events to `out` (in order). Returns false when none came.
  bool wait(std::vector<JobEvent>& out, Clock::time_point until);
  // True once the job ended (every choice done, or failed); events may still be unread.
  bool ended() const;
  // For event-driven readers (the server's streams, which hold no thread
  // each): `fn` runs after each event is queued, on the scheduler's loop
  // thread with no lock held, and once at once (on this thread) if events
  // are already waiting. It must not block: it should post the reading
  // elsewhere, which then takes the events with wait(out, Clock::now())
  // (no blocking). Replaces an earlier notifier; nullptr removes it.
  void set_notify(std::function<void()> fn);

 private:
  friend class Scheduler;
  void push(JobEvent e);
  // Wakes the scheduler's loop; outlives it (the scheduler detaches itself
  // in its destructor, so cancel() after that is only a flag).
  struct Waker {
    std::mutex mu;
    Scheduler* owner = nullptr;  // guarded by mu
  };
  std::atomic<bool> cancel_{false};
  std::shared_ptr<Waker> waker_;  // set by submit before the handle is shared
  mutable std::mutex mu_;         // guards events_, ended_
  std::condition_variable cv_;
  std::vector<JobEvent> events_;
  bool ended_ = false;
  std::shared_ptr<const std::function<void()>> notify_;  // guarded by mu_
};

// Counters and gauges of one scheduler (a snapshot; each field is read atomically).
struct SchedulerStats {
  int64_t running = 0;         // sequences live now
  int64_t waiting = 0;         // jobs queued (not yet fully admitted)
  uint64_t steps = 0;          // forward steps run
  uint64_t step_tokens = 0;    // tokens over all steps
  uint64_t prompt_tokens = 0;  // prompt tokens computed (not cached)
  uint64_t cached_tokens = 0;  // prompt tokens taken from the prefix cache (not a sibling choice's shared prompt)
  uint64_t cache_hits = 0;     // sequences that reused >= 1 cached token
  // Prompt tokens looked up in the prefix index (the prompts of sequences
  // started with the cache on; vLLM's prefix_cache_queries): cached_tokens
  // of them were found.
  uint64_t cache_queried_tokens = 0;
  uint64_t sequences = 0;   // sequences started
  uint64_t embeddings = 0;  // of which embedding sequences (one per input of an EmbeddingJob)
  // KV in positions (the model's KV pool, model::KvPool::Usage):
  // kv_used = positions of the blocks held by running sequences (pinned),
  // kv_cached = of blocks held only as prompt cache (the prefix index or
  // parked replica caches: evictable), kv_capacity = the pool's budget
  // (0 when the scheduler has no pool: every job fails then).
  int64_t kv_used = 0;
  int64_t kv_cached = 0;
  int64_t kv_capacity = 0;
  uint64_t preemptions = 0;   // sequences preempted (KV freed, recomputed later) for lack of KV
  uint64_t kv_evictions = 0;  // cached KV blocks evicted for room (model::KvPool::evictions)
  // Recurrent states (hybrid models; model::KvPool::StateUsage): states
  // held by the model's caches now and their bytes, the state snapshots of
  // the prompt cache (count, bytes, budget), snapshot hits (adoptions that
  // restored a state) and snapshots evicted for room.
  int64_t recurrent_states = 0;
  uint64_t recurrent_state_bytes = 0;
  int64_t state_snapshots = 0;
  uint64_t state_snapshot_bytes = 0;
  uint64_t state_snapshot_budget = 0;
  uint64_t state_snapshot_hits = 0;
  uint64_t state_snapshot_evictions = 0;
  // StepCost's current figures (0 until measured) and the prompt tokens the
  // last step with a pending prompt was allowed.
  double decode_step_seconds = 0;
  double prompt_token_seconds = 0;
  int64_t prompt_allowance = 0;
  // Tokens per forward step: step_hist[b] counts steps with
  // kStepBuckets[b-1] < tokens <= kStepBuckets[b] (the last entry: above all).
  std::vector<uint64_t> step_hist;
  // Speculative decoding, per proposer (prompt lookup, "ngram", here):
  // tokens proposed and verified as extra rows, and of them the ones
  // accepted (vLLM's spec_decode_num_draft_tokens / _accepted_tokens).
  uint64_t spec_ngram_proposed = 0;
  uint64_t spec_ngram_accepted = 0;
  // The same for a draft model (SpecType::kDraft, `-md FILE`).
  uint64_t spec_draft_proposed = 0;
  uint64_t spec_draft_accepted = 0;
};
// Upper bounds of SchedulerStats::step_hist (tokens per step).
inline constexpr int64_t kStepBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
inline constexpr size_t kNumStepBuckets = sizeof(kStepBuckets) / sizeof(kStepBuckets[0]) + 1;

class Scheduler {
 public:
  // Starts the loop thread over `pool` (shared with the caller; its replicas
  // must all run `model` and are not leased: the scheduler takes from one of
  // them what its sequences borrow, and stops admitting once `pool` is
  // closed). A pool with no idle replica at construction, or a KV pool
  // that cannot be made, makes every submitted job fail with that error.
  Scheduler(std::shared_ptr<EnginePool> pool, std::shared_ptr<const model::Model> model, int64_t n_ctx,
            SchedulerOptions options = {});
  // The same, owned by a shared_ptr that may be released on any thread,
  // including the loop thread itself: a job's notify callback
  // (JobHandle::set_notify) runs there and can drop the last reference to
  // the request and, through it, to the model that owns this scheduler
  // (an unloaded model whose last request just finished). A thread cannot
  // join itself, so that one release hands the deletion to a short-lived
  // detached thread, which stops and joins the loop once the callback has
  // returned (if no thread can be started, that scheduler is left running,
  // idle, instead). Every scheduler that request code can outlive is made here.
  static std::shared_ptr<Scheduler> create(std::shared_ptr<EnginePool> pool, std::shared_ptr<const model::Model> model,
                                           int64_t n_ctx, SchedulerOptions options = {});
  // Stops the loop: queued and running jobs end with kFailed kCancelled.
  // Must not run on the loop thread (see create()).
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues `job`. Errors: kInvalidArgument (empty prompt, n < 1, invalid
  // params), kResourceExhausted when SchedulerOptions::max_queue (> 0) jobs
  // are queued already, kCancelled after the scheduler stopped.
  core::Expected<std::shared_ptr<JobHandle>> submit(CompletionJob job);
  // Queues an embedding job (one queue entry whatever its number of
  // inputs; input i's kDone has choice i). Errors: kInvalidArgument (no
  // input, an empty one, one longer than n_ctx), then as submit().
  core::Expected<std::shared_ptr<JobHandle>> submit_embedding(EmbeddingJob job);

  // True when a job submitted now would be refused for the queue bound and
  // every sequence slot is busy: max_sequences running and max_queue
  // waiting (never with max_queue 0). A snapshot, for refusing a request
  // before its prompt costs anything; submit() checks the queue again.
  bool saturated() const;

  SchedulerStats stats() const;
  // The options, with max_sequences resolved (>= 1).
  const SchedulerOptions& options() const { return opt_; }

 private:
  friend class JobHandle;  // cancel() wakes the loop
  struct Job;
  struct Live;
  void loop();
  void wake();
  core::Expected<std::shared_ptr<JobHandle>> enqueue(std::shared_ptr<Job> job);
  // The loop's parts (loop thread only).
  void sweep_queue(Clock::time_point now);
  void admit(Clock::time_point now);
  // Starts the job's next choice as a new Sequence (false: the job failed).
  bool start_choice(const std::shared_ptr<Job>& job);
  void finish_live(size_t i);
  void fail_job(Job& job, core::Error error);
  // One step: stop_expired, KV reservation, then plan -> forward -> apply.
  void step();
  void stop_expired(Clock::time_point now);         // cancelled / past-deadline sequences stop and finish
  void plan_step();                                 // the batch: decode tokens, prompt chunks, tails
  core::Expected<void> forward_step();              // one Model::forward over it; stats, on_step, tails done
  void apply_step(const core::Expected<void>& ok);  // each sequence takes its rows: samples, emits
  // KV budget (kv_pool set; loop thread only).
  int64_t kv_available() const;  // blocks a new sequence may count on now
  // Whether one more running sequence's recurrent state fits
  // SchedulerOptions::state_budget_bytes (always without recurrent layers).
  bool state_room() const;
  void resume_preempted();
  void reserve_next_tokens();
  void preempt(size_t i);
  void update_kv_stats();

  std::shared_ptr<EnginePool> pool_;
  std::shared_ptr<const model::Model> model_;
  const int64_t n_ctx_;
  SchedulerOptions opt_;
  std::shared_ptr<JobHandle::Waker> waker_;         // shared with every handle
  SequenceModel shared_;                            // what every sequence borrows (from the replicas)
  std::shared_ptr<RequestRateAggregator> metrics_;  // the replicas' aggregator (nullptr: none)
  std::optional<core::Error> init_error_;           // set: every job fails with it (no replica, no KV pool)

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Job>> incoming_;  // guarded by mu_
  bool stop_ = false;                           // guarded by mu_
  bool kick_ = false;                           // guarded by mu_: a wake-up came

  // Loop thread only.
  std::vector<std::shared_ptr<Job>> queue_;
  std::vector<std::unique_ptr<Live>> live_;  // admission order: oldest first
  bool freed_ = false;                       // a sequence finished since the loop last looked at the queue
  std::vector<float> logits_;
  std::vector<float> hidden_;  // [embedding rows of a step][n_embd]
  struct Scratch;
  std::unique_ptr<Scratch> scratch_;

  std::atomic<int64_t> n_running_{0}, n_waiting_{0}, kv_used_{0}, kv_cached_{0};
  std::atomic<uint64_t> preemptions_{0};
  StepCost cost_;    // loop thread only; published through the atomics below
  SpecGuard guard_;  // loop thread only: whether greedy proposals pay here
  std::atomic<double> decode_step_s_{0}, prompt_token_s_{0};
  std::atomic<int64_t> prompt_allowance_{0};
  std::atomic<uint64_t> steps_{0}, step_tokens_{0}, prompt_tokens_{0}, cached_tokens_{0}, cache_hits_{0}, sequences_{0},
      embeddings_{0}, queried_tokens_{0};
  std::atomic<uint64_t> step_hist_[kNumStepBuckets] = {};
  std::atomic<uint64_t> spec_proposed_{0}, spec_accepted_{0};
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace bonsai::engine
