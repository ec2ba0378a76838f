// `bonsai synth` library tests: the written file parses, has every tensor and
// key a Bonsai/Qwen3 file has, a consistent BPE tokenizer, well-scaled
// weights, is deterministic per seed, and the default-model cache works.
#include "apps/bonsai/synth.h"

#include <gtest/gtest.h>
#include <unistd.h>  // getpid: temp files unique per test process

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "gguf/gguf.h"
#include "kernels/kernels.h"

namespace bonsai::synth {
namespace {

std::vector<uint8_t> synth_bytes(const std::string& preset_name, WeightType type, uint64_t seed) {
  Options o{preset(preset_name).value(), type, seed};
  auto w = build(o);
  EXPECT_TRUE(w) << (w ? "" : w.error().message);
  return w ? w->to_bytes() : std::vector<uint8_t>{};
}

std::shared_ptr<const gguf::File> parse(const std::vector<uint8_t>& bytes) {
  auto f = gguf::File::parse(core::MappedFile::from_bytes(bytes, "synth.gguf"));
  EXPECT_TRUE(f) << (f ? "" : f.error().message);
  return f ? *f : nullptr;
}

TEST(Synth, TinyHasEveryTensorAndKey) {
  const auto bytes = synth_bytes("tiny", WeightType::kQ1_0, 1);
  auto f = parse(bytes);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->get<std::string>("general.architecture").value(), "qwen3");
  EXPECT_EQ(f->get<uint32_t>("qwen3.block_count").value(), 2u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.embedding_length").value(), 256u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.feed_forward_length").value(), 768u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.attention.head_count").value(), 4u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.attention.head_count_kv").value(), 2u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.attention.key_length").value(), 64u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.attention.value_length").value(), 64u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.context_length").value(), 4096u);
  EXPECT_EQ(f->get<float>("qwen3.rope.freq_base").value(), 1e6f);
  EXPECT_EQ(f->get<float>("qwen3.attention.layer_norm_rms_epsilon").value(), 1e-6f);
  EXPECT_FALSE(f->has("qwen3.rope.scaling.type"));
  EXPECT_EQ(f->get<uint32_t>("general.file_type").value(), 40u);
  EXPECT_EQ(f->get<uint32_t>("general.quantization_version").value(), 2u);

  const int64_t E = 256, V = 2048, Q = 4 * 64, KV = 2 * 64, F = 768;
  auto expect_tensor = [&](const std::string& name, core::GgmlType type, std::vector<int64_t> ne) {
    const gguf::TensorInfo* t = f->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type, type) << name;
    ASSERT_EQ(t->n_dims, ne.size()) << name;
    for (size_t d = 0; d < ne.size(); ++d) EXPECT_EQ(t->ne[d], ne[d]) << name << " dim " << d;
  };
  expect_tensor("token_embd.weight", core::GgmlType::Q1_0, {E, V});
  expect_tensor("output_norm.weight", core::GgmlType::F32, {E});
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    expect_tensor(b + "attn_norm.weight", core::GgmlType::F32, {E});
    expect_tensor(b + "attn_q.weight", core::GgmlType::Q1_0, {E, Q});
    expect_tensor(b + "attn_k.weight", core::GgmlType::Q1_0, {E, KV});
    expect_tensor(b + "attn_v.weight", core::GgmlType::Q1_0, {E, KV});
    expect_tensor(b + "attn_output.weight", core::GgmlType::Q1_0, {Q, E});
    expect_tensor(b + "attn_q_norm.weight", core::GgmlType::F32, {64});
    expect_tensor(b + "attn_k_norm.weight", core::GgmlType::F32, {64});
    expect_tensor(b + "ffn_norm.weight", core::GgmlType::F32, {E});
    expect_tensor(b + "ffn_gate.weight", core::GgmlType::Q1_0, {E, F});
    expect_tensor(b + "ffn_up.weight", core::GgmlType::Q1_0, {E, F});
    expect_tensor(b + "ffn_down.weight", core::GgmlType::Q1_0, {F, E});
  }
  EXPECT_EQ(f->tensors().size(), 2u + 2u * 11u);
}

TEST(Synth, TokenizerIsConsistentByteLevelBpe) {
  auto f = parse(synth_bytes("tiny", WeightType::kQ1_0, 1));
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->get<std::string>("tokenizer.ggml.model").value(), "gpt2");
  EXPECT_EQ(f->get<std::string>("tokenizer.ggml.pre").value(), "qwen2");
  auto tokens = f->get_string_array("tokenizer.ggml.tokens").value();
  auto types = f->get_i32_array("tokenizer.ggml.token_type").value();
  auto merges = f->get_string_array("tokenizer.ggml.merges").value();
  ASSERT_EQ(tokens.size(), 2048u);
  ASSERT_EQ(types.size(), 2048u);
  EXPECT_EQ(tokens[0], "!");
  EXPECT_EQ(tokens[93], "~");
  EXPECT_EQ(tokens[94], "\xc2\xa1");  // '!'..'~' are ids 0..93, then U+00A1
  // GPT-2 byte alphabet: space (0x20) is U+0120 'Ġ', newline U+010A 'Ċ'.
  std::set<std::string_view> token_set(tokens.begin(), tokens.end());
  EXPECT_TRUE(token_set.count("\xc4\xa0"));
  EXPECT_TRUE(token_set.count("\xc4\x8a"));
  EXPECT_EQ(token_set.size(), tokens.size());  // no duplicates
  for (int i = 0; i < 256; ++i) EXPECT_EQ(types[i], 1) << i;
  // Every merge joins two existing tokens into an existing token.
  EXPECT_GT(merges.size(), 100u);
  for (std::string_view m : merges) {
    const size_t sp = m.find(' ');
    ASSERT_NE(sp, std::string_view::npos) << m;
    const std::string a(m.substr(0, sp)), b(m.substr(sp + 1));
    EXPECT_TRUE(token_set.count(a)) << m;
    EXPECT_TRUE(token_set.count(b)) << m;
    EXPECT_TRUE(token_set.count(a + b)) << m;
  }
  EXPECT_TRUE(token_set.count("\xc4\xa0the"));  // " the" is learned
  // Qwen specials at their ids relative to the end of the vocabulary.
  const uint32_t eos = f->get<uint32_t>("tokenizer.ggml.eos_token_id").value();
  const uint32_t bos = f->get<uint32_t>("tokenizer.ggml.bos_token_id").value();
  EXPECT_EQ(tokens[eos], "<|im_end|>");
  EXPECT_EQ(tokens[bos], "<|endoftext|>");
  EXPECT_EQ(f->get<uint32_t>("tokenizer.ggml.padding_token_id").value(), bos);
  EXPECT_EQ(tokens[2048 - 26 + 1], "<|im_start|>");
  EXPECT_EQ(tokens[2046], "<think>");
  EXPECT_EQ(tokens[2047], "</think>");
  EXPECT_EQ(types[eos], 3);
  EXPECT_EQ(types[2046], 4);
  int control = 0, user = 0, unused = 0, normal = 0;
  for (size_t i = 0; i < types.size(); ++i) {
    normal += types[i] == 1;
    control += types[i] == 3;
    user += types[i] == 4;
    if (types[i] == 5) {
      ++unused;
      EXPECT_EQ(tokens[i], "[PAD" + std::to_string(i) + "]");
    }
  }
  EXPECT_EQ(control, 20);
  EXPECT_EQ(user, 6);
  EXPECT_GT(normal, 256 + 100);  // bytes + learned merge tokens
  EXPECT_EQ(normal + control + user + unused, 2048);
  EXPECT_GT(unused, 0);
  EXPECT_FALSE(f->get<bool>("tokenizer.ggml.add_bos_token").value());
  const std::string tmpl = f->get<std::string>("tokenizer.chat_template").value();
  EXPECT_NE(tmpl.find("<|im_start|>"), std::string::npos);
  EXPECT_NE(tmpl.find("add_generation_prompt"), std::string::npos);

  // The big presets keep Qwen3's real special ids.
  auto big = build_vocab(151669).value();
  EXPECT_EQ(big.tokens.size(), 151669u);
  EXPECT_EQ(big.eos_id, 151645u);
  EXPECT_EQ(big.bos_id, 151643u);
  EXPECT_EQ(big.tokens[151667], "<think>");
  EXPECT_EQ(big.tokens[151657], "<tool_call>");
  EXPECT_FALSE(build_vocab(100).has_value());
}

TEST(Synth, DeterministicPerSeed) {
  const auto a = synth_bytes("tiny", WeightType::kQ1_0, 1);
  const auto b = synth_bytes("tiny", WeightType::kQ1_0, 1);
  const auto c = synth_bytes("tiny", WeightType::kQ1_0, 2);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), c.size());
  EXPECT_NE(a, c);
  // write() streams the same bytes as to_bytes().
  const auto path =
      (std::filesystem::temp_directory_path() / ("bonsai_synth_test-" + std::to_string(::getpid()) + ".gguf")).string();
  Options o{preset("tiny").value(), WeightType::kQ1_0, 1};
  ASSERT_TRUE(write_model(path, o));
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(disk, a);
  std::filesystem::remove(path);
}

// Mean square of a dequantized tensor's rows.
double tensor_ms(const gguf::TensorInfo& t, std::vector<double>* row_norms = nullptr) {
  const auto fmt = kernels::format_of(t.type).value();
  std::vector<float> row(static_cast<size_t>(t.ne[0]));
  double total = 0;
  for (int64_t r = 0; r < t.ne[1]; ++r) {
    kernels::dequantize_row(fmt, t.data + r * t.nb[1], row.data(), t.ne[0]);
    double s = 0;
    for (float x : row) s += static_cast<double>(x) * x;
    total += s;
    if (row_norms) row_norms->push_back(std::sqrt(s));
  }
  return total / static_cast<double>(t.n_elements());
}

TEST(Synth, WeightsAreWellScaledInEveryType) {
  for (WeightType type : {WeightType::kQ1_0, WeightType::kQ2_0, WeightType::kF16}) {
    const auto bytes = synth_bytes("tiny", type, 3);
    auto f = parse(bytes);
    ASSERT_NE(f, nullptr);
    if (type == WeightType::kQ2_0) {
      ASSERT_TRUE(f->q2_layout());
      EXPECT_EQ(*f->q2_layout(), core::Q2Layout::kG64);
    }
    // Projections: entry rms ~ gain/sqrt(row length), gain 1.5 (x4 on the residual
    // branches); quantization changes it by < 2x.
    for (const auto& [name, gain] :
         {std::pair{"blk.0.attn_q.weight", 1.5}, std::pair{"blk.1.ffn_up.weight", 1.5},
          std::pair{"blk.1.ffn_down.weight", 6.0}, std::pair{"blk.0.attn_output.weight", 6.0}}) {
      const gguf::TensorInfo* t = f->find_tensor(name);
      ASSERT_NE(t, nullptr);
      const double want = gain / std::sqrt(static_cast<double>(t->ne[0]));
      const double rms = std::sqrt(tensor_ms(*t));
      EXPECT_GT(rms, 0.5 * want) << name << " " << weight_type_name(type);
      EXPECT_LT(rms, 1.5 * want) << name << " " << weight_type_name(type);
    }
    // The tied lm head: rows have spread norms (a clear argmax), none zero.
    std::vector<double> norms;
    tensor_ms(*f->find_tensor("token_embd.weight"), &norms);
    const auto [lo, hi] = std::minmax_element(norms.begin(), norms.end());
    EXPECT_GT(*lo, 0.0);
    EXPECT_GT(*hi / *lo, 2.0);
    // Rows of PAD/special tokens (the last ones) are quiet: they rarely win the argmax.
    auto types = f->get_i32_array("tokenizer.ggml.token_type").value();
    double normal_sum = 0, quiet_sum = 0;
    int n_normal = 0, n_quiet = 0;
    for (size_t i = 0; i < norms.size(); ++i) {
      if (types[i] == 1)
        normal_sum += norms[i], ++n_normal;
      else
        quiet_sum += norms[i], ++n_quiet;
    }
    ASSERT_GT(n_quiet, 0);
    EXPECT_LT(quiet_sum / n_quiet, 0.5 * normal_sum / n_normal);
    // Norm weights are finite and near 1.
    const gguf::TensorInfo* qn = f->find_tensor("blk.0.attn_q_norm.weight");
    const float* w = reinterpret_cast<const float*>(qn->data);
    for (int i = 0; i < 64; ++i) {
      EXPECT_GE(w[i], 0.8f);
      EXPECT_LE(w[i], 1.8f);
    }
  }
}

TEST(Synth, PresetsHaveBonsaiShapes) {
  const Preset p17 = preset("1.7b").value();
  EXPECT_EQ(p17.n_embd, 2048u);
  EXPECT_EQ(p17.n_layer, 28u);
  EXPECT_EQ(p17.n_head, 16u);
  EXPECT_EQ(p17.n_head_kv, 8u);
  EXPECT_EQ(p17.head_dim, 128u);
  EXPECT_EQ(p17.n_ff, 6144u);
  EXPECT_EQ(p17.n_vocab, 151669u);
  EXPECT_EQ(p17.n_ctx, 32768u);
  EXPECT_TRUE(p17.tied);
  const Preset p4 = preset("4b").value();
  EXPECT_EQ(p4.n_embd, 2560u);
  EXPECT_EQ(p4.n_layer, 36u);
  EXPECT_EQ(p4.n_ff, 9728u);
  const Preset p8 = preset("8b").value();
  EXPECT_EQ(p8.n_embd, 4096u);
  EXPECT_EQ(p8.n_ff, 12288u);
  EXPECT_FALSE(p8.tied);
  EXPECT_EQ(p8.n_ctx, 65536u);
  EXPECT_EQ(p8.yarn_factor, 4.0f);
  EXPECT_EQ(p8.yarn_original_ctx, 16384u);
  EXPECT_FALSE(preset("70b"));
  // Building the writer is cheap (data is generated on write): check tensor counts.
  for (WeightType t : {WeightType::kQ1_0, WeightType::kQ2_0, WeightType::kF16}) {
    auto w17 = build(Options{p17, t, 1});
    ASSERT_TRUE(w17) << w17.error().message;
    EXPECT_EQ(w17->n_tensors(), 2u + 28u * 11u);
    auto w8 = build(Options{p8, t, 1});
    ASSERT_TRUE(w8) << w8.error().message;
    EXPECT_EQ(w8->n_tensors(), 3u + 36u * 11u);  // + output.weight
  }
}

TEST(Synth, UntiedYarnPresetWritesOutputAndScalingKeys) {
  // The 8b preset's structure (untied output, YaRN keys) at a small size.
  Preset p = preset("8b").value();
  p.n_embd = 256, p.n_layer = 1, p.n_ff = 512, p.n_vocab = 600, p.n_head = 4, p.n_head_kv = 2, p.head_dim = 64;
  auto w = build(Options{p, WeightType::kQ1_0, 5});
  ASSERT_TRUE(w) << w.error().message;
  auto f = parse(w->to_bytes());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->get<std::string>("qwen3.rope.scaling.type").value(), "yarn");
  EXPECT_EQ(f->get<float>("qwen3.rope.scaling.factor").value(), 4.0f);
  EXPECT_EQ(f->get<uint32_t>("qwen3.rope.scaling.original_context_length").value(), 16384u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.context_length").value(), 65536u);
  const gguf::TensorInfo* out = f->find_tensor("output.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->ne[0], 256);
  EXPECT_EQ(out->ne[1], 600);
  // Untied: the embedding is plain (rms ~1), the lm head is the scaled one.
  EXPECT_NEAR(std::sqrt(tensor_ms(*f->find_tensor("token_embd.weight"))), 0.8, 0.3);
  EXPECT_LT(std::sqrt(tensor_ms(*out)), 0.5);
  EXPECT_EQ(f->tensors().size(), 3u + 11u);
  // A bad shape for the type is refused.
  p.n_ff = 200;
  EXPECT_FALSE(build(Options{p, WeightType::kQ1_0, 5}));
}

TEST(Synth, EnsureDefaultModelWritesOnceAtomically) {
  const auto dir = std::filesystem::temp_directory_path() / ("bonsai_cache_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ::setenv("BONSAI_CACHE_DIR", dir.c_str(), 1);
  auto p1 = ensure_default_model();
  ASSERT_TRUE(p1) << p1.error().message;
  EXPECT_EQ(std::filesystem::path(*p1).parent_path(), dir);
  auto f = gguf::File::open(*p1);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ((*f)->get<uint32_t>("qwen3.embedding_length").value(), 256u);
  const auto t1 = std::filesystem::last_write_time(*p1);
  auto p2 = ensure_default_model();
  ASSERT_TRUE(p2);
  EXPECT_EQ(*p1, *p2);
  EXPECT_EQ(std::filesystem::last_write_time(*p2), t1);  // reused, not rewritten
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);  // no temp file left behind
  // A corrupt cached file is replaced.
  { std::ofstream(*p1, std::ios::trunc) << "garbage"; }
  auto p3 = ensure_default_model();
  ASSERT_TRUE(p3);
  EXPECT_TRUE(gguf::File::open(*p3));
  ::unsetenv("BONSAI_CACHE_DIR");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace bonsai::synth
