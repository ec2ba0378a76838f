// End-to-end: `bonsai validate` on every shared .gguf (exit 0) and on broken
// files (exit != 0, every problem listed); `bonsai logits --json` prints the
// top-k of the forward pass run in-process.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"  // packing_for
#include "model_test_util.h"

namespace bonsai::model {
namespace {

std::string bonsai_bin() { return (test::binary_dir() / "apps" / "bonsai" / "bonsai").string(); }

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout + stderr
};

RunResult run_cmd(const std::string& args) {
  RunResult r;
  std::string cmd;
  cmd.append(1, '\'').append(bonsai_bin()).append("' ").append(args).append(" 2>&1");
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

#define REQUIRE_BONSAI_BIN()                                                        \
  do {                                                                              \
    if (!std::filesystem::exists(bonsai_bin())) GTEST_SKIP() << "bonsai not built"; \
  } while (0)

TEST(CliValidate, EverySharedGgufIsValid) {
  REQUIRE_BONSAI_BIN();
  int n = 0;
  for (const char* dir : {"fixtures", "models/stories260K", "models/llama-2-tiny-random"}) {
    const auto d = test::shared_path(dir);
    if (!std::filesystem::exists(d)) continue;
    for (const auto& e : std::filesystem::directory_iterator(d)) {
      if (e.path().extension() != ".gguf") continue;
      const auto r = run_cmd("validate -m '" + e.path().string() + "'");
      EXPECT_EQ(r.exit_code, 0) << e.path() << "\n" << r.out;
      EXPECT_NE(r.out.find(": OK:"), std::string::npos) << r.out;
      ++n;
    }
  }
  if (n == 0) BONSAI_REQUIRE_FILE(test::shared_path("fixtures/qwen3-tiny-q1_0.gguf"));
  EXPECT_GE(n, 8);
}

TEST(CliValidate, BrokenFilesFailListingEveryProblem) {
  REQUIRE_BONSAI_BIN();
  const auto dir = std::filesystem::temp_directory_path();
  const std::string pid = std::to_string(::getpid());
  // Not a GGUF at all.
  {
    const auto path = (dir / ("bonsai_cli_garbage_" + pid + ".gguf")).string();
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("this is not a gguf file", f);
    std::fclose(f);
    const auto r = run_cmd("validate -m '" + path + "'");
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("INVALID"), std::string::npos) << r.out;
    std::filesystem::remove(path);
  }
  // A qwen3 file with keys but no tensors: every missing tensor is listed.
  {
    gguf::Writer w;
    w.set_string("general.architecture", "qwen3");
    w.set_u32("qwen3.block_count", 1);
    w.set_u32("qwen3.context_length", 64);
    w.set_u32("qwen3.embedding_length", 32);
    w.set_u32("qwen3.feed_forward_length", 64);
    w.set_u32("qwen3.attention.head_count", 4);
    w.set_f32("qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
    std::vector<uint8_t> data(32 * 10 * 4, 0);
    ASSERT_TRUE(w.add_tensor("token_embd.weight", core::GgmlType::F32, {32, 10}, data).has_value());
    const auto path = (dir / ("bonsai_cli_notensors_" + pid + ".gguf")).string();
    ASSERT_TRUE(w.write(path).has_value());
    const auto r = run_cmd("validate -m '" + path + "'");
    EXPECT_EQ(r.exit_code, 1) << r.out;
    for (const char* t :
         {"output_norm.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
          "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight",
          "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight"}) {
      EXPECT_NE(r.out.find(t), std::string::npos) << t << "\n" << r.out;
    }
    EXPECT_NE(r.out.find("12 problems"), std::string::npos) << r.out;
    std::filesystem::remove(path);
  }
  // Missing file.
  EXPECT_NE(run_cmd("validate -m /nonexistent/model.gguf").exit_code, 0);
}

TEST(CliLogits, JsonMatchesInProcessForward) {
  REQUIRE_BONSAI_BIN();
  const std::string path = test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(path);
  const auto r = run_cmd("logits -m '" + path + "' --ids 1,403,407,261 --top-k 3 --json -t 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("tokens"), nlohmann::json({1, 403, 407, 261}));
  const auto& top = j.at("top");
  ASSERT_EQ(top.size(), 4u);

  // The in-process forward on the tier the binary ran (BONSAI_KERNEL, or the
  // best): the tiers agree in integer parts, not bit for bit in float parts.
  ASSERT_TRUE(kernels::init_tier_from_env().has_value());
  auto model = testing::load_or_fail(path);
  ASSERT_TRUE(model);
  core::ThreadPool pool(1);
  Workspace ws;
  auto cache = KvCache::create(model->config(), 8);
  ASSERT_TRUE(cache.has_value());
  const std::vector<int32_t> ids = {1, 403, 407, 261};
  const auto logits = testing::run_sequence(*model, ids, 0, *cache, ws, pool, true);
  const int64_t V = model->config().n_vocab;
  for (size_t pos = 0; pos < 4; ++pos) {
    ASSERT_EQ(top[pos].size(), 3u);
    const auto row = std::span<const float>(logits).subspan(pos * V, V);
    EXPECT_EQ(top[pos][0][0].get<int32_t>(), testing::argmax(row)) << pos;
    float prev = INFINITY;
    for (const auto& e : top[pos]) {
      const int32_t id = e[0].get<int32_t>();
      const float v = e[1].get<float>();
      EXPECT_FLOAT_EQ(v, row[id]);
      EXPECT_LE(v, prev);
      prev = v;
    }
  }
  // The greedy continuation of BOS in stories260K is 403 ("Once"), then 407, 261.
  EXPECT_EQ(top[0][0][0].get<int32_t>(), 403);
  EXPECT_EQ(top[1][0][0].get<int32_t>(), 407);
  EXPECT_EQ(top[2][0][0].get<int32_t>(), 261);
}

TEST(CliLogits, BadArgumentsFail) {
  REQUIRE_BONSAI_BIN();
  const std::string path = test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(path);
  EXPECT_NE(run_cmd("logits -m '" + path + "' --ids 1,100000").exit_code, 0);  // id >= n_vocab
  EXPECT_NE(run_cmd("logits -m '" + path + "' --ids 1,abc").exit_code, 0);
  EXPECT_NE(run_cmd("logits -m '" + path + "'").exit_code, 0);                // neither -p nor --ids
  EXPECT_NE(run_cmd("logits -m '" + path + "' -p hi --ids 1").exit_code, 0);  // both
  EXPECT_NE(run_cmd("logits -m /nonexistent.gguf --ids 1").exit_code, 0);
}

TEST(CliLogits, PromptIsTokenized) {
  REQUIRE_BONSAI_BIN();
  const std::string path = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(path);
  // prompts.json "english": its prompt_ids are 785 3974 13876 ... 13.
  const auto r =
      run_cmd("logits -m '" + path + "' -p 'The quick brown fox jumps over the lazy dog.' --special --top-k 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("tokens"), nlohmann::json({785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13}));
  EXPECT_EQ(j.at("top").size(), 10u);
}

// `logits` used to allocate positions x n_vocab floats at once: a few thousand
// tokens on a 152k vocabulary is GBs, and a long prompt aborted with an
// uncaught std::bad_alloc. It now runs the sequence in ubatch slices (bounded
// buffer); here under a 700 MB address-space limit that the old 1600 x 151936
// x 4 B = 972 MB buffer could not fit in.
TEST(CliLogits, LongSequenceRunsInBoundedMemory) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan reserves terabytes of address space; ulimit -v cannot apply";
#else
  REQUIRE_BONSAI_BIN();
  const std::string path = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(path);
  std::string ids = "5";
  for (int i = 1; i < 1600; ++i) ids += ",5";
  RunResult r;
  {
    std::string cmd = "sh -c \"ulimit -v 700000; exec '" + bonsai_bin() + "' logits -m '" + path +
                      "' --top-k 1 -t 1 --ids " + ids + "\" 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    const int status = ::pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ASSERT_EQ(r.exit_code, 0) << r.out.substr(0, 2000);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1600) << r.out.substr(0, 2000);
  EXPECT_NE(r.out.find("\n1599 5: ["), std::string::npos);
#endif
}

// Slicing the sequence does not change the numbers: positions on both sides
// of the 512-token slice boundary equal one in-process forward() pass.
TEST(CliLogits, SlicedSequenceMatchesOnePass) {
  REQUIRE_BONSAI_BIN();
  const std::string path = test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(path);
  std::vector<int32_t> ids;
  std::string arg;
  for (int i = 0; i < 700; ++i) {
    ids.push_back(i == 0 ? 1 : 3 + (i * 37) % 500);
    if (i) arg += ',';
    arg += std::to_string(ids.back());
  }
  const auto r = run_cmd("logits -m '" + path + "' --top-k 2 --json -t 1 --ids " + arg);
  ASSERT_EQ(r.exit_code, 0) << r.out.substr(0, 2000);
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.at("top").size(), ids.size());
  // The in-process forward on the tier the binary ran (BONSAI_KERNEL, or the
  // best): the tiers agree in integer parts, not bit for bit in float parts.
  ASSERT_TRUE(kernels::init_tier_from_env().has_value());
  auto model = testing::load_or_fail(path);
  ASSERT_TRUE(model);
  core::ThreadPool pool(1);
  Workspace ws;
  auto cache = KvCache::create(model->config(), static_cast<int64_t>(ids.size()));
  ASSERT_TRUE(cache.has_value());
  const auto logits = testing::run_sequence(*model, ids, 0, *cache, ws, pool, true);
  const int64_t V = model->config().n_vocab;
  for (size_t pos : {size_t{0}, size_t{510}, size_t{511}, size_t{512}, size_t{513}, size_t{699}}) {
    const auto row = std::span<const float>(logits).subspan(pos * V, V);
    const auto& top = j.at("top")[pos];
    EXPECT_EQ(top[0][0].get<int32_t>(), testing::argmax(row)) << pos;
    EXPECT_EQ(top[0][1].get<float>(), row[top[0][0].get<int32_t>()]) << pos;
  }
}

// -t 100000 used to abort (std::system_error from std::thread); now the CLI
// refuses values past the pool's maximum with a message naming the flag.
TEST(CliLogits, AbsurdThreadCountIsRefused) {
  REQUIRE_BONSAI_BIN();
  const std::string path = test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(path);
  const auto r = run_cmd("logits -m '" + path + "' --ids 1 -t 100000");
  EXPECT_GT(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("--threads"), std::string::npos) << r.out;
  const auto ok = run_cmd("logits -m '" + path + "' --ids 1 -t 0 --top-k 1");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;  // <= 0: the default
}

// With slices, a bad id in a later slice must still fail before anything is
// printed (no half JSON document on stdout).
TEST(CliLogits, BadIdInLaterSliceFailsBeforeOutput) {
  REQUIRE_BONSAI_BIN();
  const std::string path = test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(path);
  std::string ids = "1";
  for (int i = 1; i < 600; ++i) ids += ",5";
  ids += ",512";  // n_vocab is 512
  std::string cmd = "'";
  cmd += bonsai_bin();
  cmd += "' logits -m '";
  cmd += path;
  cmd += "' --json -t 1 --ids ";
  cmd += ids;
  cmd += " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);  // a usage error (README: "Exit status")
  EXPECT_EQ(out, "");
  const auto r = run_cmd("logits -m '" + path + "' --ids " + ids);
  EXPECT_NE(r.out.find("token 600: id 512 is outside the vocabulary [0, 512)"), std::string::npos) << r.out;
}

// `run` (and `chat`) had no --q2-layout and ignored BONSAI_Q2_LAYOUT, unlike
// info/validate/logits, so a file whose type-42 layout must be forced could
// not be run. Both now reach Model::load.
TEST(CliRun, Q2LayoutOverrideReachesTheModel) {
  REQUIRE_BONSAI_BIN();
  const std::string path = test::shared_path("fixtures/qwen3-tiny-q2_0-paired-g128-d-first.gguf");
  BONSAI_REQUIRE_FILE(path);
  // stdout only (the JSON); stderr dropped.
  auto stdout_of = [](const std::string& args) {
    RunResult r;
    std::string cmd = "'";
    cmd += bonsai_bin();
    cmd += "' ";
    cmd += args;
    cmd += " 2>/dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return r;
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    const int status = ::pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  };
  const std::string args = "run -m '" + path + "' -p hi -n 3 --temp 0 -t 1 --json";
  const auto detected = stdout_of(args);
  ASSERT_EQ(detected.exit_code, 0) << detected.out;
  const auto forced_same = stdout_of(args + " --q2-layout g128-d-first");
  ASSERT_EQ(forced_same.exit_code, 0) << forced_same.out;
  EXPECT_EQ(nlohmann::json::parse(forced_same.out).at("tokens"), nlohmann::json::parse(detected.out).at("tokens"));
  // g64 blocks do not fit this file's tensors: refused, by flag and by env.
  const auto flag = run_cmd(args + " --q2-layout g64");
  EXPECT_EQ(flag.exit_code, 1) << flag.out;
  EXPECT_NE(flag.out.find("cannot load model"), std::string::npos) << flag.out;
  ::setenv("BONSAI_Q2_LAYOUT", "g64", 1);
  const auto env = run_cmd(args);
  ::unsetenv("BONSAI_Q2_LAYOUT");
  EXPECT_EQ(env.exit_code, 1) << env.out;
  const auto bad = run_cmd(args + " --q2-layout g32");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;  // a usage error, as in validate / logits / serve
  EXPECT_NE(bad.out.find("unknown Q2_0 layout 'g32'"), std::string::npos) << bad.out;
}

// --no-repack (and env BONSAI_NO_REPACK=1) keeps the zero-copy path; the
// logits, run's tokens and the load line say so; results equal the repacked
// model's exactly (issue 8 decision 2).
TEST(CliRepack, NoRepackGivesIdenticalResultsAndSaysZeroCopy) {
  REQUIRE_BONSAI_BIN();
  for (const char* fx : {"fixtures/qwen3-tiny-q1_0.gguf", "fixtures/qwen3-tiny-q2_0-paired-g128-qs-first.gguf"}) {
    const std::string path = test::shared_path(fx);
    BONSAI_REQUIRE_FILE(path);
    const std::string logits = "logits -m '" + path + "' --ids 1,17,300,5,42 --top-k 5 --json -t 2";
    const auto packed = run_cmd(logits + " 2>/dev/null");
    const auto plain = run_cmd(logits + " --no-repack 2>/dev/null");
    ASSERT_EQ(packed.exit_code, 0) << packed.out;
    ASSERT_EQ(plain.exit_code, 0) << plain.out;
    EXPECT_EQ(packed.out, plain.out) << fx;  // logits printed with full precision: bit-identical
    ::setenv("BONSAI_NO_REPACK", "1", 1);
    const auto env = run_cmd(logits + " 2>/dev/null");
    ::unsetenv("BONSAI_NO_REPACK");
    EXPECT_EQ(env.out, plain.out) << fx;
    // The load line (shown with progress) names what loading did.
    ::setenv("BONSAI_PROGRESS", "1", 1);
    const auto shown = run_cmd(logits + " --no-repack");
    const auto shown_packed = run_cmd(logits);
    ::unsetenv("BONSAI_PROGRESS");
    EXPECT_NE(shown.out.find("loaded " + path + ": weights not repacked (zero-copy)"), std::string::npos) << shown.out;
    (void)kernels::init_tier_from_env();  // the tier the binary runs
    if (kernels::packing_for(kernels::MatrixView{path.data(), kernels::Format::kQ1_0, 1, 128, 18}) !=
        kernels::Packing::kNone) {
      EXPECT_NE(shown_packed.out.find("loaded " + path + ": repacked "), std::string::npos) << shown_packed.out;
    }
    // Every kernel tier (BONSAI_KERNEL): repacked or not, the same logits.
    // avx512-amx (the AMX GEMM forced on) where the CPU has AMX.
    std::vector<std::string> kernel_names;
    for (kernels::Tier t : kernels::kAllTiers) {
      if (kernels::tier_supported(t)) kernel_names.emplace_back(kernels::tier_name(t));
    }
    if (kernels::tier_supported(kernels::Tier::kAvx512) && core::cpu_features().amx_int8) {
      kernel_names.emplace_back("avx512-amx");
    }
    for (const std::string& t : kernel_names) {
      const std::string env_tier = "BONSAI_KERNEL=" + t + " ";
      const std::string cmd = "sh -c \"" + env_tier + "'" + bonsai_bin() + "' " + logits;
      auto out_of = [](const std::string& c) {
        std::string out;
        FILE* p = ::popen(c.c_str(), "r");
        if (p == nullptr) return out;
        std::array<char, 4096> buf{};
        size_t n;
        while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
        ::pclose(p);
        return out;
      };
      const std::string a = out_of(cmd + " 2>/dev/null\"");
      const std::string b = out_of(cmd + " --no-repack 2>/dev/null\"");
      EXPECT_FALSE(a.empty()) << t;
      EXPECT_EQ(a, b) << fx << " " << t;
    }
    const std::string run = "run -m '" + path + "' -p hello -n 6 --temp 0 -t 2 --json 2>/dev/null";
    const auto r1 = run_cmd(run);
    const auto r2 = run_cmd(run + " --no-repack");
    ASSERT_EQ(r1.exit_code, 0) << r1.out;
    ASSERT_EQ(r2.exit_code, 0) << r2.out;
    EXPECT_EQ(nlohmann::json::parse(r1.out).at("tokens"), nlohmann::json::parse(r2.out).at("tokens")) << fx;
  }
}

// -c beyond what the model supports (its training context; no RoPE
// scaling in stories260K) is refused with the limit, as the admin load
// route refuses it (issue 33 item 6): positions past it give garbage.
TEST(CliRun, ContextBeyondTrainingIsRefused) {
  REQUIRE_BONSAI_BIN();
  const std::string path = test::shared_path("models/stories260K/stories260K.gguf");  // trained on 2048
  BONSAI_REQUIRE_FILE(path);
  const auto over = run_cmd("run -m '" + path + "' -p Once -n 1 -t 1 -c 4096");
  EXPECT_NE(over.exit_code, 0) << over.out;
  EXPECT_NE(over.out.find("a context of 4096 tokens (-c / ctx-size) is more than the model supports: at most 2048 "
                          "(training context 2048 x RoPE scaling factor 1)"),
            std::string::npos)
      << over.out;
  const auto serve = run_cmd("serve -m 's=" + path + "' -c 4096 --port 0 -t 1");
  EXPECT_NE(serve.exit_code, 0) << serve.out;
  EXPECT_NE(serve.out.find("at most 2048"), std::string::npos) << serve.out;
  const auto fits = run_cmd("run -m '" + path + "' -p Once -n 1 -t 1 -c 2048");
  ASSERT_EQ(fits.exit_code, 0) << fits.out;
  EXPECT_EQ(fits.out.find("warning"), std::string::npos) << fits.out;
}

// A model without a chat template got ChatML silently under --chat / chat.
TEST(CliRun, ChatOnModelWithoutTemplateSaysChatML) {
  REQUIRE_BONSAI_BIN();
  const std::string stories = test::shared_path("models/stories260K/stories260K.gguf");
  const std::string qwen = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(stories);
  BONSAI_REQUIRE_FILE(qwen);
  const auto r = run_cmd("run -m '" + stories + "' --chat -p hi -n 1 -t 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("note: the model has no chat template (tokenizer.chat_template); using ChatML"),
            std::string::npos)
      << r.out;
  const auto q = run_cmd("run -m '" + qwen + "' --chat -p hi -n 1 -t 1");  // has a Qwen3 template
  ASSERT_EQ(q.exit_code, 0) << q.out;
  EXPECT_EQ(q.out.find("chat template"), std::string::npos) << q.out;
}

}  // namespace
}  // namespace bonsai::model
