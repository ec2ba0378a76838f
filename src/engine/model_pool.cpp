// ModelPool: LRU warm pool of loaded models. See model_pool.h.
#include "engine/model_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "engine/inference_engine.h"  // InferenceEngine::set_metrics (gguf_model_loader)
#include "engine/proposer.h"          // draft_model_proposer, check_draft_tokenizer
#include "gguf/gguf.h"                // parse_split_name: a split model's parts (stamp_failed_load)
#include "model/kv_cache.h"           // KvPool (list: KV usage)
#include "model/model.h"              // Model::load (a draft model)
#include "tokenizer/tokenizer.h"      // Tokenizer::from_gguf (a draft model's)

namespace bonsai::engine {
namespace {

std::string mib(uint64_t bytes) { return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB"; }

// "10 s", "0.2 s", "1.35 s": a duration for a message.
std::string seconds_text(std::chrono::steady_clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", std::chrono::duration<double>(d).count());
  return buf;
}

uint64_t now_unix() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

}  // namespace

const char* model_state_name(ModelState s) {
  switch (s) {
    case ModelState::kLoaded:
      return "loaded";
    case ModelState::kLoading:
      return "loading";
    case ModelState::kFailed:
      return "failed";
  }
  return "unknown";
}

ModelPool::ModelPool(size_t capacity, uint64_t mem_budget_mb, Loader loader, Estimator estimator)
    : capacity_(capacity == 0 ? 1 : capacity),
      budget_bytes_(mem_budget_mb << 20),
      loader_(std::move(loader)),
      estimator_(std::move(estimator)) {}

ModelPool::~ModelPool() {
  {
    std::lock_guard lock(mu_);
    expiry_stop_ = true;
  }
  expiry_cv_.notify_all();
  if (expiry_thread_.joinable()) expiry_thread_.join();
  wait_background();
  close_all();
}

void ModelPool::loader_register(const std::string& id, ModelSpec spec) {
  std::lock_guard lock(mu_);
  registry_[id] = std::move(spec);
}

bool ModelPool::is_registered(const std::string& id) const {
  std::lock_guard lock(mu_);
  return registry_.contains(id);
}

std::optional<ModelSpec> ModelPool::registration(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = registry_.find(id);
  if (it == registry_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> ModelPool::registered_ids() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> ids;
  for (const auto& [id, spec] : registry_) ids.push_back(id);
  return ids;
}

uint64_t ModelPool::mem_locked() const {
  uint64_t total = 0;
  for (const auto& [id, e] : entries_)
    if (e.state != ModelState::kFailed) total += e.bytes;
  for (const auto& z : zombies_) total += z.bytes;
  return total;
}

size_t ModelPool::resident_locked() const {
  size_t n = 0;
  for (const auto& [id, e] : entries_) n += e.state != ModelState::kFailed;
  return n;
}

uint64_t ModelPool::current_mem_bytes() const {
  std::lock_guard lock(mu_);
  return mem_locked();
}

size_t ModelPool::loaded_count() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [id, e] : entries_) n += e.state == ModelState::kLoaded;
  return n;
}

void ModelPool::evict_locked(std::map<std::string, Entry>::iterator it) {
  Entry e = std::move(it->second);
  entries_.erase(it);
  if (e.model && e.model->pool) e.model->pool->close();
  if (e.in_flight > 0) zombies_.push_back(std::move(e));
  // Otherwise the last shared_ptr (ours, here) drops and the model is freed,
  // unless a caller still holds a released handle; that is its business.
}

core::Expected<void> ModelPool::make_room_locked(const std::string& id, uint64_t bytes, RoomFor room) {
  if (budget_bytes_ != 0 && bytes > budget_bytes_) {
    return core::fail(core::Errc::kResourceExhausted,
                      "model '" + id + "' needs " + mib(bytes) +
                          " (mapped file + KV caches) but the memory budget (--mem-budget) is only " +
                          mib(budget_bytes_) + ": it cannot be loaded even alone");
  }
  // Candidates: idle loaded models (for a request, idle for the grace too),
  // least recently used first. `held`: why each other resident model stays.
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::map<std::string, Entry>::iterator> idle;
  std::vector<std::string> held;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const Entry& e = it->second;
    if (it->first == id || e.state == ModelState::kFailed) continue;
    const std::string name = "'" + it->first + "'";
    if (e.state == ModelState::kLoading) {
      held.push_back(name + " (loading)");
    } else if (e.in_flight > 0) {
      held.push_back(name + " (" + std::to_string(e.in_flight) + (e.in_flight == 1 ? " request" : " requests") +
                     " in flight)");
    } else if (room == RoomFor::kRequest && recent_grace_.count() > 0 && now - e.last_active < recent_grace_) {
      held.push_back(name + " (served a request " + seconds_text(now - e.last_active) + " ago; a model is kept " +
                     seconds_text(recent_grace_) +
                     " after its last request so that two models do not evict each other on every request)");
    } else {
      idle.push_back(it);
    }
  }
  if (!zombies_.empty())
    held.push_back(std::to_string(zombies_.size()) + " unloaded model(s) still finishing requests");
  std::sort(idle.begin(), idle.end(), [](auto a, auto b) { return a->second.last_used < b->second.last_used; });

  // Plan first, evict only if the plan succeeds.
  size_t resident = resident_locked();
  uint64_t mem = mem_locked();
  std::vector<std::map<std::string, Entry>::iterator> victims;
  auto fits = [&] { return resident + 1 <= capacity_ && (budget_bytes_ == 0 || mem + bytes <= budget_bytes_); };
  for (size_t i = 0; !fits(); ++i) {
    if (i == idle.size()) {
      std::string busy;
      for (const auto& h : held) busy += (busy.empty() ? "" : ", ") + h;
      const std::string why = resident + 1 > capacity_
                                  ? "all " + std::to_string(capacity_) + " model slots (--models-max) are busy"
                                  : "it needs " + mib(bytes) + ", and " + mib(mem) + " of the " + mib(budget_bytes_) +
                                        " budget (--mem-budget) is held by models that cannot be evicted now";
      return core::fail(core::Errc::kResourceExhausted, "cannot make room for model '" + id + "': " + why +
                                                            (busy.empty() ? "" : ": " + busy) + "; retry later");
    }
    victims.push_back(idle[i]);
    --resident;
    mem -= idle[i]->second.bytes;
  }
  for (auto it : victims) evict_locked(it);
  return {};
}

core::Expected<std::shared_ptr<LoadedModel>> ModelPool::acquire_loaded_shared(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.state != ModelState::kLoaded)
    return core::fail(core::Errc::kNotFound, "model '" + id + "' is not loaded");
  it->second.last_used = ++tick_;
  it->second.last_active = std::chrono::steady_clock::now();
  ++it->second.in_flight;
  return it->second.model;
}

core::Expected<std::shared_ptr<LoadedModel>> ModelPool::acquire_shared(const std::string& id) {
  // Two passes: the estimate is read without the lock, so another thread may
  // have loaded (or started loading) the model meanwhile; the second look
  // under the lock decides.
  std::optional<uint64_t> estimate;
  ModelSpec spec;
  for (int pass = 0; pass < 2; ++pass) {
    {
      std::lock_guard lock(mu_);
      auto it = entries_.find(id);
      if (it != entries_.end()) {
        if (it->second.state == ModelState::kLoaded) {
          it->second.last_used = ++tick_;
          it->second.last_active = std::chrono::steady_clock::now();
          ++it->second.in_flight;
          return it->second.model;
        }
        if (it->second.state == ModelState::kLoading)
          return core::fail(core::Errc::kResourceExhausted, "model '" + id + "' is loading; retry later");
        // kFailed: try again if the file may have been fixed (it changed, or
        // the id now names another file); otherwise fail fast.
      }
      auto reg = registry_.find(id);
      if (reg == registry_.end()) return core::fail(core::Errc::kNotFound, "model '" + id + "' does not exist");
      if (it != entries_.end() && it->second.failed && it->second.failed->path == reg->second.path) {
        const FailedLoad& f = *it->second.failed;
        const FailedLoad now = stamp_failed_load(f.path, f.code);
        if (now.exists == f.exists && now.size == f.size && now.mtime == f.mtime) {
          return core::fail(
              f.code, it->second.reason + " (loading model '" + id + "' failed; not retried until its file changes)");
        }
      }
      if (estimate && reg->second.path == spec.path) {
        if (auto r = mark_loading_locked(id, *estimate, RoomFor::kRequest); !r) return std::unexpected(r.error());
        break;
      }
      spec = reg->second;
    }
    auto est = estimator_(spec);
    if (!est) return std::unexpected(est.error());
    estimate = *est;
    if (pass == 1) return core::fail(core::Errc::kResourceExhausted, "model '" + id + "' changed while loading; retry");
  }
  auto loaded = loader_(id, spec);
  if (!loaded) {
    loader_failed(id, spec.path, loaded.error());
    return std::unexpected(loaded.error());
  }
  std::shared_ptr<LoadedModel> model = *loaded;
  if (auto r = install(id, model, /*take=*/true); !r) return std::unexpected(r.error());
  return model;
}

std::shared_ptr<const LoadedModel> ModelPool::peek(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.state != ModelState::kLoaded) return nullptr;
  return it->second.model;
}

core::Expected<ModelHandle> ModelPool::acquire(const std::string& id) {
  auto m = acquire_shared(id);
  if (!m) return std::unexpected(m.error());
  return ModelHandle(this, std::move(*m));
}

core::Expected<ModelHandle> ModelPool::acquire_loaded(const std::string& id) {
  auto m = acquire_loaded_shared(id);
  if (!m) return std::unexpected(m.error());
  return ModelHandle(this, std::move(*m));
}

ModelHandle::ModelHandle(ModelHandle&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), model_(std::move(other.model_)) {}

ModelHandle& ModelHandle::operator=(ModelHandle&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::exchange(other.pool_, nullptr);
    model_ = std::move(other.model_);
  }
  return *this;
}

void ModelHandle::release() {
  if (pool_ != nullptr && model_) pool_->release(model_);
  pool_ = nullptr;
  model_.reset();
}

void ModelPool::release(const std::shared_ptr<LoadedModel>& model) {
  if (!model) return;
  std::lock_guard lock(mu_);
  auto it = entries_.find(model->id);
  if (it != entries_.end() && it->second.model == model) {
    if (it->second.in_flight > 0) --it->second.in_flight;
    it->second.last_active = std::chrono::steady_clock::now();
    if (it->second.in_flight == 0 && it->second.keep_alive) expiry_cv_.notify_all();
    return;
  }
  for (auto z = zombies_.begin(); z != zombies_.end(); ++z) {
    if (z->model != model) continue;
    if (--z->in_flight <= 0) zombies_.erase(z);
    return;
  }
}

void ModelPool::release(const std::string& id) {
  std::shared_ptr<LoadedModel> target;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(id);
    if (it != entries_.end() && it->second.in_flight > 0) {
      --it->second.in_flight;
      it->second.last_active = std::chrono::steady_clock::now();
      if (it->second.in_flight == 0 && it->second.keep_alive) expiry_cv_.notify_all();
      return;
    }
    for (const auto& z : zombies_)
      if (z.id == id) target = z.model;
  }
  if (target) release(target);
}

core::Expected<void> ModelPool::unload(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.state == ModelState::kFailed)
    return core::fail(core::Errc::kNotFound, "model '" + id + "' is not loaded");
  if (it->second.state == ModelState::kLoading)
    return core::fail(core::Errc::kInvalidArgument, "model '" + id + "' is still loading; unload it once it is ready");
  evict_locked(it);
  return {};
}

std::vector<ModelInfo> ModelPool::list() const {
  std::lock_guard lock(mu_);
  const auto steady_now = std::chrono::steady_clock::now();
  const auto system_now = std::chrono::system_clock::now();
  std::vector<std::pair<uint64_t, ModelInfo>> rows;
  for (const auto& [id, e] : entries_) {
    ModelInfo info;
    info.id = id;
    if (auto r = registry_.find(id); r != registry_.end()) info.path = r->second.path;
    info.state = e.state;
    info.reason = e.reason;
    info.in_flight = e.in_flight;
    info.mem_bytes = e.state == ModelState::kFailed ? 0 : e.bytes;
    if (e.state == ModelState::kLoaded && e.keep_alive) {
      const auto due = (e.in_flight > 0 ? steady_now : e.last_active) + *e.keep_alive;
      info.expires_at = system_now + std::chrono::duration_cast<std::chrono::system_clock::duration>(due - steady_now);
    }
    if (e.model) {
      info.path = e.model->spec.path;
      info.created_unix = e.model->created_unix;
      if (e.model->pool) {
        info.pool_size = e.model->pool->size();
        info.busy = std::max(0, info.pool_size - e.model->pool->available());
      }
      if (e.model->scheduler) {
        info.parallel = e.model->scheduler->options().max_sequences;
        info.running = static_cast<int>(e.model->scheduler->stats().running);
      }
      if (e.model->kv_pool) {
        const model::KvPool& kp = *e.model->kv_pool;
        const model::KvPool::Usage u = kp.usage();
        info.kv_capacity_bytes = kp.capacity_bytes();
        info.kv_used_bytes = static_cast<uint64_t>(u.used) * kp.block_bytes();
        info.kv_cached_bytes = static_cast<uint64_t>(u.cached) * kp.block_bytes();
        info.kv_pinned_bytes = static_cast<uint64_t>(u.pinned) * kp.block_bytes();
        info.kv_block_tokens = kp.block_size();
        if (kp.state_bytes() > 0) {
          const model::KvPool::StateUsage su = kp.state_usage();
          info.recurrent_state_bytes = su.state_bytes;
          info.recurrent_states = su.states;
          if (e.model->scheduler) info.recurrent_state_budget_bytes = e.model->scheduler->options().state_budget_bytes;
          info.state_snapshot_bytes = su.snapshot_bytes;
          info.state_snapshot_budget_bytes = su.snapshot_budget;
          info.state_snapshots = su.snapshots;
        }
      }
    }
    rows.emplace_back(e.last_used, std::move(info));
  }
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<ModelInfo> out;
  for (auto& r : rows) out.push_back(std::move(r.second));
  return out;
}

core::Expected<void> ModelPool::mark_loading(const std::string& id, uint64_t estimate_bytes) {
  std::lock_guard lock(mu_);
  return mark_loading_locked(id, estimate_bytes);
}

core::Expected<void> ModelPool::mark_loading_locked(const std::string& id, uint64_t estimate_bytes, RoomFor room) {
  if (!registry_.contains(id)) return core::fail(core::Errc::kNotFound, "model '" + id + "' is not registered");
  auto it = entries_.find(id);
  if (it != entries_.end() && it->second.state != ModelState::kFailed)
    return core::fail(core::Errc::kInvalidArgument,
                      "model '" + id + "' is already " + model_state_name(it->second.state));
  if (it != entries_.end()) entries_.erase(it);  // a failed entry is replaced
  if (auto r = make_room_locked(id, estimate_bytes, room); !r) return r;
  Entry e;
  e.id = id;
  e.state = ModelState::kLoading;
  e.bytes = estimate_bytes;
  e.last_used = ++tick_;
  // The recent-use grace protects a model that served a request: a load for
  // a request starts the clock, an admin load or `serve`'s preload does not
  // (a tester's preloaded, never used model blocked the other for 10 s).
  if (room == RoomFor::kRequest) e.last_active = std::chrono::steady_clock::now();
  e.on_demand = room == RoomFor::kRequest;
  entries_.emplace(id, std::move(e));
  return {};
}

core::Expected<void> ModelPool::mark_ready(const std::string& id, std::shared_ptr<LoadedModel> model) {
  return install(id, std::move(model), /*take=*/false);
}

core::Expected<void> ModelPool::install(const std::string& id, std::shared_ptr<LoadedModel> model, bool take) {
  std::shared_ptr<LoadedModel> rejected;  // dropped after the lock is released
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.state != ModelState::kLoading)
    return core::fail(core::Errc::kInvalidArgument, "model '" + id + "' is not loading");
  if (!model) return core::fail(core::Errc::kInternal, "mark_ready('" + id + "') without a model");
  if (model->created_unix == 0) model->created_unix = now_unix();
  Entry& e = it->second;
  if (budget_bytes_ != 0 && model->mem_bytes > e.bytes) {
    // Larger than the estimate that was reserved: make room for the real
    // size. While planning, this entry does not count (marked failed, 0 bytes).
    e.state = ModelState::kFailed;
    e.bytes = 0;
    auto r = make_room_locked(id, model->mem_bytes, e.on_demand ? RoomFor::kRequest : RoomFor::kAdminLoad);
    if (!r) {
      e.reason = r.error().message;
      rejected = std::move(model);
      return std::unexpected(r.error());
    }
  }
  e.state = ModelState::kLoaded;
  e.bytes = model->mem_bytes;
  e.model = std::move(model);
  e.reason.clear();
  e.last_used = ++tick_;
  if (e.on_demand || take) e.last_active = std::chrono::steady_clock::now();
  if (take) ++e.in_flight;
  return {};
}

core::Expected<void> ModelPool::mark_failed(const std::string& id, std::string reason) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.state != ModelState::kLoading)
    return core::fail(core::Errc::kInvalidArgument, "model '" + id + "' is not loading");
  it->second.state = ModelState::kFailed;
  it->second.reason = std::move(reason);
  it->second.bytes = 0;
  it->second.model.reset();
  return {};
}

ModelPool::FailedLoad ModelPool::stamp_failed_load(const std::string& path, core::Errc code) {
  FailedLoad f;
  f.path = path;
  f.code = code;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return f;
  const auto mtime = std::filesystem::last_write_time(path, ec);
  if (ec) return f;
  f.exists = true;
  f.size = static_cast<uint64_t>(size);
  f.mtime = static_cast<int64_t>(mtime.time_since_epoch().count());
  // A part of a split model: its siblings count too (a missing part copied in
  // later, or one replaced, is a change), folded into size and mtime.
  if (auto split = gguf::parse_split_name(path)) {
    for (int i = 1; i <= split->count; ++i) {
      if (i == split->no) continue;
      const std::string part = gguf::split_part_name(split->prefix, i, split->count);
      std::error_code pec;
      const auto psize = std::filesystem::file_size(part, pec);
      const auto ptime = pec ? std::filesystem::file_time_type{} : std::filesystem::last_write_time(part, pec);
      if (pec) continue;
      f.size += static_cast<uint64_t>(psize) + 1;  // + 1: an empty part appearing is a change too
      f.mtime =
          static_cast<int64_t>(static_cast<uint64_t>(f.mtime) * 31 +
                               static_cast<uint64_t>(ptime.time_since_epoch().count()) + static_cast<uint64_t>(i));
    }
  }
  return f;
}

void ModelPool::loader_failed(const std::string& id, const std::string& path, const core::Error& error) {
  FailedLoad stamp = stamp_failed_load(path, error.code);  // stat outside the lock
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.state != ModelState::kLoading) return;
  it->second.state = ModelState::kFailed;
  it->second.reason = error.message;
  it->second.bytes = 0;
  it->second.model.reset();
  it->second.failed = std::move(stamp);
}

core::Expected<void> ModelPool::load_in_background(const std::string& id) {
  ModelSpec spec;
  {
    std::lock_guard lock(mu_);
    auto reg = registry_.find(id);
    if (reg == registry_.end()) return core::fail(core::Errc::kNotFound, "model '" + id + "' is not registered");
    spec = reg->second;
  }
  auto estimate = estimator_(spec);
  if (!estimate) return std::unexpected(estimate.error());
  std::lock_guard lock(mu_);
  if (auto r = mark_loading_locked(id, *estimate); !r) return r;
  spawn_load_locked(id, std::move(spec), nullptr);
  return {};
}

core::Expected<void> ModelPool::load_in_background(const std::string& id, ModelSpec spec) {
  auto busy = [this](const std::string& mid) -> core::Expected<void> {
    auto it = entries_.find(mid);
    if (it != entries_.end() && it->second.state != ModelState::kFailed) {
      return core::fail(core::Errc::kInvalidArgument, "model '" + mid + "' is already " +
                                                          model_state_name(it->second.state) +
                                                          "; unload it first to load it again");
    }
    return {};
  };
  {
    std::lock_guard lock(mu_);
    if (auto r = busy(id); !r) return r;
  }
  auto estimate = estimator_(spec);  // reads the file: outside the lock
  if (!estimate) return std::unexpected(estimate.error());
  std::lock_guard lock(mu_);
  if (auto r = busy(id); !r) return r;  // loaded meanwhile
  std::optional<ModelSpec> previous;
  if (auto reg = registry_.find(id); reg != registry_.end()) previous = reg->second;
  registry_[id] = spec;
  auto restore = [this, id, spec, previous] {  // runs with mu_ held
    auto reg = registry_.find(id);
    if (reg == registry_.end() || reg->second.path != spec.path) return;  // re-registered since
    if (previous) {
      reg->second = *previous;
    } else {
      registry_.erase(reg);
    }
  };
  if (auto r = mark_loading_locked(id, *estimate); !r) {
    restore();
    return r;
  }
  spawn_load_locked(id, std::move(spec), restore);
  return {};
}

void ModelPool::spawn_load_locked(const std::string& id, ModelSpec spec, std::function<void()> restore) {
  // Join the loads that have finished: an unjoined thread keeps its stack
  // (8 MiB of address space each; a server doing admin loads for weeks ran
  // out of mappings). Their `done` is set as their last step, so these
  // joins return at once.
  std::erase_if(bg_threads_, [](BgLoad& b) {
    if (!b.done->load(std::memory_order_acquire)) return false;
    if (b.thread.joinable()) b.thread.join();
    return true;
  });
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([this, id, spec = std::move(spec), restore = std::move(restore), done] {
    auto loaded = loader_(id, spec);
    bool ready = false;
    if (loaded) {
      ready = mark_ready(id, *loaded).has_value();  // false: did not fit after all (listed as failed)
    } else {
      loader_failed(id, spec.path, loaded.error());
    }
    if (!ready && restore) {
      std::lock_guard lock(mu_);
      restore();
    }
    done->store(true, std::memory_order_release);
  });
  bg_threads_.push_back(BgLoad{std::move(t), std::move(done)});
}

size_t ModelPool::background_threads() const {
  std::lock_guard lock(mu_);
  return bg_threads_.size();
}

void ModelPool::wait_background() {
  std::vector<BgLoad> threads;
  {
    std::lock_guard lock(mu_);
    threads.swap(bg_threads_);
  }
  for (auto& b : threads)
    if (b.thread.joinable()) b.thread.join();
}

void ModelPool::set_recent_use_grace(std::chrono::steady_clock::duration grace) {
  std::lock_guard lock(mu_);
  recent_grace_ = grace;
}

void ModelPool::forget_recent_use(const std::string& id) {
  std::lock_guard lock(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) it->second.last_active = {};
}

core::Expected<void> ModelPool::set_keep_alive(const std::string& id,
                                               std::optional<std::chrono::steady_clock::duration> idle) {
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.state != ModelState::kLoaded)
      return core::fail(core::Errc::kNotFound, "model '" + id + "' is not loaded");
    // At most 10^9 s (~31 years): the due time (last use + idle) must not overflow.
    constexpr std::chrono::steady_clock::duration kLongest = std::chrono::seconds(1'000'000'000);
    if (idle) idle = std::clamp(*idle, std::chrono::steady_clock::duration::zero(), kLongest);
    if (pinned_.contains(id)) idle.reset();  // pin(): no expiry
    it->second.keep_alive = idle;
    if (idle && !expiry_thread_.joinable() && !expiry_stop_) expiry_thread_ = std::thread([this] { expire_loop(); });
  }
  expiry_cv_.notify_all();
  return {};
}

void ModelPool::pin(const std::string& id) {
  std::lock_guard lock(mu_);
  pinned_.insert(id);
  if (auto it = entries_.find(id); it != entries_.end()) it->second.keep_alive.reset();
}

bool ModelPool::pinned(const std::string& id) const {
  std::lock_guard lock(mu_);
  return pinned_.contains(id);
}

void ModelPool::expire_loop() {
  std::unique_lock lock(mu_);
  while (!expiry_stop_) {
    const auto now = std::chrono::steady_clock::now();
    std::optional<std::chrono::steady_clock::time_point> next;
    for (auto it = entries_.begin(); it != entries_.end();) {
      const Entry& e = it->second;
      if (e.state != ModelState::kLoaded || !e.keep_alive || e.in_flight > 0) {
        ++it;
        continue;
      }
      const auto due = e.last_active + *e.keep_alive;
      if (due <= now) {
        evict_locked(it++);
        continue;
      }
      if (!next || due < *next) next = due;
      ++it;
    }
    if (next) {
      expiry_cv_.wait_until(lock, *next);
    } else {
      expiry_cv_.wait(lock);
    }
  }
}

void ModelPool::close_all() {
  std::lock_guard lock(mu_);
  for (auto& [id, e] : entries_)
    if (e.model && e.model->pool) e.model->pool->close();
  for (auto& z : zombies_)
    if (z.model && z.model->pool) z.model->pool->close();
}

core::Expected<tokenizer::ChatTemplateOptions> chat_template_options(const ModelSpec& spec) {
  tokenizer::ChatTemplateOptions chat;
  chat.jinja = spec.jinja;
  chat.override_template = spec.chat_template;
  if (!spec.chat_template_file.empty()) {
    std::ifstream in(spec.chat_template_file, std::ios::binary);
    if (!in) {
      return core::fail(std::filesystem::exists(spec.chat_template_file) ? core::Errc::kIo : core::Errc::kNotFound,
                        spec.chat_template_file + ": cannot read the chat template file (--chat-template-file)");
    }
    std::stringstream ss;
    ss << in.rdbuf();
    chat.override_template = ss.str();
    if (chat.override_template.empty())
      return core::fail(core::Errc::kInvalidArgument,
                        spec.chat_template_file + ": the chat template file (--chat-template-file) is empty");
  }
  return chat;
}

ModelPool::Loader gguf_model_loader(std::function<void(SchedulerOptions&)> tune_scheduler) {
  return [tune_scheduler = std::move(tune_scheduler)](
             const std::string& id, const ModelSpec& spec) -> core::Expected<std::shared_ptr<LoadedModel>> {
    model::LoadOptions open;
    open.file.q2_layout = spec.q2_layout;
    open.repack = spec.repack;
    auto chat = chat_template_options(spec);
    if (!chat) return std::unexpected(chat.error());
    auto built = build_pool_from_gguf(spec.path, spec.defaults, spec.defaults.seed, spec.ctx_size, spec.pool_size, open,
                                      spec.kv_type_k, spec.kv_type_v, spec.kv_budget_tokens, 0, *chat);
    if (!built) return std::unexpected(built.error());
    auto m = std::make_shared<LoadedModel>();
    m->id = id;
    m->spec = spec;
    m->model = built->model;
    m->tokenizer = built->tokenizer;
    m->pool = std::make_shared<EnginePool>(std::move(built->pool));
    m->rates = std::make_shared<RequestRateAggregator>();
    m->pool->set_metrics_all([rates = m->rates](InferenceEngine& e) { e.set_metrics(rates); });
    m->tier = built->tier;
    m->n_ctx = static_cast<int>(built->n_ctx);
    m->kv_pool = built->kv_pool;
    SchedulerOptions so;
    so.batch_size = spec.batch_size > 0 ? spec.batch_size : kPrefillChunk;
    so.prompt_cache = spec.prompt_cache;
    so.step_budget_ms = std::max(0.0, spec.step_budget_ms);
    so.spec = spec.spec;
    so.kv_pool = built->kv_pool;
    so.max_sequences = spec.parallel > 0 ? spec.parallel : built->size;
    so.max_queue =
        spec.queue_factor > 0 ? static_cast<size_t>(spec.queue_factor) * static_cast<size_t>(so.max_sequences) : 0;
    if (tune_scheduler) tune_scheduler(so);
    // A hybrid model's running sequences each hold a recurrent state: their
    // memory is budgeted (and counted in mem_bytes) for max_sequences of them.
    if (so.state_budget_bytes == 0)
      so.state_budget_bytes = built->recurrent_state_bytes * static_cast<uint64_t>(std::max(1, so.max_sequences));
    // A draft model: loaded, its tokenizer checked, one proposer per sequence.
    uint64_t draft_bytes = 0;
    if (!spec.model_draft.empty() && so.spec.type == SpecType::kNone) so.spec.type = SpecType::kDraft;
    // A hybrid (qwen35) model never speculates (Sequence::propose: its
    // recurrent state cannot roll back a rejected proposal): no proposer, no
    // draft model loaded or counted. `serve` says so in its load line.
    if (built->recurrent_state_bytes > 0) so.spec.type = SpecType::kNone;
    if (so.spec.type == SpecType::kDraft) {
      if (spec.model_draft.empty())
        return core::fail(core::Errc::kInvalidArgument, "spec-type draft needs a draft model (model-draft / -md FILE)");
      if (spec.spec.type != SpecType::kNone && spec.spec.type != SpecType::kDraft)
        return core::fail(core::Errc::kInvalidArgument,
                          "model-draft is for spec-type draft, not " + std::string(spec_type_name(spec.spec.type)));
      auto draft = model::Model::load(spec.model_draft, open);
      if (!draft)
        return core::fail(draft.error().code,
                          "cannot load the draft model " + spec.model_draft + ": " + draft.error().message);
      auto draft_tok = tokenizer::Tokenizer::from_gguf((*draft)->file(), *chat);
      if (!draft_tok)
        return core::fail(draft_tok.error().code, "cannot load the tokenizer of the draft model " + spec.model_draft +
                                                      ": " + draft_tok.error().message);
      if (auto ok = check_draft_tokenizer(*built->tokenizer, spec.path, **draft_tok, spec.model_draft); !ok)
        return std::unexpected(ok.error());
      so.spec.proposer = draft_model_proposer(*draft, spec.kv_type_k, spec.kv_type_v, so.pool);
      draft_bytes =
          (*draft)->file().mapping()->size() + draft_kv_bytes(**draft, built->n_ctx, spec.kv_type_k, spec.kv_type_v) *
                                                   static_cast<uint64_t>(std::max(1, so.max_sequences));
    }
    m->scheduler = Scheduler::create(m->pool, m->model, built->n_ctx, so);
    m->mem_bytes = built->mapped_bytes + built->kv_bytes +
                   (built->recurrent_state_bytes > 0 ? so.state_budget_bytes : 0) + built->snapshot_bytes + draft_bytes;
    return m;
  };
}

namespace {

// What gguf_model_loader would refuse in spec's files, found without reading
// weights: the model's metadata, tensors and Hadamard fold (Model::load with
// no repack: views of the mapping), its tokenizer and chat template (the
// loader's options), and a draft model's file and tokenizer against it. The
// pool runs the estimator before it makes room for a load, and making room
// evicts idle models: a file refused only by the loader would have cost them
// for nothing. Errors: the loader's own, with its code and message.
core::Expected<void> precheck_model_files(const ModelSpec& spec, const model::LoadOptions& open) {
  model::LoadOptions views = open;
  views.repack = false;
  auto chat = chat_template_options(spec);
  if (!chat) return std::unexpected(chat.error());
  auto m = model::Model::load(spec.path, views);
  if (!m) return std::unexpected(m.error());
  auto tok = tokenizer::Tokenizer::from_gguf((*m)->file(), *chat);
  if (!tok) return std::unexpected(tok.error());
  if (spec.model_draft.empty() || (*m)->config().n_recurrent_layer() > 0) return {};  // (no draft for a hybrid)
  auto draft = model::Model::load(spec.model_draft, views);
  if (!draft) {
    return core::fail(draft.error().code,
                      "cannot load the draft model " + spec.model_draft + ": " + draft.error().message);
  }
  auto draft_tok = tokenizer::Tokenizer::from_gguf((*draft)->file(), *chat);
  if (!draft_tok) {
    return core::fail(draft_tok.error().code, "cannot load the tokenizer of the draft model " + spec.model_draft +
                                                  ": " + draft_tok.error().message);
  }
  return check_draft_tokenizer(**tok, spec.path, **draft_tok, spec.model_draft);
}

}  // namespace

ModelPool::Estimator gguf_model_estimator() {
  return [](const ModelSpec& spec) -> core::Expected<uint64_t> {
    model::LoadOptions open;
    open.file.q2_layout = spec.q2_layout;
    open.repack = spec.repack;
    auto bytes = estimate_model_bytes(spec.path, spec.ctx_size, spec.pool_size, open, spec.kv_type_k, spec.kv_type_v,
                                      spec.kv_budget_tokens, spec.parallel);
    if (!bytes) return bytes;
    if (auto ok = precheck_model_files(spec, open); !ok) return std::unexpected(ok.error());
    return bytes;
  };
}

}  // namespace bonsai::engine
