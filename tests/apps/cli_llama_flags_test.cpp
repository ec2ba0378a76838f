// llama.cpp's command lines run unchanged (apps/bonsai/llama_compat.h):
// its multi-letter single-dash flags are not misread by CLI11 as a one-letter
// flag plus a value (`-ngl 99` was `-n gl 99`, `-sys X` was `-s ys X`,
// `-fa` was `-f a`), the GPU flags are accepted, checked and ignored with a
// note, and llama-cli's conversation flags say where to go.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_util.h"

namespace {

using bonsai::test::run_bonsai;

const std::string kStories = bonsai::test::shared_path("models/stories260K/stories260K.gguf");

nlohmann::json run_json(const std::string& args) {
  const auto r = run_bonsai("run -m '" + kStories + "' --temp 0 -n 6 --json " + args);
  EXPECT_EQ(r.rc, 0) << args << "\n" << r.err;
  return r.rc == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

TEST(CliLlamaFlags, GpuFlagsAreAcceptedIgnoredAndNoted) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string run = "run -m '" + kStories + "' --temp 0 -n 6 --json -p 'Once upon a time' ";
  const auto plain = run_bonsai(run);
  ASSERT_EQ(plain.rc, 0) << plain.err;
  EXPECT_EQ(plain.err.find("note: ignored"), std::string::npos) << plain.err;
  // Was: "--n-predict: At Most 1 required but received 2" (exit 2).
  const auto gpu = run_bonsai(run + "-ngl 99 -fa -nkvo --mlock --no-mmap -ub 512 -sm layer -mg 0 -ts 3,1 -dev none");
  ASSERT_EQ(gpu.rc, 0) << gpu.err;
  EXPECT_NE(gpu.err.find("bonsai run: note: ignored -ngl, -fa, -ub, -sm, -mg, -ts, -dev, -nkvo, --mlock, --no-mmap"),
            std::string::npos)
      << gpu.err;
  // Ignored means ignored: the same greedy tokens.
  EXPECT_EQ(nlohmann::json::parse(gpu.out)["tokens"], nlohmann::json::parse(plain.out)["tokens"]);
  for (const char* v : {"-ngl all", "-ngl auto", "--gpu-layers -1", "-fa on", "-fa off", "--flash-attn auto"}) {
    const auto r = run_bonsai(run + v);
    EXPECT_EQ(r.rc, 0) << v << "\n" << r.err;
  }
  // Values are checked as llama.cpp checks them: a usage error naming the flag.
  const auto bad_ngl = run_bonsai(run + "-ngl lots");
  EXPECT_EQ(bad_ngl.rc, 2);
  EXPECT_NE(bad_ngl.err.find("--n-gpu-layers: expected N, all or auto, got 'lots'"), std::string::npos) << bad_ngl.err;
  const auto bad_fa = run_bonsai(run + "-fa maybe");
  EXPECT_EQ(bad_fa.rc, 2);
  EXPECT_NE(bad_fa.err.find("--flash-attn: expected on, off, auto, 0 or 1, got 'maybe'"), std::string::npos)
      << bad_fa.err;
  // Chat and serve take them too (serve: checked before anything loads).
  const auto chat = run_bonsai("chat -m '" + kStories + "' -ngl 99 -fa on");
  EXPECT_EQ(chat.rc, 0) << chat.err;
  EXPECT_NE(chat.err.find("bonsai chat: note: ignored -ngl, -fa"), std::string::npos) << chat.err;
  const auto serve = run_bonsai("serve -m '" + kStories + "' -ngl 99 -fa -cb --metrics --slots --port 70000");
  EXPECT_EQ(serve.rc, 2);  // the port, not the llama.cpp flags
  EXPECT_NE(serve.err.find("--port"), std::string::npos) << serve.err;
  const auto nocb = run_bonsai("serve -m '" + kStories + "' -nocb");
  EXPECT_EQ(nocb.rc, 2);
  EXPECT_NE(nocb.err.find("--no-cont-batching (-nocb): bonsai always batches"), std::string::npos) << nocb.err;
}

// llama-bench's -ngl / -fa / -b / -ub / -mmp take comma lists.
TEST(CliLlamaFlags, BenchTakesLlamaBenchGpuLists) {
  BONSAI_REQUIRE_FILE(kStories);
  const auto r = run_bonsai("bench -m '" + kStories +
                            "' -p 8 -n 0 -r 1 --bw-mib 8 -o json -ngl 99,0 -fa 0,1 -mmp 0 -b 512 -ub 256,512");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 1u) << r.out;  // ignored: they do not multiply the tests
  EXPECT_EQ(rows[0]["test"], "pp8");
  EXPECT_NE(r.err.find("bonsai bench: note: ignored -ngl, -fa, -ub, -mmp, -b"), std::string::npos) << r.err;
  const auto bad = run_bonsai("bench -m '" + kStories + "' -p 8 -n 0 -r 1 -mmp 2");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("--mmap: expected 0 or 1 (a comma list), got '2'"), std::string::npos) << bad.err;
}

// -sys is llama-cli's system prompt (was read as `-s ys`: "Could not convert:
// --seed = ys"); a system message renders the chat template, as --chat does.
TEST(CliLlamaFlags, SysIsTheSystemPromptAndImpliesTheChatTemplate) {
  BONSAI_REQUIRE_FILE(kStories);
  const auto sys = run_json("-sys 'Be brief.' -p 'Hello'");
  const auto explicit_chat = run_json("--chat --system 'Be brief.' -p 'Hello'");
  const auto long_name = run_json("--system-prompt 'Be brief.' -p 'Hello'");
  const auto plain = run_json("-p 'Hello'");
  ASSERT_FALSE(sys.is_null());
  EXPECT_EQ(sys["prompt_tokens"], explicit_chat["prompt_tokens"]);
  EXPECT_EQ(long_name["prompt_tokens"], explicit_chat["prompt_tokens"]);
  EXPECT_GT(sys["prompt_tokens"].size(), plain["prompt_tokens"].size() + 4);  // the template's markers
}

// -cnv / -no-cnv: run is one prompt, chat a conversation; the wrong one says
// which command to use (was: "Could not convert: --ctx-size = nv").
TEST(CliLlamaFlags, ConversationFlagsPointToTheRightCommand) {
  BONSAI_REQUIRE_FILE(kStories);
  const auto cnv = run_bonsai("run -m '" + kStories + "' -p Hi -cnv");
  EXPECT_EQ(cnv.rc, 2);
  EXPECT_NE(cnv.err.find("use `bonsai chat`"), std::string::npos) << cnv.err;
  const auto no_cnv = run_bonsai("chat -m '" + kStories + "' -no-cnv");
  EXPECT_EQ(no_cnv.rc, 2);
  EXPECT_NE(no_cnv.err.find("use `bonsai run -p TEXT`"), std::string::npos) << no_cnv.err;
  EXPECT_EQ(run_bonsai("run -m '" + kStories + "' -p Hi -n 2 -no-cnv").rc, 0);
  EXPECT_EQ(run_bonsai("chat -m '" + kStories + "' -cnv").rc, 0);  // stdin empty: ends at once
}

// A text flag's value is text even when it looks like a llama.cpp flag.
TEST(CliLlamaFlags, PromptThatLooksLikeAFlagIsText) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string file = ::testing::TempDir() + "bonsai_ngl_prompt_" + std::to_string(::getpid());
  std::ofstream(file) << "-ngl";
  const auto by_p = run_json("-p -ngl");
  const auto by_file = run_json("-f '" + file + "'");
  std::filesystem::remove(file);
  ASSERT_FALSE(by_p.is_null());
  EXPECT_EQ(by_p["prompt_tokens"], by_file["prompt_tokens"]);
}

// llama.cpp's logging flags: --log-file appends what went to stderr to the
// file (the answer stays on stdout), --log-disable drops it, -v / -lv are
// accepted (were unknown flags, exit 2).
TEST(CliLlamaFlags, LogFileAndLogDisable) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string log = ::testing::TempDir() + "bonsai_log_" + std::to_string(::getpid()) + ".log";
  std::filesystem::remove(log);
  const std::string run = "run -m '" + kStories + "' --temp 0 -n 4 -p 'Once upon a time' ";
  const auto plain = run_bonsai(run);
  ASSERT_EQ(plain.rc, 0) << plain.err;
  ASSERT_NE(plain.err.find("prompt:"), std::string::npos) << plain.err;  // the timings
  for (int i = 0; i < 2; ++i) {
    const auto r = run_bonsai(run + "-ngl 1 -v -lv 3 --log-timestamps --log-file '" + log + "'");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out, plain.out);  // the answer
    EXPECT_EQ(r.err, "");
  }
  const std::string logged = bonsai::test::slurp_file(log);
  std::filesystem::remove(log);
  // Appended: both runs' note and timings.
  size_t notes = 0, timings = 0;
  for (size_t at = 0; (at = logged.find("bonsai run: note: ignored -ngl", at)) != std::string::npos; ++at) ++notes;
  for (size_t at = 0; (at = logged.find("\nprompt:", at)) != std::string::npos; ++at) ++timings;
  EXPECT_EQ(notes, 2u) << logged;
  EXPECT_EQ(timings, 2u) << logged;
  const auto quiet = run_bonsai(run + "--log-disable");
  EXPECT_EQ(quiet.rc, 0);
  EXPECT_EQ(quiet.out, plain.out);
  EXPECT_EQ(quiet.err, "");
  const auto bad = run_bonsai(run + "--log-file /nonexistent/dir/bonsai.log");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("--log-file /nonexistent/dir/bonsai.log: cannot open for appending"), std::string::npos)
      << bad.err;
  EXPECT_EQ(run_bonsai(run + "-lv x").rc, 2);
}

}  // namespace
