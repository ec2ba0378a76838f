// ModelPool: the multi-model LRU warm pool behind `bonsai serve`
// (../shared/DESIGN.md, "ModelPool").
//
// Models are registered by id (loader_register) and loaded on demand or in
// the background. At most `capacity` models are resident and, when a budget
// is set, their estimated memory (mapped file bytes + KV caches of every
// replica) stays within `mem_budget_mb`. Making room evicts the least
// recently used models first, and only idle ones: a model with requests in
// flight (running or queued: each holds a ModelHandle) is never evicted to
// make room; the load is refused (kResourceExhausted naming the busy
// models) instead. Nor, once set_recent_use_grace() is given a grace, is a
// model evicted for another model's on-demand acquire() while it served a
// request within the grace (no ping-pong between two models on every
// request); admin loads (load_in_background / mark_loading) may evict it.
// A model with requests in flight can be unloaded (unload): it is unlisted,
// but its memory is freed only when its last request releases it, and until
// then it still counts in current_mem_bytes().
//
// Idle expiry (set_keep_alive, Ollama's keep_alive): a resident model given
// a keep-alive duration D is unloaded, as unload() does, once no request has
// held it for D; a thread of the pool's own (started by the first
// set_keep_alive) waits for the earliest such moment. Models without one
// (the default) stay until evicted or unloaded. A pinned model (pin():
// `bonsai serve` pins its default model, the one a request without "model"
// gets) takes no keep-alive: an Ollama client sending keep_alive "5m" with
// every request must not leave the server's default model unloaded, to be
// loaded again by the next request. It is still evicted to make room and
// unloaded by unload() (admin unload, Ollama's keep_alive 0).
//
// The loader is injectable, so the pool's bookkeeping is unit-tested without
// real models; the server uses gguf_model_loader() (declared below).
//
// Concurrency: one mutex (mu_) guards entries_, zombies_, registry_, tick_,
// recent_grace_, pinned_, bg_threads_ and the expiry thread's state. It is never held while a model loads, so loading
// one model never blocks requests to another.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"           // core::Expected
#include "core/ggml_types.h"      // Q2Layout
#include "engine/engine_pool.h"   // EnginePool, ComputeTier
#include "engine/rate_tracker.h"  // RequestRateAggregator
#include "engine/sampling.h"      // SamplingParams
#include "engine/scheduler.h"     // Scheduler

namespace bonsai::model {
class Model;  // model/model.h
}
namespace bonsai::tokenizer {
class Tokenizer;  // tokenizer/tokenizer.h
}

namespace bonsai::engine {

// How to load one model: what `-m ID=FILE` plus the pool flags say.
struct ModelSpec {
  std::string path;         // GGUF file
  int pool_size = 0;        // replicas; <= 0: default_cpu_pool_size()
  int ctx_size = 0;         // context per replica in tokens; <= 0: min(model's context_length, 4096)
  SamplingParams defaults;  // sampling used where a request does not say
  int batch_size = 0;       // tokens per scheduler step (-b); <= 0: kPrefillChunk (512)
  // Step-time budget in ms (`serve --step-budget-ms`; SchedulerOptions::
  // step_budget_ms); <= 0: twice the measured decode step.
  double step_budget_ms = 0;
  bool prompt_cache = true;  // reuse cached prompt prefixes across requests
  // The chat template (tokenizer::ChatTemplateOptions, llama-server's flags):
  // jinja (--jinja, default; false: --no-jinja, the built-in renderer of the
  // template's family), chat_template (--chat-template: a built-in name or a
  // Jinja template's text; empty: the GGUF's), chat_template_file
  // (--chat-template-file: a file holding the template, read at load).
  bool jinja = true;
  std::string chat_template;
  std::string chat_template_file;
  // Speculative decoding (`serve --spec-type / --draft-max / --draft-min /
  // --draft-p-min`; SchedulerOptions::spec): off by default.
  SpecOptions spec;
  // The draft model (`serve -md FILE`, config key model-draft, admin load
  // field model_draft): loaded beside the model, its tokenizer checked
  // (check_draft_tokenizer), its weights and one KV cache per live sequence
  // counted in the model's memory; implies spec.type kDraft where spec.type
  // is none. Empty: none (spec.type kDraft is then a load error).
  std::string model_draft;
  // Live sequences at most (`bonsai serve -np/--parallel`, default 16 there;
  // SchedulerOptions::max_sequences), independent of pool_size: each is a
  // Sequence of the scheduler with its own block table over the model's
  // KV pool; the default KV budget still counts pool_size contexts, shared
  // by all of them. <= 0: pool_size.
  int parallel = 0;
  // Requests that may wait for a slot per live-sequence slot before new
  // ones are refused (503 + Retry-After; `serve`'s queue-factor):
  // SchedulerOptions::max_queue = queue_factor x parallel. <= 0: no bound.
  int queue_factor = 4;
  // The model's KV budget in tokens (positions of all sequences together,
  // `bonsai serve --kv-budget-tokens`); <= 0: pool_size x ctx_size (every
  // slot can hold a full context). Must be >= ctx_size.
  int64_t kv_budget_tokens = 0;
  // Forced layout of type-42 (Q2_0) tensors (gguf::OpenOptions::q2_layout,
  // `bonsai serve --q2-layout`); nullopt: the reader detects it.
  std::optional<core::Q2Layout> q2_layout;
  // KV cache types of every replica (`bonsai serve -ctk / -ctv`, config keys
  // cache-type-k / cache-type-v, admin load fields cache_type_k / cache_type_v).
  model::KvType kv_type_k = model::KvType::kF16;
  model::KvType kv_type_v = model::KvType::kF16;
  // Repack the weights the kernels compute faster in another layout
  // (model::LoadOptions::repack; `serve --no-repack`, config key no-repack,
  // admin load field repack); false: zero-copy views only.
  bool repack = true;
};

// A resident model: weights (one shared mapping), tokenizer and the replica
// pool. Shared by the ModelPool and every request using it; freed when the
// last holder drops it. Immutable after loading except the pool's own state.
struct LoadedModel {
  std::string id;
  ModelSpec spec;
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;
  std::shared_ptr<EnginePool> pool;  // may be null in tests
  // The model's step loop (continuous batching of Sequences over the
  // model's KV pool; requests go through it, not through pool leases; it
  // takes the model, tokenizer and metrics from `pool`'s replicas and stops
  // admitting when `pool` is closed). May be null in tests.
  std::shared_ptr<Scheduler> scheduler;
  // Every replica, and the scheduler, records finished generations here
  // (set_metrics_all); thread-safe. May be null in tests.
  std::shared_ptr<RequestRateAggregator> rates;
  ComputeTier tier = ComputeTier::kCpu;
  int n_ctx = 0;  // context each replica was built with (tokens)
  // The KV block pool every replica's cache draws from (one budget per
  // model; usage() for /admin/models and the KV gauges). May be null in tests.
  std::shared_ptr<model::KvPool> kv_pool;
  uint64_t mem_bytes = 0;     // mapped bytes + the KV pool's capacity (+ recurrent states and snapshot budget)
  uint64_t created_unix = 0;  // seconds since the epoch (OpenAI `created`)
};

// State of a model in list().
enum class ModelState { kLoaded, kLoading, kFailed };
const char* model_state_name(ModelState s);  // "loaded", "loading", "failed"

// One row of list().
struct ModelInfo {
  std::string id;
  std::string path;
  ModelState state = ModelState::kLoaded;
  std::string reason;      // failure reason (kFailed)
  int in_flight = 0;       // requests holding the model
  uint64_t mem_bytes = 0;  // estimate while loading, actual once loaded
  int pool_size = 0;       // replicas (0 until loaded)
  int busy = 0;            // replicas leased right now
  int parallel = 0;        // live sequences at most (SchedulerOptions::max_sequences; 0 until loaded)
  int running = 0;         // sequences live now (the scheduler's)
  uint64_t created_unix = 0;
  // With a keep-alive (ModelPool::set_keep_alive): when the model unloads if
  // no request uses it meanwhile (in flight: its keep-alive from now).
  // nullopt: no idle expiry.
  std::optional<std::chrono::system_clock::time_point> expires_at;
  // The model's KV pool (0 when not loaded): its capacity (the budget), the
  // bytes of blocks held by sequences (running ones and cached prefixes),
  // and of those the bytes held only as prompt cache (evictable).
  uint64_t kv_capacity_bytes = 0;
  uint64_t kv_used_bytes = 0;
  uint64_t kv_cached_bytes = 0;
  uint64_t kv_pinned_bytes = 0;  // held by running sequences (kv_used_bytes - kv_cached_bytes)
  int64_t kv_block_tokens = 0;   // positions per block
  // Recurrent state of a hybrid model (qwen35; 0 otherwise): the states the
  // model's caches hold now (running sequences) and their bytes, the
  // scheduler's bound on them (SchedulerOptions::state_budget_bytes), and
  // the prompt cache's state snapshots (count, bytes, budget).
  uint64_t recurrent_state_bytes = 0;
  int64_t recurrent_states = 0;
  uint64_t recurrent_state_budget_bytes = 0;
  uint64_t state_snapshot_bytes = 0;
  uint64_t state_snapshot_budget_bytes = 0;
  int64_t state_snapshots = 0;
};

class ModelPool;

// The grace `bonsai serve` gives a model that served a request
// (ModelPool::set_recent_use_grace): for this long after its last request
// ended it is not evicted to make room for another model's request. Without
// it, two models alternating over one slot (--models-max) evict and reload
// each other on every request, each reload costing far more than the
// request. 10 s: well above a reload of a small model (so alternating
// traffic gets a 503 + Retry-After rather than thrashing), short enough that
// a model nobody uses any more gives its slot up promptly.
inline constexpr std::chrono::seconds kRecentUseGrace{10};

// One request's use of a model from ModelPool::acquire / acquire_loaded
// (RAII): while it lives the model is counted in flight, so it is neither
// freed nor its memory uncounted, even if it is evicted or unloaded
// meanwhile (requests in flight finish on it). Dropping the handle (or
// release()) ends the use. Move-only; the ModelPool must outlive it. Not
// thread-safe itself (one owner), but handles to one model may live on any
// threads.
class ModelHandle {
 public:
  ModelHandle() = default;
  ModelHandle(ModelHandle&& other) noexcept;
  ModelHandle& operator=(ModelHandle&& other) noexcept;
  ModelHandle(const ModelHandle&) = delete;
  ModelHandle& operator=(const ModelHandle&) = delete;
  ~ModelHandle() { release(); }

  // The model (null after release() or a move).
  LoadedModel* operator->() const { return model_.get(); }
  LoadedModel& operator*() const { return *model_; }
  const std::shared_ptr<LoadedModel>& shared() const { return model_; }
  explicit operator bool() const { return model_ != nullptr; }

  // Ends the use now (idempotent).
  void release();

 private:
  friend class ModelPool;
  ModelHandle(ModelPool* pool, std::shared_ptr<LoadedModel> model) : pool_(pool), model_(std::move(model)) {}
  ModelPool* pool_ = nullptr;
  std::shared_ptr<LoadedModel> model_;
};

class ModelPool {
 public:
  // Builds a LoadedModel for `id` from `spec`. Runs without the pool's lock.
  using Loader =
      std::function<core::Expected<std::shared_ptr<LoadedModel>>(const std::string& id, const ModelSpec& spec)>;
  // Bytes a model will need once loaded (mapped file + KV caches), read
  // cheaply (e.g. the GGUF header), so room is made before loading.
  using Estimator = std::function<core::Expected<uint64_t>(const ModelSpec& spec)>;

  // `capacity`: models resident at most (0 is treated as 1). `mem_budget_mb`:
  // MiB for all resident models, 0 = unlimited.
  ModelPool(size_t capacity, uint64_t mem_budget_mb, Loader loader, Estimator estimator);
  // Joins background loads; closes every resident model's engine pool.
  ~ModelPool();
  ModelPool(const ModelPool&) = delete;
  ModelPool& operator=(const ModelPool&) = delete;

  // Registers (or replaces the spec of) a loadable model. A resident model
  // keeps its current instance until it is unloaded.
  void loader_register(const std::string& id, ModelSpec spec);
  bool is_registered(const std::string& id) const;
  // The registered spec of `id` (nullopt if not registered).
  std::optional<ModelSpec> registration(const std::string& id) const;
  std::vector<std::string> registered_ids() const;

  // A handle to model `id`, counted in flight until the handle is dropped
  // (or ModelHandle::release). A loaded model is promoted to
  // most-recently-used. Otherwise idle LRU models (none in flight, none
  // used within the recent-use grace) are evicted until it fits the
  // capacity and the budget, and it is loaded in this thread.
  // Errors: kNotFound (never registered), kResourceExhausted (loading
  // elsewhere right now -> retry later; or no room: the budget is too small
  // for it, or every model that would have to go is busy, named with why),
  // or the loader's error.
  core::Expected<ModelHandle> acquire(const std::string& id);
  // Like acquire, but never loads: kNotFound unless `id` is resident.
  core::Expected<ModelHandle> acquire_loaded(const std::string& id);

  // The resident instance of `id` (nullptr if not loaded) for read-only
  // introspection (metrics): no in-flight count, no LRU promotion.
  std::shared_ptr<const LoadedModel> peek(const std::string& id) const;

  // Unlists a loaded model and closes its engine pool (queued requests get
  // PoolError::kClosed); requests in flight finish and then free it.
  // Errors: kNotFound when `id` is not loaded; kInvalidArgument while it is loading.
  core::Expected<void> unload(const std::string& id);

  // Loaded, loading and failed models, most recently used first.
  std::vector<ModelInfo> list() const;

  // Background loads. mark_loading reserves room (evicting LRU models) for
  // `estimate_bytes` and lists `id` as loading; mark_ready installs the
  // loaded model (MRU); mark_failed lists it as failed with `reason`.
  // Errors of mark_loading: kNotFound (not registered), kInvalidArgument
  // (already loaded or loading), kResourceExhausted (cannot make room).
  // mark_ready/mark_failed: kInvalidArgument if `id` is not loading.
  core::Expected<void> mark_loading(const std::string& id, uint64_t estimate_bytes);
  core::Expected<void> mark_ready(const std::string& id, std::shared_ptr<LoadedModel> model);
  core::Expected<void> mark_failed(const std::string& id, std::string reason);

  // Starts loading `id` on a background thread (estimate, mark_loading,
  // loader, then mark_ready or mark_failed) and returns at once.
  // Errors: those of mark_loading and of the estimator.
  core::Expected<void> load_in_background(const std::string& id);
  // Registers `id` as `spec` and loads it in the background, as one step
  // that a failure leaves without effect: the registry changes only if the
  // load starts (an id that is loaded or loading is refused with
  // kInvalidArgument before anything changes; an estimator or mark_loading
  // error restores the previous registration), and if the background load
  // then fails, the previous registration comes back (or, for a new id,
  // the id is unregistered) while list() shows the failure and its reason.
  // So a rejected or failed (admin) load never re-points a served id.
  core::Expected<void> load_in_background(const std::string& id, ModelSpec spec);
  // Waits for every background load started so far (tests, shutdown).
  void wait_background();
  // Background-load threads not joined yet (running, or finished since the
  // last load started). Bounded by the loads in progress + finished ones
  // not yet reaped; for tests.
  size_t background_threads() const;

  // Bytes of resident models plus unlisted ones still in flight; loading
  // models count with their estimate.
  uint64_t current_mem_bytes() const;
  size_t capacity() const { return capacity_; }
  uint64_t mem_budget_bytes() const { return budget_bytes_; }
  // Number of models loaded (ready) right now.
  size_t loaded_count() const;

  // Closes every resident model's engine pool (shutdown): waiters get kClosed.
  void close_all();

  // No eviction for another model's on-demand acquire() of a model that
  // held a request less than `grace` ago (its last acquire or release); that
  // acquire gets kResourceExhausted ("all N model slots are busy ..."). 0
  // (the default): only models in flight are protected. `bonsai serve` sets
  // kRecentUseGrace after preloading. Thread-safe.
  void set_recent_use_grace(std::chrono::steady_clock::duration grace);
  // Forgets when `id` last held a request, so the grace does not keep it:
  // for `bonsai serve`'s start-up preload, which acquires and releases each
  // model without serving anything. No effect on an unknown id.
  void forget_recent_use(const std::string& id);

  // Unloads resident model `id` (as unload()) once it has been idle (no
  // request in flight) for `idle`, counted from its last acquire or
  // release; nullopt: no expiry (the default). A zero or negative `idle`
  // unloads it as soon as it is idle; one above 10^9 s counts as 10^9 s. Applies to the resident instance: a
  // model loaded again starts without one. Thread-safe. Errors: kNotFound
  // when `id` is not loaded (loading, failed, or not resident).
  core::Expected<void> set_keep_alive(const std::string& id, std::optional<std::chrono::steady_clock::duration> idle);

  // Pins `id` against idle expiry: set_keep_alive on it succeeds and keeps
  // no timer (list()'s expires_at stays empty), whatever instance of it is
  // loaded now or later. Eviction for room and unload() still apply. Any id
  // (registered or not). Thread-safe.
  void pin(const std::string& id);
  bool pinned(const std::string& id) const;

 private:
  friend class ModelHandle;
  // The in-flight count of acquire / acquire_loaded (ModelHandle wraps them).
  core::Expected<std::shared_ptr<LoadedModel>> acquire_shared(const std::string& id);
  core::Expected<std::shared_ptr<LoadedModel>> acquire_loaded_shared(const std::string& id);
  // Ends one request's use of a model (ModelHandle's destructor / release):
  // the listed instance, or an unlisted one (evicted or unloaded meanwhile).
  // The id form picks the listed instance first, then an unlisted one.
  void release(const std::shared_ptr<LoadedModel>& model);
  void release(const std::string& id);
  // What a failed load was tried on: the file, its size and mtime then (a
  // split model's part: folded with its sibling parts'), and the loader's
  // error code. An on-demand acquire() of a failed model whose
  // file is unchanged fails fast with the recorded error instead of loading
  // again, which would first evict a healthy LRU model to make room.
  struct FailedLoad {
    std::string path;
    bool exists = false;
    uint64_t size = 0;
    int64_t mtime = 0;  // file_time_type ticks
    core::Errc code = core::Errc::kInternal;
  };
  static FailedLoad stamp_failed_load(const std::string& path, core::Errc code);

  struct Entry {
    std::string id;
    ModelState state = ModelState::kLoading;
    std::shared_ptr<LoadedModel> model;  // set when kLoaded
    std::string reason;                  // kFailed
    std::optional<FailedLoad> failed;    // kFailed by the loader (see FailedLoad)
    uint64_t bytes = 0;                  // estimate while loading, actual once loaded
    int in_flight = 0;
    uint64_t last_used = 0;  // tick_ value of the last acquire
    // When a request last acquired or released it (set_recent_use_grace).
    std::chrono::steady_clock::time_point last_active{};
    bool on_demand = false;  // kLoading for an acquire() (not an admin load): the grace applies to its room
    // set_keep_alive: unloaded once idle this long after last_active.
    std::optional<std::chrono::steady_clock::duration> keep_alive;
  };

  // Who room is made for: a request's on-demand load (acquire), where the
  // recent-use grace protects other models, or an admin / background load.
  enum class RoomFor { kRequest, kAdminLoad };

  // Evicts idle loaded models other than `id`, least recently used first,
  // until one more model of `bytes` fits (for kRequest: only those idle for
  // the recent-use grace). Never evicts a model in flight or loading. Fails
  // with kResourceExhausted, evicting nothing, when it cannot fit: the
  // message names `id`, what is short (slots or budget) and the models
  // holding it and why (requests in flight, loading, recently used).
  // Requires mu_ held.
  core::Expected<void> make_room_locked(const std::string& id, uint64_t bytes, RoomFor room);
  void evict_locked(std::map<std::string, Entry>::iterator it);
  core::Expected<void> mark_loading_locked(const std::string& id, uint64_t estimate_bytes,
                                           RoomFor room = RoomFor::kAdminLoad);
  // mark_failed for a loader error on `path` (records FailedLoad). Locks mu_.
  void loader_failed(const std::string& id, const std::string& path, const core::Error& error);
  // Starts the background thread that loads `id` (already marked loading)
  // from `spec`. On failure, `restore` (when set) is called under mu_ after
  // mark_failed. Requires mu_ held.
  void spawn_load_locked(const std::string& id, ModelSpec spec, std::function<void()> restore);
  // mark_ready; with `take`, also counts one request in flight (acquire).
  core::Expected<void> install(const std::string& id, std::shared_ptr<LoadedModel> model, bool take);
  uint64_t mem_locked() const;
  // The expiry thread: unloads loaded models idle past their keep-alive,
  // then sleeps until the next one is due (or expiry_cv_ wakes it).
  void expire_loop();
  size_t resident_locked() const;  // loaded + loading

  const size_t capacity_;
  const uint64_t budget_bytes_;  // 0 = unlimited
  Loader loader_;
  Estimator estimator_;

  mutable std::mutex mu_;
  std::map<std::string, ModelSpec> registry_;
  std::map<std::string, Entry> entries_;
  std::vector<Entry> zombies_;  // unlisted, still in flight
  uint64_t tick_ = 0;
  std::chrono::steady_clock::duration recent_grace_{0};  // set_recent_use_grace
  std::set<std::string> pinned_;                         // pin(): ids that take no keep-alive
  // A background load's thread and whether it has finished (then it is
  // joined by the next spawn_load_locked or by wait_background).
  struct BgLoad {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<BgLoad> bg_threads_;
  // Idle expiry (set_keep_alive): the thread (started by the first call),
  // woken when a keep-alive is set or a model with one goes idle.
  std::thread expiry_thread_;
  std::condition_variable expiry_cv_;
  bool expiry_stop_ = false;
};

// The chat template options of `spec` (jinja, chat_template, and
// chat_template_file's contents, which win over chat_template). Errors:
// kNotFound / kIo naming the file that cannot be read.
core::Expected<tokenizer::ChatTemplateOptions> chat_template_options(const ModelSpec& spec);

// The loader and estimator for real GGUF models: build_pool_from_gguf with
// the spec's pool size, context, default sampling (seed = defaults.seed) and
// Q2_0 layout, and estimate_model_bytes. The estimator also checks, without
// reading weights, everything the loader would refuse (metadata, tensors,
// Hadamard fold, tokenizer, chat template, draft model), so that a bad file
// is refused before the pool evicts idle models to make room for it.
// Defined in model_pool.cpp.
// `tune_scheduler`, if set, is called on each model's SchedulerOptions after
// they are filled from the spec and before the scheduler starts (tests use
// it to observe or hold forward steps through on_step); it runs on the
// loading thread and is copied into the loader.
ModelPool::Loader gguf_model_loader(std::function<void(SchedulerOptions&)> tune_scheduler = {});
ModelPool::Estimator gguf_model_estimator();

}  // namespace bonsai::engine
