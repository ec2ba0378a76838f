// End-to-end: the `bonsai tokenize` subcommand prints token ids as JSON.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tok_test_util.h"

namespace {

namespace fs = std::filesystem;
using bonsai::tokenizer::testing::read_file;

struct CliResult {
  int rc = -1;
  std::string out, err;
};

// Runs `bonsai ARGS` (ARGS already shell-quoted); captures stdout / stderr.
CliResult run_bonsai(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("bonsai_tokenize_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string bin = (bonsai::test::binary_dir() / "apps" / "bonsai" / "bonsai").string();
  const std::string cmd =
      "'" + bin + "' " + args + " >'" + (dir / "out").string() + "' 2>'" + (dir / "err").string() + "'";
  CliResult r;
  const int status = std::system(cmd.c_str());
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file((dir / "out").string());
  r.err = read_file((dir / "err").string());
  fs::remove_all(dir);
  return r;
}

const std::string kQwen = bonsai::test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
const std::string kStories = bonsai::test::shared_path("models/stories260K/stories260K.gguf");

TEST(CliTokenize, SpecialFlagControlsSpecialTokens) {
  BONSAI_REQUIRE_FILE(kQwen);
  // $'...' is not POSIX sh; pass the newline through printf instead.
  const std::string prompt = "\"$(printf '<|im_start|>user\\nHello!<|im_end|>')\"";
  CliResult r = run_bonsai("tokenize -m '" + kQwen + "' -p " + prompt + " --special");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::parse("[151644,872,198,9707,0,151645]"));
  r = run_bonsai("tokenize -m '" + kQwen + "' -p '<|im_end|>'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::parse("[27,91,318,6213,91,29]"));
}

TEST(CliTokenize, LlamaVocabularyAddsBos) {
  BONSAI_REQUIRE_FILE(kStories);
  CliResult r = run_bonsai("tokenize -m '" + kStories + "' -p 'Once upon a time'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::parse("[1,403,407,261,378]"));
  r = run_bonsai("tokenize -m '" + kStories + "' -p 'Once upon a time' --no-bos");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::parse("[403,407,261,378]"));
}

TEST(CliTokenize, MissingFileIsAnError) {
  const CliResult r = run_bonsai("tokenize -m /nonexistent/model.gguf -p x");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

}  // namespace
