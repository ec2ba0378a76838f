// A split GGUF (gguf-split parts, made here by gguf::write_split into a temp
// folder) runs as the unsplit file does: the same logits bit for bit and the
// same greedy tokens in-process, for stories260K (llama) and the Qwen3 tiny
// fixtures (Q1_0; g128 Q2_0 detected per part), with and without repacking
// (repack releases each tensor's pages in its own part's mapping); and
// through the binary: `run` prints the same text, `info --json` sums the
// parts, `validate` and `bench` accept it, and a missing part is an error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../apps/cli_util.h"
#include "gguf/gguf.h"
#include "model_test_util.h"

namespace bonsai::model {
namespace {

namespace fs = std::filesystem;
using testing::argmax;
using testing::run_sequence;

class SplitModel : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("bonsai_split_model_" + std::to_string(::getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Splits `src` into `n` parts in the temp folder; returns their paths.
  std::vector<std::string> split(const std::string& src, int n, bool no_tensors_in_first = false) {
    auto f = gguf::File::open(src);
    EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
    if (!f) return {};
    auto paths = gguf::write_split(**f, n, (dir_ / fs::path(src).stem()).string(), no_tensors_in_first);
    EXPECT_TRUE(paths.has_value()) << (paths ? "" : paths.error().message);
    return paths ? *paths : std::vector<std::string>{};
  }
  fs::path dir_;
};

std::shared_ptr<const Model> load(const std::string& path, bool repack) {
  LoadOptions o;
  o.repack = repack;
  auto m = Model::load(path, o);
  EXPECT_TRUE(m.has_value()) << path << ": " << (m ? "" : m.error().message);
  return m ? *m : nullptr;
}

// All-position logits of a prompt, then `n_greedy` greedy tokens.
struct Trace {
  std::vector<float> prompt_logits;
  std::vector<int32_t> greedy;
};

Trace trace(const Model& m, const std::vector<int32_t>& prompt, int n_greedy) {
  Trace t;
  core::ThreadPool pool(2);
  Workspace ws;
  auto cache = KvCache::create(m.config(), 256);
  EXPECT_TRUE(cache.has_value());
  if (!cache) return t;
  t.prompt_logits = run_sequence(m, prompt, 0, *cache, ws, pool, true);
  const size_t V = static_cast<size_t>(m.config().n_vocab);
  int32_t tok = argmax(std::span<const float>(t.prompt_logits).subspan(t.prompt_logits.size() - V, V));
  for (int i = 0; i < n_greedy; ++i) {
    t.greedy.push_back(tok);
    const int32_t one[] = {tok};
    const auto l = run_sequence(m, one, static_cast<int32_t>(prompt.size()) + i, *cache, ws, pool, false);
    tok = argmax(l);
  }
  return t;
}

void expect_identical(const std::string& whole_path, const std::string& part_path, bool repack) {
  auto whole = load(whole_path, repack);
  auto split = load(part_path, repack);
  ASSERT_TRUE(whole && split);
  EXPECT_TRUE(split->file().is_split());
  const std::vector<int32_t> prompt = {1, 42, 7, 300, 19, 5, 88, 123};
  const Trace a = trace(*whole, prompt, 24), b = trace(*split, prompt, 24);
  ASSERT_EQ(a.prompt_logits.size(), b.prompt_logits.size());
  ASSERT_FALSE(a.prompt_logits.empty());
  EXPECT_EQ(std::memcmp(a.prompt_logits.data(), b.prompt_logits.data(), a.prompt_logits.size() * sizeof(float)), 0)
      << part_path << " (repack " << repack << ")";
  EXPECT_EQ(a.greedy, b.greedy) << part_path;
  EXPECT_EQ(a.greedy.size(), 24u);
  EXPECT_EQ(split->weight_bytes(), whole->weight_bytes());
}

TEST_F(SplitModel, StoriesLogitsAreBitIdentical) {
  const std::string src = test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(src);
  const auto parts = split(src, 3);
  ASSERT_EQ(parts.size(), 3u);
  for (bool repack : {false, true}) expect_identical(src, parts[1], repack);
}

TEST_F(SplitModel, Qwen3LogitsAreBitIdentical) {
  for (const char* rel : {"fixtures/qwen3-tiny-q1_0.gguf", "fixtures/qwen3-tiny-q2_0-paired-g128-d-first.gguf"}) {
    const std::string src = test::shared_path(rel);
    BONSAI_REQUIRE_FILE(src);
    const auto parts = split(src, 3, /*no_tensors_in_first=*/true);
    ASSERT_EQ(parts.size(), 3u);
    for (bool repack : {false, true}) expect_identical(src, parts[0], repack);
  }
}

TEST_F(SplitModel, TheBinaryRunsASplitModel) {
  if (!fs::exists(test::binary_dir() / "apps" / "bonsai" / "bonsai")) GTEST_SKIP() << "bonsai not built";
  const std::string src = test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(src);
  const auto parts = split(src, 2);
  ASSERT_EQ(parts.size(), 2u);
  const std::string gen = " --temp 0 -n 40 -p 'Once upon a time' -t 1";
  const auto whole = test::run_bonsai("run -m '" + src + "'" + gen);
  const auto splitrun = test::run_bonsai("run -m '" + parts[0] + "'" + gen);
  ASSERT_EQ(whole.rc, 0) << whole.err;
  ASSERT_EQ(splitrun.rc, 0) << splitrun.err;
  EXPECT_GT(whole.out.size(), 40u);
  EXPECT_EQ(splitrun.out, whole.out);

  const auto info = test::run_bonsai("info --json -m '" + parts[1] + "'");
  ASSERT_EQ(info.rc, 0) << info.err;
  const auto j = nlohmann::json::parse(info.out);
  EXPECT_EQ(j.at("file"), parts[0]);
  EXPECT_EQ(j.at("size"), fs::file_size(parts[0]) + fs::file_size(parts[1]));
  ASSERT_EQ(j.at("parts").size(), 2u);
  EXPECT_EQ(j.at("parts")[1].at("file"), parts[1]);
  EXPECT_EQ(j.at("parts")[0].at("tensors").get<size_t>() + j.at("parts")[1].at("tensors").get<size_t>(),
            j.at("tensors").size());
  const auto text = test::run_bonsai("info -m '" + parts[0] + "'");
  EXPECT_NE(text.out.find("split:         2 parts, " +
                          std::to_string(fs::file_size(parts[0]) + fs::file_size(parts[1])) + " bytes"),
            std::string::npos)
      << text.out;

  const auto validate = test::run_bonsai("validate -m '" + parts[0] + "'");
  EXPECT_EQ(validate.rc, 0) << validate.out << validate.err;
  EXPECT_NE((validate.out + validate.err).find(": OK:"), std::string::npos) << validate.out << validate.err;
  const auto bench = test::run_bonsai("bench -m '" + parts[0] + "' -p 8 -n 4 -r 1 -t 1");
  EXPECT_EQ(bench.rc, 0) << bench.err;

  fs::remove(parts[1]);
  const auto missing = test::run_bonsai("run -m '" + parts[0] + "'" + gen);
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.err.find(parts[1] + ": missing: part 2 of 2"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace bonsai::model
