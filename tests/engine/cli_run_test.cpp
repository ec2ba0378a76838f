// `bonsai run` / `bonsai chat` end to end: runs the built binary.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/test_util.h"

namespace {

namespace fs = std::filesystem;

struct CliResult {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `[ENV] bonsai ARGS` with `stdin_text` on stdin (env: shell variable
// assignments such as "X='y' "); captures stdout / stderr.
CliResult bonsai(const std::string& args, const std::string& stdin_text = "", const std::string& env = "") {
  const fs::path dir = fs::temp_directory_path() / ("bonsai_cli_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "in") << stdin_text;
  const std::string bin = (bonsai::test::binary_dir() / "apps" / "bonsai" / "bonsai").string();
  const std::string cmd = env + "'" + bin + "' " + args + " <'" + (dir / "in").string() + "' >'" +
                          (dir / "out").string() + "' 2>'" + (dir / "err").string() + "'";
  CliResult r;
  const int status = std::system(cmd.c_str());
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(dir / "out");
  r.err = slurp(dir / "err");
  fs::remove_all(dir);
  return r;
}

const std::string kStories = bonsai::test::shared_path("models/stories260K/stories260K.gguf");
const std::string kOracle = bonsai::test::shared_path("models/stories260K/expected_greedy_from_bos.json");

nlohmann::json oracle() {
  std::ifstream f(kOracle);
  return nlohmann::json::parse(f);
}

TEST(CliRun, GreedyFromBosJsonMatchesOracle) {
  BONSAI_REQUIRE_FILE(kStories);
  BONSAI_REQUIRE_FILE(kOracle);
  const CliResult r = bonsai("run -m '" + kStories + "' --temp 0 -n 256 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto o = oracle();
  EXPECT_EQ(j.at("prompt_tokens"), nlohmann::json::array({1}));
  EXPECT_EQ(j.at("tokens"), o.at("generated_token_ids"));
  EXPECT_EQ(j.at("text"), o.at("text"));
  EXPECT_EQ(j.at("finish_reason"), "length");
  EXPECT_EQ(j.at("timings").at("predicted_n"), 256);
  EXPECT_GT(j.at("timings").at("predicted_per_second").get<double>(), 0.0);
}

TEST(CliRun, StreamsTextToStdoutAndTimingsToStderr) {
  BONSAI_REQUIRE_FILE(kStories);
  BONSAI_REQUIRE_FILE(kOracle);
  const CliResult r = bonsai("run -m '" + kStories + "' -p '' --temp 0 -n 256 -t 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, oracle().at("text").get<std::string>() + "\n");
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generation:"), std::string::npos) << r.err;
}

TEST(CliRun, SeedReproducesSampledOutput) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string args = "run -m '" + kStories + "' -p 'The cat' -n 40 --temp 0.8 --seed 123 --json";
  const CliResult a = bonsai(args), b = bonsai(args + " -t 2");
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(a.out).at("tokens"), nlohmann::json::parse(b.out).at("tokens"));
  const CliResult c = bonsai("run -m '" + kStories + "' -p 'The cat' -n 40 --temp 0.8 --seed 124 --json");
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_NE(nlohmann::json::parse(a.out).at("tokens"), nlohmann::json::parse(c.out).at("tokens"));
}

// A hybrid (qwen35) model never speculates: -md / --spec-type are dropped
// with a warning on stderr (they were ignored silently, the draft model
// loaded for nothing), and the text is the text without them.
TEST(CliRun, SpeculationOnAHybridModelWarnsAndIsOff) {
  const std::string q35 = bonsai::test::shared_path("fixtures/qwen35/qwen35-tiny-f16.gguf");
  BONSAI_REQUIRE_FILE(q35);
  const std::string base = "run -m '" + q35 + "' -p 'one two three one two three' -n 12 --temp 0 --json";
  const CliResult plain = bonsai(base);
  ASSERT_EQ(plain.rc, 0) << plain.err;
  EXPECT_EQ(plain.err.find("speculative decoding is off"), std::string::npos) << plain.err;
  for (const std::string& flags : {std::string(" -md '") + q35 + "'", std::string(" --spec-type ngram")}) {
    const CliResult r = bonsai(base + flags);
    ASSERT_EQ(r.rc, 0) << flags << ": " << r.err;
    EXPECT_NE(r.err.find("warning: speculative decoding is off for " + q35 + " (qwen35)"), std::string::npos)
        << flags << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("tokens"), nlohmann::json::parse(plain.out).at("tokens")) << flags;
    EXPECT_EQ(j.at("timings").at("draft_n"), 0) << flags;
  }
}

TEST(CliRun, ErrorsAreClearAndNonZero) {
  const CliResult missing = bonsai("run -m /nonexistent/model.gguf -p hi");
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.err.find("/nonexistent/model.gguf"), std::string::npos) << missing.err;
  BONSAI_REQUIRE_FILE(kOracle);
  const CliResult not_gguf = bonsai("run -m '" + kOracle + "' -p hi");  // a JSON file
  EXPECT_NE(not_gguf.rc, 0);
  EXPECT_NE(not_gguf.err.find("cannot load model"), std::string::npos) << not_gguf.err;
  BONSAI_REQUIRE_FILE(kStories);
  const CliResult bad_param = bonsai("run -m '" + kStories + "' --top-p 3");
  EXPECT_NE(bad_param.rc, 0);
  EXPECT_NE(bad_param.err.find("top_p"), std::string::npos) << bad_param.err;
}

TEST(CliRun, NoModelUsesTheBuiltInDefault) {
  const fs::path cache = fs::temp_directory_path() / ("bonsai_cli_cache_" + std::to_string(::getpid()));
  const std::string env = "BONSAI_CACHE_DIR='" + cache.string() + "' ";
  const CliResult r = bonsai("run -p Hello -n 6 --temp 0 --json", "", env);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("built-in default model"), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("timings").at("predicted_n"), 6);
  EXPECT_EQ(j.at("tokens").size(), 6u);
  const CliResult chat = bonsai("chat -n 4", "Hi\n/exit\n", env);
  EXPECT_EQ(chat.rc, 0) << chat.err;
  EXPECT_NE(chat.err.find("built-in default model"), std::string::npos) << chat.err;
  fs::remove_all(cache);
}

// A string as one single-quoted sh word (any bytes but NUL).
std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// `run -f FILE` (llama.cpp's prompt file): the file's bytes are the prompt,
// exactly as -p with the same bytes (trailing newlines, CR, tabs, quotes and
// UTF-8 kept).
TEST(CliRun, PromptFileIsTheBytesAsIs) {
  BONSAI_REQUIRE_FILE(kStories);
  const fs::path dir = fs::temp_directory_path() / ("bonsai_cli_prompt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string text = "Once upon a time\r\n\tthe cat said \"hi\", it's caf\xc3\xa9\n\n";
  std::ofstream(dir / "p.txt", std::ios::binary) << text;
  std::ofstream(dir / "trimmed.txt", std::ios::binary) << "Once upon a time";
  const std::string gen = " -n 8 --temp 0 --json";
  const CliResult from_file = bonsai("run -m '" + kStories + "' -f '" + (dir / "p.txt").string() + "'" + gen);
  ASSERT_EQ(from_file.rc, 0) << from_file.err;
  const CliResult from_flag = bonsai("run -m '" + kStories + "' -p " + sh_quote(text) + gen);
  ASSERT_EQ(from_flag.rc, 0) << from_flag.err;
  const auto jf = nlohmann::json::parse(from_file.out), jp = nlohmann::json::parse(from_flag.out);
  EXPECT_EQ(jf.at("prompt_tokens"), jp.at("prompt_tokens"));
  EXPECT_EQ(jf.at("tokens"), jp.at("tokens"));
  // The long form, on a file without the trailing bytes: other tokens, the
  // same as -p with those bytes, so nothing was trimmed or added above.
  const CliResult trimmed = bonsai("run -m '" + kStories + "' --file '" + (dir / "trimmed.txt").string() + "'" + gen);
  ASSERT_EQ(trimmed.rc, 0) << trimmed.err;
  const auto jt = nlohmann::json::parse(trimmed.out);
  EXPECT_EQ(
      jt.at("prompt_tokens"),
      nlohmann::json::parse(bonsai("run -m '" + kStories + "' -p 'Once upon a time'" + gen).out).at("prompt_tokens"));
  EXPECT_LT(jt.at("prompt_tokens").size(), jf.at("prompt_tokens").size());
  fs::remove_all(dir);
}

TEST(CliRun, PromptFileErrorsAreExitCode2) {
  BONSAI_REQUIRE_FILE(kStories);
  const CliResult missing = bonsai("run -m '" + kStories + "' -f /nonexistent/prompt.txt");
  EXPECT_EQ(missing.rc, 2);
  EXPECT_EQ(missing.err, "bonsai run: /nonexistent/prompt.txt: cannot read prompt file: No such file or directory\n");
  EXPECT_EQ(missing.out, "");
  const std::string dir = fs::temp_directory_path().string();
  const CliResult is_dir = bonsai("run -m '" + kStories + "' -f '" + dir + "'");
  EXPECT_EQ(is_dir.rc, 2);
  EXPECT_EQ(is_dir.err, "bonsai run: " + dir + ": cannot read prompt file: Is a directory\n");
  // An endless input stops at 256 MiB instead of exhausting memory.
  const CliResult endless = bonsai("run -m '" + kStories + "' -f /dev/zero");
  EXPECT_EQ(endless.rc, 2);
  EXPECT_EQ(endless.err, "bonsai run: /dev/zero: prompt file is larger than 268435456 bytes\n");
  // -p and -f together, even -p '': a usage error, before anything is loaded.
  for (const std::string p : {"-p hi", "-p ''", "--prompt x"}) {
    const CliResult both = bonsai("run -m /nonexistent/model.gguf " + p + " -f '" + kStories + "'");
    EXPECT_EQ(both.rc, 2) << p;
    EXPECT_EQ(both.err, "bonsai run: -p/--prompt and -f/--file cannot be used together\n") << p;
  }
}

// Usage errors found by the option parser exit 2, like the commands' own
// (-p with -f): they used to exit with CLI11's codes (109 for an unknown
// option, 104 for a value that does not convert, 114 for `-f a -f b`, 106
// for no command). --help and --version still exit 0.
TEST(CliRun, ParserUsageErrorsAreExitCode2) {
  for (const std::string args : {"run --no-such-flag", "run -n abc -p hi", "run -f a.txt -f b.txt", "run -p a -p b", "",
                                 "no-such-command", "serve --port x", "info"}) {
    const CliResult r = bonsai(args);
    EXPECT_EQ(r.rc, 2) << "bonsai " << args << ": " << r.err;
    EXPECT_FALSE(r.err.empty()) << "bonsai " << args;
    EXPECT_EQ(r.out, "") << "bonsai " << args;
  }
  for (const std::string args : {"--help", "run --help", "--version"}) {
    const CliResult r = bonsai(args);
    EXPECT_EQ(r.rc, 0) << "bonsai " << args << ": " << r.err;
    EXPECT_FALSE(r.out.empty()) << "bonsai " << args;
  }
}

// Regression: `run -p/-f` tokenized control tokens' text ("<|im_start|>")
// as plain characters, unlike llama.cpp (whose tokenization of the fixture
// prompts is the golden, special tokens parsed) and unlike our own
// /v1/completions; a prompt file with a rendered ChatML conversation reached
// the model as "<", "|", "im", ... Every golden prompt's ids must match.
TEST(CliRun, PromptTokensMatchLlamaCppWithSpecialTokens) {
  const std::string model = bonsai::test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  const std::string golden = bonsai::test::shared_path("fixtures/golden/qwen3-tiny-q1_0.json");
  BONSAI_REQUIRE_FILE(model);
  BONSAI_REQUIRE_FILE(golden);
  std::ifstream gf(golden);
  const auto g = nlohmann::json::parse(gf);
  const fs::path file = fs::temp_directory_path() / ("bonsai_cli_special_" + std::to_string(::getpid()) + ".txt");
  size_t with_special = 0;
  for (const auto& p : g.at("prompts")) {
    const std::string text = p.at("text").get<std::string>();
    std::ofstream(file, std::ios::binary) << text;
    const CliResult r = bonsai("run -m '" + model + "' -f '" + file.string() + "' -n 1 --temp 0 --json");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out).at("prompt_tokens"), p.at("prompt_ids")) << text;
    if (text.find("<|im_start|>") != std::string::npos) ++with_special;
  }
  fs::remove(file);
  EXPECT_GE(with_special, 1u);  // the check above covered special tokens
  const CliResult r = bonsai("run -m '" + model + "' -p '<|im_start|>user' -n 1 --temp 0 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("prompt_tokens"), nlohmann::json::parse("[151644, 872]"));
}

TEST(CliChat, KeepsTheConversationUntilExit) {
  BONSAI_REQUIRE_FILE(kStories);
  const CliResult r = bonsai("chat -m '" + kStories + "' -n 8 --temp 0", "Hello\n\nHow are you?\n/exit\nnot read\n");
  ASSERT_EQ(r.rc, 0) << r.err;
  // Three prompts shown (two answered turns, then /exit).
  size_t prompts = 0;
  for (size_t p = r.out.find("> "); p != std::string::npos; p = r.out.find("> ", p + 2)) ++prompts;
  EXPECT_GE(prompts, 3u) << r.out;
  const CliResult eof = bonsai("chat -m '" + kStories + "' -n 4 --temp 0", "Hi\n");  // EOF ends it
  EXPECT_EQ(eof.rc, 0) << eof.err;
}

// Input with CRLF line endings (piped from a Windows file) is read as the
// same lines without the '\r': "/exit\r" and "/reset\r" are commands, an
// "\r" line is empty, and the messages are the same text, so the whole
// session prints exactly what the LF input prints.
TEST(CliChat, CrlfInputIsReadAsLf) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string lf = "Once upon a time\n\n/reset\nThe cat sat\nand then\n/exit\nnot read\n";
  std::string crlf;
  for (char c : lf) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  const std::string args = "chat -m '" + kStories + "' -n 8 --temp 0 -t 1";
  const CliResult a = bonsai(args, lf), b = bonsai(args, crlf);
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(b.out, a.out);
  EXPECT_EQ(b.out.find('\r'), std::string::npos) << b.out;
  EXPECT_NE(b.err.find("(conversation cleared)"), std::string::npos) << b.err;
  // Prompts: one per line read up to /exit (6); "not read" never is.
  size_t prompts = 0;
  for (size_t p = b.out.find("> "); p != std::string::npos; p = b.out.find("> ", p + 2)) ++prompts;
  EXPECT_EQ(prompts, 6u) << b.out;
}

// Qwen3.5's prompt opens "<think>\n", so the tiny model's answer (random
// weights: no "</think>") is all reasoning. chat and run --chat show it apart
// from the answer: a "Thinking:" block on a pipe, dimmed with --color on;
// --hidethinking leaves it out; --reasoning-format none prints the raw text
// with the "<think>\n" the prompt opened; --no-think has no reasoning.
TEST(CliChat, ReasoningIsShownApartOrHidden) {
  const std::string model = bonsai::test::shared_path("fixtures/qwen35/qwen35-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(model);
  const std::string base = "chat -m '" + model + "' -n 6 --temp 0 -t 1";
  const std::string in = "Hi\n/exit\n";
  const CliResult shown = bonsai(base, in);
  ASSERT_EQ(shown.rc, 0) << shown.err;
  ASSERT_EQ(shown.out.rfind("> Thinking:\n", 0), 0u) << shown.out;
  EXPECT_EQ(shown.out.find("<think>"), std::string::npos) << shown.out;
  EXPECT_EQ(shown.out.find('\x1b'), std::string::npos) << shown.out;  // a pipe: no colour
  // The reasoning text itself: what follows the header up to the answer's newline.
  const size_t text_at = std::string("> Thinking:\n").size();
  const size_t end = shown.out.rfind("\n> ");
  ASSERT_NE(end, std::string::npos) << shown.out;
  const std::string reasoning = shown.out.substr(text_at, end - text_at);
  EXPECT_FALSE(reasoning.empty());

  const CliResult dim = bonsai(base + " --color on", in);
  ASSERT_EQ(dim.rc, 0) << dim.err;
  EXPECT_EQ(dim.out, "> \x1b[2m" + reasoning + "\x1b[0m\n> ") << dim.out;

  const CliResult hidden = bonsai(base + " --hidethinking", in);
  ASSERT_EQ(hidden.rc, 0) << hidden.err;
  EXPECT_EQ(hidden.out, "> \n> ");

  const CliResult raw = bonsai(base + " --reasoning-format none", in);
  ASSERT_EQ(raw.rc, 0) << raw.err;
  ASSERT_EQ(raw.out.rfind("> <think>\n", 0), 0u) << raw.out;
  EXPECT_EQ(raw.out.find("Thinking:"), std::string::npos) << raw.out;

  const CliResult off = bonsai(base + " --no-think", in);
  ASSERT_EQ(off.rc, 0) << off.err;
  EXPECT_EQ(off.out.find("Thinking:"), std::string::npos) << off.out;
  EXPECT_NE(off.out, "> \n> ");  // an answer was printed

  // run --chat: the same display; run without --chat prints the raw text.
  const CliResult run = bonsai("run -m '" + model + "' -p Hi --chat -n 6 --temp 0 -t 1");
  ASSERT_EQ(run.rc, 0) << run.err;
  EXPECT_EQ(run.out, "Thinking:\n" + reasoning + "\n") << run.out;
  const CliResult run_hidden = bonsai("run -m '" + model + "' -p Hi --chat -n 6 --temp 0 -t 1 --hidethinking");
  ASSERT_EQ(run_hidden.rc, 0) << run_hidden.err;
  EXPECT_EQ(run_hidden.out, "\n");

  // Bad values are usage errors.
  EXPECT_EQ(bonsai(base + " --reasoning-format raw", in).rc, 2);
  EXPECT_EQ(bonsai(base + " --color sometimes", in).rc, 2);
}

}  // namespace
