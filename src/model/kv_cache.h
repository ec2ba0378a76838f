// KvCache: the keys and values of one sequence, for every layer, by position.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
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
// Prefix index (vLLM's automatic prefix caching, one per model): a cache
// publishes its blocks (KvCache::publish) under a key that hashes the
// block's tokens and, through the parent key, every token before it; any
// cache of the pool can then adopt the longest published prefix of its
// prompt (KvCache::adopt_prefix), whoever computed it. A match is verified
// token by token against the copy each entry keeps, never trusted on the
// hash alone. Key of block i of a token sequence t (B = block_size()):
//   key(i) = H(key(i-1), t[iB .. iB+B))   with key(-1) = kPrefixSeed,
//   H(parent, u[0..n)) = h_n where h_0 = splitmix64(parent),
//                                  h_j = splitmix64(h_{j-1} ^ uint32(u[j-1])),
// splitmix64 being Steele, Lea & Flood's generator step (2014): x +=
// 0x9e3779b97f4a7c15, then x ^= x >> 30, x *= 0xbf58476d1ce4e5b9,
// x ^= x >> 27, x *= 0x94d049bb133111eb, x ^= x >> 31.
// A partial entry (the first c < B positions of a last block) uses the same
// H over its c tokens. A block whose last reference goes but that is in the
// index is not freed: it stays findable ("cached free") in an LRU list,
// least recently released first (a cache releases its last block first, so
// a chain's tail ages out before its parent). Allocation takes a free
// unindexed block, else the LRU cached-free block (its entry leaves the
// index; its descendants become unreachable and age out), else evicts from
// parked caches. A write over indexed positions of a block copies the block
// first (the index is one of its readers), as a write into a shared block
// does (when no block is left for the copy and no other cache holds it, the
// write goes in place and the block leaves the index); appending past a
// partial entry's positions writes in place.
//
// Recurrent-state snapshots (hybrid models, qwen35): a cached prefix of a
// model with Gated DeltaNet layers is only usable with the recurrent state
// that summarises it, and that state cannot be rebuilt from the KV blocks.
// So the pool keeps a bounded store of state copies, each attached to the
// index entry of a full block: the state of the sequence right after that
// block's last position (a block boundary). A recurrent cache's publish()
// takes one when its state stands exactly at a boundary whose block it has
// entered in the index (engine::Sequence cuts a recurrent sequence's prompt
// chunks at block boundaries so that every boundary is visited), and its
// adopt_prefix() takes the longest indexed prefix of whole blocks whose
// last block has a snapshot, restoring the state from it (never a partial
// block). A snapshot lives with its index entry: when the block leaves the
// index (reused, overwritten) the snapshot goes too, so an adopted state
// always belongs to exactly the verified tokens.
// Bounds: the store holds at most snapshot_budget() bytes (set_snapshot_budget;
// 0, the default, turns snapshots off and with them the prefix index for
// recurrent caches), least recently used snapshot evicted first. Per cache
// a running sequence keeps one replaceable snapshot, its latest boundary
// (replaced when it reaches the next one), plus kept ones: the last boundary
// of its prompt (publish's prompt_positions), the boundary where its adopted
// prefix's KV match ended beyond the snapshot it could use (a fork point
// another prompt shares), and any snapshot another cache adopted. When the
// cache lets go of its positions (truncate, destruction) its latest one
// becomes kept too (a finished conversation's end, a preempted sequence's
// resume point). So a sequence holds at most three snapshots however long
// it runs; a 27B state is ~157 MB, which is why not every boundary is kept.
//
// Thread-safe: one mutex (mu_) guards counts, the free list, the parked
// tables, the index, its LRU list and the snapshot store. Shared through
// std::shared_ptr by the caches that use it.
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

  // Point-in-time counts (under the mutex), all in blocks.
  struct Usage {
    int64_t capacity = 0;   // blocks in the budget
    int64_t used = 0;       // blocks not free: referenced by some cache (parked ones included) or cached free
    int64_t pinned = 0;     // blocks referenced by an unparked (running) cache: never evicted
    int64_t cached = 0;     // used - pinned: held only as prompt cache, by parked caches or only by the
                            // prefix index (evictable, LRU)
    int64_t allocated = 0;  // blocks whose memory has been allocated so far
    int64_t indexed = 0;    // blocks in the prefix index (referenced or not)
  };
  Usage usage() const;
  // Blocks a new allocation can get now: free ones plus evictable ones
  // (capacity - pinned; cached-free blocks are available).
  int64_t available_blocks() const;
  // Blocks evicted so far: references dropped from parked caches plus
  // cached-free blocks taken out of the prefix index for reuse.
  uint64_t evictions() const;

  // ---- Recurrent states and their snapshots (see the class comment) ----
  // Bytes of one sequence's recurrent state (KvCache::recurrent_bytes of the
  // pool's model; 0 without GDN layers): also the size of one snapshot.
  uint64_t state_bytes() const { return state_bytes_; }
  // Sets the snapshot store's bound in bytes (0: no snapshots; a budget
  // under state_bytes() holds none). Lowering it evicts at once. No effect
  // without GDN layers.
  void set_snapshot_budget(uint64_t bytes);
  uint64_t snapshot_budget() const;
  // Point-in-time counts of recurrent state memory (under the mutex).
  struct StateUsage {
    int64_t states = 0;               // recurrent states allocated by caches of this pool now (each state_bytes())
    uint64_t state_bytes = 0;         // states x state_bytes()
    int64_t snapshots = 0;            // snapshots in the store
    uint64_t snapshot_bytes = 0;      // snapshots x state_bytes()
    uint64_t snapshot_budget = 0;     // the store's bound (set_snapshot_budget)
    uint64_t snapshot_hits = 0;       // adoptions that restored a state from a snapshot
    uint64_t snapshot_stores = 0;     // snapshots taken
    uint64_t snapshot_evictions = 0;  // snapshots dropped for room (LRU), not counting ones that left with their block
  };
  StateUsage state_usage() const;

  // Parent key of block 0 in the prefix index (see the class comment).
  static constexpr uint64_t kPrefixSeed = 0x626f6e7361692d31ULL;  // "bonsai-1"
  // H(parent, tokens) of the class comment: the index key of a block (or a
  // partial block) holding `tokens` whose previous block has key `parent`.
  static uint64_t prefix_key(uint64_t parent, std::span<const int32_t> tokens);

  // Whether caches of this pool fit a model with these dimensions.
  bool matches(const ModelConfig& c) const {
    return n_layer_ == c.n_kv_layer() && n_head_kv_ == c.n_head_kv && head_dim_k_ == c.head_dim_k &&
           head_dim_v_ == c.head_dim_v && rec_layers_ == c.n_recurrent_layer() &&
           (rec_layers_ == 0 || rec_floats_ == c.recurrent_floats_per_layer());
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
  // Prefix index (see the class comment).
  struct Entry {
    uint64_t key = 0, parent = 0;
    std::vector<int32_t> tokens;       // [count]: tokens of the block's first count positions; empty: not indexed
    std::list<int32_t>::iterator lru;  // in lru_ while refs_ == 0
  };
  bool indexed_locked(int32_t id) const { return !index_[static_cast<size_t>(id)].tokens.empty(); }
  // Enters block `id` under `key` (its tokens copied). A block already in
  // the index keeps its entry unless this one extends it (same parent, its
  // tokens a proper prefix of `tokens`); a key held by another block is kept
  // there (this block stays out).
  void index_locked(int32_t id, uint64_t key, uint64_t parent, std::span<const int32_t> tokens);
  void unindex_locked(int32_t id);  // takes `id` out of the index (a cached-free one becomes free)
  // The longest indexed prefix of `tokens`, at most `limit` positions:
  // returns its positions; fills `ids` (the blocks covering them) and
  // `keys` (keys of the fully matched blocks) when not null.
  int64_t match_locked(std::span<const int32_t> tokens, int64_t limit, std::vector<int32_t>* ids,
                       std::vector<uint64_t>* keys) const;
  // Snapshot store (see the class comment).
  struct Snapshot {
    std::shared_ptr<const float[]> state;  // [rec_layers_][rec_floats_] after the block's last position; null: none
    const Table* owner = nullptr;          // the cache whose replaceable latest snapshot it is; nullptr: kept
    std::list<int32_t>::iterator lru;      // in snap_lru_ while state is set
  };
  // The indexed block holding full block `tokens` under `key` with parent
  // `parent` (verified token by token), or -1.
  int32_t indexed_block_locked(uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const;
  // Attaches `state` to block `id` (indexed, no snapshot yet), evicting
  // least recently used snapshots for room; false when the budget cannot
  // hold one.
  bool store_snapshot_locked(int32_t id, std::shared_ptr<const float[]> state, const Table* owner);
  void drop_snapshot_locked(int32_t id);
  void touch_snapshot_locked(int32_t id);  // most recently used now
  // The cache lets go of its positions: its replaceable snapshot is kept, its fork point forgotten.
  void disown_locked(Table& t);
  // Under the mutex: the longest prefix of whole blocks of `tokens` (at most
  // `limit` positions) whose last block has a snapshot. Returns its
  // positions; fills ids / keys of those blocks and `kv_full` (positions of
  // whole blocks the KV index matched, snapshot or not) when not null.
  int64_t match_snapshot_locked(std::span<const int32_t> tokens, int64_t limit, std::vector<int32_t>* ids,
                                std::vector<uint64_t>* keys, int64_t* kv_full) const;

  mutable std::mutex mu_;
  int64_t bs_ = kKvBlockSize;
  int64_t capacity_ = 0;
  uint64_t block_bytes_ = 0;
  KvType type_k_ = KvType::kF16, type_v_ = KvType::kF16;
  int64_t n_layer_ = 0, n_head_kv_ = 0, head_dim_k_ = 0, head_dim_v_ = 0;  // n_layer_: KV (attention) layers
  int64_t rec_layers_ = 0, rec_floats_ = 0;      // recurrent (GDN) layers and state floats per layer (qwen35)
  std::vector<std::unique_ptr<uint8_t[]>> mem_;  // [capacity]: allocated on first use
  std::vector<int32_t> refs_;                    // [capacity]: caches holding the block
  std::vector<int32_t> active_;                  // [capacity]: unparked caches holding it
  std::vector<int32_t> free_;                    // ids with refs 0 (allocated ones last, reused first)
  int64_t pinned_ = 0;                           // blocks with active_ > 0
  int64_t used_ = 0;                             // blocks with refs_ > 0
  int64_t allocated_ = 0;
  uint64_t evictions_ = 0;
  std::list<Table*> parked_;                      // least recently parked first
  std::vector<Entry> index_;                      // [capacity]: the block's entry in the prefix index
  std::unordered_map<uint64_t, int32_t> by_key_;  // key -> indexed block
  // H(parent key, first token) -> indexed blocks: the candidates of a partial match.
  std::unordered_multimap<uint64_t, int32_t> children_;
  std::list<int32_t> lru_;  // cached-free blocks (indexed, refs 0): least recently released first
  int64_t indexed_ = 0;     // blocks in the index
  // Recurrent states (rec_layers_ > 0).
  uint64_t state_bytes_ = 0;        // one state: rec_layers_ x rec_floats_ x 4
  std::atomic<int64_t> states_{0};  // states allocated by this pool's caches (no mutex: caches count their own)
  std::vector<Snapshot> snap_;      // [capacity]: the snapshot at the end of indexed full block id
  std::list<int32_t> snap_lru_;     // blocks with a snapshot, least recently used first
  uint64_t snap_budget_ = 0;        // bytes the store may hold
  int64_t snaps_ = 0;               // snapshots held
  uint64_t snap_hits_ = 0, snap_stores_ = 0, snap_evictions_ = 0;
};

// One cache's block table (KvCache holds it on the heap so the pool's parked
// list can point at it while the cache moves).
struct KvPool::Table {
  std::vector<int32_t> ids;    // block ids, position p in ids[p / block_size]
  std::vector<uint8_t*> ptrs;  // their memory, same order
  int64_t size = 0;            // positions held
  std::vector<uint64_t> keys;  // index keys of the leading published full blocks (<= size / B)
  // Snapshot bookkeeping (recurrent caches; the pool's mutex guards both):
  int32_t snap = -1;                  // block whose snapshot is this cache's replaceable latest one, or -1
  int64_t fork_at = -1;               // boundary whose snapshot will be kept (adopt_prefix's KV match end), or -1
  bool parked = false;                // guarded by the pool's mutex
  std::list<Table*>::iterator where;  // in KvPool::parked_ while parked
};

// Per-sequence KV cache: a block table into a KvPool, plus, for a hybrid
// model (qwen35), the sequence's recurrent state. Position p of KV layer l,
// KV head h lives in block table[p / B] at row (h * B + p % B) of that
// layer's K (or V) part (B = the pool's block size, see KvPool).
//
// A paged cache shares blocks with other caches of its pool three ways:
// copy_prefix_from (a sibling), park (its own blocks kept for reuse), and
// the pool's prefix index (publish what it computed, adopt_prefix what any
// cache published). Writes into shared blocks copy them first.
//
// size() is the number of positions held (0..size()-1 are valid). forward()
// writes a sequence's tokens at positions p0..p0+m-1 with p0 <= size()
// (p0 < size() overwrites, i.e. drops positions >= p0 first), and then
// size() == p0 + m; it calls prepare() first, which allocates the blocks.
// Not thread-safe: one user at a time per cache (the pool itself is).
// Movable, not copyable.
//
// Layers: the pool's layers are the model's attention layers only
// (ModelConfig::n_kv_layer; forward() maps model layer l to kv_layer(l)).
// A hybrid model's Gated DeltaNet layers keep instead a recurrent state
// (ModelConfig::recurrent_floats_per_layer floats per GDN layer: conv tail
// and per-head state matrices), owned by the cache, allocated on the first
// forward (begin_recurrent) and counted in bytes(). It summarises every
// position held, so it cannot rewind: truncate(n) with 0 < n < size() drops
// to 0, a prefix of another cache is taken only whole (copy_prefix_from),
// and the prefix index is reached through state snapshots at block
// boundaries (KvPool's class comment): publish() snapshots the state when it
// stands at a boundary, adopt_prefix() adopts whole blocks up to the longest
// snapshot and restores it (both do nothing while the pool's snapshot budget
// is 0). resumable() says where a forward may continue.
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
  // Bytes one position takes in every KV layer (K and V of all KV heads).
  // Used by memory budgets.
  static uint64_t bytes_per_position(const ModelConfig& config, KvType type_k, KvType type_v);
  // Bytes of one sequence's recurrent state (0 for a model without GDN layers).
  static uint64_t recurrent_bytes(const ModelConfig& config);

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
  // its private pool; shared blocks are counted by each holder), plus its
  // recurrent state once allocated.
  size_t bytes() const;
  // Whether the cache keeps a recurrent state (a hybrid model).
  bool recurrent() const { return rec_layers_ > 0; }
  // The longest prefix of at most n positions (n clamped to [0, size()])
  // from which a forward can continue: min(n, size()) without a recurrent
  // state; with one, size() when n >= size() and the state is current, else
  // 0 (it cannot rewind).
  int64_t resumable(int64_t n) const;
  int64_t block_size() const { return bs_; }
  int64_t blocks() const { return t_ ? static_cast<int64_t>(t_->ids.size()) : 0; }  // blocks referenced now
  const std::shared_ptr<KvPool>& pool() const { return pool_; }
  bool paged() const { return pool_ != nullptr && !fixed_; }  // blocks come and go (shared pool)

  // Forget every position (a paged cache gives its blocks back).
  void clear() { truncate(0); }
  // Keep positions 0..n-1 (n = resumable(n): a recurrent cache keeps all or
  // nothing); a paged cache gives back blocks wholly past n. Callers read
  // size() afterwards.
  void truncate(int64_t n);

  // Makes positions [from, end) writable: blocks are attached up to `end`
  // (from the pool, evicting parked caches' blocks if none is free), and a
  // block among those covering [from, end) that is shared, or whose indexed
  // positions the write overwrites, is copied first (copy-on-write). Requires from <= size(), end <= n_ctx(). Errors:
  // kInvalidArgument (bad range), kResourceExhausted "KV cache full" (the
  // pool has no free or evictable block; blocks attached by this call are
  // given back, the cache is unchanged).
  core::Expected<void> prepare(int64_t from, int64_t end);
  // Blocks prepare(size(), end) would have to take from the pool (new
  // blocks plus a copy of a last block that is shared or indexed past size()).
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

  // Prefix index (KvPool's class comment; vLLM's automatic prefix caching).
  // Enters this cache's blocks into its pool's index: `tokens` are the token
  // ids of positions [0, size()) (tokens.size() >= size(); the rest is
  // ignored; a shorter span publishes only the positions it covers). Every
  // full block not yet published gets key H(key of the previous block,
  // its B tokens); with `partial_last`, a partial last block (size() % B
  // != 0) is entered too with its first size() % B tokens (re-entered,
  // longer, on later calls as the cache grows). The cache remembers the keys
  // of its published full blocks, so calling this after every forward step
  // costs O(new blocks) plus O(B) for a partial last block. A block another
  // block already holds the key of stays out of the index (not an error).
  // No effect on a standalone cache. Takes the pool's mutex.
  // A recurrent cache (snapshot budget > 0) enters its full blocks only
  // (partial_last is ignored: a partial block is never adopted without the
  // state inside it) and, when size() is a multiple of block_size() and its
  // state is current, attaches a copy of the state to the last block's
  // index entry (unless it has one): its replaceable latest snapshot,
  // replacing its previous one, or a kept one when size() is the last
  // boundary at or below `prompt_positions` (the prompt's length: a
  // conversation's next turn or a retry shares the prompt even when the
  // answer is re-rendered differently) or the fork point adopt_prefix
  // recorded. The copy (state_bytes(), ~157 MB for a 27B) is made outside
  // the pool's mutex.
  void publish(std::span<const int32_t> tokens, bool partial_last = false, int64_t prompt_positions = -1);
  // Clears this cache (truncate(0): it is unparked too), then attaches the
  // longest prefix of `tokens` that the index holds: whole blocks whose key,
  // parent key and tokens match, then at most one more block matched
  // partially (among the entries whose parent is the last matched key, full
  // or partial, the one sharing the most leading tokens with the rest of
  // `tokens`, at least one). Blocks are shared (reference counted, pinned;
  // cached-free ones leave the LRU); a later write into a shared block, or
  // over indexed positions, copies it first (KvPool's class comment).
  // size() becomes the matched positions, at most min(max_positions,
  // n_ctx()) (a cap inside a block still attaches that block), less the
  // part of a last block that the next write would have to copy when that
  // part is under block_size() / 8 positions (recomputed instead). Matching and attaching are one
  // critical section under the pool's mutex: nothing is evicted in between.
  // Returns the positions adopted (0: nothing matched, or a standalone
  // cache).
  // A recurrent cache adopts only whole blocks, up to the longest matched
  // block that has a state snapshot (at most min(max_positions, n_ctx())),
  // and restores its state from that snapshot (the state is allocated here
  // if it was not; 0 when that fails); when the KV blocks matched further
  // than the snapshot, the boundary where they end is remembered as a fork
  // point whose snapshot publish() keeps. The snapshot is copied outside the
  // pool's mutex (it stays valid: snapshots are immutable and shared).
  int64_t adopt_prefix(std::span<const int32_t> tokens, int64_t max_positions);
  // What adopt_prefix(tokens, n_ctx()) would adopt now, in positions,
  // changing nothing (admission accounting; another cache may evict or
  // publish before an adopt). 0 for a standalone cache. A recurrent cache:
  // the whole blocks up to the longest snapshot, as adopt_prefix.
  int64_t cached_prefix_positions(std::span<const int32_t> tokens) const;

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
  void set_size(int64_t n);  // forward() only (positions [0, n) written and attached; state current)
  // Frees the recurrent state's memory (a preempted sequence holds none
  // while it waits); the cache is cleared first (truncate(0)). The next
  // forward from 0 allocates it again. No effect without GDN layers.
  void release_recurrent();
  // forward() only, before it writes positions from `from` on: allocates the
  // recurrent state on first use and zeroes it when from == 0. No effect
  // without GDN layers. Errors: kInvalidArgument when from is neither 0 nor
  // size() with a current state (it cannot rewind); kResourceExhausted when
  // the state cannot be allocated.
  core::Expected<void> begin_recurrent(int64_t from);
  // GDN layer r's state (r = ModelConfig::recurrent_layer(l)):
  // [(conv_kernel - 1)][conv_dim] conv inputs (oldest first), then
  // [n_v_heads][head_dim][head_dim] state matrices S[h][i][j] (i: value dim,
  // j: key dim). Valid after begin_recurrent.
  float* recurrent_state(int64_t r) { return rec_.data() + static_cast<size_t>(r * rec_floats_); }

  // Whether this cache was made for a model with these dimensions.
  bool matches(const ModelConfig& c) const {
    return n_layer_ == c.n_kv_layer() && n_head_kv_ == c.n_head_kv && head_dim_k_ == c.head_dim_k &&
           head_dim_v_ == c.head_dim_v && rec_layers_ == c.n_recurrent_layer() &&
           (rec_layers_ == 0 || rec_floats_ == c.recurrent_floats_per_layer());
  }
  // Same dimensions and K/V types as `o` (rows can be copied between them).
  bool matches_cache(const KvCache& o) const {
    return n_layer_ == o.n_layer_ && n_head_kv_ == o.n_head_kv_ && head_dim_k_ == o.head_dim_k_ &&
           head_dim_v_ == o.head_dim_v_ && type_k_ == o.type_k_ && type_v_ == o.type_v_ &&
           rec_layers_ == o.rec_layers_ && rec_floats_ == o.rec_floats_;
  }

 private:
  void release_all();
  static core::Expected<KvCache> make(std::shared_ptr<KvPool> pool, int64_t n_ctx);
  // Allocates rec_ if empty (counted in the pool's states); false when it cannot.
  bool alloc_recurrent();
  void free_recurrent();  // frees rec_ (uncounted)
  int64_t adopt_recurrent(std::span<const int32_t> tokens, int64_t max_positions);

  std::shared_ptr<KvPool> pool_;
  std::unique_ptr<KvPool::Table> t_;  // heap-held: the pool's parked list points at it
  bool fixed_ = false;                // standalone: every block attached for life
  KvType type_k_ = KvType::kF16;
  KvType type_v_ = KvType::kF16;
  int64_t n_ctx_ = 0;
  int64_t bs_ = kKvBlockSize;
  int64_t n_layer_ = 0;     // KV (attention) layers
  int64_t rec_layers_ = 0;  // recurrent (GDN) layers
  int64_t rec_floats_ = 0;  // state floats per recurrent layer
  std::vector<float> rec_;  // [rec_layers_][rec_floats_] once allocated (begin_recurrent)
  int64_t rec_pos_ = 0;     // positions the state summarises (current when == size())
  int64_t n_head_kv_ = 0;
  int64_t head_dim_k_ = 0;
  int64_t head_dim_v_ = 0;
  size_t row_k_ = 0;  // bytes of one K row (one head, one position)
  size_t row_v_ = 0;
  size_t layer_bytes_ = 0;  // K + V bytes of one layer within a block
  size_t v_off_ = 0;        // offset of V within a layer of a block
};

}  // namespace bonsai::model
