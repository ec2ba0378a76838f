// EnginePool / EngineLease: N engine replicas of one model shared by many
// concurrent requests, with the seed design's semantics (../shared/DESIGN.md,
// "EnginePool / EngineLease"):
//
//   - size = max(1, number of engines given);
//   - a counting semaphore with `size` permits bounds how many leases exist;
//   - `idle` engines sit behind a mutex that is held only for one pop or one
//     push, never while waiting and never across a forward pass;
//   - acquire(deadline) waits for a permit, then pops an idle engine;
//   - dropping a lease pushes the engine back *then* releases the permit, so
//     a waiter woken by that permit always finds an engine.
//
// The pool is a template over the engine type so its concurrency logic is
// unit-tested with a fake engine; bonsai code uses the alias `EnginePool`
// (= BasicEnginePool<InferenceEngine>) declared at the bottom.
//
// Replicas share the process-wide compute thread pool (core::global_pool()),
// whose workers are shared by all concurrent callers, so N replicas running
// at once never start more compute threads than `-t` (each forward pass gets
// its share of the workers instead of oversubscribing the cores).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"               // core::Expected
#include "gguf/gguf.h"                // OpenOptions
#include "model/kv_cache.h"           // KvType (-ctk / -ctv)
#include "model/model.h"              // LoadOptions
#include "tokenizer/chat_template.h"  // ChatTemplateOptions

namespace bonsai::model {
class Model;   // model/model.h
class KvPool;  // model/kv_cache.h
}  // namespace bonsai::model
namespace bonsai::tokenizer {
class Tokenizer;  // tokenizer/tokenizer.h
}

namespace bonsai::engine {

class InferenceEngine;  // inference_engine.h
struct SamplingParams;  // sampling.h

// Why acquire() gave no lease. At the HTTP layer every one is a 503 with Retry-After.
enum class PoolError {
  kClosed,    // close() was called: the pool is shutting down
  kEmpty,     // a permit was granted but no idle engine was there (cannot
              // happen by construction; reported, never asserted)
  kPoisoned,  // the pool's bookkeeping broke (an engine returned twice, a
              // lock threw); no further leases are handed out
  kTimeout,   // the deadline passed before a permit was free
};

// "closed", "empty", "poisoned", "timeout".
const char* pool_error_name(PoolError e);

// Where the compute runs. Only CPU exists today; a GPU tier would clamp the
// pool to one replica (one device context), as the seed did.
enum class ComputeTier { kCpu, kGpu };

// hardware_concurrency() capped at 4, at least 1 (the seed's default CPU pool size).
int default_cpu_pool_size();

// Pool size to build: GPU tier -> 1; otherwise `requested` if >= 1, else
// default_cpu_pool_size().
int resolve_pool_size(int requested, ComputeTier tier);

namespace detail {

// A counting semaphore whose waiters can be woken all at once by close().
// std::counting_semaphore cannot do that, hence this small mutex + condvar
// one. Guarded by mu_: permits_, closed_.
class ClosableSemaphore {
 public:
  enum class Result { kAcquired, kClosed, kTimeout };

  explicit ClosableSemaphore(int permits) : permits_(permits) {}

  // Takes one permit, waiting until `deadline` at most.
  Result acquire_until(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mu_);
    bool ok = cv_.wait_until(lock, deadline, [&] { return closed_ || permits_ > 0; });
    if (closed_) return Result::kClosed;
    if (!ok) return Result::kTimeout;
    --permits_;
    return Result::kAcquired;
  }

  // Returns one permit and wakes one waiter.
  void release() {
    {
      std::lock_guard lock(mu_);
      ++permits_;
    }
    cv_.notify_one();
  }

  // Every current and future acquire returns kClosed.
  void close() {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

  bool closed() const {
    std::lock_guard lock(mu_);
    return closed_;
  }
  int permits() const {
    std::lock_guard lock(mu_);
    return permits_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int permits_;
  bool closed_ = false;
};

}  // namespace detail

template <class Engine>
class BasicEnginePool;

// Exclusive use of one engine replica until the lease is dropped. Move-only.
// The destructor returns the engine to the pool's idle list and only then
// releases the permit. A moved-from lease owns nothing and returns nothing,
// so an engine can never be returned twice. Keeps the pool's shared state
// alive, so a lease may outlive the EnginePool object that made it.
template <class Engine>
class BasicEngineLease {
 public:
  BasicEngineLease(BasicEngineLease&& other) noexcept
      : state_(std::move(other.state_)), engine_(std::move(other.engine_)) {}
  BasicEngineLease& operator=(BasicEngineLease&& other) noexcept {
    if (this != &other) {
      give_back();
      state_ = std::move(other.state_);
      engine_ = std::move(other.engine_);
    }
    return *this;
  }
  BasicEngineLease(const BasicEngineLease&) = delete;
  BasicEngineLease& operator=(const BasicEngineLease&) = delete;
  ~BasicEngineLease() { give_back(); }

  Engine& engine() { return *engine_; }
  Engine& operator*() { return *engine_; }
  Engine* operator->() { return engine_.get(); }
  // False only for a moved-from lease.
  explicit operator bool() const { return engine_ != nullptr; }

 private:
  friend class BasicEnginePool<Engine>;
  using State = typename BasicEnginePool<Engine>::State;

  BasicEngineLease(std::shared_ptr<State> state, std::unique_ptr<Engine> engine)
      : state_(std::move(state)), engine_(std::move(engine)) {}

  void give_back() noexcept {
    if (state_ && engine_) {
      state_->push(std::move(engine_));  // engine first ...
      state_->sem.release();             // ... then the permit
    }
    state_.reset();
    engine_.reset();
  }

  std::shared_ptr<State> state_;
  std::unique_ptr<Engine> engine_;
};

// N replicas of one engine. Thread-safe: acquire/close/size/available may be
// called from any thread. Members: state_ (shared with leases). Inside State,
// `idle_mu` guards `idle`, `poisoned` and the pending metrics setter; the
// semaphore has its own lock.
template <class Engine>
class BasicEnginePool {
 public:
  using Lease = BasicEngineLease<Engine>;
  using Clock = std::chrono::steady_clock;

  // Takes ownership of the engines. size() = max(1, engines.size()); an empty
  // vector makes a pool of size 1 whose acquire reports kEmpty (the seed's
  // rule, kept so misuse is reported rather than hanging).
  explicit BasicEnginePool(std::vector<Engine> engines)
      : state_(std::make_shared<State>(engines.empty() ? 1 : static_cast<int>(engines.size()))) {
    state_->idle.reserve(state_->size);  // pushes never allocate, so give_back cannot throw
    for (auto& e : engines) state_->idle.push_back(std::make_unique<Engine>(std::move(e)));
    state_->slots = state_->idle.size();
  }

  BasicEnginePool(BasicEnginePool&&) noexcept = default;
  BasicEnginePool& operator=(BasicEnginePool&&) noexcept = default;
  BasicEnginePool(const BasicEnginePool&) = delete;
  BasicEnginePool& operator=(const BasicEnginePool&) = delete;

  // Waits until `deadline` for a permit, then pops an idle engine (the most
  // recently returned one: LIFO, so a warm replica is reused first).
  std::expected<Lease, PoolError> acquire(Clock::time_point deadline) { return acquire_impl(deadline, nullptr); }

  // acquire(), but pops the idle engine with the highest score(engine)
  // instead of the most recent one (ties: the most recently returned). The
  // scheduler's prompt cache scores by the cached prefix length. `score` is
  // called under the idle mutex (one pop, no waiting): keep it cheap and
  // non-blocking; it must not call back into the pool.
  std::expected<Lease, PoolError> acquire_best(Clock::time_point deadline,
                                               const std::function<int64_t(const Engine&)>& score) {
    return acquire_impl(deadline, &score);
  }

  // Visits every idle engine under the idle mutex (read-only: metrics, and
  // the scheduler, which borrows a prefix of an idle engine's KV blocks
  // while no other thread can lease it; keep `fn` short: acquire and
  // release wait for it).
  void for_each_idle(const std::function<void(const Engine&)>& fn) const {
    std::lock_guard lock(state_->idle_mu);
    for (const auto& e : state_->idle) fn(*e);
  }

  // acquire() with a relative timeout.
  std::expected<Lease, PoolError> acquire_for(Clock::duration timeout) { return acquire(Clock::now() + timeout); }

  // Wakes every waiter with kClosed; later acquires fail with kClosed.
  // Leases already out stay valid and return their engines normally.
  void close() { state_->sem.close(); }
  bool closed() const { return state_->sem.closed(); }

  // Calls setter(engine) on every replica: now for idle ones, and for leased
  // ones when their lease returns them (a leased engine is never touched by
  // another thread). Typical use: engine.set_metrics(aggregator).
  void set_metrics_all(std::function<void(Engine&)> setter) {
    std::lock_guard lock(state_->idle_mu);
    for (auto& e : state_->idle) setter(*e);
    state_->pending_setter = std::move(setter);
    state_->pending_left = state_->slots - state_->idle.size();
    state_->pending_done.clear();
    for (auto& e : state_->idle) state_->pending_done.push_back(e.get());
  }

  // Number of replicas (>= 1).
  int size() const { return state_->size; }
  // Permits free right now (a snapshot; size() - available() replicas are busy).
  int available() const { return state_->sem.permits(); }

 private:
  friend class BasicEngineLease<Engine>;

  // acquire() / acquire_best(): a permit until `deadline`, then one idle
  // engine: the most recently returned when `score` is null, else the one
  // with the highest score (ties: the most recently returned).
  std::expected<Lease, PoolError> acquire_impl(Clock::time_point deadline,
                                               const std::function<int64_t(const Engine&)>* score) {
    State& s = *state_;
    if (s.is_poisoned()) return std::unexpected(PoolError::kPoisoned);
    switch (s.sem.acquire_until(deadline)) {
      case detail::ClosableSemaphore::Result::kClosed:
        return std::unexpected(PoolError::kClosed);
      case detail::ClosableSemaphore::Result::kTimeout:
        return std::unexpected(PoolError::kTimeout);
      case detail::ClosableSemaphore::Result::kAcquired:
        break;
    }
    std::unique_ptr<Engine> engine;
    bool poisoned = false;
    {
      std::lock_guard lock(s.idle_mu);
      poisoned = s.poisoned;
      if (!poisoned && !s.idle.empty()) {
        size_t best = s.idle.size() - 1;
        if (score != nullptr) {
          int64_t best_score = (*score)(*s.idle[best]);
          for (size_t i = best; i-- > 0;) {
            const int64_t sc = (*score)(*s.idle[i]);
            if (sc > best_score) {
              best = i;
              best_score = sc;
            }
          }
        }
        engine = std::move(s.idle[best]);
        s.idle.erase(s.idle.begin() + static_cast<std::ptrdiff_t>(best));
      }
    }
    if (!engine) {
      s.sem.release();  // the permit is not used: give it back
      return std::unexpected(poisoned ? PoolError::kPoisoned : PoolError::kEmpty);
    }
    return Lease(state_, std::move(engine));
  }

  struct State {
    explicit State(int n) : size(n), sem(n) {}

    bool is_poisoned() {
      std::lock_guard lock(idle_mu);
      return poisoned;
    }

    // Returns an engine to idle. noexcept: capacity was reserved for `slots`
    // engines, so push_back cannot allocate; a return beyond `slots` (double
    // return: impossible through the Lease API) poisons the pool.
    void push(std::unique_ptr<Engine> e) noexcept {
      std::lock_guard lock(idle_mu);
      if (idle.size() >= slots) {
        poisoned = true;
        return;
      }
      if (pending_setter && pending_left > 0) {
        bool done = false;
        for (const Engine* p : pending_done) done = done || p == e.get();
        if (!done) {
          pending_setter(*e);
          pending_done.push_back(e.get());
          --pending_left;
        }
      }
      idle.push_back(std::move(e));
    }

    const int size;
    detail::ClosableSemaphore sem;
    std::mutex idle_mu;
    std::vector<std::unique_ptr<Engine>> idle;    // guarded by idle_mu
    size_t slots = 0;                             // engines owned (idle + leased)
    bool poisoned = false;                        // guarded by idle_mu
    std::function<void(Engine&)> pending_setter;  // guarded by idle_mu
    size_t pending_left = 0;                      // guarded by idle_mu
    std::vector<const Engine*> pending_done;      // guarded by idle_mu
  };

  std::shared_ptr<State> state_;
};

// The pool the server uses.
using EnginePool = BasicEnginePool<InferenceEngine>;
using EngineLease = BasicEngineLease<InferenceEngine>;

// What build_pool_from_gguf returns: the pool plus what its replicas share.
struct BuiltPool {
  EnginePool pool;
  ComputeTier tier = ComputeTier::kCpu;
  int size = 1;                                           // effective replica count
  std::shared_ptr<const model::Model> model;              // the one mapping's weights
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;  // shared by the replicas
  int64_t n_ctx = 0;                                      // KV positions per replica
  uint64_t mapped_bytes = 0;                              // size of the GGUF mapping (all parts of a split file)
  // The model's KV block pool, shared by every replica (model::KvPool): one
  // budget of kv_budget_positions(n_ctx, size, kv_budget_tokens) positions.
  std::shared_ptr<model::KvPool> kv_pool;
  uint64_t kv_bytes = 0;  // the KV pool's capacity in bytes
  // Recurrent state (qwen35; 0 otherwise): one sequence's state
  // (model::KvCache::recurrent_bytes), and the state-snapshot budget set on
  // kv_pool (state_snapshot_budget_bytes).
  uint64_t recurrent_state_bytes = 0;
  uint64_t snapshot_bytes = 0;
};

// Positions per KV block for replicas of n_ctx positions: n_ctx rounded up to
// the attention's 32-key block, at most model::kKvBlockSize (256).
int64_t kv_block_size_for(int64_t n_ctx);
// The KV budget of one model in positions (all sequences together), a whole
// number of blocks of kv_block_size_for(n_ctx): kv_budget_tokens rounded up
// when > 0, else what `replicas` full contexts take (replicas x
// ceil(n_ctx / block) blocks: every slot can reach n_ctx at once, as before
// paging).
int64_t kv_budget_positions(int64_t n_ctx, int replicas, int64_t kv_budget_tokens);
// Recurrent-state snapshots one model's prompt cache may hold
// (model::KvPool::set_snapshot_budget), in snapshots: two per full context
// the KV budget holds (ceil(kv_positions / n_ctx)): room for each
// conversation the KV budget is sized for to keep the state at its
// prompt's last block boundary and at its latest one (multi-turn reuse),
// besides what shared prefixes take under LRU. 0 for a model without
// recurrent layers.
int64_t state_snapshot_count(const model::ModelConfig& cfg, int64_t n_ctx, int64_t kv_positions);
// state_snapshot_count(...) x model::KvCache::recurrent_bytes(cfg) (saturating).
uint64_t state_snapshot_budget_bytes(const model::ModelConfig& cfg, int64_t n_ctx, int64_t kv_positions);

// Maps `path` once (Model::load), builds the tokenizer from it, and creates
// resolve_pool_size(requested_size, tier) replicas that all borrow the same
// weights, embedding table and tokenizer; each owns only its KV cache,
// workspace and sampler. Every replica gets `params` with params.seed =
// `seed`, so replicas are interchangeable. `max_seq_len` <= 0: the model's
// context_length capped at kDefaultMaxSeqLen. Errors: the model's, the
// tokenizer's and InferenceEngine::create's (each names the file), and
// check_ctx_supported's (max_seq_len beyond what the model supports).
// `options` go to Model::load (a forced Q2_0 layout). type_k / type_v: every
// replica's KV cache types (EngineOptions::kv_type_k / kv_type_v; q8_0 needs
// head dims that are multiples of 32, else InferenceEngine::create's error).
// `kv_budget_tokens`: the model's KV budget in positions (<= 0: the
// default of kv_budget_positions); every replica's cache takes its blocks
// from the one pool. kInvalidArgument when the budget is below one context.
// `sequences` > 0: at least that many replicas (for callers that lease
// one per concurrent generation; each costs its workspace and logits row,
// its KV comes from the shared pool), while the default KV budget still
// counts resolve_pool_size(requested_size) full contexts. The Scheduler
// needs none: its -np sequences are its own (engine::Sequence). `chat`:
// the tokenizer's chat template choice (Tokenizer::from_gguf; a template
// the Jinja interpreter cannot parse fails the load, kUnsupported).
core::Expected<BuiltPool> build_pool_from_gguf(const std::string& path, const SamplingParams& params, uint64_t seed,
                                               int64_t max_seq_len, int requested_size,
                                               const model::LoadOptions& options = {},
                                               model::KvType type_k = model::KvType::kF16,
                                               model::KvType type_v = model::KvType::kF16, int64_t kv_budget_tokens = 0,
                                               int sequences = 0, const tokenizer::ChatTemplateOptions& chat = {});

// What one model built by build_pool_from_gguf(path, .., max_seq_len,
// pool_size) will need, read from the GGUF header alone (no weights read, no
// cache allocated), so a caller can refuse a load before allocating.
struct ModelFootprint {
  uint64_t mapped_bytes = 0;                   // the file size (one shared mapping; all parts of a split file)
  int64_t n_ctx = 0;                           // KV positions per replica (max_seq_len <= 0: the default)
  int replicas = 0;                            // resolve_pool_size(pool_size, kCpu)
  model::KvType type_k = model::KvType::kF16;  // the caches' K / V types (as given)
  model::KvType type_v = model::KvType::kF16;
  // model::KvCache::bytes_per_position(config, type_k, type_v): K and V of
  // one position in every layer (f16 2 bytes per value, f32 4, q8_0 34 per 32).
  uint64_t kv_bytes_per_position = 0;
  int64_t kv_block_size = 0;     // positions per KV block (kv_block_size_for(n_ctx))
  int64_t kv_budget_tokens = 0;  // KV positions of the model's pool (kv_budget_positions)
  uint64_t kv_bytes = 0;         // kv_bytes_per_position x kv_budget_tokens (saturating)
  // Recurrent state (qwen35; all 0 for a model without GDN layers):
  // recurrent_state_bytes is one sequence's (model::KvCache::recurrent_bytes);
  // `sequences` run at once at most (`parallel` > 0, else replicas), each
  // holding one: states_bytes = their product; snapshot_bytes is the prompt
  // cache's state-snapshot budget (state_snapshot_budget_bytes).
  uint64_t recurrent_state_bytes = 0;
  int sequences = 0;
  uint64_t states_bytes = 0;
  uint64_t snapshot_bytes = 0;
  int64_t n_ctx_train = 0;  // <arch>.context_length (0: the file does not say)
  // The longest context the model supports: n_ctx_train, or with RoPE
  // scaling (linear / YaRN) max(n_ctx_train, original_context_length x
  // factor), as llama.cpp extends it (n_ctx_orig_yarn x rope_freq_scale^-1).
  // 0 when the file gives no context_length.
  int64_t max_ctx = 0;
  float rope_scaling_factor = 1.0f;  // 1 without RoPE scaling

  uint64_t total_bytes() const;  // mapped_bytes + kv_bytes + states_bytes + snapshot_bytes (saturating)
  // What the caches take beside the mapping: kv_bytes + states_bytes + snapshot_bytes (saturating).
  uint64_t cache_bytes() const;
};

// The longest context `cfg`'s model supports: n_ctx_train, or with RoPE
// scaling (linear / YaRN) max(n_ctx_train, original_context_length x
// factor), as llama.cpp extends it. 0 when the file gives no context_length.
int64_t max_supported_ctx(const model::ModelConfig& cfg);
// Refuses a requested context (`-c`, `ctx-size`, `ctx_size`; <= 0 means
// the default and passes) longer than max_supported_ctx(cfg): positions
// past the training context are out of distribution (stories260K at -c 8192
// produces garbage past 2,048). Error kInvalidArgument naming `path`, the
// value, the limit and how it is made (training context x RoPE factor).
// build_pool_from_gguf and `bonsai run` / `chat` call it, so every path
// (CLI flag, TOML key, admin load) refuses the same value.
core::Expected<void> check_ctx_supported(const std::string& path, int64_t ctx, const model::ModelConfig& cfg);

// The footprint of `path` built with `max_seq_len` positions and `pool_size`
// replicas. Errors: gguf::File::open's and ModelConfig::from_gguf's (each
// names the file). `options` go to gguf::File::open (a forced Q2_0 layout).
// `parallel`: the sequences the model's scheduler runs at once (ModelSpec::
// parallel; <= 0: the replicas), each with a recurrent state for a hybrid model.
core::Expected<ModelFootprint> model_footprint(const std::string& path, int64_t max_seq_len, int pool_size,
                                               const model::LoadOptions& options = {},
                                               model::KvType type_k = model::KvType::kF16,
                                               model::KvType type_v = model::KvType::kF16, int64_t kv_budget_tokens = 0,
                                               int parallel = 0);

// Bytes one model needs when built as above: model_footprint(...).total_bytes(),
// i.e. the file size (the mapping) plus `pool_size` KV caches of
// `max_seq_len` positions (K and V of type_k / type_v, every layer), plus
// for a hybrid model the recurrent states of `parallel` sequences and the
// state-snapshot budget.
core::Expected<uint64_t> estimate_model_bytes(const std::string& path, int64_t max_seq_len, int pool_size,
                                              const model::LoadOptions& options = {},
                                              model::KvType type_k = model::KvType::kF16,
                                              model::KvType type_v = model::KvType::kF16, int64_t kv_budget_tokens = 0,
                                              int parallel = 0);

}  // namespace bonsai::engine
