// Hostile qwen35 files (issue 30: "a hostile qwen35 file (fuzzed shapes,
// state sizes) never crashes the process"). A valid tiny qwen35 model is
// built with `bonsai synth`'s library (synth::build), then
//   - one metadata key at a time is set to a value that breaks a rule of
//     ModelConfig (state sizes, head counts, the attention interval, widths):
//     Model::load must refuse it with an error naming that key or a tensor
//     whose shape no longer fits, never crash or allocate absurdly;
//   - deterministic byte flips over the whole file: every load either fails
//     cleanly or gives a model whose forward pass runs on a short prompt.
// Run under scripts/sanitize.sh asan to prove there is no over-read.
#include <gtest/gtest.h>
#include <unistd.h>  // getpid: temp files unique per test process

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/bonsai/synth.h"  // synth::build: the valid base file
#include "core/thread_pool.h"
#include "model/model.h"

namespace bonsai::model {
namespace {

synth::Options tiny_options() {
  synth::Options o;
  o.preset = *synth::preset("tiny", synth::Arch::kQwen35);
  o.type = synth::WeightType::kQ1_0;
  o.seed = 3;
  return o;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("bonsai-q35-hostile-" + name + "-" + std::to_string(::getpid()) + ".gguf"))
      .string();
}

TEST(Qwen35Hostile, TheBaseFileLoadsAndRuns) {
  auto w = synth::build(tiny_options());
  ASSERT_TRUE(w.has_value()) << w.error().message;
  const std::string path = temp_path("ok");
  ASSERT_TRUE(w->write(path).has_value());
  auto m = Model::load(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  EXPECT_EQ((*m)->config().arch, Arch::kQwen35);
  std::filesystem::remove(path);
}

// Each case: the key, a setter, and a word the error must contain.
struct KeyCase {
  const char* name;
  void (*set)(gguf::Writer&);
  const char* expect;  // substring of the error message
};

const KeyCase kKeyCases[] = {
    {"conv_kernel_0", [](gguf::Writer& w) { w.set_u32("qwen35.ssm.conv_kernel", 0); }, "ssm.conv_kernel"},
    {"conv_kernel_1", [](gguf::Writer& w) { w.set_u32("qwen35.ssm.conv_kernel", 1); }, "ssm.conv_kernel"},
    {"conv_kernel_huge", [](gguf::Writer& w) { w.set_u32("qwen35.ssm.conv_kernel", 1u << 30); }, "ssm.conv_kernel"},
    {"state_size_0", [](gguf::Writer& w) { w.set_u32("qwen35.ssm.state_size", 0); }, "ssm.state_size"},
    {"state_size_huge", [](gguf::Writer& w) { w.set_u32("qwen35.ssm.state_size", 1u << 20); }, "ssm.state_size"},
    {"state_size_other", [](gguf::Writer& w) { w.set_u32("qwen35.ssm.state_size", 16); }, "inner_size"},
    {"group_count_0", [](gguf::Writer& w) { w.set_u32("qwen35.ssm.group_count", 0); }, "ssm.group_count"},
    {"group_count_3", [](gguf::Writer& w) { w.set_u32("qwen35.ssm.group_count", 3); }, "ssm.group_count"},
    {"time_step_rank_7", [](gguf::Writer& w) { w.set_u32("qwen35.ssm.time_step_rank", 7); }, "ssm.time_step_rank"},
    {"inner_size_other", [](gguf::Writer& w) { w.set_u32("qwen35.ssm.inner_size", 255); }, "ssm.inner_size"},
    {"interval_0", [](gguf::Writer& w) { w.set_u32("qwen35.full_attention_interval", 0); }, "full_attention_interval"},
    {"interval_past_layers", [](gguf::Writer& w) { w.set_u32("qwen35.full_attention_interval", 5); },
     "full_attention_interval"},
    {"interval_2", [](gguf::Writer& w) { w.set_u32("qwen35.full_attention_interval", 2); }, "tensor"},
    {"key_length_other", [](gguf::Writer& w) { w.set_u32("qwen35.attention.key_length", 32); }, "key_length"},
    {"head_count_kv_3", [](gguf::Writer& w) { w.set_u32("qwen35.attention.head_count_kv", 3); }, "head_count"},
    {"block_count_5", [](gguf::Writer& w) { w.set_u32("qwen35.block_count", 5); }, "tensor"},
    {"block_count_3", [](gguf::Writer& w) { w.set_u32("qwen35.block_count", 3); }, "block_count"},
    {"state_size_string", [](gguf::Writer& w) { w.set_string("qwen35.ssm.state_size", "32"); }, "ssm.state_size"},
};

TEST(Qwen35Hostile, BrokenKeysAreRefusedByName) {
  for (const KeyCase& kc : kKeyCases) {
    SCOPED_TRACE(kc.name);
    auto w = synth::build(tiny_options());
    ASSERT_TRUE(w.has_value());
    kc.set(*w);  // an existing key is replaced
    const std::string path = temp_path(kc.name);
    ASSERT_TRUE(w->write(path).has_value());
    auto m = Model::load(path);
    std::filesystem::remove(path);
    ASSERT_FALSE(m.has_value()) << "loaded";
    EXPECT_NE(m.error().message.find(kc.expect), std::string::npos) << m.error().message;
  }
}

// Deterministic flips of single bytes across the file (xorshift positions):
// a load fails with an error or gives a model that runs a short prompt.
TEST(Qwen35Hostile, ByteFlipsNeverCrash) {
  auto w = synth::build(tiny_options());
  ASSERT_TRUE(w.has_value());
  const std::vector<uint8_t> base = w->to_bytes();
  const std::string path = temp_path("flip");
  core::ThreadPool pool(1);
  uint64_t s = 0x9e3779b97f4a7c15ULL;
  int loaded = 0, refused = 0;
  // The header and metadata (where sizes live) get most of the flips.
  const size_t meta = std::min<size_t>(base.size(), 400000);
  for (int it = 0; it < 160; ++it) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    std::vector<uint8_t> bytes = base;
    const size_t at = static_cast<size_t>(s % (it % 4 == 3 ? bytes.size() : meta));
    bytes[at] ^= static_cast<uint8_t>(1u << (s >> 61));
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    auto m = Model::load(path, LoadOptions{});
    if (!m) {
      ++refused;
      EXPECT_FALSE(m.error().message.empty());
      continue;
    }
    ++loaded;
    auto cache = KvCache::create((*m)->config(), 16);
    ASSERT_TRUE(cache.has_value()) << "flip at " << at;
    Workspace ws;
    const int32_t ids[] = {1, 2, 3};
    Batch b = Batch::for_sequence(ids, 0);
    std::vector<float> logits(static_cast<size_t>((*m)->config().n_vocab));
    KvCache* caches[] = {&*cache};
    EXPECT_TRUE((*m)->forward(b, caches, ws, logits, pool).has_value()) << "flip at " << at;
  }
  std::filesystem::remove(path);
  std::printf("[hostile] qwen35 byte flips: %d loaded and ran, %d refused\n", loaded, refused);
  EXPECT_EQ(loaded + refused, 160);
}

}  // namespace
}  // namespace bonsai::model
