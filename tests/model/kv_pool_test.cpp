// KvPool / paged KvCache: block accounting, growth, the budget, block
// sharing with copy-on-write, parking and LRU eviction that never takes a
// pinned block, and forward() over a paged cache bit-identical to a
// standalone one across block boundaries.
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
