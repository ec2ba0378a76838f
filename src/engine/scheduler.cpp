// Scheduler: the per-model step loop. See scheduler.h.
#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "core/thread_pool.h"  // ThreadPool, global_pool
#include "model/kv_cache.h"    // KvPool
#include "model/model.h"       // Model, Batch, KvCache, Workspace

namespace bonsai::engine {

// ---- JobHandle ------------------------------------------------------------------

void JobHandle::cancel() {
  cancel_.store(true, std::memory_order_relaxed);
  if (!waker_) return;
  std::lock_guard lock(waker_->mu);
  if (waker_->owner != nullptr) waker_->owner->wake();
}

bool JobHandle::wait(std::vector<JobEvent>& out, Clock::time_point until) {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, until, [&] { return !events_.empty(); });
  if (events_.empty()) return false;
  for (auto& e : events_) out.push_back(std::move(e));
  events_.clear();
  return true;
}

bool JobHandle::ended() const {
  std::lock_guard lock(mu_);
  return ended_;
}

void JobHandle::set_notify(std::function<void()> fn) {
  auto f = fn ? std::make_shared<const std::function<void()>>(std::move(fn)) : nullptr;
  bool waiting = false;
  {
    std::lock_guard lock(mu_);
    notify_ = f;
    waiting = !events_.empty();
  }
  if (f && waiting) (*f)();
}

void JobHandle::push(JobEvent e) {
  std::shared_ptr<const std::function<void()>> notify;
  {
    std::lock_guard lock(mu_);
    if (e.kind == JobEvent::Kind::kFailed) ended_ = true;
    events_.push_back(std::move(e));
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) (*notify)();
}

// ---- StepCost ---------------------------------------------------------------------------

void StepCost::record(int64_t decode_rows, int64_t prompt_tokens, double seconds, int64_t proposal_rows) {
  constexpr double kWeight = 0.25;
  if (!(seconds > 0)) return;
  const auto blend = [](double& avg, double sample) { avg = avg > 0 ? avg + kWeight * (sample - avg) : sample; };
  proposal_rows = std::max<int64_t>(0, proposal_rows);
  if (prompt_tokens <= 0) {
    if (decode_rows <= 0) return;
    if (proposal_rows == 0 || !(decode_s_ > 0)) {
      blend(decode_s_, seconds);  // (with proposals only while D is unknown: see the class comment)
    } else {
      // A step faster than the decode estimate (noise) still costs something per row.
      blend(row_s_, std::max(seconds - decode_s_, 0.05 * seconds) / static_cast<double>(proposal_rows));
    }
    steps_since_decode_ = 0;
    decode_rows_ = decode_rows;
    return;
  }
  ++steps_since_decode_;
  if (decode_rows > 0 && !(decode_s_ > 0)) return;  // the decode part is unknown yet
  // D is the fixed part of any step (streaming the weights once), rows or
  // not; proposal rows in a prompt step cost their measured r, or a prompt
  // token's while r is unknown. A step faster than that (noise) still costs
  // something per token.
  const double rest = seconds - decode_s_ - (row_s_ > 0 ? static_cast<double>(proposal_rows) * row_s_ : 0.0);
  const int64_t per = prompt_tokens + (row_s_ > 0 ? 0 : proposal_rows);
  blend(token_s_, std::max(rest, 0.05 * seconds) / static_cast<double>(per));
}

bool StepCost::want_decode_sample(int64_t decode_rows) const {
  if (decode_rows <= 0) return false;
  if (!(decode_s_ > 0) || steps_since_decode_ >= kDecodeSampleEvery) return true;
  return 4 * std::abs(decode_rows - decode_rows_) > decode_rows_;
}

double StepCost::target_seconds(int64_t decode_rows, double budget_s) const {
  double t = budget_s > 0 ? budget_s : 2 * decode_s_;
  if (decode_rows <= 0) t = std::max(t, kSoloStepSeconds);
  return t;
}

int64_t StepCost::prompt_allowance(int64_t decode_rows, double budget_s, int64_t cap) const {
  cap = std::max<int64_t>(1, cap);
  if (!(token_s_ > 0) || (decode_rows > 0 && !(decode_s_ > 0))) return std::min(cap, kInitialPromptChunk);
  const double room = target_seconds(decode_rows, budget_s) - decode_s_;
  const double n = room / token_s_;
  if (!(n >= 1)) return 1;  // (NaN too) every step moves prompts on
  return n >= static_cast<double>(cap) ? cap : static_cast<int64_t>(n);
}

// ---- Scheduler state ----------------------------------------------------------------

struct Scheduler::Job {
  CompletionJob req;
  std::shared_ptr<JobHandle> handle;
  int next_choice = 0;  // choices admitted so far
  int live = 0;         // choices running
  int done = 0;         // choices finished
  bool failed = false;
  std::vector<float> prompt_logits;     // [n_vocab] once choice 0's prompt ran (n > 1)
  const Sequence* source = nullptr;     // choice 0's sequence while it runs (holds the prompt's KV)
  std::vector<TokenLogprob> prompt_lp;  // choice 0's prompt logprobs once its prompt ran (prompt_logprobs >= 0)
  // An embedding job (submit_embedding): choice i embeds inputs[i]; req.n = inputs.size().
  bool embed = false;
  std::vector<std::vector<int32_t>> inputs;
  std::span<const int32_t> prompt_of(int choice) const {
    if (embed) return inputs[static_cast<size_t>(choice)];
    if (!req.prompts.empty()) return req.prompts[static_cast<size_t>(choice)];
    return req.prompt;
  }
  // Choices run as independent sequences (an embedding job's inputs,
  // batched prompts): no choice waits for or shares choice 0's prompt.
  bool independent() const { return embed || !req.prompts.empty(); }
  // Whether its sequences adopt from and publish to the prompt cache
  // (`on`: SchedulerOptions::prompt_cache; CompletionJob::cache_prompt).
  bool caches(bool on) const { return on && req.cache_prompt; }
};

struct Scheduler::Live {
  std::shared_ptr<Job> job;
  int choice = 0;
  std::optional<Sequence> seq;  // set from admission to finish_live
  RequestRateTracker tracker;
  int64_t fed = 0;  // tokens put in this step's batch
  bool wants_row = false;
  bool all_rows = false;                 // this step's tokens all want logits rows (prompt logprobs)
  bool hidden_rows = false;              // this step's tokens all want hidden rows (an embedding)
  std::vector<TokenLogprob> pending_lp;  // streamed logprobs waiting for released text
  bool suspended = false;                // preempted for lack of KV: waits to resume (replays its tokens)
  bool prompt_lp_sent = false;           // the prompt logprobs went out with a kText
  std::vector<TokenLogprob> prompt_lp;   // its own prompt logprobs (a job's independent choices)
  int64_t proposed = 0;                  // this step's proposed tokens (extra rows after its decode token)
};

// One step's plan and buffers (plan_step fills them; forward_step and
// apply_step read them).
struct Scheduler::Scratch {
  model::Workspace ws;
  model::Batch batch;
  std::vector<model::KvCache*> caches;  // [live sequence] -> its cache (seq id = index)
  std::vector<size_t> order;            // live sequences in batch-filling order
  int64_t prompt_fed = 0;               // prompt tokens in the batch
  int64_t allowance = 0;                // prompt tokens the step-time budget allowed
  int64_t proposed = 0;                 // proposed tokens (speculation) in the batch
  bool greedy_proposed = false;         // a greedy sequence's proposal is among them (SpecGuard)
  int64_t tokens_out = 0;               // tokens the decoding sequences took (apply_step)
};

Scheduler::Scheduler(std::shared_ptr<EnginePool> pool, std::shared_ptr<const model::Model> model, int64_t n_ctx,
                     SchedulerOptions options)
    : pool_(std::move(pool)),
      model_(std::move(model)),
      n_ctx_(n_ctx),
      opt_(std::move(options)),
      waker_(std::make_shared<JobHandle::Waker>()),
      scratch_(std::make_unique<Scratch>()) {
  if (opt_.batch_size < 1) opt_.batch_size = kPrefillChunk;
  if (!opt_.spec.validate()) opt_.spec.type = SpecType::kNone;
  const int replicas = std::max(1, pool_ ? pool_->size() : 1);
  if (opt_.max_sequences < 1) opt_.max_sequences = replicas;
  // What every sequence borrows, and the KV types, from the replicas (all
  // idle now; they run `model`).
  model::KvType tk = model::KvType::kF16, tv = model::KvType::kF16;
  std::shared_ptr<model::KvPool> replica_pool;
  if (pool_) {
    pool_->for_each_idle([&](const InferenceEngine& e) {
      if (shared_.model) return;
      shared_ = e.sequence_model();
      metrics_ = e.metrics();
      tk = e.kv_cache().type_k();
      tv = e.kv_cache().type_v();
      if (e.kv_cache().paged()) replica_pool = e.kv_cache().pool();
    });
  }
  if (!opt_.kv_pool) opt_.kv_pool = replica_pool;
  if (!opt_.kv_pool && shared_.model) {
    // Replicas with standalone caches: the sequences get a pool of the
    // same budget (a full context per replica).
    const int64_t bs = kv_block_size_for(n_ctx_);
    const int64_t positions = kv_budget_positions(n_ctx_, replicas, 0);
    auto kp = model::KvPool::create(model_->config(), positions, tk, tv, bs);
    if (kp) {
      (*kp)->set_snapshot_budget(state_snapshot_budget_bytes(model_->config(), n_ctx_, positions));
      opt_.kv_pool = std::move(*kp);
    } else {
      init_error_ = kp.error();
    }
  }
  if (!shared_.model)
    init_error_ = core::Error{core::Errc::kInvalidArgument,
                              "scheduler: the engine pool had no idle replica to take the model from when the "
                              "scheduler was made"};
  waker_->owner = this;
  thread_ = std::thread([this] { loop(); });
}

std::shared_ptr<Scheduler> Scheduler::create(std::shared_ptr<EnginePool> pool,
                                             std::shared_ptr<const model::Model> model, int64_t n_ctx,
                                             SchedulerOptions options) {
  return std::shared_ptr<Scheduler>(new Scheduler(std::move(pool), std::move(model), n_ctx, std::move(options)),
                                    [](Scheduler* s) {
                                      if (std::this_thread::get_id() == s->thread_.get_id()) {
                                        try {
                                          std::thread([s] { delete s; }).detach();
                                        } catch (const std::system_error&) {
                                          // No thread could start: leave the scheduler
                                          // (idle) rather than terminate the process.
                                        }
                                      } else {
                                        delete s;
                                      }
                                    });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(waker_->mu);
    waker_->owner = nullptr;
  }
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::wake() {
  {
    std::lock_guard lock(mu_);
    kick_ = true;
  }
  cv_.notify_all();
}

core::Expected<std::shared_ptr<JobHandle>> Scheduler::submit(CompletionJob req) {
  if (!req.prompts.empty()) {
    if (static_cast<int64_t>(req.prompts.size()) != req.n)
      return core::fail(core::Errc::kInvalidArgument, "submit: prompts must hold n prompts");
    for (const auto& p : req.prompts)
      if (p.empty()) return core::fail(core::Errc::kInvalidArgument, "submit: a prompt is empty");
  } else if (req.prompt.empty()) {
    return core::fail(core::Errc::kInvalidArgument, "submit: the prompt is empty");
  }
  if (req.n < 1) return core::fail(core::Errc::kInvalidArgument, "submit: n must be >= 1");
  if (auto ok = req.params.validate(); !ok) return std::unexpected(ok.error());
  auto job = std::make_shared<Job>();
  job->req = std::move(req);
  return enqueue(std::move(job));
}

core::Expected<std::shared_ptr<JobHandle>> Scheduler::submit_embedding(EmbeddingJob req) {
  if (req.inputs.empty()) return core::fail(core::Errc::kInvalidArgument, "submit_embedding: no input");
  for (size_t i = 0; i < req.inputs.size(); ++i) {
    if (req.inputs[i].empty())
      return core::fail(core::Errc::kInvalidArgument, "submit_embedding: input " + std::to_string(i) + " is empty");
    if (static_cast<int64_t>(req.inputs[i].size()) > n_ctx_)
      return core::fail(core::Errc::kInvalidArgument, "submit_embedding: input " + std::to_string(i) + " has " +
                                                          std::to_string(req.inputs[i].size()) +
                                                          " tokens, more than the context of " +
                                                          std::to_string(n_ctx_));
  }
  auto job = std::make_shared<Job>();
  job->embed = true;
  job->req.n = static_cast<int>(req.inputs.size());
  job->req.deadline = req.deadline;
  job->req.submitted = req.submitted;
  job->inputs = std::move(req.inputs);
  return enqueue(std::move(job));
}

bool Scheduler::saturated() const {
  return opt_.max_queue > 0 && n_running_.load() >= opt_.max_sequences &&
         static_cast<size_t>(std::max<int64_t>(0, n_waiting_.load())) >= opt_.max_queue;
}

core::Expected<std::shared_ptr<JobHandle>> Scheduler::enqueue(std::shared_ptr<Job> job) {
  const size_t max_queue = opt_.max_queue;
  job->handle = std::make_shared<JobHandle>();
  job->handle->waker_ = waker_;
  std::shared_ptr<JobHandle> h = job->handle;
  {
    std::lock_guard lock(mu_);
    if (stop_) return core::fail(core::Errc::kCancelled, "submit: the scheduler has stopped");
    if (max_queue > 0 && static_cast<size_t>(n_waiting_.load()) >= max_queue)
      return core::fail(core::Errc::kResourceExhausted,
                        std::to_string(n_waiting_.load()) + " requests are already waiting");
    incoming_.push_back(std::move(job));
    n_waiting_.fetch_add(1);
    kick_ = true;
  }
  cv_.notify_all();
  return h;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.running = n_running_.load();
  s.waiting = n_waiting_.load();
  s.steps = steps_.load();
  s.step_tokens = step_tokens_.load();
  s.prompt_tokens = prompt_tokens_.load();
  s.cached_tokens = cached_tokens_.load();
  s.cache_hits = cache_hits_.load();
  s.cache_queried_tokens = queried_tokens_.load();
  s.sequences = sequences_.load();
  s.embeddings = embeddings_.load();
  s.kv_used = kv_used_.load();
  s.kv_cached = kv_cached_.load();
  s.kv_capacity = opt_.kv_pool ? opt_.kv_pool->capacity_blocks() * opt_.kv_pool->block_size() : 0;
  s.preemptions = preemptions_.load();
  s.kv_evictions = opt_.kv_pool ? opt_.kv_pool->evictions() : 0;
  if (opt_.kv_pool) {
    const model::KvPool::StateUsage su = opt_.kv_pool->state_usage();
    s.recurrent_states = su.states;
    s.recurrent_state_bytes = su.state_bytes;
    s.state_snapshots = su.snapshots;
    s.state_snapshot_bytes = su.snapshot_bytes;
    s.state_snapshot_budget = su.snapshot_budget;
    s.state_snapshot_hits = su.snapshot_hits;
    s.state_snapshot_evictions = su.snapshot_evictions;
  }
  s.decode_step_seconds = decode_step_s_.load();
  s.prompt_token_seconds = prompt_token_s_.load();
  s.prompt_allowance = prompt_allowance_.load();
  for (const auto& c : step_hist_) s.step_hist.push_back(c.load());
  // One proposer per scheduler (SchedulerOptions::spec): its counts.
  const bool draft = opt_.spec.type == SpecType::kDraft;
  (draft ? s.spec_draft_proposed : s.spec_ngram_proposed) = spec_proposed_.load();
  (draft ? s.spec_draft_accepted : s.spec_ngram_accepted) = spec_accepted_.load();
  return s;
}

// ---- The loop ---------------------------------------------------------------------------

void Scheduler::fail_job(Job& job, core::Error error) {
  if (job.failed) return;
  job.failed = true;
  job.handle->push(JobEvent{.kind = JobEvent::Kind::kFailed, .error = std::move(error)});
}

void Scheduler::sweep_queue(Clock::time_point now) {
  for (auto& j : queue_) {
    Job& job = *j;
    if (job.failed) continue;
    if (job.next_choice == 0) {
      if (job.handle->cancelled()) {
        fail_job(job, core::Error{core::Errc::kCancelled, "cancelled while queued"});
      } else if (now >= job.req.deadline) {
        fail_job(job, core::Error{core::Errc::kTimeout, "the request timed out while queued"});
      }
    } else if (job.handle->cancelled()) {
      // Some choices run (they stop as cancelled within a step); the ones not
      // started never will: each ends now, as cancelled with nothing produced,
      // so the submitter still gets one kDone per choice (it waits for n).
      for (; job.next_choice < job.req.n; ++job.next_choice) {
        GenerationResult r;
        r.finish_reason = FinishReason::kCancelled;
        r.prompt_tokens = static_cast<int32_t>(job.prompt_of(job.next_choice).size());
        job.handle->push(JobEvent{.kind = JobEvent::Kind::kDone, .choice = job.next_choice, .result = std::move(r)});
        ++job.done;
      }
      if (job.live == 0) {
        std::lock_guard lock(job.handle->mu_);
        job.handle->ended_ = true;
      }
    }
  }
}

bool Scheduler::start_choice(const std::shared_ptr<Job>& jp) {
  Job& job = *jp;
  const int choice = job.next_choice;
  auto cache = model::KvCache::create(opt_.kv_pool, n_ctx_);
  if (!cache) {
    fail_job(job, cache.error());
    return false;
  }
  auto live = std::make_unique<Live>();
  live->job = jp;
  live->choice = choice;
  live->tracker = RequestRateTracker(job.req.submitted);
  live->tracker.on_start();
  // The sequence's own sampler: the request's parameters, its RNG started
  // from params.seed + choice by start() below.
  live->seq.emplace(shared_, std::move(*cache), Sampler(job.req.params));
  Sequence& q = *live->seq;
  q.set_spec(opt_.spec);
  if (job.embed) {
    if (auto ok = q.start_embedding(job.prompt_of(choice), &job.handle->cancel_); !ok) {
      fail_job(job, ok.error());
      return false;
    }
    sequences_.fetch_add(1);
    embeddings_.fetch_add(1);
    ++job.next_choice;
    ++job.live;
    n_running_.fetch_add(1);
    live_.push_back(std::move(live));
    return true;
  }
  const std::span<const int32_t> prompt = job.prompt_of(choice);
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  StartOptions so;
  so.reuse_prefix = choice > 0 && !job.independent();
  if (so.reuse_prefix && !job.prompt_logits.empty()) {
    // A sibling of choice 0: it shares the prompt's KV blocks and samples
    // from the prompt logits: no prompt recomputed.
    if (job.source != nullptr && job.source->cached_prefix(job.req.prompt) >= n_prompt) {
      if (auto ok = q.copy_prefix_from(*job.source, n_prompt); !ok) q.truncate(0);
    }
    so.prompt_logits = job.prompt_logits;
  }
  GenerateRequest gr;
  gr.prompt = prompt;
  gr.seed = job.req.params.seed + static_cast<uint64_t>(choice);
  gr.cancel = &job.handle->cancel_;
  gr.tracker = &live->tracker;
  JobHandle* h = job.handle.get();
  Live* owner = live.get();  // outlives the sequence's generation (finish_live holds it through finish())
  const Job* jobp = &job;    // outlives its choices
  gr.on_token = [this, h, choice, owner, jobp](const TokenEvent& ev) {
    if (ev.logprob != nullptr) owner->pending_lp.push_back(*ev.logprob);
    if (!ev.text.empty()) {
      JobEvent out{.kind = JobEvent::Kind::kText,
                   .choice = choice,
                   .text = std::string(ev.text),
                   .step = steps_.load(std::memory_order_relaxed),
                   .logprobs = std::move(owner->pending_lp)};
      if (jobp->req.params.prompt_logprobs >= 0 && !owner->prompt_lp_sent) {
        out.prompt_logprobs = jobp->independent() ? owner->prompt_lp : jobp->prompt_lp;
        owner->prompt_lp_sent = true;
      }
      h->push(std::move(out));
      owner->pending_lp.clear();
    }
    return true;
  };
  if (auto ok = q.start(gr, so); !ok) {
    fail_job(job, ok.error());
    return false;
  }
  // The prompt cache: whatever of the prompt the model's prefix index holds,
  // whoever computed it (prompt logprobs need every row: nothing reused).
  // Counted as prefix-cache lookups and hits: choice 0's only (a sibling
  // shares its prompt's KV, which is not a cache hit), so hits <= queries.
  if ((choice == 0 || job.independent()) && job.caches(opt_.prompt_cache) && job.req.params.prompt_logprobs < 0) {
    const int64_t cached = q.adopt_cached_prefix();
    queried_tokens_.fetch_add(static_cast<uint64_t>(n_prompt));
    cached_tokens_.fetch_add(static_cast<uint64_t>(cached));
    if (cached > 0) cache_hits_.fetch_add(1);
  }
  sequences_.fetch_add(1);
  if (choice == 0) job.source = &q;
  ++job.next_choice;
  ++job.live;
  n_running_.fetch_add(1);
  live_.push_back(std::move(live));
  return true;
}

void Scheduler::admit(Clock::time_point now) {
  (void)now;
  if (pool_ && pool_->closed()) {
    // The model is unloading or the server shutting down: nothing queued starts.
    for (auto& q : queue_)
      if (q->next_choice == 0)
        fail_job(*q, core::Error{core::Errc::kResourceExhausted, "the model's engine pool is closed"});
    return;
  }
  for (size_t qi = 0; qi < queue_.size(); ++qi) {
    const std::shared_ptr<Job>& jp = queue_[qi];
    Job& job = *jp;
    if (init_error_ && !job.failed) {
      fail_job(job, *init_error_);
      continue;
    }
    while (!job.failed && job.next_choice < job.req.n) {
      // Siblings wait for choice 0's prompt logits (one prefill per job);
      // an embedding job's inputs are independent sequences.
      if (!job.independent() && job.next_choice > 0 && job.prompt_logits.empty()) break;
      if (static_cast<int64_t>(live_.size()) >= opt_.max_sequences) return;  // -np: the rest waits
      if (!live_.empty()) {
        // KV room: preempted sequences resume first; a new prompt needs its
        // blocks (a sibling shares the prompt's: one block for its copy-on-write).
        for (const auto& l : live_)
          if (l->suspended) return;
        const int64_t positions =
            std::min<int64_t>(static_cast<int64_t>(job.prompt_of(job.next_choice).size()) + 1, n_ctx_);
        const int64_t need = job.next_choice > 0 && !job.independent() ? 1 : opt_.kv_pool->blocks_for(positions);
        if (kv_available() < need) return;  // the queue waits (FIFO)
        if (!state_room()) return;          // so it does for recurrent-state memory
      }
      if (!start_choice(jp)) break;
    }
  }
}

void Scheduler::finish_live(size_t i) {
  std::unique_ptr<Live> live = std::move(live_[i]);
  live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
  Job& job = *live->job;
  Sequence& q = *live->seq;
  if (job.source == &q) job.source = nullptr;
  // What it computed stays in the prefix index (its last, partial block
  // too), for whoever continues this conversation or shares its prefix.
  const bool embedding = q.is_embedding();
  if (job.caches(opt_.prompt_cache) && !embedding) q.publish(/*partial_last=*/true);
  GenerationResult res = q.finish();
  if (!embedding && metrics_) metrics_->record(res.rate);
  // A sibling started from choice 0's prompt logits computed no prompt logprobs: they are choice 0's.
  if (job.req.params.prompt_logprobs >= 0 && res.prompt_logprobs.empty()) res.prompt_logprobs = job.prompt_lp;
  live->seq.reset();  // its blocks back to the pool (published ones stay cached)
  n_running_.fetch_sub(1);
  freed_ = true;
  --job.live;
  ++job.done;
  if (!job.failed)
    job.handle->push(JobEvent{.kind = JobEvent::Kind::kDone, .choice = live->choice, .result = std::move(res)});
  if (job.done >= job.req.n || (job.failed && job.live == 0)) {
    std::lock_guard lock(job.handle->mu_);
    job.handle->ended_ = true;
  }
}

// ---- KV budget -------------------------------------------------------------------------

int64_t Scheduler::kv_available() const {
  // Free or evictable blocks, less what admitted prompts (and replays) will
  // still take to reach their first sampled token.
  const model::KvPool& kp = *opt_.kv_pool;
  int64_t owed = 0;
  for (const auto& l : live_) {
    if (l->suspended) continue;
    const Sequence& q = *l->seq;
    const int64_t pending = q.pending_prompt();
    if (pending == 0) continue;
    const int64_t target = std::min<int64_t>(q.next_pos() + pending + 1, n_ctx_);
    // New blocks plus the copy of a shared partial last block (a prefix
    // adopted from the index, n > 1 siblings).
    owed += q.kv_cache().blocks_needed(target);
  }
  return kp.available_blocks() - owed;
}

bool Scheduler::state_room() const {
  const uint64_t per = opt_.kv_pool ? opt_.kv_pool->state_bytes() : 0;
  if (per == 0 || opt_.state_budget_bytes == 0) return true;
  uint64_t running = 0;  // sequences holding (or about to allocate) a state: all but the preempted
  for (const auto& l : live_)
    if (!l->suspended) ++running;
  return (running + 1) * per <= opt_.state_budget_bytes;
}

void Scheduler::preempt(size_t i) {
  Live& l = *live_[i];
  // Its blocks go back; what it computed stays findable in the prefix
  // index, so its recompute takes back whatever was not evicted meanwhile.
  if (l.job->caches(opt_.prompt_cache) && !l.seq->is_embedding()) l.seq->publish(/*partial_last=*/true);
  l.seq->suspend();
  l.suspended = true;
  preemptions_.fetch_add(1);
}

void Scheduler::resume_preempted() {
  bool running = false;
  for (const auto& l : live_) running = running || !l->suspended;
  for (auto& l : live_) {
    if (!l->suspended) continue;
    const Sequence& q = *l->seq;
    const int64_t target = std::min<int64_t>(q.next_pos() + q.pending_prompt() + 1, n_ctx_);
    // Oldest first; with nothing running it always fits (budget >= one context).
    if (running && (kv_available() < opt_.kv_pool->blocks_for(target) || !state_room())) return;
    l->suspended = false;
    if (l->job->caches(opt_.prompt_cache) && !l->seq->is_embedding()) l->seq->adopt_cached_prefix();
    running = true;
  }
}

void Scheduler::reserve_next_tokens() {
  // Oldest first: each running sequence gets the block of its next position;
  // when the pool is full the youngest running sequence holding blocks is
  // preempted (it may be this one).
  for (size_t i = 0; i < live_.size(); ++i) {
    Live& l = *live_[i];
    Sequence& q = *l.seq;
    if (l.suspended || q.finished()) continue;
    const int64_t pos = q.next_pos();
    for (;;) {
      if (pos >= n_ctx_ || q.kv_cache().prepare(pos, pos + 1)) break;
      size_t victim = live_.size();
      for (size_t j = live_.size(); j-- > i + 1;) {
        const Sequence& v = *live_[j]->seq;
        if (!live_[j]->suspended && !v.finished() && v.kv_cache().blocks() > 0) {
          victim = j;
          break;
        }
      }
      if (victim == live_.size()) {
        bool older = false;
        for (size_t j = 0; j < i; ++j)
          older = older || (!live_[j]->suspended && live_[j]->seq->kv_cache().blocks() > 0);
        if (older) {
          preempt(i);  // it is the youngest: it waits for the older ones
        } else {
          q.stop_now(FinishReason::kLength);  // alone it exceeds the budget: the context is full
        }
        break;
      }
      preempt(victim);
    }
  }
}

void Scheduler::update_kv_stats() {
  if (!opt_.kv_pool) return;
  const model::KvPool::Usage u = opt_.kv_pool->usage();
  kv_used_.store(u.pinned * opt_.kv_pool->block_size());
  kv_cached_.store(u.cached * opt_.kv_pool->block_size());
}

void Scheduler::stop_expired(Clock::time_point now) {
  for (auto& l : live_) {
    Sequence& q = *l->seq;
    if (q.finished()) continue;
    if (l->job->failed) {
      q.stop_now(FinishReason::kCancelled);
    } else if (!q.poll_cancel() && now >= l->job->req.deadline) {
      q.stop_now(FinishReason::kLength, /*timed_out=*/true);
    }
  }
  for (size_t i = live_.size(); i-- > 0;)
    if (live_[i]->seq->finished()) finish_live(i);
}

void Scheduler::plan_step() {
  // The batch: every decode token, then prompt chunks (shortest pending
  // first) in what is left of the budget.
  Scratch& sc = *scratch_;
  sc.batch.clear();
  sc.caches.clear();
  sc.prompt_fed = 0;
  sc.proposed = 0;
  sc.greedy_proposed = false;
  // Prompt tokens get what the decode tokens leave of batch_size, at least
  // one per step (so prompts progress even when batch_size <= running streams).
  int64_t decoders = 0;
  for (auto& l : live_) {
    l->fed = 0;
    l->proposed = 0;
    l->wants_row = false;
    l->all_rows = false;
    l->hidden_rows = false;
    if (!l->suspended && l->seq->pending_prompt() == 0) ++decoders;
  }
  // ... and what the step-time budget leaves them (StepCost); none in a
  // step that measures the decode step for the rows running now.
  int64_t budget = cost_.want_decode_sample(decoders)
                       ? 0
                       : cost_.prompt_allowance(decoders, opt_.step_budget_ms / 1e3,
                                                std::max<int64_t>(1, opt_.batch_size - decoders));
  sc.allowance = budget;
  // The oldest pending prompt keeps half of the allowance whatever shorter
  // ones arrive, so a steady flow of short requests cannot starve it.
  size_t oldest = live_.size();
  int64_t prefilling = 0;
  for (size_t i = 0; i < live_.size(); ++i) {
    if (live_[i]->suspended || live_[i]->seq->pending_prompt() == 0) continue;
    if (oldest == live_.size()) oldest = i;
    ++prefilling;
  }
  int64_t reserve = prefilling > 1 ? budget / 2 : 0;  // (an allowance of 1 goes to the shortest)
  // Shortest pending prompt first (then oldest): a short request arriving
  // during a long prompt gets its first token within a few steps.
  for (auto& l : live_) sc.caches.push_back(&l->seq->kv_cache());
  // Speculation: rows the batch has for proposed tokens beyond one per
  // decoding sequence and the prompt tokens it may carry (batch_size caps
  // the step; prompts keep their allowance), and what one more row costs
  // relative to the step per token it yields (r * R / D, with a prompt
  // token's c for r until a proposal row was timed; unknown yet:
  // kSampledRowCost).
  int64_t draft_room = std::max<int64_t>(0, opt_.batch_size - decoders - (prefilling > 0 ? budget : 0));
  // Where proposing yields fewer tokens per second than not (measured:
  // SpecGuard), greedy sequences do not propose this step (infinite cost;
  // sampled ones keep kSampledRowCost).
  const double row_s = cost_.proposal_row_seconds(), step_s = cost_.decode_step_seconds();
  const double row_cost = opt_.spec.type != SpecType::kNone && decoders > 0 && !guard_.allow(decoders)
                              ? std::numeric_limits<double>::infinity()
                          : row_s > 0 && step_s > 0
                              ? row_s * static_cast<double>(std::max<int64_t>(1, decoders)) / step_s
                              : kSampledRowCost;
  sc.order.resize(live_.size());
  for (size_t i = 0; i < live_.size(); ++i) sc.order[i] = i;
  std::stable_sort(sc.order.begin(), sc.order.end(), [&](size_t a, size_t b) {
    return live_[a]->seq->pending_prompt() < live_[b]->seq->pending_prompt();
  });
  for (const size_t si : sc.order) {
    Live& l = *live_[si];
    if (l.suspended) continue;
    Sequence& e = *l.seq;
    const bool prefill = e.pending_prompt() > 0;
    const int64_t avail = si == oldest ? budget : budget - reserve;
    if (prefill && avail <= 0) continue;
    // Prompt logprobs: every prompt token's logits row, in smaller chunks.
    const bool all_rows = prefill && e.wants_prompt_rows();
    const bool hidden_rows = prefill && e.wants_hidden_rows();  // an embedding: every token's hidden row
    std::span<const int32_t> in = e.next_input(prefill ? (all_rows ? std::min(avail, kPromptRowsChunk) : avail) : 1);
    if (in.empty()) continue;
    const int64_t pos = e.next_pos();
    if (prefill && !e.kv_cache().prepare(pos, pos + static_cast<int64_t>(in.size()))) {
      // The pool cannot give the whole chunk: run what the blocks held
      // already take (reserve_next_tokens gave at least the next position).
      const int64_t room = e.kv_cache().blocks() * e.kv_cache().block_size() - pos;
      if (room <= 0) continue;
      in = in.first(static_cast<size_t>(std::min<int64_t>(room, static_cast<int64_t>(in.size()))));
    }
    if (!prefill && opt_.spec.type != SpecType::kNone && draft_room > 0 &&
        e.propose(std::min<int64_t>(draft_room, n_ctx_ - pos - 1), row_cost, cost_.decode_step_seconds()) > 0) {
      // The proposal's positions need blocks too: as many as the pool gives
      // (without preempting anyone); the rest of the proposal is dropped.
      int64_t k = e.proposed();
      if (!e.kv_cache().prepare(pos, pos + 1 + k))
        k = std::min(k, e.kv_cache().blocks() * e.kv_cache().block_size() - pos - 1);
      e.trim_proposal(k);
      in = e.next_input(1);
      l.proposed = e.proposed();
      draft_room -= l.proposed;
      sc.proposed += l.proposed;
      if (l.proposed > 0 && !(e.sampler().params().temperature > 0.0f)) sc.greedy_proposed = true;
    }
    const bool wants = e.logits_wanted(static_cast<int64_t>(in.size()));
    for (size_t k = 0; k < in.size(); ++k)
      sc.batch.add(in[k], static_cast<int32_t>(pos + static_cast<int64_t>(k)), static_cast<int32_t>(si),
                   all_rows || l.proposed > 0 || (wants && k + 1 == in.size()), hidden_rows);
    l.fed = static_cast<int64_t>(in.size());
    l.all_rows = all_rows;
    l.hidden_rows = hidden_rows;
    l.wants_row = wants;
    if (prefill) {
      budget -= l.fed;
      sc.prompt_fed += l.fed;
      if (si == oldest) reserve = 0;
    }
  }
}

core::Expected<void> Scheduler::forward_step() {
  Scratch& sc = *scratch_;
  const size_t n_vocab = static_cast<size_t>(model_->config().n_vocab);
  const size_t n_embd = static_cast<size_t>(model_->config().n_embd);
  const size_t rows = sc.batch.n_wanted();
  if (logits_.size() < rows * n_vocab) logits_.resize(rows * n_vocab);
  const size_t hrows = sc.batch.n_hidden();
  if (hidden_.size() < hrows * n_embd) hidden_.resize(hrows * n_embd);
  core::ThreadPool& tp = opt_.pool != nullptr ? *opt_.pool : core::global_pool();
  auto ok = model_->forward(sc.batch, sc.caches, sc.ws, logits_, hidden_, tp);
  steps_.fetch_add(1);
  step_tokens_.fetch_add(sc.batch.size());
  prompt_tokens_.fetch_add(static_cast<uint64_t>(sc.prompt_fed));
  {
    size_t b = 0;
    while (b + 1 < kNumStepBuckets && static_cast<int64_t>(sc.batch.size()) > kStepBuckets[b]) ++b;
    step_hist_[b].fetch_add(1);
  }
  if (opt_.on_step) opt_.on_step(static_cast<int64_t>(sc.batch.size()), static_cast<int64_t>(live_.size()));
  return ok;
}

void Scheduler::apply_step(const core::Expected<void>& ok) {
  Scratch& sc = *scratch_;
  if (!ok) {
    // Nothing was written (forward checks first): every sequence in the step fails.
    for (auto& l : live_) {
      if (l->fed == 0) continue;
      fail_job(*l->job, ok.error());
      l->seq->stop_now(FinishReason::kCancelled);
    }
    return;
  }
  const size_t n_vocab = static_cast<size_t>(model_->config().n_vocab);
  const size_t n_embd = static_cast<size_t>(model_->config().n_embd);
  sc.tokens_out = 0;
  size_t row = 0;   // logits rows come in batch order, i.e. sc.order
  size_t hrow = 0;  // hidden rows likewise
  for (const size_t si : sc.order) {
    auto& l = live_[si];
    if (l->fed == 0) continue;
    Sequence& e = *l->seq;
    if (l->hidden_rows) {  // rows [hrow, hrow + fed) are this embedding's
      e.record_hidden_rows(
          std::span<const float>(hidden_.data() + hrow * n_embd, static_cast<size_t>(l->fed) * n_embd));
      hrow += static_cast<size_t>(l->fed);
    }
    if (l->all_rows) {  // rows [row, row + fed) are this sequence's; the last one may be sampled from
      e.record_prompt_rows(
          std::span<const float>(logits_.data() + row * n_vocab, static_cast<size_t>(l->fed) * n_vocab));
      row += static_cast<size_t>(l->fed) - 1;
    }
    if (l->proposed > 0) {  // rows [row, row + fed): the decode token's and the proposal's
      e.inputs_done(l->fed);
      const SpecCounts c =
          e.accept_rows(std::span<const float>(logits_.data() + row * n_vocab, static_cast<size_t>(l->fed) * n_vocab));
      row += static_cast<size_t>(l->fed);
      spec_proposed_.fetch_add(static_cast<uint64_t>(c.proposed));
      spec_accepted_.fetch_add(static_cast<uint64_t>(c.accepted));
      sc.tokens_out += 1 + c.accepted;
      continue;
    }
    const bool wanted = e.inputs_done(l->fed);
    if (!wanted) {
      if (l->all_rows) ++row;
      continue;
    }
    const std::span<const float> lg(logits_.data() + row * n_vocab, n_vocab);
    ++row;
    ++sc.tokens_out;
    Job& job = *l->job;
    if (job.independent()) {
      if (job.req.params.prompt_logprobs >= 0 && l->prompt_lp.empty() &&
          e.next_pos() == static_cast<int64_t>(job.prompt_of(l->choice).size()))
        l->prompt_lp = e.prompt_logprobs();
    } else {
      if (l->choice == 0 && job.req.n > 1 && job.prompt_logits.empty() &&
          e.next_pos() == static_cast<int64_t>(job.req.prompt.size()))
        job.prompt_logits.assign(lg.begin(), lg.end());
      if (l->choice == 0 && job.req.params.prompt_logprobs >= 0 && job.prompt_lp.empty() &&
          e.next_pos() == static_cast<int64_t>(job.req.prompt.size()))
        job.prompt_lp = e.prompt_logprobs();
    }
    e.accept_logits(lg);
  }
  // Blocks that became full are findable by other requests at once.
  for (auto& l : live_)
    if (l->job->caches(opt_.prompt_cache) && l->fed > 0 && !l->seq->is_embedding()) l->seq->publish();
}

void Scheduler::step() {
  stop_expired(Clock::now());  // cancelled or past the deadline: they stop before this step's forward
  if (live_.empty() || !opt_.kv_pool) {
    update_kv_stats();
    return;
  }
  resume_preempted();
  reserve_next_tokens();
  plan_step();
  Scratch& sc = *scratch_;
  if (sc.batch.empty()) {
    update_kv_stats();
    return;
  }
  const Clock::time_point t0 = Clock::now();
  const auto ok = forward_step();
  apply_step(ok);
  // What the step cost (forward and sampling), for the next steps' prompt chunks.
  if (ok) {
    // Decode rows are the decoding sequences, as want_decode_sample counts
    // them; their proposals' rows are timed apart (StepCost's r).
    const int64_t rows = static_cast<int64_t>(sc.batch.size()) - sc.prompt_fed - sc.proposed;
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    cost_.record(rows, sc.prompt_fed, seconds, sc.proposed);
    if (sc.prompt_fed == 0) guard_.record(rows, sc.greedy_proposed, sc.tokens_out, seconds);
    decode_step_s_.store(cost_.decode_step_seconds());
    prompt_token_s_.store(cost_.token_seconds());
    if (sc.prompt_fed > 0) prompt_allowance_.store(sc.allowance);
  }
  for (size_t i = live_.size(); i-- > 0;)
    if (live_[i]->seq->finished()) finish_live(i);
  update_kv_stats();
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      // Idle: sleep until a submission, a cancel, or the earliest queued
      // deadline; not when sequences just finished (queued jobs may start).
      if (live_.empty() && !stop_ && !(freed_ && !queue_.empty())) {
        Clock::time_point until = Clock::time_point::max();
        for (const auto& j : queue_) until = std::min(until, j->req.deadline);
        if (until == Clock::time_point::max()) {
          cv_.wait(lock, [&] { return stop_ || kick_; });
        } else {
          cv_.wait_until(lock, until, [&] { return stop_ || kick_; });
        }
      }
      kick_ = false;
      freed_ = false;
      if (stop_) break;
      for (auto& j : incoming_) queue_.push_back(std::move(j));
      incoming_.clear();
    }
    const Clock::time_point now = Clock::now();
    sweep_queue(now);
    admit(now);
    std::erase_if(queue_, [](const std::shared_ptr<Job>& j) { return j->failed || j->next_choice >= j->req.n; });
    {
      std::lock_guard lock(mu_);
      n_waiting_.store(static_cast<int64_t>(queue_.size() + incoming_.size()));
    }
    step();
  }
  // Stopped: everything still queued or running ends.
  std::vector<std::shared_ptr<Job>> rest;
  {
    std::lock_guard lock(mu_);
    rest = std::move(incoming_);
  }
  for (auto& j : rest) queue_.push_back(std::move(j));
  for (auto& j : queue_) fail_job(*j, core::Error{core::Errc::kCancelled, "the scheduler stopped"});
  for (auto& l : live_) fail_job(*l->job, core::Error{core::Errc::kCancelled, "the scheduler stopped"});
  for (size_t i = live_.size(); i-- > 0;) {
    live_[i]->seq->stop_now(FinishReason::kCancelled);
    finish_live(i);
  }
  queue_.clear();
  n_waiting_.store(0);
}

}  // namespace bonsai::engine
