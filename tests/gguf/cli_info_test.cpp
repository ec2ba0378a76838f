// End-to-end: `bonsai synth` then `bonsai info --json` round-trips, and
// `bonsai info --json` on every shared .gguf agrees with the reader tensor by
// tensor (name, ggml type, shape in ne order, offset, bytes) and key by key.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>  // getpid: temp files unique per test process

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "common/q2_fixture_util.h"
#include "common/test_util.h"
#include "gguf/gguf.h"

namespace bonsai::gguf {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout (stderr is merged when asked)
};

// Runs `bonsai ARGS` (with `env` assignments prefixed, e.g. "X=1") through the shell.
RunResult run(const std::string& args, bool merge_stderr = false, const std::string& env = "") {
  const std::string bin = (test::binary_dir() / "apps/bonsai/bonsai").string();
  const std::string cmd = env + " '" + bin + "' " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  RunResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Compares `bonsai info --json` output with the file as the reader sees it.
void expect_json_matches(const nlohmann::json& j, const File& f) {
  ASSERT_TRUE(j.contains("metadata"));
  ASSERT_TRUE(j.contains("tensors"));
  EXPECT_EQ(j["metadata"].size(), f.metadata().size());
  for (const KeyValue& kv : f.metadata()) {
    const std::string key(kv.key);
    ASSERT_TRUE(j["metadata"].contains(key)) << key;
    const auto& v = j["metadata"][key];
    if (const auto* a = std::get_if<Array>(&kv.value.v)) {
      EXPECT_EQ(v["type"], "array") << key;
      EXPECT_EQ(v["elem_type"], std::string(value_type_name(a->elem_type))) << key;
      EXPECT_EQ(v["len"].get<size_t>(), a->items.size()) << key;
    } else if (const auto* u = std::get_if<uint64_t>(&kv.value.v)) {
      EXPECT_EQ(v.get<uint64_t>(), *u) << key;
    } else if (const auto* s = std::get_if<std::string_view>(&kv.value.v)) {
      if (v.get<std::string>() != std::string(*s)) ADD_FAILURE() << key << " differs";
    } else if (const auto* d = std::get_if<double>(&kv.value.v)) {
      EXPECT_EQ(v.get<double>(), *d) << key;
    }
  }
  ASSERT_EQ(j["tensors"].size(), f.tensors().size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    const auto& jt = j["tensors"][i];
    EXPECT_EQ(jt["name"], std::string(t.name));
    EXPECT_EQ(jt["type"], core::ggml_type_name(t.type_id)) << t.name;
    ASSERT_EQ(jt["shape"].size(), t.n_dims) << t.name;
    for (uint32_t d = 0; d < t.n_dims; ++d) EXPECT_EQ(jt["shape"][d].get<int64_t>(), t.ne[d]) << t.name;
    EXPECT_EQ(jt["offset"].get<uint64_t>(), t.offset) << t.name;
    EXPECT_EQ(jt["bytes"].get<uint64_t>(), t.n_bytes) << t.name;
  }
  if (f.q2_layout()) {
    EXPECT_EQ(j["q2_layout"], std::string(core::q2_layout_name(*f.q2_layout())));
  } else {
    EXPECT_FALSE(j.contains("q2_layout"));
  }
}

TEST(CliInfo, SynthThenInfoRoundTrips) {
  const auto path =
      (std::filesystem::temp_directory_path() / ("bonsai_cli_synth_test-" + std::to_string(::getpid()) + ".gguf"))
          .string();
  auto w = run("synth -o '" + path + "' --preset tiny --type q2_0 --seed 7", true);
  ASSERT_EQ(w.exit_code, 0) << w.out;
  auto r = run("info -m '" + path + "' --json");
  ASSERT_EQ(r.exit_code, 0);
  const auto j = nlohmann::json::parse(r.out);
  auto f = File::open(path);
  ASSERT_TRUE(f) << f.error().message;
  expect_json_matches(j, **f);
  EXPECT_EQ(j["q2_layout"], "g64");
  EXPECT_EQ(j["metadata"]["qwen3.block_count"], 2);
  EXPECT_EQ(j["metadata"]["general.architecture"], "qwen3");
  EXPECT_EQ(j["metadata"]["tokenizer.ggml.tokens"]["len"], 2048);
  EXPECT_EQ(j["tensors"][0]["name"], "token_embd.weight");
  EXPECT_EQ(j["tensors"][0]["type"], "Q2_0");
  EXPECT_EQ(j["tensors"][0]["shape"], nlohmann::json::array({256, 2048}));

  // Same seed, same bytes; the text mode shows hyper-parameters and the table.
  const auto path2 = path + ".2";
  ASSERT_EQ(run("synth -o '" + path2 + "' --preset tiny --type q2_0 --seed 7").exit_code, 0);
  auto info2 = run("info -m '" + path2 + "' --json");
  EXPECT_EQ(nlohmann::json::parse(info2.out)["tensors"], j["tensors"]);
  auto text = run("info -m '" + path + "'");
  ASSERT_EQ(text.exit_code, 0);
  EXPECT_NE(text.out.find("block_count"), std::string::npos);
  EXPECT_NE(text.out.find("blk.1.ffn_down.weight"), std::string::npos);
  EXPECT_NE(text.out.find("q2 layout:     g64"), std::string::npos);
  std::filesystem::remove(path);
  std::filesystem::remove(path2);
}

TEST(CliInfo, EverySharedFileMatchesTheReader) {
  BONSAI_REQUIRE_FILE(test::shared_path("fixtures"));
  int n = 0;
  for (const char* dir : {"fixtures", "models/stories260K", "models/llama-2-tiny-random"}) {
    for (const auto& e : std::filesystem::directory_iterator(test::shared_path(dir))) {
      if (e.path().extension() != ".gguf") continue;
      auto r = run("info -m '" + e.path().string() + "' --json");
      ASSERT_EQ(r.exit_code, 0) << e.path();
      auto f = File::open(e.path().string());
      ASSERT_TRUE(f) << f.error().message;
      expect_json_matches(nlohmann::json::parse(r.out), **f);
      ++n;
    }
  }
  EXPECT_EQ(n, 8);
  const auto qs = test::shared_path("fixtures/qwen3-tiny-q2_0-paired-g128-qs-first.gguf");
  EXPECT_EQ(nlohmann::json::parse(run("info -m '" + qs + "' --json").out)["q2_layout"], "g128-qs-first");
}

TEST(CliInfo, LayoutOverrideAndErrors) {
  const auto d_first = test::shared_path("fixtures/qwen3-tiny-q2_0-paired-g128-d-first.gguf");
  BONSAI_REQUIRE_FILE(d_first);
  // A file valid under both g128 byte orders: detection refuses it; the flag
  // and the env var force an order.
  const auto amb =
      (std::filesystem::temp_directory_path() / ("bonsai_cli_ambiguous_g128-" + std::to_string(::getpid()) + ".gguf"))
          .string();
  ASSERT_EQ(test::write_ambiguous_g128_copy(d_first, amb), "");
  auto refused = run("info -m '" + amb + "'", true);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.out.find("byte order is ambiguous"), std::string::npos) << refused.out;
  auto forced = run("info -m '" + amb + "' --json --q2-layout g128-qs-first");
  ASSERT_EQ(forced.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(forced.out)["q2_layout"], "g128-qs-first");
  auto env = run("info -m '" + amb + "' --json", false, "BONSAI_Q2_LAYOUT=g128-qs-first");
  ASSERT_EQ(env.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(env.out)["q2_layout"], "g128-qs-first");
  std::filesystem::remove(amb);
  auto detected = run("info -m '" + d_first + "' --json");
  EXPECT_EQ(nlohmann::json::parse(detected.out)["q2_layout"], "g128-d-first");
  // The other byte order forced on the real d-first file: refused (exit 1).
  auto wrong = run("info -m '" + d_first + "' --q2-layout g128-qs-first", true);
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_NE(wrong.out.find("the forced Q2_0 layout g128-qs-first does not fit the data"), std::string::npos)
      << wrong.out;
  auto env_g64 = run("info -m '" + d_first + "'", true, "BONSAI_Q2_LAYOUT=g64");  // g64 on a g128 file
  EXPECT_EQ(env_g64.exit_code, 1);
  EXPECT_NE(env_g64.out.find(d_first + ": offset "), std::string::npos) << env_g64.out;
  auto flag_wins = run("info -m '" + d_first + "' --json --q2-layout g128-d-first", false, "BONSAI_Q2_LAYOUT=g64");
  ASSERT_EQ(flag_wins.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(flag_wins.out)["q2_layout"], "g128-d-first");
  auto bad_layout = run("info -m '" + d_first + "' --q2-layout g32", true);
  EXPECT_EQ(bad_layout.exit_code, 2);  // a usage error
  EXPECT_NE(bad_layout.out.find("unknown Q2_0 layout 'g32'"), std::string::npos);
  auto missing = run("info -m /nonexistent/file.gguf", true);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.out.find("/nonexistent/file.gguf"), std::string::npos);
  const auto junk =
      (std::filesystem::temp_directory_path() / ("bonsai_cli_junk-" + std::to_string(::getpid()) + ".gguf")).string();
  {
    std::FILE* f = std::fopen(junk.c_str(), "wb");
    std::fputs("GGUF\x03\x00\x00\x00garbage", f);
    std::fclose(f);
  }
  auto bad = run("info -m '" + junk + "'", true);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.out.find(junk + ": offset "), std::string::npos) << bad.out;
  std::filesystem::remove(junk);
  auto bad_synth = run("synth -o /tmp/x.gguf --preset huge", true);
  EXPECT_NE(bad_synth.exit_code, 0);
  EXPECT_NE(bad_synth.out.find("unknown preset 'huge'"), std::string::npos);
  auto bad_type = run("synth -o /tmp/x.gguf --type q4_0", true);
  EXPECT_NE(bad_type.exit_code, 0);
}

// Text mode printed general.name, keys and tensor names raw: a file could put
// terminal escape sequences (ESC [ ... ) on the user's screen. Control
// characters in anything taken from the file now print as '?'.
TEST(CliInfo, TextModeEscapesControlCharactersFromTheFile) {
  Writer w;
  w.set_string("general.architecture", "qwen3");
  w.set_string("general.name", "evil\x1b[2Jname\x07");
  w.set_bool("x.k\x1b[31mey", true);
  auto t = w.add_tensor("t\x1b]0;title\x07", core::GgmlType::F32, {4}, std::vector<uint8_t>(16, 0));
  ASSERT_TRUE(t.has_value()) << t.error().message;
  const auto path =
      (std::filesystem::temp_directory_path() / ("bonsai_cli_info_escapes-" + std::to_string(::getpid()) + ".gguf"))
          .string();
  ASSERT_TRUE(w.write(path).has_value());
  const auto r = run("info -m '" + path + "'");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x07'), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("evil?[2Jname?"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("x.k?[31mey"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("t?]0;title?"), std::string::npos) << r.out;
  // --json keeps the exact text (JSON escapes it).
  const auto j = nlohmann::json::parse(run("info -m '" + path + "' --json").out);
  EXPECT_EQ(j["metadata"]["general.name"], "evil\x1b[2Jname\x07");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace bonsai::gguf
