// PTQ1_0 weights packed at load (kernels.h "Load-time transcoding"): a
// synthetic qwen35 Bonsai 2 model (PTQ1_0 + Hadamard fold) whose widths are
// multiples of 1,024 columns, so the AVX-512 tier packs its matrices as
// their PQ2_0 twins' row quads (the tiny fixtures' 128-column rows pad too
// much for that and are transcoded): the logits of a prompt, every
// position, and of two batched decode steps are bit-identical to the
// zero-copy model's (PTQ1_0 read directly), and the load says what it did.
#include <gtest/gtest.h>
#include <unistd.h>  // getpid: temp files unique per test process

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/bonsai/synth.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model_test_util.h"

namespace bonsai::model {
namespace {

using testing::run_sequence;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Qwen35Ptq1Pack, PackedLogitsEqualZeroCopyBits) {
  synth::Options o;
  o.preset = *synth::preset("tiny", synth::Arch::kQwen35);
  o.preset.n_embd = 1024;  // every matrix reading the residual: 1,024 columns
  o.preset.n_ff = 1024;    // ffn_down too
  o.preset.n_layer = 4;    // 3 GDN layers and one full-attention layer
  o.type = synth::WeightType::kPTQ1_0;
  o.hadamard = true;
  o.seed = 11;
  auto w = synth::build(o);
  ASSERT_TRUE(w.has_value()) << w.error().message;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("bonsai-q35-ptq1-pack-" + std::to_string(::getpid()) + ".gguf"))
          .string();
  ASSERT_TRUE(w->write(path).has_value());
  auto packed = Model::load(path);
  auto zero_copy = Model::load(path, LoadOptions{.repack = false});
  std::filesystem::remove(path);  // (the mappings stay valid)
  ASSERT_TRUE(packed.has_value()) << packed.error().message;
  ASSERT_TRUE(zero_copy.has_value()) << zero_copy.error().message;
  const Model& m = **packed;
  const RepackStats& st = m.repack_stats();
  const kernels::MatrixView& gate = m.weights().layers[0].w_gate;
  const kernels::Tier tier = kernels::active_tier();
  if (tier == kernels::Tier::kAvx512 && kernels::packing_for(gate) == kernels::Packing::kAvx512RowQuad) {
    // (not where the AMX path is in use: it reads stored layouts)
    EXPECT_EQ(gate.format, kernels::Format::kPTQ1_0);  // the file's bytes stay the stored copy
    EXPECT_EQ(gate.packing, kernels::Packing::kAvx512RowQuad);
    EXPECT_NE(gate.packed, nullptr);
    EXPECT_GT(st.by_packing[static_cast<size_t>(kernels::Packing::kAvx512RowQuad)], 0);
    EXPECT_NE(describe(st).find("avx512-row-quad"), std::string::npos) << describe(st);
  } else if (tier == kernels::Tier::kAvx2 || tier == kernels::Tier::kAvx512) {
    EXPECT_EQ(gate.format, kernels::Format::kPQ2_0);  // transcoded
    EXPECT_GT(st.transcoded, 0);
  } else {
    EXPECT_EQ(gate.format, kernels::Format::kPTQ1_0);
  }
  core::ThreadPool pool(2);
  Workspace ws;
  std::vector<int32_t> ids;
  for (int i = 0; i < 21; ++i) ids.push_back((i * 197 + 13) % 8000);
  auto c1 = KvCache::create(m.config(), 64);
  auto c2 = KvCache::create(m.config(), 64);
  ASSERT_TRUE(c1.has_value() && c2.has_value());
  const std::vector<float> a = run_sequence(m, ids, 0, *c1, ws, pool, true);
  const std::vector<float> b = run_sequence(**zero_copy, ids, 0, *c2, ws, pool, true);
  ASSERT_EQ(a.size(), ids.size() * static_cast<size_t>(m.config().n_vocab));
  EXPECT_TRUE(same_bits(a, b));
  // Decode steps (one row each: the GEMV path).
  for (int32_t t : {5, 4242}) {
    const int32_t pos = static_cast<int32_t>(c1->size());
    const std::vector<int32_t> one{t};
    EXPECT_TRUE(same_bits(run_sequence(m, one, pos, *c1, ws, pool, false),
                          run_sequence(**zero_copy, one, pos, *c2, ws, pool, false)))
        << "token " << t;
  }
}

}  // namespace
}  // namespace bonsai::model
