#include "model/kv_cache.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>

namespace bonsai::model {

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::kF16:
      return "f16";
    case KvType::kF32:
      return "f32";
    case KvType::kQ8_0:
      return "q8_0";
  }
  return "?";
}

core::Expected<KvType> parse_kv_type(std::string_view name) {
  for (KvType t : {KvType::kF16, KvType::kF32, KvType::kQ8_0}) {
    if (name == kv_type_name(t)) return t;
  }
  return core::fail(core::Errc::kInvalidArgument,
                    "cache type '" + std::string(name) + "' is not supported (f16, f32, q8_0)");
}

size_t kv_row_bytes(KvType t, int64_t n) {
  switch (t) {
    case KvType::kF16:
      return static_cast<size_t>(n) * 2;
    case KvType::kF32:
      return static_cast<size_t>(n) * 4;
    case KvType::kQ8_0:
      return static_cast<size_t>(n / 32) * 34;  // block_q8_0: fp16 d + 32 int8
  }
  return 0;
}

uint64_t KvCache::recurrent_bytes(const ModelConfig& c) {
  return static_cast<uint64_t>(c.n_recurrent_layer()) * static_cast<uint64_t>(c.recurrent_floats_per_layer()) *
         sizeof(float);
}

uint64_t KvCache::bytes_per_position(const ModelConfig& c, KvType type_k, KvType type_v) {
  return static_cast<uint64_t>(c.n_kv_layer()) * static_cast<uint64_t>(c.n_head_kv) *
         (kv_row_bytes(type_k, c.head_dim_k) + kv_row_bytes(type_v, c.head_dim_v));
}

namespace {

core::Expected<void> check_dims(const ModelConfig& config, KvType type_k, KvType type_v) {
  if (config.n_kv_layer() <= 0 || config.n_head_kv <= 0 || config.head_dim_k <= 0 || config.head_dim_v <= 0) {
    return core::fail(core::Errc::kInvalidArgument, "KV cache: model config has no layers/heads");
  }
  if ((type_k == KvType::kQ8_0 && config.head_dim_k % 32 != 0) ||
      (type_v == KvType::kQ8_0 && config.head_dim_v % 32 != 0)) {
    return core::fail(core::Errc::kInvalidArgument,
                      "KV cache: cache type q8_0 needs head dims that are multiples of 32 (K " +
                          std::to_string(config.head_dim_k) + ", V " + std::to_string(config.head_dim_v) + ")");
  }
  return {};
}

}  // namespace

// ---- KvPool -----------------------------------------------------------------------------

core::Expected<std::shared_ptr<KvPool>> KvPool::create(const ModelConfig& config, int64_t capacity_positions,
                                                       KvType type_k, KvType type_v, int64_t block_size) {
  if (auto ok = check_dims(config, type_k, type_v); !ok) return std::unexpected(ok.error());
  if (block_size < 32 || block_size % 32 != 0) {
    return core::fail(core::Errc::kInvalidArgument,
                      "KV pool: block size " + std::to_string(block_size) + " must be a positive multiple of 32");
  }
  if (capacity_positions < 1) {
    return core::fail(core::Errc::kInvalidArgument,
                      "KV pool: capacity " + std::to_string(capacity_positions) + " positions must be >= 1");
  }
  const int64_t blocks = capacity_positions / block_size + (capacity_positions % block_size != 0 ? 1 : 0);
  if (blocks > INT32_MAX) {
    return core::fail(core::Errc::kInvalidArgument, "KV pool: " + std::to_string(blocks) + " blocks exceed 2^31-1");
  }
  const long double bb = static_cast<long double>(config.n_kv_layer()) * config.n_head_kv * block_size *
                         (kv_row_bytes(type_k, config.head_dim_k) + kv_row_bytes(type_v, config.head_dim_v));
  if (bb * blocks > static_cast<long double>(SIZE_MAX / 2)) {
    return core::fail(core::Errc::kResourceExhausted, "KV pool: size overflows");
  }
  std::shared_ptr<KvPool> p(new KvPool());
  p->bs_ = block_size;
  p->capacity_ = blocks;
  p->block_bytes_ = static_cast<uint64_t>(bb);
  p->type_k_ = type_k;
  p->type_v_ = type_v;
  p->n_layer_ = config.n_kv_layer();
  p->rec_layers_ = config.n_recurrent_layer();
  p->rec_floats_ = config.recurrent_floats_per_layer();
  p->n_head_kv_ = config.n_head_kv;
  p->head_dim_k_ = config.head_dim_k;
  p->head_dim_v_ = config.head_dim_v;
  p->mem_.resize(static_cast<size_t>(blocks));
  p->refs_.assign(static_cast<size_t>(blocks), 0);
  p->active_.assign(static_cast<size_t>(blocks), 0);
  p->index_.resize(static_cast<size_t>(blocks));
  p->state_bytes_ = KvCache::recurrent_bytes(config);
  if (p->rec_layers_ > 0) p->snap_.resize(static_cast<size_t>(blocks));
  p->free_.reserve(static_cast<size_t>(blocks));
  for (int64_t i = blocks; i-- > 0;) p->free_.push_back(static_cast<int32_t>(i));  // 0 handed out first
  return p;
}

KvPool::~KvPool() = default;

KvPool::Usage KvPool::usage() const {
  std::lock_guard lock(mu_);
  return Usage{.capacity = capacity_,
               .used = used_,
               .pinned = pinned_,
               .cached = used_ - pinned_,
               .allocated = allocated_,
               .indexed = indexed_};
}

int64_t KvPool::available_blocks() const {
  std::lock_guard lock(mu_);
  return capacity_ - pinned_;
}

uint64_t KvPool::evictions() const {
  std::lock_guard lock(mu_);
  return evictions_;
}

void KvPool::set_snapshot_budget(uint64_t bytes) {
  std::lock_guard lock(mu_);
  if (rec_layers_ == 0) return;
  snap_budget_ = bytes;
  while (snaps_ > 0 && static_cast<uint64_t>(snaps_) * state_bytes_ > snap_budget_) {
    drop_snapshot_locked(snap_lru_.front());
    ++snap_evictions_;
  }
}

uint64_t KvPool::snapshot_budget() const {
  std::lock_guard lock(mu_);
  return snap_budget_;
}

KvPool::StateUsage KvPool::state_usage() const {
  std::lock_guard lock(mu_);
  const int64_t states = states_.load(std::memory_order_relaxed);
  return StateUsage{.states = states,
                    .state_bytes = static_cast<uint64_t>(states) * state_bytes_,
                    .snapshots = snaps_,
                    .snapshot_bytes = static_cast<uint64_t>(snaps_) * state_bytes_,
                    .snapshot_budget = snap_budget_,
                    .snapshot_hits = snap_hits_,
                    .snapshot_stores = snap_stores_,
                    .snapshot_evictions = snap_evictions_};
}

int32_t KvPool::indexed_block_locked(uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const {
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  const Entry& e = index_[static_cast<size_t>(it->second)];
  if (e.parent != parent || e.tokens.size() != tokens.size() || static_cast<int64_t>(tokens.size()) != bs_ ||
      !std::equal(tokens.begin(), tokens.end(), e.tokens.begin())) {
    return -1;
  }
  return it->second;
}

bool KvPool::store_snapshot_locked(int32_t id, std::shared_ptr<const float[]> state, const Table* owner) {
  if (state_bytes_ == 0 || snap_budget_ < state_bytes_) return false;
  Snapshot& sn = snap_[static_cast<size_t>(id)];
  if (sn.state) return false;
  while (static_cast<uint64_t>(snaps_ + 1) * state_bytes_ > snap_budget_ && !snap_lru_.empty()) {
    drop_snapshot_locked(snap_lru_.front());
    ++snap_evictions_;
  }
  sn.state = std::move(state);
  sn.owner = owner;
  sn.lru = snap_lru_.insert(snap_lru_.end(), id);
  ++snaps_;
  ++snap_stores_;
  return true;
}

void KvPool::drop_snapshot_locked(int32_t id) {
  if (snap_.empty()) return;
  Snapshot& sn = snap_[static_cast<size_t>(id)];
  if (!sn.state) return;
  snap_lru_.erase(sn.lru);
  sn.state.reset();
  sn.owner = nullptr;
  --snaps_;
}

void KvPool::touch_snapshot_locked(int32_t id) {
  Snapshot& sn = snap_[static_cast<size_t>(id)];
  if (sn.state) snap_lru_.splice(snap_lru_.end(), snap_lru_, sn.lru);
}

void KvPool::disown_locked(Table& t) {
  if (t.snap >= 0 && !snap_.empty()) {
    Snapshot& sn = snap_[static_cast<size_t>(t.snap)];
    if (sn.state && sn.owner == &t) sn.owner = nullptr;
  }
  t.snap = -1;
  t.fork_at = -1;
}

int64_t KvPool::match_snapshot_locked(std::span<const int32_t> tokens, int64_t limit, std::vector<int32_t>* ids_out,
                                      std::vector<uint64_t>* keys_out, int64_t* kv_full) const {
  std::vector<int32_t> ids;
  std::vector<uint64_t> keys;
  match_locked(tokens, limit, &ids, &keys);
  // Whole blocks only, back to the last one that has a snapshot.
  size_t j = keys.size();
  if (kv_full) *kv_full = static_cast<int64_t>(j) * bs_;
  while (j > 0 && (snap_.empty() || !snap_[static_cast<size_t>(ids[j - 1])].state)) --j;
  ids.resize(j);
  keys.resize(j);
  if (ids_out) *ids_out = std::move(ids);
  if (keys_out) *keys_out = std::move(keys);
  return static_cast<int64_t>(j) * bs_;
}

int32_t KvPool::alloc_locked() {
  // A free block; else the least recently released cached-free one; else
  // evict from parked caches (which may free a block or make one cached free).
  while (free_.empty()) {
    if (!lru_.empty()) {
      const int32_t id = lru_.front();
      unindex_locked(id);  // cached free -> free
      ++evictions_;
      continue;
    }
    if (!evict_one_locked()) return -1;
  }
  const int32_t id = free_.back();
  auto& mem = mem_[static_cast<size_t>(id)];
  if (!mem) {
    mem.reset(new (std::nothrow) uint8_t[block_bytes_]);  // default-initialised: no zero fill
    if (!mem) return -2;
    ++allocated_;
  }
  free_.pop_back();
  refs_[static_cast<size_t>(id)] = 1;
  active_[static_cast<size_t>(id)] = 1;
  ++used_;
  ++pinned_;
  return id;
}

void KvPool::retain_locked(int32_t id, bool active) {
  const auto i = static_cast<size_t>(id);
  if (refs_[i]++ == 0) {
    if (indexed_locked(id)) {
      lru_.erase(index_[i].lru);  // cached free -> referenced (already counted in used_)
    } else {
      ++used_;
    }
  }
  if (active && active_[i]++ == 0) ++pinned_;
}

void KvPool::release_locked(int32_t id, bool active) {
  const auto i = static_cast<size_t>(id);
  if (active && --active_[i] == 0) --pinned_;
  if (--refs_[i] == 0) {
    if (indexed_locked(id)) {
      index_[i].lru = lru_.insert(lru_.end(), id);  // cached free: still used_, evictable
    } else {
      --used_;
      free_.push_back(id);
    }
  }
}

uint64_t KvPool::prefix_key(uint64_t parent, std::span<const int32_t> tokens) {
  auto splitmix64 = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  uint64_t h = splitmix64(parent);
  for (int32_t t : tokens) h = splitmix64(h ^ static_cast<uint32_t>(t));
  return h;
}

void KvPool::index_locked(int32_t id, uint64_t key, uint64_t parent, std::span<const int32_t> tokens) {
  Entry& e = index_[static_cast<size_t>(id)];
  if (tokens.empty()) return;
  if (!e.tokens.empty()) {
    const bool extends = e.parent == parent && e.tokens.size() < tokens.size() &&
                         std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin());
    if (!extends) return;  // indexed already (this key, or another chain's): keep it
    unindex_locked(id);    // a longer entry replaces it (refs > 0: stays referenced)
  }
  if (by_key_.contains(key)) return;  // another block holds this content: keep the first
  e.key = key;
  e.parent = parent;
  e.tokens.assign(tokens.begin(), tokens.end());
  by_key_.emplace(key, id);
  children_.emplace(prefix_key(parent, tokens.first(1)), id);
  ++indexed_;
  if (refs_[static_cast<size_t>(id)] == 0) e.lru = lru_.insert(lru_.end(), id);
}

void KvPool::unindex_locked(int32_t id) {
  Entry& e = index_[static_cast<size_t>(id)];
  if (e.tokens.empty()) return;
  drop_snapshot_locked(id);  // the state belongs to this entry's tokens
  if (auto it = by_key_.find(e.key); it != by_key_.end() && it->second == id) by_key_.erase(it);
  for (auto [it, end] = children_.equal_range(prefix_key(e.parent, std::span(e.tokens).first(1))); it != end; ++it) {
    if (it->second == id) {
      children_.erase(it);
      break;
    }
  }
  e.tokens.clear();
  e.tokens.shrink_to_fit();
  --indexed_;
  if (refs_[static_cast<size_t>(id)] == 0) {  // was cached free
    lru_.erase(e.lru);
    --used_;
    free_.push_back(id);
  }
}

int64_t KvPool::match_locked(std::span<const int32_t> tokens, int64_t limit, std::vector<int32_t>* ids_out,
                             std::vector<uint64_t>* keys) const {
  std::vector<int32_t> own_ids;
  std::vector<int32_t>& ids = ids_out != nullptr ? *ids_out : own_ids;
  ids.clear();
  const auto n = static_cast<int64_t>(tokens.size());
  limit = std::max<int64_t>(0, limit);
  uint64_t parent = kPrefixSeed;
  int64_t at = 0;  // positions matched
  // Whole blocks, by key.
  while (at + bs_ <= n && at < limit) {
    const auto block = tokens.subspan(static_cast<size_t>(at), static_cast<size_t>(bs_));
    const uint64_t key = prefix_key(parent, block);
    const auto it = by_key_.find(key);
    if (it == by_key_.end()) break;
    const Entry& e = index_[static_cast<size_t>(it->second)];
    if (e.parent != parent || static_cast<int64_t>(e.tokens.size()) != bs_ ||
        !std::equal(block.begin(), block.end(), e.tokens.begin())) {
      break;
    }
    ids.push_back(it->second);
    if (keys) keys->push_back(key);
    parent = key;
    at += bs_;
  }
  // At most one more block, partially: the child of the last match sharing
  // the most leading tokens (at least the first) with the rest.
  if (at < n && at < limit) {
    const auto rest = tokens.subspan(static_cast<size_t>(at), static_cast<size_t>(std::min(n - at, bs_)));
    int64_t best = 0;
    int32_t best_id = -1;
    for (auto [it, end] = children_.equal_range(prefix_key(parent, rest.first(1))); it != end; ++it) {
      const Entry& e = index_[static_cast<size_t>(it->second)];
      if (e.parent != parent) continue;  // a hash collision
      const std::vector<int32_t>& et = e.tokens;
      const auto common =
          static_cast<int64_t>(std::mismatch(rest.begin(), rest.end(), et.begin(), et.end()).first - rest.begin());
      if (common > best) best = common, best_id = it->second;
    }
    if (best > 0) {
      ids.push_back(best_id);
      at += best;
    }
  }
  at = std::min(at, limit);
  // A last block adopted in part whose next write overwrites indexed
  // positions (the rest diverges inside it, or the cap falls inside it) is
  // copied first (KvCache::prepare): a whole block of memory, and one more
  // block of the budget, for those positions. Below an eighth of a block
  // (32 positions of a 256-position block) they are recomputed instead, so
  // a prompt that shares only its first tokens with another (BOS, a chat
  // template's opening) takes neither.
  if (const int64_t part = at % bs_; part != 0 && part < bs_ / 8) {
    const int32_t id = ids[static_cast<size_t>(at / bs_)];
    if (static_cast<int64_t>(index_[static_cast<size_t>(id)].tokens.size()) > part) at -= part;
  }
  ids.resize(static_cast<size_t>(blocks_for(at)));
  if (keys) keys->resize(std::min(keys->size(), static_cast<size_t>(at / bs_)));
  return at;
}

void KvPool::drop_tail_locked(Table& t, int64_t keep_blocks, bool active) {
  while (static_cast<int64_t>(t.ids.size()) > keep_blocks) {
    release_locked(t.ids.back(), active);
    t.ids.pop_back();
    t.ptrs.pop_back();
  }
  t.size = std::min(t.size, static_cast<int64_t>(t.ids.size()) * bs_);
  t.keys.resize(std::min(t.keys.size(), static_cast<size_t>(t.size / bs_)));
}

bool KvPool::evict_one_locked() {
  while (!parked_.empty()) {
    Table* t = parked_.front();
    if (t->ids.empty()) {  // nothing left to take: it leaves the list (still parked)
      parked_.pop_front();
      t->where = parked_.end();
      continue;
    }
    drop_tail_locked(*t, static_cast<int64_t>(t->ids.size()) - 1, /*active=*/false);
    ++evictions_;
    return true;
  }
  return false;
}

// ---- KvCache ----------------------------------------------------------------------------

core::Expected<KvCache> KvCache::make(std::shared_ptr<KvPool> pool, int64_t n_ctx) {
  if (pool == nullptr) return core::fail(core::Errc::kInvalidArgument, "KV cache: the pool is null");
  if (n_ctx < 1 || n_ctx > INT32_MAX) {
    return core::fail(core::Errc::kInvalidArgument,
                      "KV cache: context size " + std::to_string(n_ctx) + " must be in 1..2^31-1");
  }
  KvCache c;
  c.type_k_ = pool->type_k_;
  c.type_v_ = pool->type_v_;
  c.n_ctx_ = n_ctx;
  c.bs_ = pool->bs_;
  c.n_layer_ = pool->n_layer_;
  c.rec_layers_ = pool->rec_layers_;
  c.rec_floats_ = pool->rec_floats_;
  c.n_head_kv_ = pool->n_head_kv_;
  c.head_dim_k_ = pool->head_dim_k_;
  c.head_dim_v_ = pool->head_dim_v_;
  c.row_k_ = kv_row_bytes(c.type_k_, c.head_dim_k_);
  c.row_v_ = kv_row_bytes(c.type_v_, c.head_dim_v_);
  c.v_off_ = static_cast<size_t>(c.n_head_kv_ * c.bs_) * c.row_k_;
  c.layer_bytes_ = c.v_off_ + static_cast<size_t>(c.n_head_kv_ * c.bs_) * c.row_v_;
  c.t_ = std::make_unique<KvPool::Table>();
  c.pool_ = std::move(pool);
  c.t_->where = c.pool_->parked_.end();
  return c;
}

core::Expected<KvCache> KvCache::create(std::shared_ptr<KvPool> pool, int64_t n_ctx) {
  return make(std::move(pool), n_ctx);
}

core::Expected<KvCache> KvCache::create(const ModelConfig& config, int64_t n_ctx, KvType type_k, KvType type_v) {
  if (n_ctx < 1 || n_ctx > INT32_MAX) {
    return core::fail(core::Errc::kInvalidArgument,
                      "KV cache: context size " + std::to_string(n_ctx) + " must be in 1..2^31-1");
  }
  const int64_t bs = std::min<int64_t>(kKvBlockSize, (n_ctx + 31) / 32 * 32);
  auto pool = KvPool::create(config, n_ctx, type_k, type_v, bs);
  if (!pool) return std::unexpected(pool.error());
  auto c = make(std::move(*pool), n_ctx);
  if (!c) return std::unexpected(c.error());
  c->fixed_ = true;
  KvPool& p = *c->pool_;
  std::lock_guard lock(p.mu_);
  for (int64_t b = 0; b < p.capacity_; ++b) {
    const int32_t id = p.alloc_locked();
    if (id < 0) {
      return core::fail(core::Errc::kResourceExhausted, "KV cache: cannot allocate " +
                                                            std::to_string(p.capacity_bytes()) + " bytes for " +
                                                            std::to_string(n_ctx) + " positions");
    }
    c->t_->ids.push_back(id);
    c->t_->ptrs.push_back(p.mem_[static_cast<size_t>(id)].get());
  }
  return c;
}

KvCache& KvCache::operator=(KvCache&& o) noexcept {
  if (this != &o) {
    release_all();
    pool_ = std::move(o.pool_);
    t_ = std::move(o.t_);
    fixed_ = o.fixed_;
    type_k_ = o.type_k_;
    type_v_ = o.type_v_;
    n_ctx_ = o.n_ctx_;
    bs_ = o.bs_;
    n_layer_ = o.n_layer_;
    rec_layers_ = o.rec_layers_;
    rec_floats_ = o.rec_floats_;
    rec_ = std::move(o.rec_);
    rec_pos_ = o.rec_pos_;
    n_head_kv_ = o.n_head_kv_;
    head_dim_k_ = o.head_dim_k_;
    head_dim_v_ = o.head_dim_v_;
    row_k_ = o.row_k_;
    row_v_ = o.row_v_;
    layer_bytes_ = o.layer_bytes_;
    v_off_ = o.v_off_;
  }
  return *this;
}

KvCache::~KvCache() { release_all(); }

void KvCache::release_all() {
  free_recurrent();
  if (!pool_ || !t_) return;
  std::lock_guard lock(pool_->mu_);
  pool_->disown_locked(*t_);
  const bool active = !t_->parked;
  if (t_->parked && t_->where != pool_->parked_.end()) pool_->parked_.erase(t_->where);
  t_->where = pool_->parked_.end();
  t_->parked = false;
  pool_->drop_tail_locked(*t_, 0, active);
  t_->size = 0;
}

size_t KvCache::bytes() const {
  if (!pool_) return 0;
  const size_t rec = rec_.size() * sizeof(float);
  if (fixed_) return pool_->capacity_bytes() + rec;
  return static_cast<size_t>(blocks()) * pool_->block_bytes() + rec;
}

int64_t KvCache::resumable(int64_t n) const {
  const int64_t held = std::clamp<int64_t>(n, 0, size());
  if (rec_layers_ == 0) return held;
  return held == size() && rec_pos_ == size() ? held : 0;
}

void KvCache::truncate(int64_t n) {
  if (!t_) return;
  if (t_->parked) unpark();
  n = std::max<int64_t>(0, n);
  if (rec_layers_ > 0 && n != 0 && resumable(n) != n) n = 0;  // a recurrent state cannot rewind
  if (n >= t_->size) return;
  t_->size = n;
  if (rec_layers_ > 0) rec_pos_ = 0;
  if (fixed_) return;
  std::lock_guard lock(pool_->mu_);
  if (rec_layers_ > 0) pool_->disown_locked(*t_);  // its latest snapshot stays, kept
  pool_->drop_tail_locked(*t_, pool_->blocks_for(n), /*active=*/true);
}

bool KvCache::alloc_recurrent() {
  if (!rec_.empty()) return true;
  try {
    rec_.resize(static_cast<size_t>(rec_layers_) * static_cast<size_t>(rec_floats_));
  } catch (const std::bad_alloc&) {
    return false;
  }
  if (pool_) pool_->states_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void KvCache::free_recurrent() {
  if (rec_.empty()) return;
  rec_ = std::vector<float>();
  if (pool_) pool_->states_.fetch_sub(1, std::memory_order_relaxed);
}

void KvCache::release_recurrent() {
  if (rec_layers_ == 0) return;
  truncate(0);
  free_recurrent();
  rec_pos_ = 0;
}

void KvCache::set_size(int64_t n) {
  if (t_->parked) unpark();
  t_->size = n;
  rec_pos_ = n;
}

core::Expected<void> KvCache::begin_recurrent(int64_t from) {
  if (rec_layers_ == 0) return {};
  if (from != 0 && (from != size() || rec_pos_ != size())) {
    return core::fail(core::Errc::kInvalidArgument, "KV cache: a recurrent state continues only at position " +
                                                        std::to_string(size()) + " or restarts at 0, not at " +
                                                        std::to_string(from) +
                                                        (rec_pos_ != size() ? " (its state was dropped)" : ""));
  }
  if (!alloc_recurrent()) {
    const auto n = static_cast<size_t>(rec_layers_) * static_cast<size_t>(rec_floats_);
    return core::fail(core::Errc::kResourceExhausted,
                      "KV cache: cannot allocate " + std::to_string(n * sizeof(float)) + " bytes of recurrent state");
  }
  if (from == 0) {
    std::fill(rec_.begin(), rec_.end(), 0.0f);
    rec_pos_ = 0;  // summarises nothing until set_size
  }
  return {};
}

int64_t KvCache::blocks_needed(int64_t end) const {
  if (!t_ || fixed_) return 0;
  const int64_t have = static_cast<int64_t>(t_->ids.size());
  int64_t need = std::max<int64_t>(0, pool_->blocks_for(end) - have);
  const int64_t b = t_->size / bs_;
  if (t_->size % bs_ != 0 && b < have && end > t_->size) {
    // The copy prepare() makes of a last block that is shared or indexed past size().
    std::lock_guard lock(pool_->mu_);
    const auto id = static_cast<size_t>(t_->ids[static_cast<size_t>(b)]);
    if (pool_->refs_[id] > 1 || static_cast<int64_t>(pool_->index_[id].tokens.size()) > t_->size - b * bs_) ++need;
  }
  return need;
}

core::Expected<void> KvCache::prepare(int64_t from, int64_t end) {
  if (!t_) return core::fail(core::Errc::kInvalidArgument, "KV cache: not created");
  if (t_->parked) unpark();
  if (from < 0 || from > t_->size || end < from || end > n_ctx_) {
    return core::fail(core::Errc::kInvalidArgument, "KV cache: cannot prepare positions [" + std::to_string(from) +
                                                        ", " + std::to_string(end) + ") of a cache holding " +
                                                        std::to_string(t_->size) + " of " + std::to_string(n_ctx_));
  }
  if (from == end || fixed_) return {};
  KvPool& p = *pool_;
  std::lock_guard lock(p.mu_);
  KvPool::Table& t = *t_;
  const auto old_n = static_cast<int64_t>(t.ids.size());
  const int64_t want = p.blocks_for(end);
  auto full = [&](int32_t why) -> core::Expected<void> {
    p.drop_tail_locked(t, old_n, /*active=*/true);
    if (why == -2) {
      return core::fail(core::Errc::kResourceExhausted,
                        "KV cache: cannot allocate a block of " + std::to_string(p.block_bytes_) + " bytes");
    }
    return core::fail(core::Errc::kResourceExhausted,
                      "KV cache full: positions up to " + std::to_string(end) + " need " +
                          std::to_string(want - old_n) + " more blocks of " + std::to_string(p.bs_) +
                          " positions, and all " + std::to_string(p.capacity_) + " blocks of the pool are in use");
  };
  // Positions >= from are rewritten: blocks from from / B on are no longer
  // published by this cache.
  t.keys.resize(std::min(t.keys.size(), static_cast<size_t>(from / bs_)));
  // Copy-on-write of the blocks this write touches that someone else may
  // read: shared ones (a shared last block) and indexed ones whose indexed
  // positions this write overwrites (the prefix index is a reader too: a
  // prompt adopted up to a cap inside a cached block writes its next token
  // into a copy, and the cached block stays findable for the next request).
  // Appending past a partial entry writes in place: its positions stay.
  for (int64_t b = from / bs_; b < std::min(old_n, want); ++b) {
    const int32_t old = t.ids[static_cast<size_t>(b)];
    const bool overwrites_indexed =
        static_cast<int64_t>(p.index_[static_cast<size_t>(old)].tokens.size()) > from - b * bs_;
    const bool shared = p.refs_[static_cast<size_t>(old)] > 1;
    if (!shared && !overwrites_indexed) continue;
    const int32_t id = p.alloc_locked();
    if (id < 0 && !shared) {
      // No block for the copy: the write goes in place and the cached
      // content leaves the index (only this cache held the block).
      p.unindex_locked(old);
      continue;
    }
    if (id < 0) return full(id);
    uint8_t* dst = p.mem_[static_cast<size_t>(id)].get();
    std::memcpy(dst, p.mem_[static_cast<size_t>(old)].get(), p.block_bytes_);
    p.release_locked(old, /*active=*/true);
    t.ids[static_cast<size_t>(b)] = id;
    t.ptrs[static_cast<size_t>(b)] = dst;
  }
  while (static_cast<int64_t>(t.ids.size()) < want) {
    const int32_t id = p.alloc_locked();
    if (id < 0) return full(id);
    t.ids.push_back(id);
    t.ptrs.push_back(p.mem_[static_cast<size_t>(id)].get());
  }
  return {};
}

core::Expected<void> KvCache::copy_prefix_from(const KvCache& src, int64_t n) {
  if (!t_ || !src.t_ || !src.matches_cache(*this) || n < 0 || n > src.size() || n > n_ctx_) {
    return core::fail(core::Errc::kInvalidArgument, "KV cache: cannot copy " + std::to_string(n) +
                                                        " positions (another model or cache type, "
                                                        "or more than the source holds or this cache fits)");
  }
  if (t_->parked) unpark();
  std::vector<float> rec;  // the source's recurrent state, installed once the copy succeeds
  if (rec_layers_ > 0 && n > 0) {
    // The state summarises all of the source's positions: only a copy of
    // the whole of it (up to where its state stands) is meaningful.
    if (n != src.size() || src.rec_pos_ != n || src.rec_.empty()) {
      return core::fail(core::Errc::kInvalidArgument, "KV cache: a recurrent state can only be copied whole (" +
                                                          std::to_string(n) + " of " + std::to_string(src.size()) +
                                                          " positions asked)");
    }
    try {
      rec = src.rec_;
    } catch (const std::bad_alloc&) {
      return core::fail(core::Errc::kResourceExhausted, "KV cache: cannot allocate the recurrent state copy");
    }
  }
  if (paged() && src.pool_ == pool_) {
    KvPool& p = *pool_;
    std::lock_guard lock(p.mu_);
    const int64_t nb = p.blocks_for(n);
    // Checked again under the pool's mutex: a parked source may have lost
    // trailing blocks to eviction since (another cache's prepare).
    if (src.t_->size < n || static_cast<int64_t>(src.t_->ids.size()) < nb) {
      return core::fail(core::Errc::kInvalidArgument,
                        "KV cache: the source no longer holds " + std::to_string(n) + " positions (evicted meanwhile)");
    }
    std::vector<int32_t> ids(src.t_->ids.begin(), src.t_->ids.begin() + nb);
    std::vector<uint8_t*> ptrs(src.t_->ptrs.begin(), src.t_->ptrs.begin() + nb);
    for (int32_t id : ids) p.retain_locked(id, /*active=*/true);
    p.drop_tail_locked(*t_, 0, /*active=*/true);
    t_->ids = std::move(ids);
    t_->ptrs = std::move(ptrs);
    t_->size = n;
    // Same blocks, same positions: src's published keys hold for them.
    t_->keys.assign(
        src.t_->keys.begin(),
        src.t_->keys.begin() + static_cast<ptrdiff_t>(std::min(src.t_->keys.size(), static_cast<size_t>(n / bs_))));
    if (!rec.empty()) {
      if (rec_.empty()) pool_->states_.fetch_add(1, std::memory_order_relaxed);
      rec_ = std::move(rec);
    }
    rec_pos_ = n;
    return {};
  }
  truncate(0);
  if (auto ok = prepare(0, n); !ok) return ok;
  for (int64_t l = 0; l < n_layer_; ++l) {
    for (int64_t h = 0; h < n_head_kv_; ++h) {
      for (int64_t p0 = 0; p0 < n;) {
        const int64_t run = std::min({bs_ - p0 % bs_, src.bs_ - p0 % src.bs_, n - p0});
        std::memcpy(k_row(l, h, p0), src.k_row(l, h, p0), static_cast<size_t>(run) * row_k_);
        std::memcpy(v_row(l, h, p0), src.v_row(l, h, p0), static_cast<size_t>(run) * row_v_);
        p0 += run;
      }
    }
  }
  t_->size = n;
  if (!rec.empty()) {
    if (rec_.empty() && pool_) pool_->states_.fetch_add(1, std::memory_order_relaxed);
    rec_ = std::move(rec);
  }
  rec_pos_ = n;
  return {};
}

void KvCache::park() {
  if (!paged() || !t_) return;
  KvPool& p = *pool_;
  std::lock_guard lock(p.mu_);
  if (t_->parked) return;
  t_->parked = true;
  for (int32_t id : t_->ids) {
    if (--p.active_[static_cast<size_t>(id)] == 0) --p.pinned_;
  }
  t_->where = p.parked_.insert(p.parked_.end(), t_.get());
}

void KvCache::unpark() {
  if (!pool_ || !t_) return;
  KvPool& p = *pool_;
  std::lock_guard lock(p.mu_);
  if (!t_->parked) return;
  if (t_->where != p.parked_.end()) p.parked_.erase(t_->where);
  t_->where = p.parked_.end();
  t_->parked = false;
  for (int32_t id : t_->ids) {
    if (p.active_[static_cast<size_t>(id)]++ == 0) ++p.pinned_;
  }
}

bool KvCache::parked() const {
  if (!pool_ || !t_) return false;
  std::lock_guard lock(pool_->mu_);
  return t_->parked;
}

// ---- Prefix index ---------------------------------------------------------------------

void KvCache::publish(std::span<const int32_t> tokens, bool partial_last, int64_t prompt_positions) {
  if (!paged() || !t_) return;
  const bool rec = rec_layers_ > 0;
  KvPool& p = *pool_;
  KvPool::Table& t = *t_;
  uint64_t snap_key = 0, snap_parent = 0;  // the block whose snapshot to take (rec, size() at a boundary)
  {
    std::lock_guard lock(p.mu_);
    // A recurrent cache's blocks are only adoptable with a snapshot.
    if (rec && p.snap_budget_ < p.state_bytes_) return;
    const int64_t n = std::min({t.size, static_cast<int64_t>(tokens.size()),
                                static_cast<int64_t>(t.ids.size()) * bs_});  // a parked cache may have shrunk
    auto block_tokens = [&](int64_t b, int64_t count) {
      return tokens.subspan(static_cast<size_t>(b * bs_), static_cast<size_t>(count));
    };
    while (static_cast<int64_t>(t.keys.size()) < n / bs_) {
      const auto b = static_cast<int64_t>(t.keys.size());
      const uint64_t parent = t.keys.empty() ? KvPool::kPrefixSeed : t.keys.back();
      const auto bt = block_tokens(b, bs_);
      const uint64_t key = KvPool::prefix_key(parent, bt);
      p.index_locked(t.ids[static_cast<size_t>(b)], key, parent, bt);
      t.keys.push_back(key);
    }
    if (!rec && partial_last && n % bs_ != 0) {
      const int64_t b = n / bs_;
      const uint64_t parent = t.keys.empty() ? KvPool::kPrefixSeed : t.keys.back();
      const auto bt = block_tokens(b, n % bs_);
      p.index_locked(t.ids[static_cast<size_t>(b)], KvPool::prefix_key(parent, bt), parent, bt);
    }
    if (!rec || n == 0 || n != t.size || n % bs_ != 0 || rec_pos_ != n || rec_.empty() ||
        static_cast<int64_t>(t.keys.size()) != n / bs_) {
      return;  // the state does not stand at a published boundary
    }
    const int64_t b = n / bs_ - 1;
    snap_key = t.keys.back();
    snap_parent = b > 0 ? t.keys[static_cast<size_t>(b - 1)] : KvPool::kPrefixSeed;
    const int32_t id = p.indexed_block_locked(snap_key, snap_parent, block_tokens(b, bs_));
    if (id < 0) return;  // not in the index (a collision kept it out)
    if (p.snap_[static_cast<size_t>(id)].state) {
      p.touch_snapshot_locked(id);  // this state is there already (another cache's, or ours)
      return;
    }
  }
  // The copy, outside the pool's mutex (a 27B state is ~157 MB).
  const size_t count = rec_.size();
  std::shared_ptr<float[]> copy(new (std::nothrow) float[count]);
  if (!copy) return;  // no memory for a snapshot: the cache goes on without one
  std::memcpy(copy.get(), rec_.data(), count * sizeof(float));
  std::lock_guard lock(p.mu_);
  const int64_t n = t.size;
  const int64_t b = n / bs_ - 1;
  const int32_t id = p.indexed_block_locked(snap_key, snap_parent,
                                            tokens.subspan(static_cast<size_t>(b * bs_), static_cast<size_t>(bs_)));
  if (id < 0 || p.snap_[static_cast<size_t>(id)].state) return;  // left the index, or taken meanwhile
  const bool keep = n == t.fork_at || (prompt_positions > 0 && n == prompt_positions / bs_ * bs_);
  if (!p.store_snapshot_locked(id, std::move(copy), keep ? nullptr : &t)) return;
  // The new one replaces the previous latest, unless that one is kept by now.
  if (t.snap >= 0 && t.snap != id && p.snap_[static_cast<size_t>(t.snap)].owner == &t) p.drop_snapshot_locked(t.snap);
  t.snap = keep ? -1 : id;
}

int64_t KvCache::adopt_recurrent(std::span<const int32_t> tokens, int64_t max_positions) {
  KvPool& p = *pool_;
  KvPool::Table& t = *t_;
  std::shared_ptr<const float[]> state;
  {
    std::lock_guard lock(p.mu_);
    t.fork_at = -1;
    if (p.snap_budget_ < p.state_bytes_) return 0;
    std::vector<int32_t> ids;
    std::vector<uint64_t> keys;
    int64_t kv_full = 0;
    const int64_t n = p.match_snapshot_locked(tokens, std::min(max_positions, n_ctx_), &ids, &keys, &kv_full);
    // The KV matched past the last snapshot: a prefix shared with another
    // prompt ends there; the snapshot this cache takes there is kept.
    if (kv_full > n) t.fork_at = kv_full;
    if (n <= 0) return 0;
    const int32_t last = ids.back();
    KvPool::Snapshot& sn = p.snap_[static_cast<size_t>(last)];
    state = sn.state;
    sn.owner = nullptr;  // shared now: kept
    p.touch_snapshot_locked(last);
    ++p.snap_hits_;
    const bool active = !t.parked;
    for (int32_t id : ids) {
      p.retain_locked(id, active);
      t.ids.push_back(id);
      t.ptrs.push_back(p.mem_[static_cast<size_t>(id)].get());
    }
    t.keys = std::move(keys);
    t.size = n;
  }
  if (!alloc_recurrent()) {  // no memory for the state: nothing adopted (the forward from 0 reports it)
    truncate(0);
    return 0;
  }
  std::memcpy(rec_.data(), state.get(), rec_.size() * sizeof(float));
  rec_pos_ = t.size;
  return t.size;
}

int64_t KvCache::adopt_prefix(std::span<const int32_t> tokens, int64_t max_positions) {
  if (!paged() || !t_) return 0;
  truncate(0);
  if (rec_layers_ > 0) return adopt_recurrent(tokens, max_positions);
  KvPool& p = *pool_;
  std::lock_guard lock(p.mu_);
  KvPool::Table& t = *t_;
  std::vector<int32_t> ids;
  std::vector<uint64_t> keys;
  const int64_t n = p.match_locked(tokens, std::min(max_positions, n_ctx_), &ids, &keys);
  if (n <= 0) return 0;
  const bool active = !t.parked;
  for (int32_t id : ids) {
    p.retain_locked(id, active);
    t.ids.push_back(id);
    t.ptrs.push_back(p.mem_[static_cast<size_t>(id)].get());
  }
  t.keys = std::move(keys);
  t.size = n;
  return n;
}

int64_t KvCache::cached_prefix_positions(std::span<const int32_t> tokens) const {
  if (!paged() || !t_) return 0;
  std::lock_guard lock(pool_->mu_);
  if (rec_layers_ > 0) return pool_->match_snapshot_locked(tokens, n_ctx_, nullptr, nullptr, nullptr);
  return pool_->match_locked(tokens, n_ctx_, nullptr, nullptr);
}

}  // namespace bonsai::model
