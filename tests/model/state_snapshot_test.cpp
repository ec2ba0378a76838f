// Recurrent-state snapshots of the qwen35 prompt cache (model::KvPool's
// class comment): a recurrent cache publishes its state at block boundaries
// and another cache adopts whole blocks up to the longest snapshot. Every
// continuation from an adopted prefix is compared with the same prompt
// computed from scratch in a standalone cache, bit for bit (memcmp): the
// chunking invariance of the qwen35 forward pass makes them equal. Also the
// bounds: which snapshots a cache keeps, the byte budget with LRU eviction
// (never a wrong state), a budget of 0 (off), and the count of states.
// Fixtures: ../shared/fixtures/qwen35/ (README "Qwen3.5 (qwen35) fixtures").
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "model_test_util.h"

namespace bonsai::model {
namespace {

using testing::load_or_fail;
using testing::run_sequence;

constexpr int64_t kBlock = 32;  // small blocks: the fixture's prompts are short

std::string fixture(const std::string& stem) { return test::shared_path("fixtures/qwen35/" + stem + ".gguf"); }

// Token ids inside the fixtures' vocabulary (below the special tokens at 8094..).
std::vector<int32_t> ids_of(int n, int32_t salt) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 131 + salt * 17 + 7) % 8000));
  return ids;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class StateSnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = fixture("qwen35-tiny-q1_0");
    BONSAI_REQUIRE_FILE(path);
    m_ = load_or_fail(path);
    ASSERT_TRUE(m_);
    state_ = KvCache::recurrent_bytes(m_->config());
    ASSERT_GT(state_, 0u);
  }

  // A pool of `blocks` blocks of kBlock positions holding `snapshots` snapshots.
  std::shared_ptr<KvPool> make_pool(int64_t blocks, uint64_t snapshots) {
    auto p = KvPool::create(m_->config(), blocks * kBlock, KvType::kF16, KvType::kF16, kBlock);
    EXPECT_TRUE(p.has_value());
    if (!p) return nullptr;
    (*p)->set_snapshot_budget(snapshots * state_);
    return *p;
  }

  // Runs ids[from, end) on `c` in chunks that end at block boundaries (as
  // engine::Sequence feeds a recurrent cache), publishing after each chunk;
  // returns the logits of every position run ([end - from][n_vocab]).
  std::vector<float> feed(KvCache& c, const std::vector<int32_t>& ids, int64_t from, int64_t end,
                          int64_t prompt_positions = -1) {
    std::vector<float> out;
    for (int64_t p = from; p < end;) {
      const int64_t n = std::min(end - p, kBlock - p % kBlock);
      const auto rows = run_sequence(*m_, std::span(ids).subspan(static_cast<size_t>(p), static_cast<size_t>(n)),
                                     static_cast<int32_t>(p), c, ws_, tp_, true);
      out.insert(out.end(), rows.begin(), rows.end());
      c.publish(std::span(ids).first(static_cast<size_t>(p + n)), false, prompt_positions);
      p += n;
    }
    return out;
  }

  // Every position's logits of `ids` computed from scratch in one batch (a standalone cache).
  std::vector<float> scratch(const std::vector<int32_t>& ids) {
    auto c = KvCache::create(m_->config(), 256);
    EXPECT_TRUE(c.has_value());
    return run_sequence(*m_, ids, 0, *c, ws_, tp_, true);
  }

  // Adopts what the pool holds of `ids` (the last token always runs), runs
  // the rest, and checks every computed position against scratch(ids) by
  // memcmp. Returns the positions adopted.
  int64_t adopt_and_check(KvCache& c, const std::vector<int32_t>& ids, int64_t prompt_positions = -1) {
    const auto n = static_cast<int64_t>(ids.size());
    const int64_t predicted = c.cached_prefix_positions(std::span(ids).first(static_cast<size_t>(n - 1)));
    const int64_t got = c.adopt_prefix(ids, n - 1);
    EXPECT_EQ(got, predicted);
    EXPECT_EQ(got % kBlock, 0) << "only whole blocks are adopted";
    EXPECT_EQ(c.size(), got);
    EXPECT_EQ(c.resumable(got), got) << "the restored state stands at the adopted end";
    const std::vector<float> rows = feed(c, ids, got, n, prompt_positions);
    const std::vector<float> ref = scratch(ids);
    const size_t V = static_cast<size_t>(m_->config().n_vocab);
    EXPECT_EQ(rows.size(), static_cast<size_t>(n - got) * V);
    if (rows.size() == static_cast<size_t>(n - got) * V) {
      EXPECT_EQ(std::memcmp(rows.data(), ref.data() + static_cast<size_t>(got) * V, rows.size() * sizeof(float)), 0)
          << "positions " << got << ".." << n << " differ from the prompt computed from scratch";
    }
    return got;
  }

  std::shared_ptr<const Model> m_;
  uint64_t state_ = 0;
  Workspace ws_;
  core::ThreadPool tp_{2};
};

// A prompt continued from an adopted snapshot gives the logits of the same
// prompt computed from scratch; the snapshot is counted as a hit.
TEST_F(StateSnapshotTest, AdoptedSnapshotContinuesAsFromScratch) {
  auto pool = make_pool(16, 8);
  const std::vector<int32_t> first = ids_of(80, 1);
  auto a = KvCache::create(pool, 256);
  ASSERT_TRUE(a.has_value());
  feed(*a, first, 0, 80);
  // Boundaries 32 and 64 were visited; the latest replaced the earlier one.
  KvPool::StateUsage u = pool->state_usage();
  EXPECT_EQ(u.snapshot_stores, 2u);
  EXPECT_EQ(u.snapshots, 1);
  EXPECT_EQ(u.snapshot_bytes, state_);
  EXPECT_EQ(u.states, 1);  // a's own state

  const std::vector<int32_t> second = concat(first, ids_of(20, 2));
  auto b = KvCache::create(pool, 256);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(adopt_and_check(*b, second), 64);
  u = pool->state_usage();
  EXPECT_EQ(u.snapshot_hits, 1u);
  EXPECT_EQ(u.states, 2);
  // b passed 96 (its latest) and kept the adopted one at 64.
  EXPECT_EQ(u.snapshots, 2);
  // A prompt ending inside the first block adopts nothing (never a partial block).
  auto c = KvCache::create(pool, 256);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(adopt_and_check(*c, ids_of(30, 1)), 0);
}

// Which snapshots a cache keeps: its latest boundary (replaced as it goes),
// the last boundary of its prompt, and, once it lets go, its latest.
TEST_F(StateSnapshotTest, KeepsPromptEndAndLatestBoundary) {
  auto pool = make_pool(16, 8);
  const std::vector<int32_t> ids = ids_of(110, 3);
  {
    auto a = KvCache::create(pool, 256);
    ASSERT_TRUE(a.has_value());
    feed(*a, ids, 0, 110, /*prompt_positions=*/40);  // prompt end boundary: 32
    KvPool::StateUsage u = pool->state_usage();
    EXPECT_EQ(u.snapshot_stores, 3u);  // 32, 64, 96
    EXPECT_EQ(u.snapshots, 2);         // 32 (prompt end) and 96 (latest); 64 was replaced
  }
  // a is gone: its latest (96) stays, and so do its KV blocks (indexed, cached free).
  EXPECT_EQ(pool->state_usage().snapshots, 2);
  EXPECT_EQ(pool->state_usage().states, 0);
  auto b = KvCache::create(pool, 256);
  ASSERT_TRUE(b.has_value());
  const auto first = [&](size_t n) { return std::vector<int32_t>(ids.begin(), ids.begin() + n); };
  EXPECT_EQ(b->cached_prefix_positions(first(109)), 96);
  EXPECT_EQ(b->cached_prefix_positions(first(70)), 32);  // 64 has no snapshot: back to 32
  EXPECT_EQ(b->cached_prefix_positions(first(50)), 32);
  EXPECT_EQ(b->cached_prefix_positions(first(31)), 0);
  EXPECT_EQ(adopt_and_check(*b, concat(first(70), ids_of(10, 4))), 32);
}

// A prefix shared by two prompts past the snapshot the second one could use:
// the second records the boundary where the KV match ended (the fork) and
// keeps its snapshot there, so a third prompt sharing it adopts it.
TEST_F(StateSnapshotTest, ForkPointSnapshotServesTheNextPromptSharingIt) {
  auto pool = make_pool(32, 8);
  const std::vector<int32_t> system = ids_of(100, 5);  // a "system prompt" over three blocks
  auto a = KvCache::create(pool, 256);
  ASSERT_TRUE(a.has_value());
  const std::vector<int32_t> p1 = concat(system, ids_of(40, 6));
  feed(*a, p1, 0, 140, 140);  // snapshots 32..128: kept 128 (prompt end), latest 128
  EXPECT_EQ(pool->state_usage().snapshots, 1);
  auto b = KvCache::create(pool, 256);
  ASSERT_TRUE(b.has_value());
  // The KV of three blocks matches, but no snapshot below 128: nothing adopted.
  EXPECT_EQ(adopt_and_check(*b, concat(system, ids_of(40, 7)), 140), 0);
  auto c = KvCache::create(pool, 256);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(adopt_and_check(*c, concat(system, ids_of(45, 8)), 145), 96);
}

// Under a budget of one snapshot and a KV pool small enough that blocks are
// reused, prompts with and without shared prefixes adopt whatever is left:
// every continuation still equals the scratch run, the store never holds
// more than its budget, and evictions are counted.
TEST_F(StateSnapshotTest, EvictionNeverGivesAWrongState) {
  auto pool = make_pool(10, 1);
  const std::vector<int32_t> base_a = ids_of(70, 9), base_b = ids_of(70, 10);
  const std::vector<std::vector<int32_t>> prompts = {concat(base_a, ids_of(5, 11)),  concat(base_a, ids_of(30, 13)),
                                                     concat(base_b, ids_of(20, 12)), concat(base_b, ids_of(3, 14)),
                                                     concat(base_a, ids_of(12, 15)), ids_of(90, 16),
                                                     concat(base_b, ids_of(40, 17)), concat(base_a, ids_of(9, 18))};
  int64_t adopted = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(i);
    auto c = KvCache::create(pool, 256);
    ASSERT_TRUE(c.has_value());
    adopted += adopt_and_check(*c, prompts[i], static_cast<int64_t>(prompts[i].size()));
    const KvPool::StateUsage u = pool->state_usage();
    EXPECT_LE(u.snapshot_bytes, u.snapshot_budget);
    EXPECT_LE(u.snapshots, 1);
  }
  const KvPool::StateUsage u = pool->state_usage();
  EXPECT_GT(adopted, 0) << "some prefix should have been reused";
  EXPECT_GT(u.snapshot_evictions, 0u);
  EXPECT_GT(pool->evictions(), 0u) << "the KV pool should have reused cached blocks";
}

// A budget of 0 (the default) keeps no snapshot and adopts nothing; lowering
// a budget evicts at once.
TEST_F(StateSnapshotTest, ZeroBudgetTurnsSnapshotsOff) {
  auto pool = make_pool(8, 0);
  const std::vector<int32_t> ids = ids_of(70, 19);
  auto a = KvCache::create(pool, 256);
  ASSERT_TRUE(a.has_value());
  feed(*a, ids, 0, 70);
  EXPECT_EQ(pool->state_usage().snapshots, 0);
  EXPECT_EQ(pool->usage().indexed, 0) << "a recurrent cache's blocks are not indexed without snapshots";
  auto b = KvCache::create(pool, 256);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(adopt_and_check(*b, ids), 0);

  pool->set_snapshot_budget(4 * state_);
  a->truncate(0);
  feed(*a, ids, 0, 70);
  EXPECT_EQ(pool->state_usage().snapshots, 1);
  pool->set_snapshot_budget(state_ - 1);  // holds none
  EXPECT_EQ(pool->state_usage().snapshots, 0);
  EXPECT_EQ(pool->state_usage().snapshot_evictions, 1u);
}

// The pool counts the recurrent states its caches hold: allocated on the
// first forward, freed by release_recurrent and with the cache.
TEST_F(StateSnapshotTest, PoolCountsStates) {
  auto pool = make_pool(8, 0);
  EXPECT_EQ(pool->state_bytes(), state_);
  auto a = KvCache::create(pool, 256);
  auto b = KvCache::create(pool, 256);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(pool->state_usage().states, 0);
  feed(*a, ids_of(10, 20), 0, 10);
  feed(*b, ids_of(10, 21), 0, 10);
  EXPECT_EQ(pool->state_usage().states, 2);
  EXPECT_EQ(pool->state_usage().state_bytes, 2 * state_);
  a->release_recurrent();
  EXPECT_EQ(a->size(), 0);
  EXPECT_EQ(pool->state_usage().states, 1);
  {
    auto moved = std::move(*b);
    EXPECT_EQ(pool->state_usage().states, 1);
  }
  EXPECT_EQ(pool->state_usage().states, 0);
  // A copy of a whole cache takes a state of its own.
  feed(*a, ids_of(10, 22), 0, 10);
  auto c = KvCache::create(pool, 256);
  ASSERT_TRUE(c.has_value());
  ASSERT_TRUE(c->copy_prefix_from(*a, 10).has_value());
  EXPECT_EQ(pool->state_usage().states, 2);
}

}  // namespace
}  // namespace bonsai::model
