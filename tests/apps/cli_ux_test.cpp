// The CLI's user-facing conventions (apps/bonsai): `-f -` reads the prompt
// from stdin, exit codes (2: usage error, 1: runtime failure) in every
// command, chat's slash commands, bench's cache-resident roofline and depth.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.h"

namespace {

using bonsai::test::run_bonsai;
using bonsai::test::run_bonsai_stdin;

const std::string kStories = bonsai::test::shared_path("models/stories260K/stories260K.gguf");

// `-f -` is stdin (llama-cli's convention): the same tokens as -p with the
// same text, and as -f /dev/stdin.
TEST(CliRunPromptFile, DashReadsStdin) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string m = "run -m '" + kStories + "' --temp 0 -n 4 --json ";
  const auto by_p = run_bonsai(m + "-p 'Once upon a time'");
  ASSERT_EQ(by_p.rc, 0) << by_p.err;
  const auto dash = run_bonsai_stdin(m + "-f -", "Once upon a time");
  ASSERT_EQ(dash.rc, 0) << dash.err;
  const auto dev = run_bonsai_stdin(m + "-f /dev/stdin", "Once upon a time");
  ASSERT_EQ(dev.rc, 0) << dev.err;
  const auto tokens = [](const std::string& out) {
    const auto j = nlohmann::json::parse(out);
    return std::make_pair(j["prompt_tokens"], j["tokens"]);
  };
  EXPECT_EQ(tokens(dash.out), tokens(by_p.out));
  EXPECT_EQ(tokens(dev.out), tokens(by_p.out));
  EXPECT_GT(tokens(dash.out).first.size(), 3u);
  // Empty stdin: an empty prompt (starts from BOS alone), as an empty file.
  const auto empty = run_bonsai(m + "-f -");
  EXPECT_EQ(empty.rc, 0) << empty.err;
  EXPECT_EQ(nlohmann::json::parse(empty.out)["prompt_tokens"].size(), 1u) << empty.out;
}

}  // namespace
