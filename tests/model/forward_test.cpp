// Forward pass on real inputs: stories260K greedy decoding reproduces the
// published output; prefill == decode; thread count does not change logits;
// batched decode of several sequences == decoding each alone; bad input is
// an error, never a crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "model_test_util.h"

namespace bonsai::model {
namespace {

using testing::argmax;
using testing::load_or_fail;
using testing::run_sequence;

std::string stories_path() { return test::shared_path("models/stories260K/stories260K.gguf"); }
std::string q1_path() { return test::shared_path("fixtures/qwen3-tiny-q1_0.gguf"); }

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

TEST(Stories260K, GreedyFromBosMatchesPublishedOutput) {
  const std::string path = stories_path();
  const std::string expected_path = test::shared_path("models/stories260K/expected_greedy_from_bos.json");
  BONSAI_REQUIRE_FILE(path);
  BONSAI_REQUIRE_FILE(expected_path);
  std::ifstream in(expected_path);
  const auto expected = nlohmann::json::parse(in).at("generated_token_ids").get<std::vector<int32_t>>();
  ASSERT_EQ(expected.size(), 256u);

  auto model = load_or_fail(path);
  ASSERT_TRUE(model);
  EXPECT_EQ(model->config().arch, Arch::kLlama);
  EXPECT_EQ(model->config().n_rot, 8);
  core::ThreadPool pool(2);
  Workspace ws;
  auto cache = KvCache::create(model->config(), 512);
  ASSERT_TRUE(cache.has_value());

  // Token-by-token decode over the KV cache, starting from BOS (id 1).
  std::vector<int32_t> got;
  int32_t token = 1;
  for (int32_t pos = 0; pos < 256; ++pos) {
    const int32_t one[] = {token};
    const auto logits = run_sequence(*model, one, pos, *cache, ws, pool, false);
    token = argmax(logits);
    got.push_back(token);
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(cache->size(), 256);
}

// Prefill of a whole sequence as one batch (GEMM) vs one token at a time (GEMV).
void expect_prefill_equals_decode(const std::string& path, std::vector<int32_t> ids, double tol) {
  auto model = load_or_fail(path);
  ASSERT_TRUE(model);
  const int64_t V = model->config().n_vocab;
  core::ThreadPool pool(2);
  Workspace ws;
  auto c1 = KvCache::create(model->config(), 64);
  auto c2 = KvCache::create(model->config(), 64);
  ASSERT_TRUE(c1 && c2);
  const auto batch_logits = run_sequence(*model, ids, 0, *c1, ws, pool, true);
  double worst = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t one[] = {ids[i]};
    const auto step = run_sequence(*model, one, static_cast<int32_t>(i), *c2, ws, pool, false);
    worst = std::max(worst, max_abs_diff(step, std::span<const float>(batch_logits).subspan(i * V, V)));
    EXPECT_EQ(argmax(step), argmax(std::span<const float>(batch_logits).subspan(i * V, V))) << "pos " << i;
  }
  std::printf("[prefill vs decode] %s: max |diff| %.3g\n", path.c_str(), worst);
  EXPECT_LE(worst, tol);
}

TEST(Forward, PrefillEqualsTokenByTokenDecodeStories) {
  BONSAI_REQUIRE_FILE(stories_path());
  expect_prefill_equals_decode(stories_path(), {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315}, 1e-3);
}

TEST(Forward, PrefillEqualsTokenByTokenDecodeQwen3) {
  BONSAI_REQUIRE_FILE(q1_path());
  expect_prefill_equals_decode(q1_path(), {785, 3974, 13876, 38835, 34208, 916, 279, 15678}, 0.05);
}

// Same logits bit for bit with 1 and 2 threads.
void expect_thread_count_invariant(const std::string& path, const std::vector<int32_t>& ids) {
  auto model = load_or_fail(path);
  ASSERT_TRUE(model);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2}) {
    core::ThreadPool pool(threads);
    Workspace ws;
    auto cache = KvCache::create(model->config(), 64);
    ASSERT_TRUE(cache.has_value());
    auto all = run_sequence(*model, ids, 0, *cache, ws, pool, true);
    const int32_t next[] = {ids.back()};
    auto step = run_sequence(*model, next, static_cast<int32_t>(ids.size()), *cache, ws, pool, false);
    all.insert(all.end(), step.begin(), step.end());
    results.push_back(std::move(all));
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_TRUE(results[0] == results[1]) << "max |diff| " << max_abs_diff(results[0], results[1]);
}

TEST(Forward, DeterministicAcrossThreadCountsStories) {
  BONSAI_REQUIRE_FILE(stories_path());
  expect_thread_count_invariant(stories_path(), {1, 403, 407, 261, 378, 432, 383});
}

TEST(Forward, DeterministicAcrossThreadCountsQwen3) {
  BONSAI_REQUIRE_FILE(q1_path());
  expect_thread_count_invariant(q1_path(), {785, 3974, 13876, 38835, 34208});
}

// Three sequences with different prompt lengths decoded together, one token
// each per step, equal each sequence decoded alone.
void expect_batched_decode_equals_single(const std::string& path, std::vector<std::vector<int32_t>> prompts,
                                         double tol) {
  auto model = load_or_fail(path);
  ASSERT_TRUE(model);
  const int64_t V = model->config().n_vocab;
  const size_t S = prompts.size();
  core::ThreadPool pool(2);
  constexpr int kSteps = 4;

  // Alone: each sequence greedy-decodes kSteps tokens on its own cache.
  std::vector<std::vector<std::vector<float>>> alone(S);
  // (One emplace_back per sequence: the sized constructor of a vector of vectors trips
  // GCC 12's -Wfree-nonheap-object false positive here.)
  std::vector<std::vector<int32_t>> alone_tokens;
  for (size_t s = 0; s < S; ++s) alone_tokens.emplace_back();
  for (size_t s = 0; s < S; ++s) {
    Workspace ws;
    auto cache = KvCache::create(model->config(), 64);
    ASSERT_TRUE(cache.has_value());
    auto logits = run_sequence(*model, prompts[s], 0, *cache, ws, pool, false);
    for (int step = 0; step < kSteps; ++step) {
      const int32_t tok[] = {argmax(logits)};
      alone_tokens[s].push_back(tok[0]);
      logits = run_sequence(*model, tok, static_cast<int32_t>(prompts[s].size()) + step, *cache, ws, pool, false);
      alone[s].push_back(logits);
    }
  }

  // Together: prefill each, then one Batch per step with one token per sequence.
  Workspace ws;
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<KvCache*> ptrs;
  for (size_t s = 0; s < S; ++s) {
    auto c = KvCache::create(model->config(), 64);
    ASSERT_TRUE(c.has_value());
    caches.push_back(std::make_unique<KvCache>(std::move(*c)));
    ptrs.push_back(caches.back().get());
  }
  // Prefill all prompts in one batch too (several sequences, many tokens each).
  Batch prefill;
  for (size_t s = 0; s < S; ++s) {
    for (size_t i = 0; i < prompts[s].size(); ++i) {
      prefill.add(prompts[s][i], static_cast<int32_t>(i), static_cast<int32_t>(s), i + 1 == prompts[s].size());
    }
  }
  std::vector<float> logits(S * V);
  ASSERT_TRUE(model->forward(prefill, ptrs, ws, logits, pool).has_value());
  std::vector<int32_t> next(S);
  for (size_t s = 0; s < S; ++s) next[s] = argmax(std::span<const float>(logits).subspan(s * V, V));
  double worst = 0.0;
  for (int step = 0; step < kSteps; ++step) {
    Batch b;
    for (size_t s = 0; s < S; ++s) {
      EXPECT_EQ(next[s], alone_tokens[s][step]) << "seq " << s << " step " << step;
      b.add(next[s], static_cast<int32_t>(prompts[s].size()) + step, static_cast<int32_t>(s), true);
    }
    auto r = model->forward(b, ptrs, ws, logits, pool);
    ASSERT_TRUE(r.has_value()) << r.error().message;
    for (size_t s = 0; s < S; ++s) {
      const auto row = std::span<const float>(logits).subspan(s * V, V);
      worst = std::max(worst, max_abs_diff(row, alone[s][step]));
      next[s] = argmax(row);
    }
  }
  std::printf("[batched decode] %s: max |diff| vs alone %.3g\n", path.c_str(), worst);
  EXPECT_LE(worst, tol);
}

TEST(Forward, BatchedDecodeEqualsSingleStories) {
  BONSAI_REQUIRE_FILE(stories_path());
  expect_batched_decode_equals_single(stories_path(), {{1, 403, 407}, {1, 261}, {1, 378, 432, 383, 286}}, 1e-3);
}

TEST(Forward, BatchedDecodeEqualsSingleQwen3) {
  BONSAI_REQUIRE_FILE(q1_path());
  expect_batched_decode_equals_single(q1_path(), {{785, 3974}, {13876, 38835, 34208, 916}, {279}}, 0.05);
}

TEST(Forward, BadInputIsAnErrorNotACrash) {
  BONSAI_REQUIRE_FILE(stories_path());
  auto model = load_or_fail(stories_path());
  ASSERT_TRUE(model);
  const int64_t V = model->config().n_vocab;
  core::ThreadPool pool(2);
  Workspace ws;
  auto cache = KvCache::create(model->config(), 8);
  ASSERT_TRUE(cache.has_value());
  KvCache* caches[] = {&*cache};
  std::vector<float> logits(2 * V);
  auto run = [&](const Batch& b) { return model->forward(b, caches, ws, logits, pool); };
  auto code_of = [&](const Batch& b) {
    auto r = run(b);
    EXPECT_FALSE(r.has_value());
    return r ? core::Errc::kInternal : r.error().code;
  };
  Batch b;
  EXPECT_EQ(code_of(b), core::Errc::kInvalidArgument);  // empty
  b.add(static_cast<int32_t>(V), 0, 0, true);
  EXPECT_EQ(code_of(b), core::Errc::kInvalidArgument);  // token id
  b.clear(), b.add(-1, 0, 0, true);
  EXPECT_EQ(code_of(b), core::Errc::kInvalidArgument);  // token id
  b.clear(), b.add(1, 0, 1, true);
  EXPECT_EQ(code_of(b), core::Errc::kInvalidArgument);  // seq id
  b.clear(), b.add(1, 0, -1, true);
  EXPECT_EQ(code_of(b), core::Errc::kInvalidArgument);  // seq id
  b.clear(), b.add(1, 3, 0, true);
  EXPECT_EQ(code_of(b), core::Errc::kInvalidArgument);  // gap
  b.clear(), b.add(1, 0, 0, false), b.add(2, 2, 0, true);
  EXPECT_EQ(code_of(b), core::Errc::kInvalidArgument);  // not consecutive
  b = Batch::for_sequence(std::vector<int32_t>(9, 1), 0, 0, false);
  EXPECT_EQ(code_of(b), core::Errc::kOutOfRange);  // beyond n_ctx
  b = Batch::for_sequence(std::vector<int32_t>(3, 1), 0, 0, true);
  EXPECT_EQ(code_of(b), core::Errc::kInvalidArgument);  // logits too small
  EXPECT_EQ(cache->size(), 0);                          // nothing written on error

  // The cache of another model is refused.
  BONSAI_REQUIRE_FILE(q1_path());
  auto other = load_or_fail(q1_path());
  ASSERT_TRUE(other);
  auto other_cache = KvCache::create(other->config(), 8);
  ASSERT_TRUE(other_cache.has_value());
  KvCache* wrong[] = {&*other_cache};
  b = Batch::for_sequence(std::vector<int32_t>{1}, 0);
  auto r = model->forward(b, wrong, ws, logits, pool);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, core::Errc::kInvalidArgument);

  // Valid input still works after the errors, and an overwrite (pos < size) is allowed.
  b = Batch::for_sequence(std::vector<int32_t>{1, 403}, 0);
  ASSERT_TRUE(run(b).has_value());
  EXPECT_EQ(cache->size(), 2);
  b = Batch::for_sequence(std::vector<int32_t>{407}, 1);
  ASSERT_TRUE(run(b).has_value());
  EXPECT_EQ(cache->size(), 2);
}

// A batch longer than Model::kMaxUbatch runs in slices; the result equals
// feeding the same tokens in two separate forward() calls.
TEST(Forward, LongBatchIsSlicedTransparently) {
  BONSAI_REQUIRE_FILE(stories_path());
  auto model = load_or_fail(stories_path());
  ASSERT_TRUE(model);
  const int64_t V = model->config().n_vocab;
  const int32_t n = static_cast<int32_t>(Model::kMaxUbatch) + 77;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) ids[i] = i == 0 ? 1 : 3 + (i * 37) % 500;
  core::ThreadPool pool(2);
  Workspace ws;
  auto a = KvCache::create(model->config(), n);
  auto b = KvCache::create(model->config(), n);
  ASSERT_TRUE(a && b);
  const auto one = run_sequence(*model, ids, 0, *a, ws, pool, true);
  ASSERT_EQ(one.size(), static_cast<size_t>(n) * V);
  EXPECT_EQ(a->size(), n);
  const int32_t split = 300;
  auto first = run_sequence(*model, std::span<const int32_t>(ids).first(split), 0, *b, ws, pool, true);
  auto second = run_sequence(*model, std::span<const int32_t>(ids).subspan(split), split, *b, ws, pool, true);
  first.insert(first.end(), second.begin(), second.end());
  EXPECT_LE(max_abs_diff(one, first), 1e-4);
  EXPECT_EQ(b->size(), n);
}

TEST(KvCacheTest, SizesAndErrors) {
  ModelConfig c;
  c.n_layer = 2, c.n_head_kv = 2, c.head_dim_k = 8, c.head_dim_v = 4;
  auto f16 = KvCache::create(c, 10);
  ASSERT_TRUE(f16.has_value());
  // 10 positions take one block of 32 (n_ctx rounded up to the attention's key block).
  EXPECT_EQ(f16->block_size(), 32);
  EXPECT_EQ(f16->bytes(), 2u * 2 * 32 * (8 + 4) * 2);
  EXPECT_EQ(f16->n_ctx(), 10);
  auto f32 = KvCache::create(c, 10, KvType::kF32);
  ASSERT_TRUE(f32.has_value());
  EXPECT_EQ(f32->bytes(), 2u * 2 * 32 * (8 + 4) * 4);
  EXPECT_FALSE(KvCache::create(c, 0).has_value());
  EXPECT_FALSE(KvCache::create(c, -5).has_value());
  f16->set_size(5);
  f16->truncate(3);
  EXPECT_EQ(f16->size(), 3);
  f16->clear();
  EXPECT_EQ(f16->size(), 0);
}

TEST(Forward, F32KvCacheCloseToF16) {
  BONSAI_REQUIRE_FILE(stories_path());
  auto model = load_or_fail(stories_path());
  ASSERT_TRUE(model);
  core::ThreadPool pool(1);
  Workspace ws;
  auto a = KvCache::create(model->config(), 16, KvType::kF16);
  auto b = KvCache::create(model->config(), 16, KvType::kF32);
  ASSERT_TRUE(a && b);
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378};
  const auto la = run_sequence(*model, ids, 0, *a, ws, pool, true);
  const auto lb = run_sequence(*model, ids, 0, *b, ws, pool, true);
  const double d = max_abs_diff(la, lb);
  EXPECT_LE(d, 0.05);
  EXPECT_GT(b->bytes(), a->bytes());
}

}  // namespace
}  // namespace bonsai::model
