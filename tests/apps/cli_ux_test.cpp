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

// Every usage error (an unknown flag, a flag value out of range, a bad
// config file value) exits 2 in every command; a runtime failure (a model
// file that cannot be read, a port that cannot be bound) exits 1.
TEST(CliExitCodes, UsageErrorsAre2RuntimeFailuresAre1) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string m = " -m '" + kStories + "'";
  const std::string dir = ::testing::TempDir() + "bonsai_exit_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string bad_toml = dir + "/bad.toml", typo_toml = dir + "/typo.toml";
  std::ofstream(bad_toml) << "port = 70000\n";
  std::ofstream(typo_toml) << "prot = 8080\n";
  const std::vector<std::pair<std::string, int>> cases = {
      // Unknown flags.
      {"run" + m + " --bogus", 2},
      {"chat" + m + " --bogus", 2},
      {"serve" + m + " --bogus", 2},
      {"bench" + m + " --bogus", 2},
      {"info" + m + " --bogus", 2},
      {"nosuchcommand", 2},
      // Values that do not convert or are out of range.
      {"run" + m + " -p Hi --top-p 2", 2},
      {"run" + m + " -p Hi --min-p -0.5", 2},
      {"run" + m + " -p Hi --repeat-penalty 0", 2},
      {"run" + m + " -p Hi -n abc", 2},
      {"run" + m + " -p Hi -c -5", 2},  // was exit 1 ("InferenceEngine: max_seq_len must be >= 0")
      {"chat" + m + " -c -1", 2},
      {"chat" + m + " --top-p 2", 2},
      {"run" + m + " -p Hi --chat-template-file /nonexistent/t.jinja", 2},
      {"serve" + m + " --port 70000", 2},
      {"bench" + m + " -p 8 -n 0 -r 0", 2},
      {"bench" + m + " -p x", 2},
      {"logits" + m + " --ids 1,99999", 2},  // outside the vocabulary (512)
      {"logits" + m + " --ids x", 2},
      {"synth -o '" + dir + "/x.gguf' --type bogus", 2},
      {"synth -o '" + dir + "/x.gguf' --preset 99b", 2},
      // Config files: a value out of range, an unknown key, a missing file.
      {"serve" + m + " --config '" + bad_toml + "'", 2},
      {"serve" + m + " --config '" + typo_toml + "'", 2},
      {"serve" + m + " --config /nonexistent/bonsai.toml", 2},
      // Runtime failures: the model file cannot be read.
      {"run -m /nonexistent/model.gguf -p Hi", 1},
      {"chat -m /nonexistent/model.gguf", 1},
      {"run" + m + " -md /nonexistent/draft.gguf -p Hi", 1},
      {"bench -m /nonexistent/model.gguf -p 8 -n 0 -r 1", 1},
      {"info -m /nonexistent/model.gguf", 1},
      {"validate -m /nonexistent/model.gguf", 1},
      {"logits -m /nonexistent/model.gguf --ids 1", 1},
      {"tokenize -m /nonexistent/model.gguf -p Hi", 1},
      {"serve -m /nonexistent/model.gguf --port 0", 1},
      {"synth -o /nonexistent/dir/x.gguf", 1},  // cannot write the file
  };
  for (const auto& [args, rc] : cases) {
    const auto r = run_bonsai(args);
    EXPECT_EQ(r.rc, rc) << args << "\n" << r.err;
    EXPECT_NE(r.err, "") << args;  // says why
  }
  std::filesystem::remove_all(dir);
  // The rule is at the end of every --help.
  for (const char* help : {"--help", "run --help", "chat --help", "serve --help", "bench --help", "info --help"}) {
    const auto r = run_bonsai(help);
    EXPECT_EQ(r.rc, 0) << help;
    EXPECT_NE(r.out.find("Exit status: 0 success; 1 runtime failure"), std::string::npos) << help << "\n" << r.out;
    EXPECT_NE(r.out.find("2 usage error"), std::string::npos) << help;
  }
}

// A port another socket holds: serve cannot bind, a runtime failure (exit 1).
TEST(CliExitCodes, ServeBindFailureIs1) {
  BONSAI_REQUIRE_FILE(kStories);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  const auto r = run_bonsai("serve -m '" + kStories + "' --host 127.0.0.1 --port " + std::to_string(port));
  ::close(fd);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find(std::to_string(port)), std::string::npos) << r.err;
}

// chat's slash commands, through piped stdin (not a terminal). Greedy
// answers of a few tokens; sessions are compared with each other.
class CliChatCommands : public ::testing::Test {
 protected:
  void SetUp() override { BONSAI_REQUIRE_FILE(kStories); }
  static bonsai::test::CliResult chat(const std::string& input, const std::string& flags = "") {
    return run_bonsai_stdin("chat -m '" + kStories + "' --temp 0 -n 6 --ignore-eos " + flags, input);
  }
  // The one answer of a session that sent one message: stdout "> ANSWER\n> ".
  static std::string answer(const bonsai::test::CliResult& r) {
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_GT(r.out.size(), 5u);
    EXPECT_EQ(r.out.substr(0, 2), "> ");
    EXPECT_EQ(r.out.substr(r.out.size() - 3), "\n> ");
    return r.out.size() > 5 ? r.out.substr(2, r.out.size() - 5) : "";
  }
};

TEST_F(CliChatCommands, HelpListsTheCommandsAndSendsNothing) {
  for (const char* cmd : {"/help\n", "/?\n"}) {
    const auto r = chat(cmd);
    EXPECT_EQ(r.rc, 0) << r.err;
    for (const char* listed : {"/help", "/bye", "/exit", "/clear", "/set system", "/show info", "//"})
      EXPECT_NE(r.out.find(listed), std::string::npos) << cmd << listed << "\n" << r.out;
    // Nothing generated: the help, then the next prompt.
    EXPECT_EQ(r.out.substr(r.out.size() - 2), "> ");
  }
}

TEST_F(CliChatCommands, UnknownCommandIsNotSent) {
  const std::string a = answer(chat("hello\n"));
  ASSERT_NE(a, "");
  const auto r = chat("/foo bar\nhello\n");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("unknown command '/foo', /help lists them"), std::string::npos) << r.err;
  // The unknown command left only its prompt: no answer, nothing in the conversation.
  EXPECT_EQ(r.out, "> > " + a + "\n> ");
}

TEST_F(CliChatCommands, ByeAndExitQuit) {
  const std::string a = answer(chat("hello\n"));
  for (const char* quit : {"/bye", "/exit", "/quit"}) {
    const auto r = chat(std::string("hello\n") + quit + "\nhello again\n");
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out, "> " + a + "\n> ") << quit;
  }
}

TEST_F(CliChatCommands, ClearResetsTheConversation) {
  const std::string a = answer(chat("hello\n"));
  for (const char* clear : {"/clear", "/reset"}) {
    const auto r = chat(std::string("hello\n") + clear + "\nhello\n");
    EXPECT_EQ(r.out, "> " + a + "\n> > " + a + "\n> ") << clear;
  }
  // Without it the second answer sees the first turn (the control).
  const auto kept = chat("hello\nhello\n");
  EXPECT_NE(kept.out, "> " + a + "\n> " + a + "\n> ");
}

TEST_F(CliChatCommands, SetSystemIsTheSystemPrompt) {
  const std::string with_flag = answer(chat("hello\n", "--system 'Answer in French.'"));
  const std::string without = answer(chat("hello\n"));
  ASSERT_NE(with_flag, without);  // the system prompt changes the answer (the control)
  const auto r = chat("/set system Answer in French.\nhello\n");
  EXPECT_EQ(r.out, "> > " + with_flag + "\n> ") << r.err;
  // Replacing the one given by --system; kept by /clear.
  const auto replaced = chat("/set system Answer in French.\n/clear\nhello\n", "--system 'Be terse.'");
  EXPECT_EQ(replaced.out, "> > > " + with_flag + "\n> ") << replaced.err;
  // No text: a usage message, nothing changes.
  const auto bare = chat("/set system\nhello\n");
  EXPECT_NE(bare.err.find("/set system TEXT"), std::string::npos) << bare.err;
  EXPECT_EQ(bare.out, "> > " + without + "\n> ");
}

TEST_F(CliChatCommands, ShowInfoPrintsTheModelSummary) {
  const auto r = chat("/show info\n");
  EXPECT_EQ(r.rc, 0) << r.err;
  for (const char* field : {"architecture", "llama", "parameters", "context length", "2048", "embedding length"})
    EXPECT_NE(r.out.find(field), std::string::npos) << field << "\n" << r.out;
  const auto bad = chat("/show nothing\n");
  EXPECT_NE(bad.err.find("/show info"), std::string::npos) << bad.err;
}

// "//text" and "\\/text" send "/text": one slash (or the backslash) taken off.
TEST_F(CliChatCommands, DoubleSlashSendsTheLineLiterally) {
  const auto slash = chat("//hello\n");
  const auto escaped = chat("\\/hello\n");
  const std::string a = answer(slash);
  EXPECT_EQ(answer(escaped), a);
  EXPECT_EQ(slash.err.find("unknown command"), std::string::npos) << slash.err;
  // "///hello" sends "//hello", another message (another answer).
  EXPECT_NE(answer(chat("///hello\n")), a);
}

}  // namespace
