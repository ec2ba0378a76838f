// Reader tests on the real files in ../shared (fixtures and models): metadata
// values, tensor shapes/types/offsets, typed accessor errors, Q2_0 layouts.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/q2_fixture_util.h"
#include "common/test_util.h"
#include "gguf/gguf.h"

namespace bonsai::gguf {
namespace {

using test::shared_path;

std::shared_ptr<const File> open_ok(const std::string& path, const OpenOptions& opt = {}) {
  auto f = File::open(path, opt);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  return f ? *f : nullptr;
}

TEST(GgufReader, OpensEveryFixtureAndModel) {
  const auto fixtures = shared_path("fixtures");
  BONSAI_REQUIRE_FILE(fixtures);
  int n = 0;
  for (const char* dir : {"fixtures", "models/stories260K", "models/llama-2-tiny-random"}) {
    for (const auto& e : std::filesystem::directory_iterator(shared_path(dir))) {
      if (e.path().extension() != ".gguf") continue;
      auto f = open_ok(e.path().string());
      ASSERT_NE(f, nullptr) << e.path();
      EXPECT_EQ(f->version(), 3u);
      EXPECT_GT(f->tensors().size(), 0u);
      // Every tensor lies inside the file and the data pointers are consistent.
      for (const TensorInfo& t : f->tensors()) {
        EXPECT_EQ(t.data, f->mapping()->data() + f->data_offset() + t.offset) << t.name;
        EXPECT_LE(f->data_offset() + t.offset + t.n_bytes, f->mapping()->size()) << t.name;
        EXPECT_EQ(t.offset % f->alignment(), 0u);
      }
      ++n;
    }
  }
  EXPECT_EQ(n, 8);
}

TEST(GgufReader, Qwen3TinyQ1Metadata) {
  const auto path = shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(path);
  auto f = open_ok(path);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->get<std::string>("general.architecture").value(), "qwen3");
  EXPECT_EQ(f->get<uint32_t>("qwen3.block_count").value(), 2u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.embedding_length").value(), 256u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.feed_forward_length").value(), 768u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.attention.head_count").value(), 4u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.attention.head_count_kv").value(), 2u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.attention.key_length").value(), 64u);
  EXPECT_EQ(f->get<uint64_t>("qwen3.context_length").value(), 40960u);  // u32 widens
  EXPECT_EQ(f->get<int32_t>("qwen3.context_length").value(), 40960);    // and fits in i32
  EXPECT_FLOAT_EQ(f->get<float>("qwen3.rope.freq_base").value(), 1e6f);
  EXPECT_FLOAT_EQ(f->get<float>("qwen3.attention.layer_norm_rms_epsilon").value(), 1e-6f);
  EXPECT_EQ(f->get<uint32_t>("tokenizer.ggml.eos_token_id").value(), 151645u);
  EXPECT_EQ(f->get<uint32_t>("tokenizer.ggml.bos_token_id").value(), 151643u);
  EXPECT_FALSE(f->get<bool>("tokenizer.ggml.add_bos_token").value());
  EXPECT_EQ(f->get<std::string_view>("tokenizer.ggml.pre").value(), "qwen2");

  auto tokens = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens) << tokens.error().message;
  ASSERT_EQ(tokens->size(), 151936u);
  EXPECT_EQ((*tokens)[151645], "<|im_end|>");
  EXPECT_EQ((*tokens)[151643], "<|endoftext|>");
  EXPECT_EQ((*tokens)[151935], "[PAD151935]");
  auto types = f->get_i32_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types);
  ASSERT_EQ(types->size(), 151936u);
  int control = 0, user = 0, unused = 0;
  for (int32_t t : *types) {
    control += t == 3;
    user += t == 4;
    unused += t == 5;
  }
  EXPECT_EQ(control, 20);
  EXPECT_EQ(user, 6);
  EXPECT_EQ(unused, 267);
  auto merges = f->get_string_array("tokenizer.ggml.merges");
  ASSERT_TRUE(merges);
  EXPECT_EQ(merges->size(), 151387u);
  auto tmpl = f->get<std::string>("tokenizer.chat_template");
  ASSERT_TRUE(tmpl);
  EXPECT_NE(tmpl->find("<|im_start|>"), std::string::npos);

  ASSERT_EQ(f->tensors().size(), 24u);
  const TensorInfo* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, core::GgmlType::Q1_0);
  EXPECT_EQ(emb->n_dims, 2u);
  EXPECT_EQ(emb->ne[0], 256);
  EXPECT_EQ(emb->ne[1], 151936);
  EXPECT_EQ(emb->nb[0], 18u);
  EXPECT_EQ(emb->nb[1], 36u);
  EXPECT_EQ(emb->n_bytes, 151936u * 36u);
  EXPECT_EQ(emb->offset, 0u);
  const TensorInfo* down = f->find_tensor("blk.1.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->ne[0], 768);
  EXPECT_EQ(down->ne[1], 256);
  EXPECT_EQ(down->offset, 5669376u);
  const TensorInfo* norm = f->find_tensor("blk.0.attn_q_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, core::GgmlType::F32);
  EXPECT_EQ(norm->n_dims, 1u);
  EXPECT_EQ(norm->ne[0], 64);
  EXPECT_EQ(norm->n_bytes, 256u);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied
  EXPECT_FALSE(f->q2_layout().has_value());
  // Norm weights are generated in [0.8, 1.8] (make_qwen3_gguf.py --qk-norm-lo/hi).
  const float* w = reinterpret_cast<const float*>(norm->data);
  for (int i = 0; i < 64; ++i) {
    EXPECT_GE(w[i], 0.8f);
    EXPECT_LE(w[i], 1.8f);
  }
}

TEST(GgufReader, Qwen3TinyQ2AndF16) {
  const auto q2 = shared_path("fixtures/qwen3-tiny-q2_0.gguf");
  const auto f16 = shared_path("fixtures/qwen3-tiny-f16.gguf");
  BONSAI_REQUIRE_FILE(q2);
  BONSAI_REQUIRE_FILE(f16);
  auto f = open_ok(q2);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->get<uint32_t>("qwen3.block_count").value(), 3u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.embedding_length").value(), 384u);
  EXPECT_EQ(f->get<uint32_t>("qwen3.attention.key_length").value(), 128u);
  EXPECT_EQ(f->tensors().size(), 36u);
  ASSERT_TRUE(f->q2_layout().has_value());
  EXPECT_EQ(*f->q2_layout(), core::Q2Layout::kG64);
  const TensorInfo* out = f->find_tensor("output.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->type, core::GgmlType::Q2_0);
  EXPECT_EQ(out->ne[0], 384);
  EXPECT_EQ(out->ne[1], 151936);
  EXPECT_EQ(out->n_bytes, 151936u * 6u * 18u);
  const TensorInfo* q = f->find_tensor("blk.2.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->ne[0], 384);
  EXPECT_EQ(q->ne[1], 768);  // n_head * head_dim != n_embd

  auto g = open_ok(f16);
  ASSERT_NE(g, nullptr);
  const TensorInfo* up = g->find_tensor("blk.0.ffn_up.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->type, core::GgmlType::F16);
  EXPECT_EQ(up->nb[1], 512u);
  EXPECT_EQ(up->n_bytes, 256u * 768u * 2u);
  EXPECT_EQ(g->find_tensor("token_embd.weight")->type, core::GgmlType::Q1_0);
}

TEST(GgufReader, LlamaModels) {
  const auto stories = shared_path("models/stories260K/stories260K.gguf");
  const auto llama2 = shared_path("models/llama-2-tiny-random/llama-2-tiny-random.gguf");
  BONSAI_REQUIRE_FILE(stories);
  BONSAI_REQUIRE_FILE(llama2);
  auto s = open_ok(stories);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->get<std::string>("general.architecture").value(), "llama");
  EXPECT_EQ(s->get<uint32_t>("llama.block_count").value(), 5u);
  EXPECT_EQ(s->get<uint32_t>("llama.feed_forward_length").value(), 172u);
  EXPECT_EQ(s->get<uint32_t>("tokenizer.ggml.padding_token_id").value(), 4294967295u);
  EXPECT_FALSE(s->get<int32_t>("tokenizer.ggml.padding_token_id").has_value());  // does not fit
  EXPECT_EQ(s->get_string_array("tokenizer.ggml.tokens")->size(), 512u);
  auto scores = s->get_f32_array("tokenizer.ggml.scores");
  ASSERT_TRUE(scores);
  EXPECT_EQ(scores->size(), 512u);
  EXPECT_EQ(s->tensors().size(), 48u);
  const TensorInfo* w1 = s->find_tensor("blk.0.ffn_gate.weight");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->ne[0], 64);
  EXPECT_EQ(w1->ne[1], 172);

  auto l = open_ok(llama2);
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->get<uint32_t>("llama.embedding_length").value(), 8u);
  EXPECT_EQ(l->get_string_array("tokenizer.ggml.tokens")->size(), 32000u);
  EXPECT_EQ(l->tensors().size(), 12u);
  const TensorInfo* emb = l->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, core::GgmlType::F16);
  EXPECT_EQ(emb->ne[1], 32000);
}

TEST(GgufReader, AccessorErrorsNameKeyAndType) {
  const auto path = shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(path);
  auto f = open_ok(path);
  ASSERT_NE(f, nullptr);
  auto missing = f->get<uint32_t>("qwen3.nope");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, core::Errc::kNotFound);
  EXPECT_NE(missing.error().message.find("missing key 'qwen3.nope'"), std::string::npos);
  auto wrong = f->get<std::string>("qwen3.block_count");
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code, core::Errc::kFormat);
  EXPECT_NE(wrong.error().message.find("key 'qwen3.block_count' has type u32, expected string"), std::string::npos)
      << wrong.error().message;
  auto narrow = f->get<uint8_t>("qwen3.context_length");
  ASSERT_FALSE(narrow);
  EXPECT_NE(narrow.error().message.find("value 40960 does not fit in u8"), std::string::npos) << narrow.error().message;
  auto not_array = f->get_string_array("general.name");
  ASSERT_FALSE(not_array);
  EXPECT_EQ(not_array.error().code, core::Errc::kFormat);
  auto wrong_elems = f->get_f32_array("tokenizer.ggml.tokens");
  ASSERT_FALSE(wrong_elems);
  EXPECT_NE(wrong_elems.error().message.find("element 0"), std::string::npos);
  auto no_file = File::open("/nonexistent/x.gguf");
  ASSERT_FALSE(no_file);
  EXPECT_EQ(no_file.error().code, core::Errc::kNotFound);
}

struct PairedCase {
  const char* file;
  core::Q2Layout layout;
};

TEST(GgufQ2Layout, DetectsEachPairedFixture) {
  const PairedCase cases[] = {
      {"fixtures/qwen3-tiny-q2_0-paired-g64.gguf", core::Q2Layout::kG64},
      {"fixtures/qwen3-tiny-q2_0-paired-g128-d-first.gguf", core::Q2Layout::kG128DFirst},
      {"fixtures/qwen3-tiny-q2_0-paired-g128-qs-first.gguf", core::Q2Layout::kG128QsFirst},
  };
  for (const PairedCase& c : cases) {
    const auto path = shared_path(c.file);
    BONSAI_REQUIRE_FILE(path);
    auto f = open_ok(path);
    ASSERT_NE(f, nullptr) << c.file;
    ASSERT_TRUE(f->q2_layout().has_value()) << c.file;
    EXPECT_EQ(*f->q2_layout(), c.layout) << c.file << ": got " << core::q2_layout_name(*f->q2_layout());
    const TensorInfo* emb = f->find_tensor("token_embd.weight");
    ASSERT_NE(emb, nullptr);
    const uint64_t block_bytes = c.layout == core::Q2Layout::kG64 ? 18 : 34;
    const uint64_t block_elems = c.layout == core::Q2Layout::kG64 ? 64 : 128;
    EXPECT_EQ(emb->nb[0], block_bytes);
    EXPECT_EQ(emb->n_bytes, 151936u * 256u / block_elems * block_bytes) << c.file;
  }
}

TEST(GgufQ2Layout, OverrideIsHonouredOrRefused) {
  const auto d_first = shared_path("fixtures/qwen3-tiny-q2_0-paired-g128-d-first.gguf");
  const auto g64_file = shared_path("fixtures/qwen3-tiny-q2_0-paired-g64.gguf");
  BONSAI_REQUIRE_FILE(d_first);
  BONSAI_REQUIRE_FILE(g64_file);
  OpenOptions opt;
  // The right layout forced: honoured.
  opt.q2_layout = core::Q2Layout::kG128DFirst;
  auto ok = File::open(d_first, opt);
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(*(*ok)->q2_layout(), core::Q2Layout::kG128DFirst);
  // The other byte order against clear evidence in the data (violations under
  // it, none under d-first): refused, naming the order that fits. (It used to
  // load and give NaN logits.)
  opt.q2_layout = core::Q2Layout::kG128QsFirst;
  auto f = File::open(d_first, opt);
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().code, core::Errc::kFormat);
  EXPECT_NE(f.error().message.find(d_first + ": the forced Q2_0 layout g128-qs-first does not fit the data"),
            std::string::npos)
      << f.error().message;
  EXPECT_NE(f.error().message.find("none under g128-d-first"), std::string::npos) << f.error().message;
  // Forcing g64 on a g128 file makes the tensors overlap / run past the end: refused.
  opt.q2_layout = core::Q2Layout::kG64;
  auto g = File::open(d_first, opt);
  ASSERT_FALSE(g);
  EXPECT_EQ(g.error().code, core::Errc::kFormat);
  EXPECT_NE(g.error().message.find(d_first + ": offset "), std::string::npos) << g.error().message;
  // Forcing g128 on a file whose tensors end exactly on g64 blocks: refused.
  opt.q2_layout = core::Q2Layout::kG128DFirst;
  auto h = File::open(g64_file, opt);
  ASSERT_FALSE(h);
  EXPECT_NE(h.error().message.find("end exactly on 64-weight (g64) blocks"), std::string::npos) << h.error().message;
  // A file valid under both g128 byte orders: detection refuses it, and
  // either forced order is honoured (what the override is for).
  const auto amb =
      (std::filesystem::temp_directory_path() / ("bonsai_q2_ambiguous_" + std::to_string(::getpid()) + ".gguf"))
          .string();
  ASSERT_EQ(test::write_ambiguous_g128_copy(d_first, amb), "");
  auto detected = File::open(amb);
  ASSERT_FALSE(detected);
  EXPECT_NE(detected.error().message.find("byte order is ambiguous"), std::string::npos) << detected.error().message;
  for (auto l : {core::Q2Layout::kG128DFirst, core::Q2Layout::kG128QsFirst}) {
    opt.q2_layout = l;
    auto forced = File::open(amb, opt);
    ASSERT_TRUE(forced) << forced.error().message;
    EXPECT_EQ(*(*forced)->q2_layout(), l);
  }
  std::filesystem::remove(amb);
}

// Writer::write removed its output path on a write error whatever it was:
// `bonsai synth -o /dev/full` run as root deleted /dev/full. A private
// /dev/full twin (mknod needs root; skipped otherwise) must survive the error,
// while a half-written regular file is still cleaned up.
TEST(GgufWriter, WriteErrorRemovesOnlyRegularFiles) {
  Writer w;
  w.set_string("general.architecture", "qwen3");
  ASSERT_TRUE(w.add_tensor("t", core::GgmlType::F32, {1024}, std::vector<uint8_t>(4096, 0)).has_value());
  const auto dir = std::filesystem::temp_directory_path() / ("bonsai_writer_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto full = (dir / "full").string();
  if (::mknod(full.c_str(), S_IFCHR | 0666, ::makedev(1, 7)) != 0) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "mknod needs root";
  }
  auto r = w.write(full);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find(full + ": write failed"), std::string::npos) << r.error().message;
  EXPECT_TRUE(std::filesystem::exists(full)) << "the device node was deleted";
  // Regular files are still written normally.
  const auto ok = (dir / "ok.gguf").string();
  ASSERT_TRUE(w.write(ok).has_value());
  EXPECT_TRUE(File::open(ok).has_value());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace bonsai::gguf
