// The CLI's one runtime initialisation (apps/bonsai/cli_common.h): every
// command that computes refuses a bad BONSAI_KERNEL as a usage error (exit
// 2) naming the variable, before it loads anything; a valid tier is used.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "gguf/gguf.h"

namespace {

using bonsai::test::run_bonsai;

const std::string kStories = bonsai::test::shared_path("models/stories260K/stories260K.gguf");
const std::string kOracle = bonsai::test::shared_path("models/stories260K/expected_greedy_from_bos.json");

TEST(CliRuntime, BogusKernelIsExitCode2InEveryCommand) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string m = " -m '" + kStories + "'";
  const std::vector<std::pair<std::string, std::string>> commands = {
      {"run", "run" + m + " -p Hi -n 2"},
      {"chat", "chat" + m + " -n 2"},
      {"bench", "bench" + m + " -p 8 -n 0 -r 1"},
      {"serve", "serve" + m + " --port 0"},
      {"logits", "logits" + m + " --ids 1,2"},
      {"info", "info" + m},
      {"validate", "validate" + m},
      {"tokenize", "tokenize" + m + " -p Hi"},
  };
  for (const auto& [name, args] : commands) {
    const auto r = run_bonsai(args, "BONSAI_KERNEL=bogus ");
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_EQ(r.err,
              "bonsai " + name +
                  ": BONSAI_KERNEL='bogus' is not a kernel tier (expected reference, avx2, avx512, avx512-amx, neon, "
                  "neon-dotprod or neon-i8mm)\n")
        << args;
    EXPECT_EQ(r.out, "") << args;
  }
}

// BONSAI_NO_REPACK is a switch: 1 or 0 (or unset/empty). Any other value is a
// usage error in every command that loads a model, not silently "repack on".
TEST(CliRuntime, BadNoRepackValueIsExitCode2InEveryCommand) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string m = " -m '" + kStories + "'";
  const std::vector<std::pair<std::string, std::string>> commands = {
      {"run", "run" + m + " -p Hi -n 2"},   {"bench", "bench" + m + " -p 8 -n 0 -r 1"},
      {"serve", "serve" + m + " --port 0"}, {"logits", "logits" + m + " --ids 1,2"},
      {"validate", "validate" + m},
  };
  for (const auto& [name, args] : commands) {
    for (const char* value : {"yes", "true", "2"}) {
      const auto r = run_bonsai(args, std::string("BONSAI_NO_REPACK=") + value + " ");
      EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
      EXPECT_EQ(r.err, "bonsai " + name + ": BONSAI_NO_REPACK='" + value + "' is not a switch (expected 1 or 0)\n")
          << args;
      EXPECT_EQ(r.out, "") << args;
    }
  }
  // 0 and empty mean "repack as usual": the command runs.
  for (const char* value : {"0", ""}) {
    const auto r = run_bonsai("logits" + m + " --ids 1,2", std::string("BONSAI_NO_REPACK=") + value + " ");
    EXPECT_EQ(r.rc, 0) << value << "\n" << r.err;
    EXPECT_FALSE(r.out.empty()) << value;
  }
}

// llama.cpp's -ctk / -ctv (multi-letter single-dash names CLI11 cannot
// register; main() rewrites them to --cache-type-k / --cache-type-v).
TEST(CliRuntime, LlamaCppShortCacheTypeFlagsInRun) {
  const std::string tiny = bonsai::test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(tiny);
  const std::string run = "run -m '" + tiny + "' -p Hi -n 3 --temp 0 ";
  const auto q8 = run_bonsai(run + "-ctk q8_0 -ctv q8_0");
  EXPECT_EQ(q8.rc, 0) << q8.err;
  EXPECT_FALSE(q8.out.empty());
  const auto bad = run_bonsai(run + "-ctk q4_0");
  EXPECT_EQ(bad.rc, 2) << bad.err;
  EXPECT_NE(bad.err.find("q4_0"), std::string::npos) << bad.err;
  // Only whole arguments are rewritten: "-ctkx" stays an unknown option.
  const auto other = run_bonsai(run + "-ctkx q8_0");
  EXPECT_EQ(other.rc, 2) << other.err;
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
  const auto r =
      run_bonsai("run -m '" + kStories + "' -n " + std::to_string(n) + " --temp 0 --json", "BONSAI_KERNEL=reference ");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<int32_t> got = nlohmann::json::parse(r.out).at("tokens");
  EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(n)));
  const auto b =
      run_bonsai("bench -m '" + kStories + "' -p 8 -n 2 -r 1 -t 1 --bw-mib 16 -o jsonl", "BONSAI_KERNEL=reference ");
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
  EXPECT_EQ(
      r.err,
      "bonsai synth: BONSAI_KERNEL='bogus' is not a kernel tier (expected reference, avx2, avx512, avx512-amx, neon, "
      "neon-dotprod or neon-i8mm)\n");
}

// `synth --arch qwen35`: writes the Qwen3.5 file its flags name (the keys are
// checked in tests/gguf/synth_qwen35_test.cpp) and refuses combinations the
// architecture does not take as usage errors (exit 2) with a message naming
// the flag.
TEST(CliSynth, Qwen35FlagsWriteOrRefuse) {
  const auto out = std::filesystem::temp_directory_path() / ("bonsai_synth35_" + std::to_string(::getpid()) + ".gguf");
  const auto ok = run_bonsai("synth --arch qwen35 --type pq2_0 --hadamard --seed 3 -o '" + out.string() + "'");
  ASSERT_EQ(ok.rc, 0) << ok.err;
  EXPECT_EQ(ok.out,
            "wrote " + out.string() + ": arch qwen35, preset tiny, type pq2_0 + hadamard, seed 3, 56 tensors\n");
  auto f = bonsai::gguf::File::open(out.string());
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ((*f)->get<std::string>("general.architecture").value(), "qwen35");
  EXPECT_EQ((*f)->get<uint32_t>("prism.hadamard.block_size").value(), 64u);
  EXPECT_EQ((*f)->find_tensor("blk.0.attn_qkv.weight")->type, bonsai::core::GgmlType::PQ2_0);
  std::filesystem::remove(out);
  const std::pair<std::string, std::string> refused[] = {
      {"--arch qwen35 --preset 8b", "unknown preset '8b' for --arch qwen35 (expected tiny or 27b)"},
      {"--arch qwen4", "unknown --arch 'qwen4' (expected qwen3 or qwen35)"},
      {"--arch qwen35 --type q1_0 --hadamard", "--hadamard needs a ternary --type (q2_0, pq2_0 or ptq1_0)"},
      {"--type ptq1_0", "--type ptq1_0 is for --arch qwen35"},
      {"--hadamard --type q2_0", "--hadamard is for --arch qwen35"},
  };
  for (const auto& [flags, message] : refused) {
    const auto r = run_bonsai("synth " + flags + " -o '" + out.string() + "'");
    EXPECT_EQ(r.rc, 2) << flags;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << flags;
  }
}

}  // namespace

namespace {

// `bonsai serve ARGS` until it listens (at most 60 s), then SIGTERM; its stderr.
std::string serve_startup_stderr(const std::string& args) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("bonsai_apps_serve_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string bin = (bonsai::test::binary_dir() / "apps" / "bonsai" / "bonsai").string();
  const std::string out = (dir / "out").string(), err = (dir / "err").string();
  const std::string script = "'" + bin + "' serve " + args + " </dev/null >'" + out + "' 2>'" + err +
                             "' & pid=$!; for i in $(seq 600); do grep -q listening '" + out +
                             "' && break; sleep 0.1; done; kill -TERM $pid; wait $pid";
  const int status = std::system(script.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::string text = bonsai::test::slurp_file(err);
  fs::remove_all(dir);
  return text;
}

// Issue 10: with a memory budget that holds one of two preloaded models, the
// second preload evicts the first; start-up said "loaded" for both.
TEST(CliServe, StartupReportsOnlyModelsStillResidentUnderTheBudget) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string two =
      "-m a='" + kStories + "' -m b='" + kStories + "' --port 0 -c 2048 --pool-size 1 --models-max 2";
  const std::string both = serve_startup_stderr(two);
  EXPECT_NE(both.find("bonsai serve: loaded 'a' from "), std::string::npos) << both;
  EXPECT_NE(both.find("bonsai serve: loaded 'b' from "), std::string::npos) << both;
  // Each is ~2.3 MiB (the mapping and a 2048-position KV cache): 4 MiB holds one.
  const std::string one = serve_startup_stderr(two + " --mem-budget 4");
  EXPECT_EQ(one.find("loaded 'a'"), std::string::npos) << one;
  EXPECT_NE(one.find("bonsai serve: 'a' was evicted at start-up to make room for a later model (--mem-budget 4 MiB, "
                     "--models-max 2); it loads on first use\n"),
            std::string::npos)
      << one;
  EXPECT_NE(one.find("bonsai serve: loaded 'b' from "), std::string::npos) << one;
}

}  // namespace
