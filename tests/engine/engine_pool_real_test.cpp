// EnginePool over real InferenceEngine replicas on a trained model
// (stories260K): shared weights, a one-replica pool byte-identical to a
// direct engine (RNG progression included), and concurrent leases with
// different prompts each producing exactly what that prompt produces alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "engine/engine_pool.h"
#include "engine/inference_engine.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace bonsai::engine {
namespace {

using namespace std::chrono_literals;

const std::string kStories = test::shared_path("models/stories260K/stories260K.gguf");

SamplingParams sampled_params(int n) {
  SamplingParams p;  // temperature 0.8, top_k 40, top_p 0.95, min_p 0.05: the RNG matters
  p.max_tokens = n;
  return p;
}

TEST(EnginePoolReal, ReplicasBorrowOneMappingAndTokenizer) {
  BONSAI_REQUIRE_FILE(kStories);
  auto built = build_pool_from_gguf(kStories, sampled_params(16), 7, 256, 3);
  ASSERT_TRUE(built.has_value()) << built.error().message;
  EXPECT_EQ(built->size, 3);
  EXPECT_EQ(built->pool.size(), 3);
  EXPECT_EQ(built->tier, ComputeTier::kCpu);
  EXPECT_EQ(built->n_ctx, 256);
  EXPECT_EQ(built->mapped_bytes, std::filesystem::file_size(kStories));
  std::vector<EngineLease> leases;
  ASSERT_NE(built->kv_pool, nullptr);
  // One KV pool for the model: 3 full contexts of 256 positions (blocks of 256).
  EXPECT_EQ(built->kv_pool->block_size(), 256);
  EXPECT_EQ(built->kv_pool->capacity_blocks(), 3);
  EXPECT_EQ(built->kv_bytes, built->kv_pool->capacity_bytes());
  for (int i = 0; i < 3; ++i) {
    auto l = built->pool.acquire_for(1s);
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ(l->engine().model_ptr().get(), built->model.get()) << "replica " << i << " has its own weights";
    EXPECT_EQ(l->engine().tokenizer_ptr().get(), built->tokenizer.get());
    EXPECT_EQ(l->engine().max_seq_len(), 256);
    EXPECT_EQ(l->engine().params().seed, 7u);
    EXPECT_EQ(l->engine().kv_cache().pool(), built->kv_pool) << "replica " << i << " has its own KV memory";
    EXPECT_EQ(l->engine().kv_cache_bytes(), 0u);  // blocks come as the sequence grows
    leases.push_back(std::move(*l));
  }
  EXPECT_GT(built->kv_bytes, 0u);
  // The estimate used by ModelPool before loading matches what was built.
  auto est = estimate_model_bytes(kStories, 256, 3);
  ASSERT_TRUE(est.has_value()) << est.error().message;
  EXPECT_EQ(*est, built->mapped_bytes + built->kv_bytes);
}

// --kv-budget-tokens: one pool of that many positions (rounded up to whole
// blocks) for all replicas, counted by model_footprint the same; a budget
// below one context is refused.
TEST(EnginePoolReal, KvBudgetSizesTheSharedPool) {
  BONSAI_REQUIRE_FILE(kStories);
  auto built =
      build_pool_from_gguf(kStories, sampled_params(4), 1, 256, 4, {}, model::KvType::kF16, model::KvType::kF16,
                           /*kv_budget_tokens=*/600);
  ASSERT_TRUE(built.has_value()) << built.error().message;
  EXPECT_EQ(built->kv_pool->block_size(), 256);
  EXPECT_EQ(built->kv_pool->capacity_blocks(), 3);  // ceil(600 / 256)
  auto fp = model_footprint(kStories, 256, 4, {}, model::KvType::kF16, model::KvType::kF16, 600);
  ASSERT_TRUE(fp.has_value());
  EXPECT_EQ(fp->kv_budget_tokens, 768);
  EXPECT_EQ(fp->kv_bytes, built->kv_bytes);
  EXPECT_EQ(fp->kv_bytes, fp->kv_bytes_per_position * 768);
  // 300 tokens round up to 2 blocks of 256 = 512 positions < a context of 1024.
  auto small = build_pool_from_gguf(kStories, sampled_params(4), 1, 1024, 4, {}, model::KvType::kF16,
                                    model::KvType::kF16, /*kv_budget_tokens=*/300);
  ASSERT_FALSE(small.has_value());
  EXPECT_EQ(small.error().code, core::Errc::kInvalidArgument);
  EXPECT_NE(small.error().message.find("smaller than one sequence's context"), std::string::npos)
      << small.error().message;
}

// model_footprint: the KV bytes it predicts are the bytes the built replicas
// allocate, per position n_layer x (K + V dims) x 2 (F16); max_ctx is the
// training context (no RoPE scaling in stories260K).
TEST(EnginePoolReal, FootprintMatchesWhatIsBuilt) {
  BONSAI_REQUIRE_FILE(kStories);
  auto built = build_pool_from_gguf(kStories, sampled_params(4), 1, 200, 2);
  ASSERT_TRUE(built.has_value()) << built.error().message;
  auto fp = model_footprint(kStories, 200, 2);
  ASSERT_TRUE(fp.has_value()) << fp.error().message;
  const model::ModelConfig& c = built->model->config();
  EXPECT_EQ(fp->type_k, model::KvType::kF16);
  EXPECT_EQ(fp->type_v, model::KvType::kF16);
  EXPECT_EQ(fp->kv_bytes_per_position, static_cast<uint64_t>(c.n_layer * (c.k_dim() + c.v_dim()) * 2));
  EXPECT_EQ(fp->n_ctx, 200);
  EXPECT_EQ(fp->replicas, 2);
  EXPECT_EQ(fp->kv_bytes, built->kv_bytes);
  EXPECT_EQ(fp->mapped_bytes, built->mapped_bytes);
  EXPECT_EQ(fp->total_bytes(), built->kv_bytes + built->mapped_bytes);
  EXPECT_EQ(fp->n_ctx_train, c.n_ctx_train);
  EXPECT_EQ(fp->max_ctx, c.n_ctx_train);
  EXPECT_FLOAT_EQ(fp->rope_scaling_factor, 1.0f);
  // Default context: min(context_length, 4096).
  auto def = model_footprint(kStories, 0, 1);
  ASSERT_TRUE(def.has_value());
  EXPECT_EQ(def->n_ctx, std::min<int64_t>(c.n_ctx_train, kDefaultMaxSeqLen));
}

// The footprint follows the KV cache types (q8_0: 34 bytes per 32 values):
// what it predicts is what build_pool_from_gguf allocates with those types.
TEST(EnginePoolReal, FootprintCountsTheKvCacheTypes) {
  const std::string tiny = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(tiny);
  auto built = build_pool_from_gguf(tiny, sampled_params(4), 1, 96, 2, {}, model::KvType::kQ8_0, model::KvType::kF16);
  ASSERT_TRUE(built.has_value()) << built.error().message;
  auto fp = model_footprint(tiny, 96, 2, {}, model::KvType::kQ8_0, model::KvType::kF16);
  ASSERT_TRUE(fp.has_value()) << fp.error().message;
  const model::ModelConfig& c = built->model->config();
  ASSERT_EQ(c.head_dim_k % 32, 0);
  EXPECT_EQ(fp->type_k, model::KvType::kQ8_0);
  EXPECT_EQ(fp->kv_bytes_per_position,
            static_cast<uint64_t>(c.n_layer * c.n_head_kv * (c.head_dim_k / 32 * 34 + c.head_dim_v * 2)));
  EXPECT_EQ(fp->kv_bytes, built->kv_bytes);
  auto f16 = model_footprint(tiny, 96, 2);
  ASSERT_TRUE(f16.has_value());
  EXPECT_LT(fp->kv_bytes, f16->kv_bytes);
  EXPECT_EQ(*estimate_model_bytes(tiny, 96, 2, {}, model::KvType::kQ8_0, model::KvType::kF16), fp->total_bytes());
}

// A header-only qwen3 GGUF (metadata + token_embd) with context_length 128
// and the given RoPE scaling keys.
std::string write_header_model(const std::string& name, const std::function<void(gguf::Writer&)>& keys) {
  gguf::Writer w;
  w.set_string("general.architecture", "qwen3");
  w.set_u32("qwen3.block_count", 3);
  w.set_u32("qwen3.context_length", 128);
  w.set_u32("qwen3.embedding_length", 32);
  w.set_u32("qwen3.feed_forward_length", 64);
  w.set_u32("qwen3.attention.head_count", 4);
  w.set_u32("qwen3.attention.head_count_kv", 2);
  w.set_u32("qwen3.attention.key_length", 8);
  w.set_u32("qwen3.attention.value_length", 8);
  w.set_f32("qwen3.rope.freq_base", 10000.0f);
  w.set_f32("qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
  keys(w);
  EXPECT_TRUE(w.add_tensor("token_embd.weight", core::GgmlType::F32, {32, 16}, std::vector<uint8_t>(32 * 16 * 4)));
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("bonsai_footprint_" + std::to_string(::getpid()) + "_" + name + ".gguf"))
                               .string();
  auto r = w.write(path);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  return path;
}

// With RoPE scaling the supported context is original_context_length (or
// context_length) x factor, never less than context_length.
TEST(ModelFootprint, MaxContextFollowsRopeScaling) {
  struct Case {
    const char* name;
    std::function<void(gguf::Writer&)> keys;
    int64_t max_ctx;
    float factor;
  };
  const Case cases[] = {
      {"none", [](gguf::Writer&) {}, 128, 1.0f},
      {"yarn",
       [](gguf::Writer& w) {
         w.set_string("qwen3.rope.scaling.type", "yarn");
         w.set_f32("qwen3.rope.scaling.factor", 4.0f);
         w.set_u32("qwen3.rope.scaling.original_context_length", 64);
       },
       256, 4.0f},
      {"linear_no_orig",
       [](gguf::Writer& w) {
         w.set_string("qwen3.rope.scaling.type", "linear");
         w.set_f32("qwen3.rope.scaling.factor", 2.0f);
       },
       256, 2.0f},
      {"yarn_below_train",
       [](gguf::Writer& w) {
         w.set_string("qwen3.rope.scaling.type", "yarn");
         w.set_f32("qwen3.rope.scaling.factor", 1.5f);
         w.set_u32("qwen3.rope.scaling.original_context_length", 32);
       },
       128, 1.5f},
  };
  for (const auto& c : cases) {
    const std::string path = write_header_model(c.name, c.keys);
    auto fp = model_footprint(path, 100, 3);
    ASSERT_TRUE(fp.has_value()) << c.name << ": " << fp.error().message;
    EXPECT_EQ(fp->max_ctx, c.max_ctx) << c.name;
    EXPECT_FLOAT_EQ(fp->rope_scaling_factor, c.factor) << c.name;
    EXPECT_EQ(fp->n_ctx_train, 128) << c.name;
    // 3 layers x (2 x 8 + 2 x 8) x 2 bytes = 192 bytes per position.
    EXPECT_EQ(fp->kv_bytes_per_position, 192u) << c.name;
    // Contexts of 100 positions take one KV block of 128 each.
    EXPECT_EQ(fp->kv_block_size, 128) << c.name;
    EXPECT_EQ(fp->kv_budget_tokens, 3 * 128) << c.name;
    EXPECT_EQ(fp->kv_bytes, 192u * 128u * 3u) << c.name;
    EXPECT_EQ(fp->mapped_bytes, std::filesystem::file_size(path)) << c.name;
    std::filesystem::remove(path);
  }
}

TEST(EnginePoolReal, OneReplicaPoolIsByteIdenticalToDirectEngine) {
  BONSAI_REQUIRE_FILE(kStories);
  const SamplingParams params = sampled_params(24);
  auto built = build_pool_from_gguf(kStories, params, 1234, 256, 1);
  ASSERT_TRUE(built.has_value()) << built.error().message;
  EngineOptions opts;
  opts.max_seq_len = 256;
  opts.params = params;
  opts.params.seed = 1234;
  auto direct = InferenceEngine::create(built->model, built->tokenizer, opts);
  ASSERT_TRUE(direct.has_value()) << direct.error().message;

  const auto a = built->tokenizer->encode_prompt("Once upon a time");
  const auto b = built->tokenizer->encode_prompt("The little dog");
  // The same sequence of calls on both: plain generates advance the RNG, a
  // seeded one leaves no trace, params swaps keep the RNG going.
  auto run = [&](InferenceEngine& e) {
    std::vector<std::string> texts;
    for (int i = 0; i < 2; ++i) {
      auto r = e.generate(a);
      EXPECT_TRUE(r.has_value());
      texts.push_back(r ? r->text : "<error>");
    }
    auto s = e.generate_with_seed(b, 99);
    texts.push_back(s ? s->text : "<error>");
    SamplingParams hot = params;
    hot.temperature = 1.2f;
    auto h = e.generate_with_params(b, hot);
    texts.push_back(h ? h->text : "<error>");
    auto g = e.generate(b);
    texts.push_back(g ? g->text : "<error>");
    return texts;
  };
  std::vector<std::string> via_pool;
  Rng::State pool_state{};
  {
    auto lease = built->pool.acquire_for(1s);
    ASSERT_TRUE(lease.has_value());
    via_pool = run(lease->engine());
  }
  {
    auto lease = built->pool.acquire_for(1s);  // the same replica again: state carried over
    ASSERT_TRUE(lease.has_value());
    auto r = lease->engine().generate(a);
    ASSERT_TRUE(r.has_value());
    via_pool.push_back(r->text);
    pool_state = lease->engine().rng_state();
  }
  std::vector<std::string> via_direct = run(*direct);
  auto r = direct->generate(a);
  ASSERT_TRUE(r.has_value());
  via_direct.push_back(r->text);
  EXPECT_EQ(via_pool, via_direct);
  EXPECT_TRUE(pool_state == direct->rng_state());
  EXPECT_NE(via_pool[0], via_pool[1]) << "sampling should advance the RNG between plain generates";
}

// Runs `prompts` solo, then all at once on `replicas` leases, and compares.
void check_concurrent_matches_solo(const std::string& path, int replicas, int n_tokens,
                                   const std::vector<std::string>& prompts) {
  const int kReplicas = replicas;
  auto built = build_pool_from_gguf(path, sampled_params(n_tokens), 5, 256, kReplicas);
  ASSERT_TRUE(built.has_value()) << built.error().message;
  // Solo answers, one prompt at a time on one replica. Seeded calls restart
  // the RNG, so the answer depends only on the prompt and seed.
  std::vector<std::vector<int32_t>> solo_tokens;
  std::vector<std::string> solo_text;
  {
    auto lease = built->pool.acquire_for(1s);
    ASSERT_TRUE(lease.has_value());
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto r = lease->engine().generate_with_seed(built->tokenizer->encode_prompt(prompts[i]), 100 + i);
      ASSERT_TRUE(r.has_value()) << r.error().message;
      solo_tokens.push_back(r->tokens);
      solo_text.push_back(r->text);
    }
  }
  for (size_t i = 1; i < prompts.size(); ++i) EXPECT_NE(solo_text[0], solo_text[i]);

  // Now all at once, each thread on its own lease, several rounds.
  std::vector<std::vector<std::string>> got(prompts.size());
  std::vector<std::vector<std::vector<int32_t>>> got_tokens(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      const auto ids = built->tokenizer->encode_prompt(prompts[i]);
      for (int round = 0; round < 3; ++round) {
        auto lease = built->pool.acquire_for(30s);
        if (!lease) {
          got[i].push_back(std::string("<no lease: ") + pool_error_name(lease.error()) + ">");
          continue;
        }
        auto r = lease->engine().generate_with_seed(ids, 100 + i);
        got[i].push_back(r ? r->text : "<error: " + r.error().message + ">");
        got_tokens[i].push_back(r ? r->tokens : std::vector<int32_t>{});
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(got[i].size(), 3u);
    for (int round = 0; round < 3; ++round) {
      EXPECT_EQ(got[i][round], solo_text[i]) << "prompt " << i << " round " << round;
      EXPECT_EQ(got_tokens[i][round], solo_tokens[i]) << "prompt " << i << " round " << round;
    }
  }
  EXPECT_EQ(built->pool.available(), kReplicas);
}

TEST(EnginePoolReal, ConcurrentLeasesWithDifferentPromptsMatchSoloRuns) {
  BONSAI_REQUIRE_FILE(kStories);
  check_concurrent_matches_solo(kStories, 4, 32,
                                {"Once upon a time", "The cat sat", "Lily and Ben went to the park", "One day, a big"});
}

// The same on a Qwen3 fixture with 1-bit weights (different kernels and tokenizer).
TEST(EnginePoolReal, ConcurrentLeasesOnQwen3Q1Fixture) {
  const std::string path = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(path);
  check_concurrent_matches_solo(path, 2, 12, {"Hello, world", "def fib(n):", "The quick brown fox"});
}

}  // namespace
}  // namespace bonsai::engine
