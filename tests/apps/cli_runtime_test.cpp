// The CLI's one runtime initialisation (apps/bonsai/cli_common.h): every
// command that computes refuses a bad BONSAI_KERNEL as a usage error (exit
// 2) naming the variable, before it loads anything; a valid tier is used.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "cli_util.h"

namespace {

using bonsai::test::run_bonsai;

const std::string kStories = bonsai::test::shared_path("models/stories260K/stories260K.gguf");
const std::string kOracle = bonsai::test::shared_path("models/stories260K/expected_greedy_from_bos.json");

TEST(CliRuntime, BogusKernelIsExitCode2InEveryCommandThatComputes) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string m = " -m '" + kStories + "'";
  const std::vector<std::pair<std::string, std::string>> commands = {
      {"run", "run" + m + " -p Hi -n 2"},
      {"chat", "chat" + m + " -n 2"},
      {"bench", "bench" + m + " -p 8 -n 0 -r 1"},
      {"serve", "serve" + m + " --port 0"},
      {"logits", "logits" + m + " --ids 1,2"},
  };
  for (const auto& [name, args] : commands) {
    const auto r = run_bonsai(args, "BONSAI_KERNEL=bogus ");
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_EQ(r.err, "bonsai " + name +
                         ": BONSAI_KERNEL='bogus' is not a kernel tier (expected reference, avx2, avx512 or neon)\n")
        << args;
    EXPECT_EQ(r.out, "") << args;
  }
}

TEST(CliRuntime, UnsupportedKernelNamesTheVariable) {
#if defined(__x86_64__)
  const auto r = run_bonsai("run -m '" + kStories + "' -p Hi -n 2", "BONSAI_KERNEL=neon ");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_EQ(r.err.rfind("bonsai run: BONSAI_KERNEL: kernel tier 'neon' is not supported by this CPU", 0), 0u) << r.err;
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

TEST(CliRuntime, ReferenceKernelRunsAndReproducesTheGreedyOracle) {
  BONSAI_REQUIRE_FILE(kStories);
  BONSAI_REQUIRE_FILE(kOracle);
  std::ifstream f(kOracle);
  const auto oracle = nlohmann::json::parse(f);
  const std::vector<int32_t> want = oracle.at("generated_token_ids");
  const size_t n = std::min<size_t>(want.size(), 32);
  const auto r = run_bonsai("run -m '" + kStories + "' -n " + std::to_string(n) + " --temp 0 --json",
                            "BONSAI_KERNEL=reference ");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<int32_t> got = nlohmann::json::parse(r.out).at("tokens");
  EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(n)));
  const auto b = run_bonsai("bench -m '" + kStories + "' -p 8 -n 2 -r 1 -t 1 --bw-mib 16 -o jsonl",
                            "BONSAI_KERNEL=reference ");
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_NE(b.out.find("\"backends\":\"CPU/reference\""), std::string::npos) << b.out;
}

}  // namespace

namespace {

// Progress lines (synth, model load) go to stderr only when forced here
// (BONSAI_PROGRESS=1 stands in for a terminal) and never to stdout.
TEST(CliProgress, SynthAndModelLoadShowProgressOnlyWhenEnabled) {
  const auto out = std::filesystem::temp_directory_path() / ("bonsai_progress_" + std::to_string(::getpid()) + ".gguf");
  const std::string synth = "synth --preset tiny -o '" + out.string() + "'";
  const auto shown = run_bonsai(synth, "BONSAI_PROGRESS=1 ");
  ASSERT_EQ(shown.rc, 0) << shown.err;
  EXPECT_EQ(shown.err.rfind("\r\033[Ksynth: writing " + out.string() + " [", 0), 0u) << shown.err;
  EXPECT_NE(shown.err.find(" MiB / "), std::string::npos) << shown.err;
  EXPECT_EQ(shown.out.rfind("wrote " + out.string(), 0), 0u) << shown.out;
  const auto quiet = run_bonsai(synth, "BONSAI_PROGRESS=0 ");
  ASSERT_EQ(quiet.rc, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
  const auto piped = run_bonsai(synth);  // stderr is a file: not a terminal
  ASSERT_EQ(piped.rc, 0) << piped.err;
  EXPECT_EQ(piped.err, "");

  const std::string logits = "logits -m '" + out.string() + "' --ids 1,2 --top-k 1 --json";
  const auto load = run_bonsai(logits, "BONSAI_PROGRESS=1 ");
  ASSERT_EQ(load.rc, 0) << load.err;
  EXPECT_EQ(load.err.rfind("\r\033[Kloading " + out.string() + " ...", 0), 0u) << load.err;
  EXPECT_EQ(nlohmann::json::parse(load.out).at("tokens"), nlohmann::json::array({1, 2})) << load.out;
  const auto load_quiet = run_bonsai(logits);
  ASSERT_EQ(load_quiet.rc, 0) << load_quiet.err;
  EXPECT_EQ(load_quiet.err, "");
  std::filesystem::remove(out);
}

TEST(CliRuntime, BogusKernelIsExitCode2InSynth) {
  const auto r = run_bonsai("synth --preset tiny -o /nonexistent/x.gguf", "BONSAI_KERNEL=bogus ");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_EQ(r.err, "bonsai synth: BONSAI_KERNEL='bogus' is not a kernel tier (expected reference, avx2, avx512 or neon)\n");
}

}  // namespace
