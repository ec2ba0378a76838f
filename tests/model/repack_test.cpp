// Load-time repacked weights (DESIGN.md "Weights", issue 8 decision 2):
// logits are bit-identical with and without repacking on every fixture
// (prefill and batched decode); --no-repack (LoadOptions::repack = false)
// keeps every matrix a zero-copy view; a repacked model's resident memory
// (its mapping plus the packed copies) stays within the file size + 5%.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "model_test_util.h"

namespace bonsai::model {
namespace {

using testing::run_sequence;

const char* const kFixtures[] = {"fixtures/qwen3-tiny-q1_0.gguf",
                                 "fixtures/qwen3-tiny-q2_0.gguf",
                                 "fixtures/qwen3-tiny-q2_0-paired-g64.gguf",
                                 "fixtures/qwen3-tiny-q2_0-paired-g128-d-first.gguf",
                                 "fixtures/qwen3-tiny-q2_0-paired-g128-qs-first.gguf",
                                 "fixtures/qwen3-tiny-f16.gguf"};

std::shared_ptr<const Model> load(const std::string& path, bool repack) {
  LoadOptions o;
  o.repack = repack;
  auto m = Model::load(path, o);
  EXPECT_TRUE(m.has_value()) << (m ? "" : m.error().message);
  return m ? *m : nullptr;
}

// Every product matrix of the model.
std::vector<const kernels::MatrixView*> matrices(const Model& m) {
  std::vector<const kernels::MatrixView*> v{&m.weights().output};
  for (const LayerWeights& L : m.weights().layers)
    for (const kernels::MatrixView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) v.push_back(w);
  return v;
}

// Resident bytes of the mapping (VMA) that contains `p`, from /proc/self/smaps.
uint64_t vma_rss(const void* p) {
  std::ifstream in("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's header line
      inside = a >= lo && a < hi;
      continue;
    }
    unsigned long kb = 0;
    if (inside && std::sscanf(line.c_str(), "Rss: %lu kB", &kb) == 1) return uint64_t{kb} << 10;
  }
  return 0;
}

TEST(Repack, LogitsBitIdenticalWithAndWithoutRepack) {
  core::ThreadPool pool(2);
  const std::vector<int32_t> ids = {1, 17, 300, 5, 42, 99, 7, 250, 3, 11, 64, 128};
  int repacked_models = 0;
  for (const char* fx : kFixtures) {
    const std::string path = test::shared_path(fx);
    BONSAI_REQUIRE_FILE(path);
    auto packed = load(path, true);
    auto plain = load(path, false);
    ASSERT_TRUE(packed && plain);
    const RepackStats& st = packed->repack_stats();
    EXPECT_EQ(plain->repack_stats().tensors, 0) << fx;
    for (const kernels::MatrixView* w : matrices(*plain)) {
      EXPECT_EQ(w->packed, nullptr) << fx;
      EXPECT_EQ(w->packing, kernels::Packing::kNone) << fx;
    }
    if (st.tensors > 0) {
      ++repacked_models;
      EXPECT_NE(st.packing, kernels::Packing::kNone) << fx;
      int packed_views = 0;
      std::array<int, kernels::kPackingCount> by{};  // the views' layouts, against by_packing
      for (const kernels::MatrixView* w : matrices(*packed)) {
        packed_views += w->packed != nullptr ? 1 : 0;
        if (w->packed != nullptr) ++by[static_cast<size_t>(w->packing)];
      }
      EXPECT_EQ(packed_views, st.tensors) << fx;
      EXPECT_EQ(by, st.by_packing) << fx;
      int kinds = 0;
      for (size_t i = 1; i < by.size(); ++i) kinds += by[i] > 0 ? 1 : 0;
      if (kinds > 1) {  // e.g. "(169 tile16, 28 avx512-row-quad)"
        for (size_t i = 1; i < by.size(); ++i) {
          if (by[i] == 0) continue;
          const std::string part =
              std::to_string(by[i]) + " " + std::string(kernels::packing_name(static_cast<kernels::Packing>(i)));
          EXPECT_NE(describe(st).find(part), std::string::npos) << describe(st);
        }
      }
      EXPECT_GT(st.bytes, 0u);
      EXPECT_NE(describe(st).find("repacked " + std::to_string(st.tensors) + " tensors"), std::string::npos)
          << describe(st);
    } else {
      EXPECT_EQ(describe(st), "weights not repacked (zero-copy)");
    }
    // Prefill of one sequence, every position's logits.
    const int64_t n_ctx = 64;
    auto c1 = KvCache::create(packed->config(), n_ctx);
    auto c2 = KvCache::create(plain->config(), n_ctx);
    ASSERT_TRUE(c1 && c2);
    Workspace w1, w2;
    const auto l1 = run_sequence(*packed, ids, 0, *c1, w1, pool, true);
    const auto l2 = run_sequence(*plain, ids, 0, *c2, w2, pool, true);
    ASSERT_EQ(l1.size(), l2.size());
    EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0) << fx << " prefill";
    // One decode step of three sequences in one batch (small-N products).
    std::vector<std::unique_ptr<KvCache>> k1, k2;
    std::vector<KvCache*> p1, p2;
    Batch b;
    for (int s = 0; s < 3; ++s) {
      auto a = KvCache::create(packed->config(), n_ctx);
      auto c = KvCache::create(plain->config(), n_ctx);
      ASSERT_TRUE(a && c);
      k1.push_back(std::make_unique<KvCache>(std::move(*a)));
      k2.push_back(std::make_unique<KvCache>(std::move(*c)));
      p1.push_back(k1.back().get());
      p2.push_back(k2.back().get());
      b.add(ids[static_cast<size_t>(s)], 0, s, true);
    }
    std::vector<float> d1(3 * static_cast<size_t>(packed->config().n_vocab)), d2(d1.size());
    ASSERT_TRUE(packed->forward(b, p1, w1, d1, pool).has_value());
    ASSERT_TRUE(plain->forward(b, p2, w2, d2, pool).has_value());
    EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(float)), 0) << fx << " batched decode";
  }
  // (A probe shape every packing takes: 16 rows of 2,048 Q1_0 columns, no padding.)
  if (kernels::packing_for(kernels::MatrixView{&ids, kernels::Format::kQ1_0, 16, 2048, 288}) !=
      kernels::Packing::kNone) {
    EXPECT_GT(repacked_models, 0) << "the active tier has a packing, but no fixture was repacked";
  }
}

// A repacked model's weights are resident once: the mapping's pages of the
// repacked tensors were released, so mapping + packed copies <= file + 5%
// after a forward pass has touched every weight.
TEST(Repack, ResidentMemoryStaysAboutTheFileSize) {
  const std::string path = test::shared_path("fixtures/qwen3-tiny-q2_0.gguf");
  BONSAI_REQUIRE_FILE(path);
  auto m = load(path, true);
  ASSERT_TRUE(m);
  const RepackStats& st = m->repack_stats();
  if (st.tensors == 0) GTEST_SKIP() << "the active kernel tier has no packed layout";
  core::ThreadPool pool(2);
  auto cache = KvCache::create(m->config(), 32);
  ASSERT_TRUE(cache);
  Workspace ws;
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  (void)run_sequence(*m, ids, 0, *cache, ws, pool, false);
  const uint64_t file = std::filesystem::file_size(path);
  const uint64_t mapped = vma_rss(m->file().mapping()->data());
  const void* first_packed = nullptr;  // the packed copies share one mapping
  for (const kernels::MatrixView* w : matrices(*m))
    if (first_packed == nullptr && w->packed != nullptr) first_packed = w->packed;
  const uint64_t packed = vma_rss(first_packed);
  EXPECT_GE(packed, st.bytes / 2) << "the packed copies are what the forward pass read";
  // Released: every tensor's page-aligned interior (at most 2 partial pages each are kept).
  EXPECT_GE(st.released_bytes + uint64_t{8192} * static_cast<uint64_t>(st.tensors), st.bytes) << describe(st);
  EXPECT_LE(mapped + packed, file + file / 20) << "mapping " << (mapped >> 10) << " KiB + packed " << (packed >> 10)
                                               << " KiB vs file " << (file >> 10) << " KiB; " << describe(st);
  std::printf("file %llu KiB, mapping resident %llu KiB, packed resident %llu KiB; %s\n",
              static_cast<unsigned long long>(file >> 10), static_cast<unsigned long long>(mapped >> 10),
              static_cast<unsigned long long>(packed >> 10), describe(st).c_str());
}

}  // namespace
}  // namespace bonsai::model
