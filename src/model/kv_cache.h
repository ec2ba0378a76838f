// KvCache: the keys and values of one sequence, for every layer, by position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "model/config.h"  // ModelConfig

namespace bonsai::model {

// Element type of the K or V half of the cache. F16 is the default, as
// llama.cpp's (-ctk/-ctv f16). kQ8_0 is ggml's block_q8_0 (fp16 d + 32 int8,
// 34 bytes per 32 values; needs a head dim that is a multiple of 32).
enum class KvType : uint8_t { kF16, kF32, kQ8_0 };

// llama.cpp's names for the -ctk/-ctv values: "f16", "f32", "q8_0".
const char* kv_type_name(KvType t);
// Parses a -ctk/-ctv value (case-sensitive, llama.cpp's spelling).
// Errors: kInvalidArgument "cache type 'q4_0' is not supported (f16, f32, q8_0)".
core::Expected<KvType> parse_kv_type(std::string_view name);
// Bytes of one cached row of n values (n a multiple of 32 for kQ8_0).
size_t kv_row_bytes(KvType t, int64_t n);

// Positions per KV block (the paging unit of KvPool): a multiple of the
// attention's 32-key block, so a 32-key block never straddles two KV blocks.
inline constexpr int64_t kKvBlockSize = 256;

class KvCache;

// KvPool: the KV memory of one model, one budget shared by every sequence
// (paged, as vLLM's block manager and llama.cpp's unified KV cache).
//
// The pool is `capacity_blocks()` blocks of `block_size()` positions each; a
// block holds, for those positions, K and V of every layer and KV head:
//   [n_layer][K: n_head_kv][block_size][row_k] [V: n_head_kv][block_size][row_v]
// so one head's positions inside a block are contiguous (attention reads
// 32-row runs). Block memory is allocated on first use and kept for reuse
// (capacity is a budget, not an up-front allocation).
//
// Blocks are reference counted: caches that share a prompt prefix (n > 1
// choices, the prompt cache) hold the same blocks; a write into a shared
// block copies it first (copy-on-write, KvCache::prepare). A cache that is
// idle can be *parked* (KvCache::park): its blocks stay cached for prefix
// reuse, but when the pool runs out of free blocks it evicts from the least
// recently parked cache (its last blocks first). Blocks referenced by an
// unparked cache ("pinned") are never evicted.
//
// Thread-safe: one mutex guards counts, the free list and parked tables.
// Shared through std::shared_ptr by the caches that use it.
class KvPool {
 public:
  // A pool of ceil(capacity_positions / block_size) blocks for `config`'s
  // layers and KV heads. Errors: kInvalidArgument (capacity < 1, block size
  // not a positive multiple of 32, no layers/heads, q8_0 with head dims not
  // multiples of 32, more than 2^31-1 blocks).
  static core::Expected<std::shared_ptr<KvPool>> create(const ModelConfig& config, int64_t capacity_positions,
                                                        KvType type_k, KvType type_v,
                                                        int64_t block_size = kKvBlockSize);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  int64_t block_size() const { return bs_; }             // positions per block
  int64_t capacity_blocks() const { return capacity_; }  // the budget in blocks
  uint64_t block_bytes() const { return block_bytes_; }  // bytes of one block (K and V, all layers)
  uint64_t capacity_bytes() const { return block_bytes_ * static_cast<uint64_t>(capacity_); }
  KvType type_k() const { return type_k_; }
  KvType type_v() const { return type_v_; }
  // Blocks needed for `positions` positions: ceil(positions / block_size).
  int64_t blocks_for(int64_t positions) const { return positions <= 0 ? 0 : (positions + bs_ - 1) / bs_; }

  // Point-in-time counts (under the mutex).
  struct Usage {
    int64_t capacity = 0;   // blocks in the budget
    int64_t used = 0;       // blocks referenced by some cache (parked ones included)
    int64_t pinned = 0;     // blocks referenced by an unparked (running) cache: never evicted
    int64_t cached = 0;     // used - pinned: held only by parked caches (evictable, LRU)
    int64_t allocated = 0;  // blocks whose memory has been allocated so far
  };
  Usage usage() const;
  // Blocks a new allocation can get now: free ones plus evictable ones
  // (capacity - pinned).
  int64_t available_blocks() const;
  // Blocks evicted from parked caches so far.
  uint64_t evictions() const;

  // Whether caches of this pool fit a model with these dimensions.
  bool matches(const ModelConfig& c) const {
    return n_layer_ == c.n_layer && n_head_kv_ == c.n_head_kv && head_dim_k_ == c.head_dim_k &&
           head_dim_v_ == c.head_dim_v;
  }

 private:
  friend class KvCache;
  struct Table;
  KvPool() = default;
  // All below: call with mu_ held.
  int32_t alloc_locked();  // a block with refs 1 (active), or -1 (full after eviction)
  void retain_locked(int32_t id, bool active);
  void release_locked(int32_t id, bool active);
  bool evict_one_locked();  // drops one block reference of the LRU parked cache
  void drop_tail_locked(Table& t, int64_t keep_blocks, bool active);

  mutable std::mutex mu_;
  int64_t bs_ = kKvBlockSize;
  int64_t capacity_ = 0;
  uint64_t block_bytes_ = 0;
  KvType type_k_ = KvType::kF16, type_v_ = KvType::kF16;
  int64_t n_layer_ = 0, n_head_kv_ = 0, head_dim_k_ = 0, head_dim_v_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>> mem_;  // [capacity]: allocated on first use
  std::vector<int32_t> refs_;                    // [capacity]: caches holding the block
  std::vector<int32_t> active_;                  // [capacity]: unparked caches holding it
  std::vector<int32_t> free_;                    // ids with refs 0 (allocated ones last, reused first)
  int64_t pinned_ = 0;                           // blocks with active_ > 0
  int64_t used_ = 0;                             // blocks with refs_ > 0
  int64_t allocated_ = 0;
  uint64_t evictions_ = 0;
  std::list<Table*> parked_;  // least recently parked first
};

// One cache's block table (KvCache holds it on the heap so the pool's parked
// list can point at it while the cache moves).
struct KvPool::Table {
  std::vector<int32_t> ids;           // block ids, position p in ids[p / block_size]
  std::vector<uint8_t*> ptrs;         // their memory, same order
  int64_t size = 0;                   // positions held
  bool parked = false;                // guarded by the pool's mutex
  std::list<Table*>::iterator where;  // in KvPool::parked_ while parked
};

// Per-sequence KV cache: a block table into a KvPool. Position p of layer l,
// KV head h lives in block table[p / B] at row (h * B + p % B) of that
// layer's K (or V) part (B = the pool's block size, see KvPool).
//
// size() is the number of positions held (0..size()-1 are valid). forward()
// writes a sequence's tokens at positions p0..p0+m-1 with p0 <= size()
// (p0 < size() overwrites, i.e. drops positions >= p0 first), and then
// size() == p0 + m; it calls prepare() first, which allocates the blocks.
// Not thread-safe: one user at a time per cache (the pool itself is).
// Movable, not copyable.
class KvCache {
 public:
  // A standalone cache of n_ctx positions for `config`'s layers and KV
  // heads, K in type_k and V in type_v: its own private pool (block size
  // min(kKvBlockSize, n_ctx rounded up to 32)) with every block attached
  // up front, so any position < n_ctx can be written (rows are written
  // before they are read; memory is not zero-filled).
  // Errors: kInvalidArgument if n_ctx < 1 or n_ctx > 2^31-1, or kQ8_0 for a
  // head dim that is not a multiple of 32; kResourceExhausted if the
  // allocation fails.
  static core::Expected<KvCache> create(const ModelConfig& config, int64_t n_ctx, KvType type_k, KvType type_v);
  // Both halves in `type`.
  static core::Expected<KvCache> create(const ModelConfig& config, int64_t n_ctx, KvType type = KvType::kF16) {
    return create(config, n_ctx, type, type);
  }
  // A paged cache of at most n_ctx positions in the shared `pool`: it holds
  // no block until prepare() (or forward()) needs one. Errors:
  // kInvalidArgument (null pool, n_ctx < 1 or > 2^31-1).
  static core::Expected<KvCache> create(std::shared_ptr<KvPool> pool, int64_t n_ctx);
  // Bytes one position takes in every layer (K and V of all KV heads). Used
  // by memory budgets.
  static uint64_t bytes_per_position(const ModelConfig& config, KvType type_k, KvType type_v);

  KvCache() = default;
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&& o) noexcept;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache();  // releases its blocks

  int64_t n_ctx() const { return n_ctx_; }            // capacity in positions (per sequence)
  int64_t size() const { return t_ ? t_->size : 0; }  // positions currently held
  KvType type() const { return type_k_; }             // K's type (== V's unless created with two)
  KvType type_k() const { return type_k_; }
  KvType type_v() const { return type_v_; }
  // Bytes of the blocks this cache references (a standalone cache: all of
  // its private pool; shared blocks are counted by each holder).
  size_t bytes() const;
  int64_t block_size() const { return bs_; }
  int64_t blocks() const { return t_ ? static_cast<int64_t>(t_->ids.size()) : 0; }  // blocks referenced now
  const std::shared_ptr<KvPool>& pool() const { return pool_; }
  bool paged() const { return pool_ != nullptr && !fixed_; }  // blocks come and go (shared pool)

  // Forget every position (a paged cache gives its blocks back).
  void clear() { truncate(0); }
  // Keep positions 0..n-1; a paged cache gives back blocks wholly past n.
  void truncate(int64_t n);

  // Makes positions [from, end) writable: blocks are attached up to `end`
  // (from the pool, evicting parked caches' blocks if none is free), and a
  // shared block among those covering [from, end) is copied first
  // (copy-on-write). Requires from <= size(), end <= n_ctx(). Errors:
  // kInvalidArgument (bad range), kResourceExhausted "KV cache full" (the
  // pool has no free or evictable block; blocks attached by this call are
  // given back, the cache is unchanged).
  core::Expected<void> prepare(int64_t from, int64_t end);
  // Blocks prepare(size(), end) would have to take from the pool (new
  // blocks plus a copy of a shared last block).
  int64_t blocks_needed(int64_t end) const;

  // Makes this cache hold positions [0, n) of `src` (same model dimensions
  // and types, n <= src.size(), n <= n_ctx()): in the same pool the blocks
  // are shared (reference counted, copied on a later write), otherwise the
  // rows are copied. Errors: kInvalidArgument (mismatch), kResourceExhausted
  // (copying needs blocks the pool lacks).
  core::Expected<void> copy_prefix_from(const KvCache& src, int64_t n);

  // Parks the cache (it is idle: its blocks become evictable, least recently
  // parked first, and size() may shrink while parked) / takes it back
  // (its blocks are pinned again). No effect on a standalone cache.
  void park();
  void unpark();
  bool parked() const;

  // Raw access for the forward pass. K of layer l, KV head h, position p
  // starts at k_row(l, h, p) and takes k_row_bytes() bytes (type_k()); the
  // rows of positions p, p+1, ... of one head follow each other within a
  // block (so a 32-position run aligned to 32 is contiguous). The block of p
  // must be attached (p < blocks() * block_size(); prepare()).
  size_t k_row_bytes() const { return row_k_; }
  size_t v_row_bytes() const { return row_v_; }
  uint8_t* k_row(int64_t layer, int64_t head, int64_t pos) {
    return t_->ptrs[static_cast<size_t>(pos / bs_)] + static_cast<size_t>(layer) * layer_bytes_ +
           static_cast<size_t>(head * bs_ + pos % bs_) * row_k_;
  }
  uint8_t* v_row(int64_t layer, int64_t head, int64_t pos) {
    return t_->ptrs[static_cast<size_t>(pos / bs_)] + static_cast<size_t>(layer) * layer_bytes_ + v_off_ +
           static_cast<size_t>(head * bs_ + pos % bs_) * row_v_;
  }
  const uint8_t* k_row(int64_t layer, int64_t head, int64_t pos) const {
    return const_cast<KvCache*>(this)->k_row(layer, head, pos);
  }
  const uint8_t* v_row(int64_t layer, int64_t head, int64_t pos) const {
    return const_cast<KvCache*>(this)->v_row(layer, head, pos);
  }
  void set_size(int64_t n);  // forward() only (positions [0, n) written and attached)

  // Whether this cache was made for a model with these dimensions.
  bool matches(const ModelConfig& c) const {
    return n_layer_ == c.n_layer && n_head_kv_ == c.n_head_kv && head_dim_k_ == c.head_dim_k &&
           head_dim_v_ == c.head_dim_v;
  }
  // Same dimensions and K/V types as `o` (rows can be copied between them).
  bool matches_cache(const KvCache& o) const {
    return n_layer_ == o.n_layer_ && n_head_kv_ == o.n_head_kv_ && head_dim_k_ == o.head_dim_k_ &&
           head_dim_v_ == o.head_dim_v_ && type_k_ == o.type_k_ && type_v_ == o.type_v_;
  }

 private:
  void release_all();
  static core::Expected<KvCache> make(std::shared_ptr<KvPool> pool, int64_t n_ctx);

  std::shared_ptr<KvPool> pool_;
  std::unique_ptr<KvPool::Table> t_;  // heap-held: the pool's parked list points at it
  bool fixed_ = false;                // standalone: every block attached for life
  KvType type_k_ = KvType::kF16;
  KvType type_v_ = KvType::kF16;
  int64_t n_ctx_ = 0;
  int64_t bs_ = kKvBlockSize;
  int64_t n_layer_ = 0;
  int64_t n_head_kv_ = 0;
  int64_t head_dim_k_ = 0;
  int64_t head_dim_v_ = 0;
  size_t row_k_ = 0;  // bytes of one K row (one head, one position)
  size_t row_v_ = 0;
  size_t layer_bytes_ = 0;  // K + V bytes of one layer within a block
  size_t v_off_ = 0;        // offset of V within a layer of a block
};

}  // namespace bonsai::model
