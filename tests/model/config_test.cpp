// ModelConfig::from_gguf and check_model: values read from the shared files,
// and every problem of a broken file listed (hand-made files via gguf::Writer).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model_test_util.h"

namespace bonsai::model {
namespace {

std::shared_ptr<const gguf::File> open_or_fail(const std::string& path) {
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  return f ? *f : nullptr;
}

TEST(ModelConfigTest, Qwen3FixtureQ2) {
  const std::string path = test::shared_path("fixtures/qwen3-tiny-q2_0.gguf");
  BONSAI_REQUIRE_FILE(path);
  auto f = open_or_fail(path);
  ASSERT_TRUE(f);
  auto c = ModelConfig::from_gguf(*f);
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->arch, Arch::kQwen3);
  EXPECT_EQ(c->rope_type, RopeType::kNeox);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->n_embd, 384);
  EXPECT_EQ(c->n_layer, 3);
  EXPECT_EQ(c->n_head, 6);
  EXPECT_EQ(c->n_head_kv, 2);
  EXPECT_EQ(c->head_dim_k, 128);  // != n_embd / n_head
  EXPECT_EQ(c->head_dim_v, 128);
  EXPECT_EQ(c->n_rot, 128);
  EXPECT_EQ(c->n_ff, 1024);
  EXPECT_EQ(c->n_vocab, 151936);
  EXPECT_EQ(c->n_ctx_train, 40960);
  EXPECT_FLOAT_EQ(c->rope_freq_base, 1e6f);
  EXPECT_FLOAT_EQ(c->rms_eps, 1e-6f);
  EXPECT_FALSE(c->tied_output);
  EXPECT_EQ(c->rope_scaling, RopeScaling::kNone);
  EXPECT_TRUE(check_model(*f).empty());
}

TEST(ModelConfigTest, Stories260KLlama) {
  const std::string path = test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(path);
  auto f = open_or_fail(path);
  ASSERT_TRUE(f);
  auto c = ModelConfig::from_gguf(*f);
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->arch, Arch::kLlama);
  EXPECT_EQ(c->rope_type, RopeType::kNorm);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->n_embd, 64);
  EXPECT_EQ(c->n_layer, 5);
  EXPECT_EQ(c->n_head, 8);
  EXPECT_EQ(c->n_head_kv, 4);
  EXPECT_EQ(c->head_dim_k, 8);
  EXPECT_EQ(c->n_rot, 8);
  EXPECT_EQ(c->n_ff, 172);
  EXPECT_EQ(c->n_vocab, 512);
  EXPECT_FLOAT_EQ(c->rope_freq_base, 10000.0f);  // default: key absent
  EXPECT_FLOAT_EQ(c->rms_eps, 1e-5f);
  EXPECT_FALSE(c->tied_output);  // the GGUF has a separate output.weight
}

TEST(ModelConfigTest, LlamaTinyRandomHasPartialRope) {
  const std::string path = test::shared_path("models/llama-2-tiny-random/llama-2-tiny-random.gguf");
  BONSAI_REQUIRE_FILE(path);
  auto f = open_or_fail(path);
  ASSERT_TRUE(f);
  auto c = ModelConfig::from_gguf(*f);
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->n_embd, 8);
  EXPECT_EQ(c->n_head, 2);
  EXPECT_EQ(c->head_dim_k, 4);
  EXPECT_EQ(c->n_rot, 4);
  EXPECT_EQ(c->n_vocab, 32000);
  EXPECT_TRUE(check_model(*f).empty());
  // And it runs.
  auto m = Model::from_file(f);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  core::ThreadPool pool(2);
  Workspace ws;
  auto cache = KvCache::create((*m)->config(), 16);
  ASSERT_TRUE(cache.has_value());
  const std::vector<int32_t> ids = {1, 450, 4996};
  const auto logits = testing::run_sequence(**m, ids, 0, *cache, ws, pool, true);
  ASSERT_EQ(logits.size(), 3u * 32000);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

TEST(ModelConfigTest, EveryFixtureAndModelChecksClean) {
  std::vector<std::string> files;
  for (const char* dir : {"fixtures", "models/stories260K", "models/llama-2-tiny-random"}) {
    const auto d = test::shared_path(dir);
    if (!std::filesystem::exists(d)) continue;
    for (const auto& e : std::filesystem::directory_iterator(d)) {
      if (e.path().extension() == ".gguf") files.push_back(e.path().string());
    }
  }
  if (files.empty()) {
    BONSAI_REQUIRE_FILE(test::shared_path("fixtures/qwen3-tiny-q1_0.gguf"));
  }
  for (const auto& path : files) {
    auto f = open_or_fail(path);
    ASSERT_TRUE(f) << path;
    const auto problems = check_model(*f);
    EXPECT_TRUE(problems.empty()) << path << ": " << (problems.empty() ? "" : problems.front());
    auto m = Model::from_file(f);
    EXPECT_TRUE(m.has_value()) << path;
    if (m) {
      EXPECT_GT((*m)->weight_bytes(), 0u);
    }
  }
}

// ---- Hand-made files ---------------------------------------------------------------

// A tiny all-F32 qwen3 (or llama) model; `mutate` edits it before writing.
struct TinySpec {
  std::string arch = "qwen3";
  int64_t n_embd = 32, n_layer = 2, n_head = 4, n_head_kv = 2, head_dim = 8, n_ff = 64, n_vocab = 40;
  bool tied = true;
};

std::vector<uint8_t> f32_bytes(int64_t n, uint32_t seed) {
  std::vector<uint8_t> out(static_cast<size_t>(n) * 4);
  uint32_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const float v = (static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 0.5f;
    std::memcpy(out.data() + 4 * i, &v, 4);
  }
  return out;
}

void add_f32(gguf::Writer& w, const std::string& name, std::vector<int64_t> ne, uint32_t seed) {
  int64_t n = 1;
  for (auto d : ne) n *= d;
  auto r = w.add_tensor(name, core::GgmlType::F32, ne, f32_bytes(n, seed));
  ASSERT_TRUE(r.has_value()) << r.error().message;
}

// Writes the tiny model; `skip` names tensors to leave out, `keys` edits metadata.
std::string write_tiny(const std::string& file_name, const TinySpec& s, const std::vector<std::string>& skip = {},
                       const std::function<void(gguf::Writer&)>& keys = {}) {
  gguf::Writer w;
  const std::string a = s.arch;
  w.set_string("general.architecture", a);
  w.set_u32(a + ".block_count", static_cast<uint32_t>(s.n_layer));
  w.set_u32(a + ".context_length", 128);
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(s.n_embd));
  w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(s.n_head));
  w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(s.head_dim));
  w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(s.head_dim));
  w.set_f32(a + ".rope.freq_base", 10000.0f);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  if (keys) keys(w);
  uint32_t seed = 1;
  auto add = [&](const std::string& name, std::vector<int64_t> ne) {
    ++seed;
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) return;
    add_f32(w, name, ne, seed);
  };
  const int64_t q = s.n_head * s.head_dim, kv = s.n_head_kv * s.head_dim;
  add("token_embd.weight", {s.n_embd, s.n_vocab});
  add("output_norm.weight", {s.n_embd});
  if (!s.tied) add("output.weight", {s.n_embd, s.n_vocab});
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {s.n_embd});
    add(p + "attn_q.weight", {s.n_embd, q});
    add(p + "attn_k.weight", {s.n_embd, kv});
    add(p + "attn_v.weight", {s.n_embd, kv});
    add(p + "attn_output.weight", {q, s.n_embd});
    if (s.arch == "qwen3") {
      add(p + "attn_q_norm.weight", {s.head_dim});
      add(p + "attn_k_norm.weight", {s.head_dim});
    }
    add(p + "ffn_norm.weight", {s.n_embd});
    add(p + "ffn_gate.weight", {s.n_embd, s.n_ff});
    add(p + "ffn_up.weight", {s.n_embd, s.n_ff});
    add(p + "ffn_down.weight", {s.n_ff, s.n_embd});
  }
  const auto path =
      (std::filesystem::temp_directory_path() / ("bonsai_model_test_" + std::to_string(::getpid()) + "_" + file_name))
          .string();
  auto r = w.write(path);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  return path;
}

bool any_contains(const std::vector<std::string>& v, const std::string& needle) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& s) { return s.find(needle) != std::string::npos; });
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

TEST(CheckModel, TinyValidModelLoadsAndRuns) {
  for (const char* arch : {"qwen3", "llama"}) {
    TinySpec s;
    s.arch = arch;
    s.tied = std::string(arch) == "llama";
    const auto path = write_tiny(std::string("valid_") + arch + ".gguf", s);
    auto f = open_or_fail(path);
    ASSERT_TRUE(f);
    EXPECT_TRUE(check_model(*f).empty()) << join(check_model(*f));
    auto m = Model::from_file(f);
    ASSERT_TRUE(m.has_value()) << m.error().message;
    EXPECT_EQ((*m)->config().tied_output, s.tied);
    core::ThreadPool pool(1);
    Workspace ws;
    auto cache = KvCache::create((*m)->config(), 8);
    ASSERT_TRUE(cache.has_value());
    const std::vector<int32_t> ids = {3, 7, 39};
    const auto logits = testing::run_sequence(**m, ids, 0, *cache, ws, pool, true);
    ASSERT_EQ(logits.size(), 3u * 40);
    for (float v : logits) EXPECT_TRUE(std::isfinite(v));
    std::filesystem::remove(path);
  }
}

TEST(CheckModel, ListsEveryProblem) {
  TinySpec s;
  // Missing tensors, a wrong shape and a missing required key in one file.
  const auto path =
      write_tiny("broken.gguf", s, {"blk.1.ffn_up.weight", "output_norm.weight", "blk.0.attn_k_norm.weight"},
                 [](gguf::Writer&) {});
  auto f = open_or_fail(path);
  ASSERT_TRUE(f);
  const auto problems = check_model(*f);
  EXPECT_EQ(problems.size(), 3u) << join(problems);
  EXPECT_TRUE(any_contains(problems, "blk.1.ffn_up.weight")) << join(problems);
  EXPECT_TRUE(any_contains(problems, "output_norm.weight")) << join(problems);
  EXPECT_TRUE(any_contains(problems, "blk.0.attn_k_norm.weight")) << join(problems);
  auto m = Model::from_file(f);
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().message.find("blk.1.ffn_up.weight"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(CheckModel, WrongShapeIsNamed) {
  TinySpec s;
  s.n_ff = 64;
  // Declare a different feed_forward_length than the tensors have.
  const auto path =
      write_tiny("shape.gguf", s, {}, [](gguf::Writer& w) { w.set_u32("qwen3.feed_forward_length", 48); });
  auto f = open_or_fail(path);
  ASSERT_TRUE(f);
  const auto problems = check_model(*f);
  // ffn_gate, ffn_up, ffn_down of both layers.
  EXPECT_EQ(problems.size(), 6u) << join(problems);
  EXPECT_TRUE(any_contains(problems, "blk.0.ffn_down.weight")) << join(problems);
  EXPECT_TRUE(any_contains(problems, "expected [32, 48]")) << join(problems);
  std::filesystem::remove(path);
}

TEST(CheckModel, BadKeysAreNamed) {
  TinySpec s;
  const auto path = write_tiny("keys.gguf", s, {}, [](gguf::Writer& w) {
    w.set_u32("qwen3.attention.head_count_kv", 3);        // 4 % 3 != 0
    w.set_string("qwen3.context_length", "long");         // wrong type
    w.set_string("qwen3.rope.scaling.type", "longrope");  // unsupported
  });
  auto f = open_or_fail(path);
  ASSERT_TRUE(f);
  const auto problems = check_model(*f);
  EXPECT_TRUE(any_contains(problems, "qwen3.attention.head_count_kv")) << join(problems);
  EXPECT_TRUE(any_contains(problems, "qwen3.context_length")) << join(problems);
  EXPECT_TRUE(any_contains(problems, "qwen3.rope.scaling.type")) << join(problems);
  auto c = ModelConfig::from_gguf(*f);
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().message.find("qwen3.context_length"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(CheckModel, MissingKeysAndArchitecture) {
  {
    gguf::Writer w;
    w.set_string("general.architecture", "gpt2");
    const auto path =
        (std::filesystem::temp_directory_path() / ("bonsai_model_test_arch-" + std::to_string(::getpid()) + ".gguf"))
            .string();
    ASSERT_TRUE(w.write(path).has_value());
    auto f = open_or_fail(path);
    ASSERT_TRUE(f);
    const auto problems = check_model(*f);
    ASSERT_FALSE(problems.empty());
    EXPECT_TRUE(any_contains(problems, "gpt2")) << join(problems);
    std::filesystem::remove(path);
  }
  {
    gguf::Writer w;
    w.set_string("general.architecture", "llama");
    const auto path =
        (std::filesystem::temp_directory_path() / ("bonsai_model_test_nokeys-" + std::to_string(::getpid()) + ".gguf"))
            .string();
    ASSERT_TRUE(w.write(path).has_value());
    auto f = open_or_fail(path);
    ASSERT_TRUE(f);
    const auto problems = check_model(*f);
    for (const char* key :
         {"llama.block_count", "llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
          "llama.attention.head_count", "llama.attention.layer_norm_rms_epsilon", "token_embd.weight"}) {
      EXPECT_TRUE(any_contains(problems, key)) << key << "\n" << join(problems);
    }
    std::filesystem::remove(path);
  }
}

// Random (often inconsistent) hyper-parameters over a fixed tensor set: the
// file is either refused with problems listed, or it loads and runs. Never a
// crash (run under ASan/UBSan too).
TEST(CheckModel, RandomHyperParametersNeverCrash) {
  const std::vector<std::string> keys = {"block_count",
                                         "embedding_length",
                                         "feed_forward_length",
                                         "attention.head_count",
                                         "attention.head_count_kv",
                                         "attention.key_length",
                                         "attention.value_length",
                                         "rope.dimension_count",
                                         "context_length"};
  const std::vector<uint64_t> values = {0, 1, 2, 3, 4, 6, 7, 8, 16, 32, 40, 64, 1ull << 31, (1ull << 32) + 5};
  uint64_t rng = 12345;
  auto next = [&rng] {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return rng >> 33;
  };
  int loaded = 0, refused = 0;
  for (int iter = 0; iter < 60; ++iter) {
    TinySpec s;
    s.arch = (iter % 3 == 0) ? "llama" : "qwen3";
    std::vector<std::pair<std::string, uint64_t>> edits;
    const int n_edits = 1 + static_cast<int>(next() % 3);
    for (int e = 0; e < n_edits; ++e) {
      edits.emplace_back(keys[next() % keys.size()], values[next() % values.size()]);
    }
    const auto path = write_tiny("random.gguf", s, {}, [&](gguf::Writer& w) {
      for (const auto& [k, v] : edits) {
        if (v > UINT32_MAX) {
          w.set_u64(s.arch + "." + k, v);
        } else {
          w.set_u32(s.arch + "." + k, static_cast<uint32_t>(v));
        }
      }
    });
    auto f = gguf::File::open(path);
    ASSERT_TRUE(f.has_value()) << f.error().message;
    const auto problems = check_model(**f);
    auto m = Model::from_file(*f);
    EXPECT_EQ(problems.empty(), m.has_value()) << join(problems);
    if (m) {
      ++loaded;
      core::ThreadPool pool(2);
      Workspace ws;
      auto cache = KvCache::create((*m)->config(), 4);
      ASSERT_TRUE(cache.has_value());
      const std::vector<int32_t> ids = {1, 2, 3};
      const auto logits = testing::run_sequence(**m, ids, 0, *cache, ws, pool, true);
      for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    } else {
      ++refused;
      EXPECT_FALSE(problems.empty());
    }
    std::filesystem::remove(path);
  }
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused, 0);
}

TEST(ModelConfigTest, YarnScalingKeys) {
  TinySpec s;
  const auto path = write_tiny("yarn.gguf", s, {}, [](gguf::Writer& w) {
    w.set_string("qwen3.rope.scaling.type", "yarn");
    w.set_f32("qwen3.rope.scaling.factor", 4.0f);
    w.set_u32("qwen3.rope.scaling.original_context_length", 32);
  });
  auto f = open_or_fail(path);
  ASSERT_TRUE(f);
  auto c = ModelConfig::from_gguf(*f);
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->rope_scaling, RopeScaling::kYarn);
  EXPECT_FLOAT_EQ(c->rope_scaling_factor, 4.0f);
  EXPECT_EQ(c->rope_orig_ctx, 32);
  EXPECT_FLOAT_EQ(c->yarn_ext_factor, 1.0f);
  // YaRN changes the logits (it applies at every position, not only past 32).
  auto plain_path = write_tiny("noyarn.gguf", s);
  auto m1 = Model::load(path);
  auto m2 = Model::load(plain_path);
  ASSERT_TRUE(m1 && m2);
  core::ThreadPool pool(1);
  Workspace ws;
  auto c1 = KvCache::create((*m1)->config(), 8);
  auto c2 = KvCache::create((*m2)->config(), 8);
  const std::vector<int32_t> ids = {3, 7, 39, 5};
  const auto l1 = testing::run_sequence(**m1, ids, 0, *c1, ws, pool, false);
  const auto l2 = testing::run_sequence(**m2, ids, 0, *c2, ws, pool, false);
  EXPECT_NE(l1, l2);
  std::filesystem::remove(path);
  std::filesystem::remove(plain_path);
}

// A rope scaling factor so small that 1/factor (RoPE's frequency scale)
// overflows used to load fine and give NaN logits from position 1 on.
TEST(CheckModel, SubnormalRopeScalingFactorIsNamed) {
  TinySpec s;
  for (const char* key : {"qwen3.rope.scaling.factor", "qwen3.rope.scale_linear"}) {
    const auto path = write_tiny("tiny_factor.gguf", s, {}, [key](gguf::Writer& w) {
      if (std::string(key).ends_with("factor")) w.set_string("qwen3.rope.scaling.type", "linear");
      w.set_f32(key, 1e-38f);
    });
    auto f = open_or_fail(path);
    ASSERT_TRUE(f);
    const auto problems = check_model(*f);
    EXPECT_TRUE(any_contains(problems, key)) << key << "\n" << join(problems);
    EXPECT_FALSE(Model::from_file(f).has_value()) << key;
    std::filesystem::remove(path);
  }
  // A small but normal factor stays accepted, and its logits are finite.
  const auto path = write_tiny("small_factor.gguf", s, {}, [](gguf::Writer& w) {
    w.set_string("qwen3.rope.scaling.type", "linear");
    w.set_f32("qwen3.rope.scaling.factor", 1e-30f);
  });
  auto m = Model::load(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  core::ThreadPool pool(1);
  Workspace ws;
  auto cache = KvCache::create((*m)->config(), 8);
  ASSERT_TRUE(cache.has_value());
  const std::vector<int32_t> ids = {3, 7, 39, 5};
  for (float v : testing::run_sequence(**m, ids, 0, *cache, ws, pool, true)) {
    ASSERT_TRUE(std::isfinite(v));
  }
  std::filesystem::remove(path);
}

// A tokenizer with more tokens than token_embd.weight has rows used to pass
// `validate` and load, then fail mid-run on the first prompt whose ids fell
// past the last row. Fewer tokens than rows (padding rows) stays valid.
TEST(CheckModel, TokenizerLargerThanEmbeddingIsNamed) {
  TinySpec s;  // 40 embedding rows
  auto tokens = [](int n) {
    std::vector<std::string> t;
    for (int i = 0; i < n; ++i) {
      std::string name = "t";  // (not "t" + to_string: g++ 12 -Wrestrict false positive)
      name += std::to_string(i);
      t.push_back(std::move(name));
    }
    return t;
  };
  const auto big = write_tiny("vocab_big.gguf", s, {},
                              [&](gguf::Writer& w) { w.set_string_array("tokenizer.ggml.tokens", tokens(41)); });
  auto f = open_or_fail(big);
  ASSERT_TRUE(f);
  const auto problems = check_model(*f);
  ASSERT_EQ(problems.size(), 1u) << join(problems);
  EXPECT_TRUE(any_contains(problems, "tokenizer.ggml.tokens has 41 entries")) << join(problems);
  EXPECT_TRUE(any_contains(problems, "'token_embd.weight' has only 40 rows")) << join(problems);
  EXPECT_FALSE(ModelConfig::from_gguf(*f).has_value());
  std::filesystem::remove(big);
  for (int n : {40, 39}) {
    const auto ok = write_tiny("vocab_ok.gguf", s, {},
                               [&](gguf::Writer& w) { w.set_string_array("tokenizer.ggml.tokens", tokens(n)); });
    auto g = open_or_fail(ok);
    ASSERT_TRUE(g);
    EXPECT_TRUE(check_model(*g).empty()) << n << ": " << join(check_model(*g));
    std::filesystem::remove(ok);
  }
}

// block_count 1 on a file with two layers of tensors used to validate and run
// as a 1-layer model, silently ignoring half the weights (llama.cpp refuses:
// "wrong number of tensors"). Unused tensors are now one named problem.
TEST(CheckModel, TensorsBeyondBlockCountAreNamed) {
  TinySpec s;  // 2 layers of tensors
  const auto path = write_tiny("unused.gguf", s, {}, [](gguf::Writer& w) { w.set_u32("qwen3.block_count", 1); });
  auto f = open_or_fail(path);
  ASSERT_TRUE(f);
  const auto problems = check_model(*f);
  ASSERT_EQ(problems.size(), 1u) << join(problems);
  EXPECT_TRUE(any_contains(problems, "11 tensors are not part of a 1-layer qwen3 model")) << join(problems);
  EXPECT_TRUE(any_contains(problems, "'blk.1.attn_norm.weight'")) << join(problems);
  EXPECT_TRUE(any_contains(problems, "qwen3.block_count")) << join(problems);
  EXPECT_FALSE(Model::from_file(f).has_value());
  std::filesystem::remove(path);
  // An untied file whose tensors are all used stays valid.
  s.tied = false;
  const auto ok = write_tiny("untied_ok.gguf", s);
  auto g = open_or_fail(ok);
  ASSERT_TRUE(g);
  EXPECT_TRUE(check_model(*g).empty()) << join(check_model(*g));
  std::filesystem::remove(ok);
}

}  // namespace
}  // namespace bonsai::model
