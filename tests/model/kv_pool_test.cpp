// KvPool / paged KvCache: block accounting, growth, the budget, block
// sharing with copy-on-write, parking and LRU eviction that never takes a
// pinned block, and forward() over a paged cache bit-identical to a
// standalone one across block boundaries; the prefix index (publish,
// adopt_prefix, cached-free blocks and their LRU eviction, invalidation on
// overwrite).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model_test_util.h"

namespace bonsai::model {
namespace {

using testing::load_or_fail;
using testing::run_sequence;

ModelConfig tiny_config() {
  ModelConfig c;
  c.n_layer = 2, c.n_head_kv = 2, c.head_dim_k = 8, c.head_dim_v = 4;
  return c;
}

// Writes a recognisable byte pattern into K rows of positions [from, end).
void fill(KvCache& c, int64_t from, int64_t end, uint8_t v) {
  for (int64_t p = from; p < end; ++p)
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t h = 0; h < 2; ++h) std::memset(c.k_row(l, h, p), v + static_cast<uint8_t>(p), c.k_row_bytes());
}
bool holds(const KvCache& c, int64_t from, int64_t end, uint8_t v) {
  for (int64_t p = from; p < end; ++p)
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t h = 0; h < 2; ++h) {
        const uint8_t* r = c.k_row(l, h, p);
        for (size_t i = 0; i < c.k_row_bytes(); ++i)
          if (r[i] != static_cast<uint8_t>(v + p)) return false;
      }
  return true;
}

TEST(KvPool, CreateValidatesAndCountsBytes) {
  const ModelConfig c = tiny_config();
  auto p = KvPool::create(c, 100, KvType::kF16, KvType::kF16, 32);
  ASSERT_TRUE(p.has_value()) << p.error().message;
  EXPECT_EQ((*p)->capacity_blocks(), 4);  // ceil(100 / 32)
  // 2 layers x 2 heads x 32 positions x (8 + 4) f16 values.
  EXPECT_EQ((*p)->block_bytes(), 2u * 2 * 32 * (8 + 4) * 2);
  EXPECT_EQ((*p)->capacity_bytes(), 4 * (*p)->block_bytes());
  EXPECT_EQ((*p)->usage().used, 0);
  EXPECT_EQ((*p)->usage().allocated, 0);  // memory comes on first use
  EXPECT_FALSE(KvPool::create(c, 100, KvType::kF16, KvType::kF16, 48).has_value());
  EXPECT_FALSE(KvPool::create(c, 0, KvType::kF16, KvType::kF16, 32).has_value());
  EXPECT_FALSE(KvCache::create(std::shared_ptr<KvPool>(), 10).has_value());
}

TEST(KvPool, CacheGrowsByBlocksAndGivesThemBack) {
  auto pool = *KvPool::create(tiny_config(), 128, KvType::kF16, KvType::kF16, 32);
  auto c = *KvCache::create(pool, 128);
  EXPECT_TRUE(c.paged());
  EXPECT_EQ(c.blocks(), 0);
  EXPECT_EQ(c.blocks_needed(33), 2);
  ASSERT_TRUE(c.prepare(0, 33).has_value());
  EXPECT_EQ(c.blocks(), 2);
  EXPECT_EQ(pool->usage().used, 2);
  EXPECT_EQ(pool->usage().pinned, 2);
  EXPECT_EQ(c.bytes(), 2 * pool->block_bytes());
  fill(c, 0, 33, 7);
  c.set_size(33);
  EXPECT_TRUE(holds(c, 0, 33, 7));
  c.truncate(32);  // the second block is no longer needed
  EXPECT_EQ(c.blocks(), 1);
  EXPECT_EQ(pool->usage().used, 1);
  EXPECT_TRUE(holds(c, 0, 32, 7));
  c.clear();
  EXPECT_EQ(pool->usage().used, 0);
  EXPECT_EQ(pool->available_blocks(), 4);
}

TEST(KvPool, FullPoolIsAnErrorAndLeavesTheCacheUnchanged) {
  auto pool = *KvPool::create(tiny_config(), 64, KvType::kF16, KvType::kF16, 32);  // 2 blocks
  auto a = *KvCache::create(pool, 128);
  auto b = *KvCache::create(pool, 128);
  ASSERT_TRUE(a.prepare(0, 40).has_value());  // 2 blocks: the pool is full
  a.set_size(40);
  EXPECT_EQ(b.blocks_needed(1), 1);
  auto r = b.prepare(0, 1);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, core::Errc::kResourceExhausted);
  EXPECT_NE(r.error().message.find("KV cache full"), std::string::npos) << r.error().message;
  EXPECT_EQ(b.blocks(), 0);
  // a growing past its blocks fails the same way and keeps what it had.
  auto r2 = a.prepare(40, 70);
  ASSERT_FALSE(r2.has_value());
  EXPECT_EQ(a.blocks(), 2);
  EXPECT_EQ(a.size(), 40);
  a.clear();
  EXPECT_TRUE(b.prepare(0, 1).has_value());
}

TEST(KvPool, SharedPrefixBlocksAreCopiedOnWrite) {
  auto pool = *KvPool::create(tiny_config(), 256, KvType::kF16, KvType::kF16, 32);
  auto a = *KvCache::create(pool, 256);
  auto b = *KvCache::create(pool, 256);
  ASSERT_TRUE(a.prepare(0, 40).has_value());
  fill(a, 0, 40, 3);
  a.set_size(40);
  ASSERT_TRUE(b.copy_prefix_from(a, 40).has_value());
  EXPECT_EQ(b.size(), 40);
  EXPECT_EQ(pool->usage().used, 2);  // shared, not copied
  EXPECT_EQ(b.k_row(0, 0, 5), a.k_row(0, 0, 5));
  // b writing position 40 (in the shared second block) copies that block first.
  EXPECT_EQ(b.blocks_needed(41), 1);
  ASSERT_TRUE(b.prepare(40, 41).has_value());
  EXPECT_EQ(pool->usage().used, 3);
  EXPECT_NE(b.k_row(0, 0, 35), a.k_row(0, 0, 35));
  EXPECT_EQ(b.k_row(0, 0, 5), a.k_row(0, 0, 5));  // the full first block stays shared
  fill(b, 40, 41, 90);
  b.set_size(41);
  EXPECT_TRUE(holds(b, 0, 40, 3));  // the copy kept the shared rows
  EXPECT_TRUE(holds(a, 0, 40, 3));  // a untouched
  // Overwriting inside the shared first block copies it too.
  b.truncate(10);
  ASSERT_TRUE(b.prepare(10, 11).has_value());
  EXPECT_NE(b.k_row(0, 0, 5), a.k_row(0, 0, 5));
  fill(b, 10, 11, 50);
  EXPECT_TRUE(holds(a, 0, 40, 3));
  // Between pools (standalone caches) rows are copied.
  auto s = *KvCache::create(tiny_config(), 64);
  ASSERT_TRUE(s.copy_prefix_from(a, 40).has_value());
  EXPECT_TRUE(holds(s, 0, 40, 3));
}

TEST(KvPool, ParkedCachesAreEvictedLeastRecentFirstNeverPinnedBlocks) {
  auto pool = *KvPool::create(tiny_config(), 4 * 32, KvType::kF16, KvType::kF16, 32);  // 4 blocks
  auto older = *KvCache::create(pool, 128);
  auto newer = *KvCache::create(pool, 128);
  auto running = *KvCache::create(pool, 128);
  ASSERT_TRUE(older.prepare(0, 64).has_value());  // 2 blocks
  older.set_size(64);
  ASSERT_TRUE(newer.prepare(0, 32).has_value());  // 1 block
  fill(newer, 0, 32, 11);
  newer.set_size(32);
  ASSERT_TRUE(running.prepare(0, 1).has_value());  // 1 block: the pool is full
  older.park();
  newer.park();
  EXPECT_TRUE(older.parked());
  auto u = pool->usage();
  EXPECT_EQ(u.used, 4);
  EXPECT_EQ(u.pinned, 1);
  EXPECT_EQ(u.cached, 3);
  EXPECT_EQ(pool->available_blocks(), 3);
  // running grows by 2 blocks: both come from `older` (parked first), its
  // last block first; `newer` keeps its prefix.
  ASSERT_TRUE(running.prepare(0, 65).has_value());
  EXPECT_EQ(pool->evictions(), 2u);
  EXPECT_EQ(older.blocks(), 0);
  EXPECT_EQ(newer.blocks(), 1);
  newer.unpark();
  EXPECT_EQ(newer.size(), 32);
  EXPECT_TRUE(holds(newer, 0, 32, 11));
  // Now everything is pinned: nothing may be evicted.
  EXPECT_EQ(pool->available_blocks(), 0);
  auto r = older.prepare(0, 1);
  EXPECT_FALSE(r.has_value());
  EXPECT_TRUE(holds(newer, 0, 32, 11));
  EXPECT_EQ(running.blocks(), 3);
  // A parked cache that lost blocks reports the positions it still holds.
  newer.park();
  ASSERT_TRUE(older.prepare(0, 1).has_value());
  newer.unpark();
  EXPECT_EQ(newer.size(), 0);
  EXPECT_EQ(newer.blocks(), 0);
}

TEST(KvPool, ParkedBlockSharedWithARunningCacheIsNotFreed) {
  auto pool = *KvPool::create(tiny_config(), 2 * 32, KvType::kF16, KvType::kF16, 32);
  auto idle = *KvCache::create(pool, 64);
  auto live = *KvCache::create(pool, 64);
  ASSERT_TRUE(idle.prepare(0, 32).has_value());
  fill(idle, 0, 32, 21);
  idle.set_size(32);
  ASSERT_TRUE(live.copy_prefix_from(idle, 32).has_value());
  idle.park();
  EXPECT_EQ(pool->usage().pinned, 1);  // live pins the shared block
  auto other = *KvCache::create(pool, 64);
  ASSERT_TRUE(other.prepare(0, 1).has_value());    // the free block
  EXPECT_FALSE(other.prepare(0, 33).has_value());  // evicting idle's reference frees nothing
  EXPECT_TRUE(holds(live, 0, 32, 21));
}

// ---- Prefix index ------------------------------------------------------------------------

// Distinct bytes for K and V of every layer, head and position: a function of
// (seed, position, layer, head, byte), so rows can be checked without the
// cache that wrote them.
uint8_t pattern(uint8_t seed, int64_t p, int64_t l, int64_t h, size_t i, bool v) {
  return static_cast<uint8_t>(seed * 31 + p * 7 + l * 13 + h * 5 + static_cast<int64_t>(i) + (v ? 101 : 0));
}
void fill_kv(KvCache& c, int64_t from, int64_t end, uint8_t seed) {
  for (int64_t p = from; p < end; ++p)
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t h = 0; h < 2; ++h) {
        for (size_t i = 0; i < c.k_row_bytes(); ++i) c.k_row(l, h, p)[i] = pattern(seed, p, l, h, i, false);
        for (size_t i = 0; i < c.v_row_bytes(); ++i) c.v_row(l, h, p)[i] = pattern(seed, p, l, h, i, true);
      }
}
// Whether K and V rows of [from, end) hold fill_kv(seed)'s bytes.
bool holds_kv(const KvCache& c, int64_t from, int64_t end, uint8_t seed) {
  for (int64_t p = from; p < end; ++p)
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t h = 0; h < 2; ++h) {
        for (size_t i = 0; i < c.k_row_bytes(); ++i)
          if (c.k_row(l, h, p)[i] != pattern(seed, p, l, h, i, false)) return false;
        for (size_t i = 0; i < c.v_row_bytes(); ++i)
          if (c.v_row(l, h, p)[i] != pattern(seed, p, l, h, i, true)) return false;
      }
  return true;
}
// K and V rows of [from, end) byte-equal in both caches.
bool same_rows(const KvCache& a, const KvCache& b, int64_t from, int64_t end) {
  for (int64_t p = from; p < end; ++p)
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t h = 0; h < 2; ++h) {
        if (std::memcmp(a.k_row(l, h, p), b.k_row(l, h, p), a.k_row_bytes()) != 0) return false;
        if (std::memcmp(a.v_row(l, h, p), b.v_row(l, h, p), a.v_row_bytes()) != 0) return false;
      }
  return true;
}
std::vector<int32_t> token_run(int64_t n, int32_t base) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(base + static_cast<int32_t>(i * 3 % 1000));
  return t;
}
// A cache of `pool` holding positions [0, n) filled with seed's bytes.
KvCache written(const std::shared_ptr<KvPool>& pool, int64_t n, uint8_t seed) {
  auto c = *KvCache::create(pool, 256);
  EXPECT_TRUE(c.prepare(0, n).has_value());
  fill_kv(c, 0, n, seed);
  c.set_size(n);
  return c;
}

TEST(KvPrefixIndex, AdoptSharesPublishedBlocksWithoutNewMemory) {
  auto pool = *KvPool::create(tiny_config(), 8 * 32, KvType::kF16, KvType::kF16, 32);
  const auto toks = token_run(80, 1);  // 2.5 blocks
  auto a = written(pool, 80, 1);
  a.publish(toks, /*partial_last=*/true);
  EXPECT_EQ(pool->usage().indexed, 3);
  EXPECT_EQ(pool->usage().used, 3);
  auto b = *KvCache::create(pool, 256);
  EXPECT_EQ(b.cached_prefix_positions(toks), 80);
  EXPECT_EQ(b.adopt_prefix(toks, 1000), 80);
  EXPECT_EQ(b.size(), 80);
  EXPECT_EQ(b.blocks(), 3);
  EXPECT_TRUE(same_rows(a, b, 0, 80));
  EXPECT_TRUE(holds_kv(b, 0, 80, 1));
  EXPECT_EQ(b.k_row(1, 1, 70), a.k_row(1, 1, 70));  // the same memory
  const auto u = pool->usage();
  EXPECT_EQ(u.used, 3);  // nothing new allocated
  EXPECT_EQ(u.pinned, 3);
  EXPECT_EQ(u.cached, 0);
  EXPECT_EQ(u.indexed, 3);
  // A prompt that ends inside the partial entry adopts its common part.
  const std::vector<int32_t> shorter(toks.begin(), toks.begin() + 75);
  EXPECT_EQ(b.cached_prefix_positions(shorter), 75);
  // Nothing matches an unknown first token.
  auto other = toks;
  other[0] = 9999;
  EXPECT_EQ(b.cached_prefix_positions(other), 0);
  auto c = *KvCache::create(pool, 256);
  EXPECT_EQ(c.adopt_prefix(other, 1000), 0);
  EXPECT_EQ(c.size(), 0);
  EXPECT_EQ(c.blocks(), 0);
}

TEST(KvPrefixIndex, DivergenceInsideABlockAdoptsTheCommonPartAndCopiesOnWrite) {
  auto pool = *KvPool::create(tiny_config(), 8 * 32, KvType::kF16, KvType::kF16, 32);
  const auto toks = token_run(80, 1);
  auto a = written(pool, 80, 1);
  a.publish(toks, true);
  auto mine = toks;
  mine[40] = 7777;  // block 1 is positions 32..63: 8 of them in common
  auto b = *KvCache::create(pool, 256);
  EXPECT_EQ(b.adopt_prefix(mine, 1000), 40);
  EXPECT_EQ(b.blocks(), 2);
  EXPECT_TRUE(same_rows(a, b, 0, 40));
  EXPECT_EQ(pool->usage().used, 3);
  // B's next write (position 40, in the shared block 1) copies block 1.
  ASSERT_TRUE(b.prepare(40, 64).has_value());
  EXPECT_EQ(pool->usage().used, 4);
  EXPECT_NE(b.k_row(0, 0, 33), a.k_row(0, 0, 33));
  EXPECT_EQ(b.k_row(0, 0, 3), a.k_row(0, 0, 3));  // block 0 stays shared
  fill_kv(b, 40, 64, 9);
  b.set_size(64);
  EXPECT_TRUE(holds_kv(b, 0, 40, 1));  // the copy kept the common rows
  EXPECT_TRUE(holds_kv(b, 40, 64, 9));
  EXPECT_TRUE(holds_kv(a, 0, 80, 1));  // A unchanged
  // B publishes its own block 1: both continuations of block 0 are found.
  b.publish(mine);
  EXPECT_EQ(pool->usage().indexed, 4);
  auto c = *KvCache::create(pool, 256);
  EXPECT_EQ(c.adopt_prefix(mine, 1000), 64);
  EXPECT_EQ(c.k_row(0, 0, 50), b.k_row(0, 0, 50));
  EXPECT_EQ(c.adopt_prefix(toks, 1000), 80);
  EXPECT_EQ(c.k_row(0, 0, 50), a.k_row(0, 0, 50));
  // Two candidates for block 1 share its first tokens: the longer common prefix wins.
  auto third = toks;
  third[50] = 8888;
  EXPECT_EQ(c.adopt_prefix(third, 1000), 50);
  EXPECT_EQ(c.k_row(0, 0, 45), a.k_row(0, 0, 45));
  auto fourth = mine;
  fourth[45] = 8888;
  EXPECT_EQ(c.adopt_prefix(fourth, 1000), 45);
  EXPECT_EQ(c.k_row(0, 0, 42), b.k_row(0, 0, 42));
}

TEST(KvPrefixIndex, AdoptStopsAtMaxPositions) {
  auto pool = *KvPool::create(tiny_config(), 8 * 32, KvType::kF16, KvType::kF16, 32);
  const auto toks = token_run(96, 1);
  auto a = written(pool, 96, 1);
  a.publish(toks);
  auto b = *KvCache::create(pool, 256);
  EXPECT_EQ(b.adopt_prefix(toks, 0), 0);
  EXPECT_EQ(b.blocks(), 0);
  EXPECT_EQ(b.adopt_prefix(toks, 64), 64);
  EXPECT_EQ(b.blocks(), 2);
  EXPECT_EQ(b.adopt_prefix(toks, 50), 50);  // inside block 1: attached, size capped
  EXPECT_EQ(b.blocks(), 2);
  EXPECT_EQ(b.size(), 50);
  EXPECT_TRUE(holds_kv(b, 0, 50, 1));
  auto small = *KvCache::create(pool, 40);  // n_ctx caps too
  EXPECT_EQ(small.cached_prefix_positions(toks), 40);
  EXPECT_EQ(small.adopt_prefix(toks, 1000), 40);
  // B's write at the cap copies the shared block; A keeps its rows.
  ASSERT_TRUE(b.prepare(50, 51).has_value());
  fill_kv(b, 50, 51, 77);
  b.set_size(51);
  EXPECT_TRUE(holds_kv(a, 0, 96, 1));
  EXPECT_TRUE(holds_kv(b, 0, 50, 1));
  EXPECT_EQ(pool->usage().used, 4);
  EXPECT_EQ(pool->usage().indexed, 3);  // the copy is not indexed
}

TEST(KvPrefixIndex, ReleasedBlocksStayCachedUntilEvictedTailFirst) {
  auto pool = *KvPool::create(tiny_config(), 4 * 32, KvType::kF16, KvType::kF16, 32);  // 4 blocks
  const auto toks = token_run(96, 1);
  {
    auto a = written(pool, 96, 1);
    a.publish(toks);
    const auto u = pool->usage();
    EXPECT_EQ(u.used, 3);
    EXPECT_EQ(u.pinned, 3);
    EXPECT_EQ(u.cached, 0);
    EXPECT_EQ(u.indexed, 3);
    EXPECT_EQ(pool->available_blocks(), 1);
  }
  // A is gone: its blocks are cached free (used, evictable, findable).
  auto u = pool->usage();
  EXPECT_EQ(u.used, 3);
  EXPECT_EQ(u.pinned, 0);
  EXPECT_EQ(u.cached, 3);
  EXPECT_EQ(u.indexed, 3);
  EXPECT_EQ(pool->available_blocks(), 4);
  {
    auto c = *KvCache::create(pool, 256);
    EXPECT_EQ(c.adopt_prefix(toks, 1000), 96);
    EXPECT_TRUE(holds_kv(c, 0, 96, 1));
    u = pool->usage();
    EXPECT_EQ(u.used, 3);
    EXPECT_EQ(u.pinned, 3);
    EXPECT_EQ(u.cached, 0);
    EXPECT_EQ(pool->available_blocks(), 1);
  }
  EXPECT_EQ(pool->usage().cached, 3);
  EXPECT_EQ(pool->evictions(), 0u);
  // Pressure: the free block first, then cached-free blocks, the chain's tail first.
  auto d = *KvCache::create(pool, 256);
  ASSERT_TRUE(d.prepare(0, 32).has_value());
  d.set_size(32);
  EXPECT_EQ(pool->evictions(), 0u);
  EXPECT_EQ(d.cached_prefix_positions(toks), 96);
  ASSERT_TRUE(d.prepare(32, 64).has_value());
  d.set_size(64);
  EXPECT_EQ(pool->evictions(), 1u);
  u = pool->usage();
  EXPECT_EQ(u.used, 4);
  EXPECT_EQ(u.pinned, 2);
  EXPECT_EQ(u.cached, 2);
  EXPECT_EQ(u.indexed, 2);
  EXPECT_EQ(pool->available_blocks(), 2);
  EXPECT_EQ(d.cached_prefix_positions(toks), 64);
  ASSERT_TRUE(d.prepare(64, 96).has_value());
  d.set_size(96);
  EXPECT_EQ(pool->evictions(), 2u);
  EXPECT_EQ(pool->usage().indexed, 1);
  EXPECT_EQ(pool->usage().cached, 1);
  auto e = *KvCache::create(pool, 256);
  EXPECT_EQ(e.adopt_prefix(toks, 1000), 32);
  EXPECT_TRUE(holds_kv(e, 0, 32, 1));
  EXPECT_EQ(pool->usage().pinned, 4);
  EXPECT_EQ(pool->available_blocks(), 0);
  EXPECT_FALSE(d.prepare(96, 97).has_value());  // the adopted block is pinned now
  EXPECT_TRUE(holds_kv(e, 0, 32, 1));
}

TEST(KvPrefixIndex, ParkedEvictionOfAnIndexedBlockKeepsItCachedFree) {
  auto pool = *KvPool::create(tiny_config(), 3 * 32, KvType::kF16, KvType::kF16, 32);  // 3 blocks
  const auto toks = token_run(64, 1);
  auto a = written(pool, 64, 1);
  a.publish(toks);
  a.park();
  EXPECT_EQ(pool->usage().cached, 2);
  auto d = *KvCache::create(pool, 256);
  ASSERT_TRUE(d.prepare(0, 64).has_value());  // the free block, then A's block 1 (evicted, then reused)
  EXPECT_EQ(a.blocks(), 1);
  const auto u = pool->usage();
  EXPECT_EQ(u.used, 3);
  EXPECT_EQ(u.pinned, 2);
  EXPECT_EQ(u.cached, 1);
  EXPECT_EQ(u.indexed, 1);
  auto c = *KvCache::create(pool, 256);
  EXPECT_EQ(c.adopt_prefix(toks, 1000), 32);  // block 0 still held by parked A
  EXPECT_TRUE(holds_kv(c, 0, 32, 1));
  a.unpark();
  EXPECT_EQ(a.size(), 32);
}

// A write over indexed positions copies the block first (the index is one
// of its readers): the original stays findable under its tokens, the copy
// is published under the new ones. Appending past a partial entry writes in
// place and a later publish extends the entry.
TEST(KvPrefixIndex, OverwrittenPositionsAreCopiedAndTheIndexKeepsTheOriginal) {
  auto pool = *KvPool::create(tiny_config(), 8 * 32, KvType::kF16, KvType::kF16, 32);
  const auto toks = token_run(64, 1);
  auto a = written(pool, 64, 1);
  a.publish(toks);
  EXPECT_EQ(pool->usage().indexed, 2);
  a.truncate(40);
  EXPECT_EQ(a.blocks_needed(64), 1);           // the copy of block 1
  ASSERT_TRUE(a.prepare(40, 64).has_value());  // overwrites indexed positions of block 1: a copy
  EXPECT_EQ(pool->usage().indexed, 2);
  EXPECT_EQ(pool->usage().used, 3);  // blocks 0, 1 (cached free) and the copy
  auto changed = toks;
  for (size_t i = 40; i < 64; ++i) changed[i] = 5000 + static_cast<int32_t>(i);
  fill_kv(a, 40, 64, 3);
  a.set_size(64);
  EXPECT_TRUE(holds_kv(a, 32, 40, 1));  // the copy kept the rows before the write
  auto b = *KvCache::create(pool, 256);
  EXPECT_EQ(b.cached_prefix_positions(toks), 64);     // the original block 1, untouched
  EXPECT_EQ(b.cached_prefix_positions(changed), 40);  // its common part
  a.publish(changed);                                 // the copy, under its new tokens
  EXPECT_EQ(pool->usage().indexed, 3);
  EXPECT_EQ(b.adopt_prefix(changed, 1000), 64);
  EXPECT_TRUE(holds_kv(b, 40, 64, 3));
  auto c = *KvCache::create(pool, 256);
  EXPECT_EQ(c.adopt_prefix(toks, 1000), 64);
  EXPECT_TRUE(holds_kv(c, 32, 64, 1));
  // Appending past a partial entry keeps it, and a later publish extends it.
  auto p = written(pool, 40, 5);
  const auto pt = token_run(60, 300);
  p.publish(pt, true);
  EXPECT_EQ(p.cached_prefix_positions(pt), 40);
  ASSERT_TRUE(p.prepare(40, 50).has_value());
  fill_kv(p, 40, 50, 5);
  p.set_size(50);
  EXPECT_EQ(p.cached_prefix_positions(pt), 40);
  p.publish(pt, true);
  EXPECT_EQ(p.cached_prefix_positions(pt), 50);
  p.truncate(45);  // overwriting inside the entry copies the block: the entry stays
  ASSERT_TRUE(p.prepare(45, 46).has_value());
  fill_kv(p, 45, 46, 9);
  p.set_size(46);
  EXPECT_EQ(p.cached_prefix_positions(pt), 50);
  auto q = *KvCache::create(pool, 256);
  EXPECT_EQ(q.adopt_prefix(pt, 1000), 50);
  EXPECT_TRUE(holds_kv(q, 32, 50, 5));
}

// A last block whose adopted part the next write would have to copy is
// taken only for at least B / 8 positions (4 of 32 here): a prompt sharing
// just its first tokens (BOS) with a cached one takes no block; a prompt
// that continues a partial entry takes it whatever its length (appending
// needs no copy).
TEST(KvPrefixIndex, ShortPartialMatchesThatNeedACopyAreRecomputed) {
  auto pool = *KvPool::create(tiny_config(), 8 * 32, KvType::kF16, KvType::kF16, 32);
  const auto toks = token_run(40, 1);
  auto a = written(pool, 40, 1);
  a.publish(toks, /*partial_last=*/true);  // block 0 full, block 1: 8 positions
  auto b = *KvCache::create(pool, 256);
  auto bos_only = token_run(40, 900);
  bos_only[0] = toks[0];
  EXPECT_EQ(b.cached_prefix_positions(bos_only), 0);  // 1 shared position: no copy for it
  auto three = bos_only;
  std::copy(toks.begin(), toks.begin() + 3, three.begin());
  EXPECT_EQ(b.cached_prefix_positions(three), 0);
  auto four = bos_only;
  std::copy(toks.begin(), toks.begin() + 4, four.begin());
  EXPECT_EQ(b.cached_prefix_positions(four), 4);
  auto diverge_in_1 = toks;  // block 0 whole, then 2 of block 1's 8 positions
  diverge_in_1[34] = 7777;
  EXPECT_EQ(b.cached_prefix_positions(diverge_in_1), 32);
  auto cont = toks;  // continues the partial entry: all of it, even 8 positions
  cont.push_back(4242);
  EXPECT_EQ(b.adopt_prefix(cont, 1000), 40);
  EXPECT_EQ(b.blocks_needed(41), 1);  // shared with A: a copy to write position 40
  auto c = *KvCache::create(pool, 256);
  EXPECT_EQ(c.adopt_prefix(toks, 34), 32);  // a cap 2 positions into block 1: recomputed
}

// No block left for the copy of an indexed block that only this cache
// holds: the write goes in place and the block leaves the index (it does
// not fail).
TEST(KvPrefixIndex, OverwriteWithoutAFreeBlockGoesInPlace) {
  auto pool = *KvPool::create(tiny_config(), 2 * 32, KvType::kF16, KvType::kF16, 32);  // 2 blocks
  const auto toks = token_run(64, 1);
  auto a = written(pool, 64, 1);
  a.publish(toks);
  a.truncate(40);
  ASSERT_EQ(pool->available_blocks(), 0);
  ASSERT_TRUE(a.prepare(40, 64).has_value());  // no block for a copy: in place
  EXPECT_EQ(pool->usage().used, 2);
  EXPECT_EQ(pool->usage().indexed, 1);  // block 0 only
  auto b = *KvCache::create(pool, 256);
  EXPECT_EQ(b.cached_prefix_positions(toks), 32);
}

TEST(KvPrefixIndex, SameBlockTokensUnderAnotherParentDoNotMatch) {
  auto pool = *KvPool::create(tiny_config(), 8 * 32, KvType::kF16, KvType::kF16, 32);
  auto x = token_run(64, 1);
  auto z = x;
  for (size_t i = 0; i < 32; ++i) z[i] = 4000 + static_cast<int32_t>(i);  // block 0 differs, block 1 equal
  auto a = written(pool, 64, 1);
  a.publish(x);
  auto c = *KvCache::create(pool, 256);
  EXPECT_EQ(c.cached_prefix_positions(z), 0);
  // The second block of z alone (as block 0) does not match A's block 1.
  const std::vector<int32_t> tail(x.begin() + 32, x.end());
  EXPECT_EQ(c.cached_prefix_positions(tail), 0);
  auto b = written(pool, 64, 2);
  b.publish(z);
  EXPECT_EQ(pool->usage().indexed, 4);  // equal block 1 tokens, different keys: both indexed
  EXPECT_EQ(c.adopt_prefix(z, 1000), 64);
  EXPECT_TRUE(holds_kv(c, 0, 64, 2));
  EXPECT_EQ(c.adopt_prefix(x, 1000), 64);
  EXPECT_TRUE(holds_kv(c, 0, 64, 1));
}

TEST(KvPrefixIndex, FirstPublisherKeepsTheKeyAndChainsContinueByKey) {
  auto pool = *KvPool::create(tiny_config(), 8 * 32, KvType::kF16, KvType::kF16, 32);
  const auto toks = token_run(96, 1);
  auto a = written(pool, 32, 1);
  a.publish(toks);
  auto b = written(pool, 64, 1);  // computed block 0 again, then block 1
  b.publish(toks);
  EXPECT_EQ(pool->usage().indexed, 2);  // A's block 0, B's block 1
  auto c = *KvCache::create(pool, 256);
  EXPECT_EQ(c.adopt_prefix(toks, 1000), 64);
  EXPECT_EQ(c.k_row(0, 0, 5), a.k_row(0, 0, 5));
  EXPECT_EQ(c.k_row(0, 0, 40), b.k_row(0, 0, 40));
  // C continues the chain it adopted: its next block is found after it.
  ASSERT_TRUE(c.prepare(64, 96).has_value());
  fill_kv(c, 64, 96, 1);
  c.set_size(96);
  c.publish(toks);
  EXPECT_EQ(pool->usage().indexed, 3);
  auto d = *KvCache::create(pool, 256);
  EXPECT_EQ(d.adopt_prefix(toks, 1000), 96);
  EXPECT_TRUE(holds_kv(d, 0, 96, 1));
  // A sibling made by copy_prefix_from inherits the published keys.
  auto e = *KvCache::create(pool, 256);
  ASSERT_TRUE(e.copy_prefix_from(d, 96).has_value());
  e.publish(toks);
  EXPECT_EQ(pool->usage().indexed, 3);
}

TEST(KvPrefixIndex, StandaloneCacheHasNoIndex) {
  auto s = *KvCache::create(tiny_config(), 64);
  ASSERT_TRUE(s.prepare(0, 40).has_value());
  fill_kv(s, 0, 40, 1);
  s.set_size(40);
  const auto toks = token_run(40, 1);
  s.publish(toks, true);
  EXPECT_EQ(s.pool()->usage().indexed, 0);
  EXPECT_EQ(s.cached_prefix_positions(toks), 0);
  EXPECT_EQ(s.adopt_prefix(toks, 40), 0);
  EXPECT_EQ(s.size(), 40);
  EXPECT_TRUE(holds_kv(s, 0, 40, 1));
}

// forward() over a paged cache (blocks of 32 from a shared pool, a partial
// block shared with a sibling) gives the logits of a standalone cache.
TEST(KvPool, ForwardOverPagedCacheEqualsStandalone) {
  const std::string path = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(path);
  auto model = load_or_fail(path);
  ASSERT_TRUE(model);
  core::ThreadPool tp(2);
  Workspace ws;
  std::vector<int32_t> ids;
  for (int i = 0; i < 75; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % model->config().n_vocab));
  auto alone = *KvCache::create(model->config(), 128);
  const auto want = run_sequence(*model, ids, 0, alone, ws, tp, true);
  auto pool = *KvPool::create(model->config(), 8 * 32, KvType::kF16, KvType::kF16, 32);
  auto paged = *KvCache::create(pool, 128);
  // Prompt in uneven chunks crossing block boundaries.
  std::vector<float> got;
  for (int64_t at = 0; at < 75;) {
    const int64_t len = std::min<int64_t>(at == 0 ? 20 : 23, 75 - at);
    const std::span<const int32_t> chunk(ids.data() + at, static_cast<size_t>(len));
    const auto lg = run_sequence(*model, chunk, static_cast<int32_t>(at), paged, ws, tp, true);
    got.insert(got.end(), lg.begin(), lg.end());
    at += len;
  }
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  EXPECT_EQ(paged.blocks(), 3);
  // A fork sharing the first 70 positions continues exactly like the original.
  auto fork = *KvCache::create(pool, 128);
  ASSERT_TRUE(fork.copy_prefix_from(paged, 70).has_value());
  const std::span<const int32_t> tail(ids.data() + 70, 5);
  const auto lf = run_sequence(*model, tail, 70, fork, ws, tp, true);
  const size_t V = static_cast<size_t>(model->config().n_vocab);
  EXPECT_EQ(std::memcmp(lf.data(), want.data() + 70 * V, 5 * V * sizeof(float)), 0);
  EXPECT_EQ(pool->usage().used, 4);  // 2 shared full blocks + paged's last + fork's copy of it
}

}  // namespace
}  // namespace bonsai::model
