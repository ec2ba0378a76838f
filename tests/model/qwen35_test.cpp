// The qwen35 (Qwen3.5 hybrid) forward pass beyond the goldens (golden_test.cpp):
//   - chunking and batch invariance with recurrent layers (DESIGN.md
//     "Numerics"): a sequence's logits are the same bits however its prompt
//     is chunked and whatever shares its step (memcmp);
//   - the same ternary weights in Q2_0 g64, PQ2_0 and PTQ1_0 give
//     bit-identical logits, plain and Bonsai 2 (folded);
//   - the recurrent state's cache rules: it cannot rewind (truncate drops to
//     0, a forward at a middle position is refused), copies whole, and is
//     counted in bytes(); the KV pool holds the attention layers only.
// Fixtures: ../shared/fixtures/qwen35/ (README "Qwen3.5 (qwen35) fixtures").
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model_test_util.h"

namespace bonsai::model {
namespace {

using testing::load_or_fail;
using testing::run_sequence;

std::string fixture(const std::string& stem) { return test::shared_path("fixtures/qwen35/" + stem + ".gguf"); }

// A prompt long enough to cross chunk boundaries (ids inside the fixtures' vocabulary).
std::vector<int32_t> prompt_ids(int n, int32_t salt) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 131 + salt * 17 + 7) % 8000));
  return ids;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Qwen35, ConfigAndCacheLayers) {
  const std::string path = fixture("qwen35-tiny-q1_0");
  BONSAI_REQUIRE_FILE(path);
  auto m = load_or_fail(path);
  ASSERT_TRUE(m);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, Arch::kQwen35);
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.full_attn_interval, 4);
  EXPECT_TRUE(c.is_recurrent(0) && c.is_recurrent(1) && c.is_recurrent(2));
  EXPECT_FALSE(c.is_recurrent(3));
  EXPECT_EQ(c.n_kv_layer(), 1);
  EXPECT_EQ(c.kv_layer(3), 0);
  EXPECT_EQ(c.recurrent_layer(2), 2);
  EXPECT_EQ(c.ssm_conv_dim(), 512);
  EXPECT_EQ(c.ssm_v_dim(), 256);
  // Conv tail 3 x 512 plus 8 heads of 32 x 32, per GDN layer.
  EXPECT_EQ(c.recurrent_floats_per_layer(), 3 * 512 + 8 * 32 * 32);
  EXPECT_EQ(KvCache::recurrent_bytes(c), 3u * (3 * 512 + 8 * 32 * 32) * 4);
  // One attention layer's K and V (2 heads of 64, f16) per position.
  EXPECT_EQ(KvCache::bytes_per_position(c, KvType::kF16, KvType::kF16), 1u * 2 * (64 * 2 + 64 * 2));

  auto cache = KvCache::create(c, 64);
  ASSERT_TRUE(cache.has_value());
  EXPECT_TRUE(cache->recurrent());
  const size_t before = cache->bytes();
  core::ThreadPool pool(2);
  Workspace ws;
  run_sequence(*m, prompt_ids(5, 1), 0, *cache, ws, pool, false);
  EXPECT_EQ(cache->bytes(), before + KvCache::recurrent_bytes(c));  // the state, allocated on first use
}

// One prompt as one batch, and in chunks of 1, 5, 13 and the rest: every
// position's logits are the same bits (the per-token recurrence and the
// conv tail carry across chunks exactly).
TEST(Qwen35, ChunkingInvariance) {
  for (const char* stem : {"qwen35-tiny-q1_0", "qwen35-tiny-bonsai2-ptq1_0"}) {
    SCOPED_TRACE(stem);
    const std::string path = fixture(stem);
    BONSAI_REQUIRE_FILE(path);
    auto m = load_or_fail(path);
    ASSERT_TRUE(m);
    core::ThreadPool pool(2);
    Workspace ws;
    const std::vector<int32_t> ids = prompt_ids(40, 3);
    auto whole_cache = KvCache::create(m->config(), 64);
    ASSERT_TRUE(whole_cache.has_value());
    const std::vector<float> whole = run_sequence(*m, ids, 0, *whole_cache, ws, pool, true);

    auto cache = KvCache::create(m->config(), 64);
    ASSERT_TRUE(cache.has_value());
    std::vector<float> chunked;
    int32_t pos = 0;
    for (int len : {1, 5, 13, 21}) {
      const std::span<const int32_t> part(ids.data() + pos, static_cast<size_t>(len));
      const std::vector<float> got = run_sequence(*m, part, pos, *cache, ws, pool, true);
      chunked.insert(chunked.end(), got.begin(), got.end());
      pos += len;
    }
    ASSERT_EQ(pos, 40);
    EXPECT_TRUE(same_bits(whole, chunked));
  }
}

// Three sequences: each alone, then all three in one batch (interleaved
// prompt chunks), then decode steps that share one batch: every sequence's
// logits equal its solo run's bit for bit.
TEST(Qwen35, BatchInvariance) {
  const std::string path = fixture("qwen35-tiny-pq2_0");
  BONSAI_REQUIRE_FILE(path);
  auto m = load_or_fail(path);
  ASSERT_TRUE(m);
  const int64_t V = m->config().n_vocab;
  core::ThreadPool pool(2);
  Workspace ws;
  const std::vector<std::vector<int32_t>> prompts = {prompt_ids(9, 1), prompt_ids(17, 2), prompt_ids(4, 3)};
  const std::vector<int32_t> next = {11, 222, 3333};  // one decode token per sequence

  // Solo: the prompt, then the decode token.
  std::vector<std::vector<float>> solo_prompt, solo_step;
  for (size_t s = 0; s < prompts.size(); ++s) {
    auto cache = KvCache::create(m->config(), 64);
    ASSERT_TRUE(cache.has_value());
    solo_prompt.push_back(run_sequence(*m, prompts[s], 0, *cache, ws, pool, true));
    const int32_t one[] = {next[s]};
    solo_step.push_back(run_sequence(*m, one, static_cast<int32_t>(prompts[s].size()), *cache, ws, pool, false));
  }

  // Together: prompts interleaved token by token in one batch.
  std::vector<KvCache> caches;
  for (size_t s = 0; s < prompts.size(); ++s) {
    auto cache = KvCache::create(m->config(), 64);
    ASSERT_TRUE(cache.has_value());
    caches.push_back(std::move(*cache));
  }
  std::vector<KvCache*> ptrs;
  for (auto& c : caches) ptrs.push_back(&c);
  Batch b;
  std::vector<std::pair<size_t, size_t>> order;  // (sequence, position) of each logits row
  for (size_t i = 0; i < 17; ++i) {
    for (size_t s = 0; s < prompts.size(); ++s) {
      if (i < prompts[s].size()) {
        b.add(prompts[s][i], static_cast<int32_t>(i), static_cast<int32_t>(s), true);
        order.emplace_back(s, i);
      }
    }
  }
  std::vector<float> logits(b.n_wanted() * static_cast<size_t>(V));
  ASSERT_TRUE(m->forward(b, ptrs, ws, logits, pool).has_value());
  for (size_t r = 0; r < order.size(); ++r) {
    const auto [s, i] = order[r];
    EXPECT_EQ(std::memcmp(logits.data() + r * V, solo_prompt[s].data() + i * V, static_cast<size_t>(V) * 4), 0)
        << "sequence " << s << " position " << i;
  }
  // One decode step for all three in one batch (reversed order).
  Batch d;
  for (size_t s = prompts.size(); s-- > 0;) {
    d.add(next[s], static_cast<int32_t>(prompts[s].size()), static_cast<int32_t>(s), true);
  }
  std::vector<float> step(3 * static_cast<size_t>(V));
  ASSERT_TRUE(m->forward(d, ptrs, ws, step, pool).has_value());
  for (size_t k = 0; k < 3; ++k) {
    const size_t s = 2 - k;
    EXPECT_EQ(std::memcmp(step.data() + k * V, solo_step[s].data(), static_cast<size_t>(V) * 4), 0) << "sequence " << s;
  }
}

// The same ternary weights stored three ways give the same bits (the three
// formats share the Q2_0 kernels' chunk order), with and without the fold.
TEST(Qwen35, SameWeightsSameBitsAcrossFormats) {
  core::ThreadPool pool(2);
  Workspace ws;
  const std::vector<int32_t> ids = prompt_ids(23, 5);
  auto run = [&](const std::string& stem) {
    auto m = load_or_fail(fixture(stem));
    if (!m) return std::vector<float>{};
    auto cache = KvCache::create(m->config(), 32);
    EXPECT_TRUE(cache.has_value());
    return run_sequence(*m, ids, 0, *cache, ws, pool, true);
  };
  for (const auto& group : {std::vector<std::string>{"qwen35-tiny-pq2_0", "qwen35-tiny-ptq1_0", "qwen35-tiny-q2_0-g64"},
                            std::vector<std::string>{"qwen35-tiny-bonsai2-pq2_0", "qwen35-tiny-bonsai2-ptq1_0"}}) {
    for (const auto& stem : group) BONSAI_REQUIRE_FILE(fixture(stem));
    const std::vector<float> ref = run(group[0]);
    ASSERT_FALSE(ref.empty());
    for (size_t i = 1; i < group.size(); ++i) EXPECT_TRUE(same_bits(ref, run(group[i]))) << group[i];
  }
  // And the fold is applied: the Bonsai 2 file is not the plain file's model.
  const std::vector<float> plain = run("qwen35-tiny-pq2_0");
  const std::vector<float> folded = run("qwen35-tiny-bonsai2-pq2_0");
  double ss = 0;
  for (size_t i = 0; i < plain.size(); ++i) ss += (double(plain[i]) - folded[i]) * (double(plain[i]) - folded[i]);
  EXPECT_GT(std::sqrt(ss / static_cast<double>(plain.size())), 1.0);  // README: about 5 rms apart
}

// The recurrent state cannot rewind; it is copied whole.
TEST(Qwen35, RecurrentCacheRules) {
  const std::string path = fixture("qwen35-tiny-q1_0");
  BONSAI_REQUIRE_FILE(path);
  auto m = load_or_fail(path);
  ASSERT_TRUE(m);
  const int64_t V = m->config().n_vocab;
  core::ThreadPool pool(2);
  Workspace ws;
  const std::vector<int32_t> ids = prompt_ids(12, 7);
  auto a = KvCache::create(m->config(), 32);
  ASSERT_TRUE(a.has_value());
  const std::vector<float> full = run_sequence(*m, ids, 0, *a, ws, pool, true);
  EXPECT_EQ(a->size(), 12);
  EXPECT_EQ(a->resumable(12), 12);
  EXPECT_EQ(a->resumable(20), 12);
  EXPECT_EQ(a->resumable(7), 0);

  // A forward at a middle position is refused, and changes nothing.
  {
    Batch b = Batch::for_sequence(std::span<const int32_t>(ids.data() + 7, 5), 7);
    std::vector<float> out(static_cast<size_t>(V));
    KvCache* caches[] = {&*a};
    const auto r = m->forward(b, caches, ws, out, pool);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code, core::Errc::kInvalidArgument);
    EXPECT_NE(r.error().message.find("recurrent"), std::string::npos) << r.error().message;
    EXPECT_EQ(a->size(), 12);
  }
  // A whole copy continues exactly as the source does.
  auto b = KvCache::create(m->config(), 32);
  ASSERT_TRUE(b.has_value());
  EXPECT_FALSE(b->copy_prefix_from(*a, 7).has_value());  // part of the state: refused
  ASSERT_TRUE(b->copy_prefix_from(*a, 12).has_value());
  const int32_t one[] = {42};
  const std::vector<float> from_a = run_sequence(*m, one, 12, *a, ws, pool, false);
  const std::vector<float> from_b = run_sequence(*m, one, 12, *b, ws, pool, false);
  EXPECT_TRUE(same_bits(from_a, from_b));

  // truncate to a middle position drops to 0; a rerun from 0 gives the same bits.
  a->truncate(7);
  EXPECT_EQ(a->size(), 0);
  const std::vector<float> again = run_sequence(*m, ids, 0, *a, ws, pool, true);
  EXPECT_TRUE(same_bits(full, again));
}

}  // namespace
}  // namespace bonsai::model
