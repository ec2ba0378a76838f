// `bonsai serve` end to end for the type-42 (Q2_0) layout: runs the built
// binary (apps/bonsai/cmd_serve.cpp) over the three `paired` fixtures, which
// hold the same weights in the g64, g128-d-first and g128-qs-first layouts
// (../shared/fixtures/README.md). serve used to ignore --q2-layout and
// BONSAI_Q2_LAYOUT, which run/info/validate/logits honour.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/q2_fixture_util.h"
#include "common/test_util.h"
#include "server/config.h"  // apply_serve_toml, validate_serve_config

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kG64 = bonsai::test::shared_path("fixtures/qwen3-tiny-q2_0-paired-g64.gguf");
const std::string kDFirst = bonsai::test::shared_path("fixtures/qwen3-tiny-q2_0-paired-g128-d-first.gguf");
const std::string kQsFirst = bonsai::test::shared_path("fixtures/qwen3-tiny-q2_0-paired-g128-qs-first.gguf");

std::string bonsai_bin() { return (bonsai::test::binary_dir() / "apps" / "bonsai" / "bonsai").string(); }

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A scratch directory per test process.
fs::path scratch() {
  const fs::path dir = fs::temp_directory_path() / ("bonsai_serve_cli_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

// `bonsai serve ARGS` as a child process with `env` added ("K=V" entries);
// stdout and stderr go to files. Stops it (SIGTERM) when destroyed.
class ServeProcess {
 public:
  ServeProcess(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    const fs::path dir = scratch();
    static int n = 0;
    out_ = dir / ("out" + std::to_string(n));
    err_ = dir / ("err" + std::to_string(n++));
    pid_ = ::fork();
    if (pid_ == 0) {
      ::unsetenv("BONSAI_Q2_LAYOUT");
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      if (!std::freopen(out_.c_str(), "w", stdout) || !std::freopen(err_.c_str(), "w", stderr)) ::_exit(126);
      std::vector<std::string> argv_s = {bonsai_bin(), "serve"};
      argv_s.insert(argv_s.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~ServeProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  // Waits (up to 60 s) until it prints its URL (returns the port) or exits
  // (returns 0; exit_code() then holds its status).
  // `pattern`: the line with the port as its first group.
  int wait_listening(const std::string& pattern = R"(listening on http://127\.0\.0\.1:(\d+))") {
    const std::regex url(pattern);
    for (int i = 0; i < 600; ++i) {
      std::smatch m;
      const std::string out = slurp(out_);
      if (std::regex_search(out, m, url)) return std::stoi(m[1]);
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return 0;
  }
  // Waits for the process to end without signalling it (a start-up error).
  int wait_exit() {
    if (!exited_) {
      int status = 0;
      ::waitpid(pid_, &status, 0);
      exited_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    return exit_code_;
  }
  // SIGTERM, then its exit code (0 = graceful shutdown).
  int stop() {
    if (!exited_) ::kill(pid_, SIGTERM);
    return wait_exit();
  }
  std::string err() const { return slurp(err_); }
  std::string out() const { return slurp(out_); }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_code_ = -1;
  fs::path out_, err_;
};

// Common flags: any free port, one replica, one thread, a small context.
std::vector<std::string> serve_args(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--port", "0", "-t", "1", "--pool-size", "1", "-c", "128"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The start-up error of `bonsai serve ARGS` (it must exit): {code, stderr}.
std::pair<int, std::string> startup_error(const std::vector<std::string>& args,
                                          const std::vector<std::string>& env = {}) {
  ServeProcess p(serve_args(args), env);
  const int port = p.wait_listening();
  if (port != 0) return {-100, "unexpectedly started on port " + std::to_string(port) + ": " + p.err()};
  return {p.wait_exit(), p.err()};
}

// The start-up line of `bonsai serve ARGS` that names model `id`, after a
// clean start and SIGTERM (empty, with a failure, otherwise).
std::string loaded_line(const std::string& id, const std::vector<std::string>& args,
                        const std::vector<std::string>& env = {}) {
  ServeProcess p(serve_args(args), env);
  const int port = p.wait_listening();
  EXPECT_NE(port, 0) << p.err();
  EXPECT_EQ(p.stop(), 0) << p.err();
  std::istringstream lines(p.err());
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("bonsai serve: loaded '" + id + "'", 0) == 0) return line;
  ADD_FAILURE() << "no 'loaded' line for " << id << " in:\n" << p.err();
  return {};
}

fs::path write_toml(const std::string& name, const std::string& text) {
  const fs::path p = scratch() / name;
  std::ofstream(p) << text;
  return p;
}

// The "loaded" line says what loading did about repacked weights; --no-repack,
// env BONSAI_NO_REPACK=1 and the config's no-repack = true keep them zero-copy.
TEST(ServeCli, NoRepackFlagEnvAndConfigKeepZeroCopy) {
  BONSAI_REQUIRE_FILE(kDFirst);
  const std::string m = "d=" + kDFirst;
  const std::string zero_copy = "; weights not repacked (zero-copy)";
  const std::string def = loaded_line("d", {"-m", m});
  EXPECT_TRUE(def.find("; repacked ") != std::string::npos || def.find(zero_copy) != std::string::npos) << def;
  EXPECT_NE(loaded_line("d", {"-m", m, "--no-repack"}).find(zero_copy), std::string::npos);
  EXPECT_NE(loaded_line("d", {"-m", m}, {"BONSAI_NO_REPACK=1"}).find(zero_copy), std::string::npos);
  const fs::path toml = write_toml("norepack.toml", "no-repack = true\n");
  EXPECT_NE(loaded_line("d", {"-m", m, "--config", toml.string()}).find(zero_copy), std::string::npos);
  const fs::path bad = write_toml("norepack-bad.toml", "no-repack = \"yes\"\n");
  const auto [code, err] = startup_error({"-m", m, "--config", bad.string()});
  EXPECT_NE(code, 0) << err;
  EXPECT_NE(err.find("no-repack"), std::string::npos) << err;
}

TEST(ServeCli, Q2LayoutFlagEnvAndConfigReachTheLoader) {
  BONSAI_REQUIRE_FILE(kDFirst);
  const std::string m = "d=" + kDFirst;
  // Detected without any override.
  EXPECT_NE(loaded_line("d", {"-m", m}).find("Q2_0 layout g128-d-first (detected)"), std::string::npos);
  // The right order forced: loads, marked forced.
  EXPECT_NE(loaded_line("d", {"-m", m, "--q2-layout", "g128-d-first"}).find("Q2_0 layout g128-d-first (forced)"),
            std::string::npos);
  // The other order against the data's evidence: refused at start-up (it
  // used to load and answer with NaN logits).
  {
    const auto [code, err] = startup_error({"-m", m, "--q2-layout", "g128-qs-first"});
    EXPECT_EQ(code, 1) << err;
    EXPECT_NE(err.find("the forced Q2_0 layout g128-qs-first does not fit the data"), std::string::npos) << err;
  }
  // A file valid under both byte orders (what the override is for): detection
  // refuses it, and the flag, the env var and the config file's q2-layout
  // each force an order.
  const std::string amb = (scratch() / "ambiguous-g128.gguf").string();
  ASSERT_EQ(bonsai::test::write_ambiguous_g128_copy(kDFirst, amb), "");
  const std::string a = "a=" + amb;
  {
    const auto [code, err] = startup_error({"-m", a});
    EXPECT_EQ(code, 1) << err;
    EXPECT_NE(err.find("byte order is ambiguous"), std::string::npos) << err;
  }
  EXPECT_NE(loaded_line("a", {"-m", a, "--q2-layout", "g128-qs-first"}).find("Q2_0 layout g128-qs-first (forced)"),
            std::string::npos);
  EXPECT_NE(loaded_line("a", {"-m", a}, {"BONSAI_Q2_LAYOUT=g128-qs-first"}).find("Q2_0 layout g128-qs-first (forced)"),
            std::string::npos);
  const fs::path toml = write_toml("qs.toml", "q2-layout = \"g128-qs-first\"\n");
  EXPECT_NE(loaded_line("a", {"-m", a, "--config", toml.string()}).find("Q2_0 layout g128-qs-first (forced)"),
            std::string::npos);
  // Precedence: flag over env over config.
  EXPECT_NE(loaded_line("a", {"-m", a, "--q2-layout", "g128-d-first"}, {"BONSAI_Q2_LAYOUT=g128-qs-first"})
                .find("Q2_0 layout g128-d-first (forced)"),
            std::string::npos);
  EXPECT_NE(loaded_line("a", {"-m", a, "--config", toml.string()}, {"BONSAI_Q2_LAYOUT=g128-d-first"})
                .find("Q2_0 layout g128-d-first (forced)"),
            std::string::npos);

  // g64 blocks do not fit this file's tensors: the load is refused (exit 1),
  // whichever way g64 was asked for.
  const fs::path g64_toml = write_toml("g64.toml", "q2-layout = \"g64\"\n");
  for (const auto& [args, env] : std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>>{
           {{"-m", m, "--q2-layout", "g64"}, {}},
           {{"-m", m}, {"BONSAI_Q2_LAYOUT=g64"}},
           {{"-m", m, "--config", g64_toml.string()}, {}}}) {
    const auto [code, err] = startup_error(args, env);
    EXPECT_EQ(code, 1) << err;
    EXPECT_NE(err.find("bonsai serve: cannot load model 'd': " + kDFirst + ": offset "), std::string::npos) << err;
  }
}

TEST(ServeCli, UnknownQ2LayoutIsExitCode2) {
  BONSAI_REQUIRE_FILE(kDFirst);
  const std::string m = "d=" + kDFirst;
  const auto [flag_code, flag_err] = startup_error({"-m", m, "--q2-layout", "g32"});
  EXPECT_EQ(flag_code, 2) << flag_err;
  EXPECT_EQ(flag_err, "bonsai serve: unknown Q2_0 layout 'g32' (expected g64, g128-d-first or g128-qs-first)\n");
  const auto [env_code, env_err] = startup_error({"-m", m}, {"BONSAI_Q2_LAYOUT=G64"});
  EXPECT_EQ(env_code, 2) << env_err;
  EXPECT_NE(env_err.find("unknown Q2_0 layout 'G64'"), std::string::npos) << env_err;
  const fs::path toml = write_toml("bad.toml", "q2_layout = \"g96\"\n");
  const auto [cfg_code, cfg_err] = startup_error({"-m", m, "--config", toml.string()});
  EXPECT_EQ(cfg_code, 2) << cfg_err;
  EXPECT_NE(cfg_err.find(toml.string() + ": key 'q2-layout': unknown Q2_0 layout 'g96'"), std::string::npos) << cfg_err;
}

// The TOML key itself (library level): parsed as a string, refused by
// validate_serve_config when the name is unknown.
TEST(ServeCli, ConfigQ2LayoutKey) {
  bonsai::server::ServeConfig cfg;
  ASSERT_TRUE(bonsai::server::apply_serve_toml("q2-layout = \"g128-qs-first\"\n", "t.toml", cfg));
  EXPECT_EQ(cfg.q2_layout, "g128-qs-first");
  EXPECT_TRUE(bonsai::server::validate_serve_config(cfg));
  auto wrong_type = bonsai::server::apply_serve_toml("q2-layout = 64\n", "t.toml", cfg);
  ASSERT_FALSE(wrong_type);
  EXPECT_EQ(wrong_type.error().message, "t.toml: key 'q2-layout': expected a string");
  cfg.q2_layout = "g32";
  auto bad = bonsai::server::validate_serve_config(cfg);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "q2-layout: unknown Q2_0 layout 'g32' (expected g64, g128-d-first or g128-qs-first)");
}

// POST /admin/models/load takes "q2_layout": a bad value is a 400 naming the
// parameter; a good one reaches the loader, so the g128 files loaded with
// their layout generate exactly what the g64 file does (the three hold the
// same weights, and the kernels make paired g64/g128 bit-identical).
TEST(ServeCli, AdminLoadTakesQ2Layout) {
  BONSAI_REQUIRE_FILE(kG64);
  BONSAI_REQUIRE_FILE(kDFirst);
  BONSAI_REQUIRE_FILE(kQsFirst);
  ServeProcess p(serve_args({"-m", "g64=" + kG64, "--models-max", "4"}));
  const int port = p.wait_listening();
  ASSERT_NE(port, 0) << p.err();
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  auto post = [&](const std::string& path, const json& body) -> std::pair<int, json> {
    auto r = cli.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  };
  auto wait_state = [&](const std::string& id) {
    std::string last;
    for (int i = 0; i < 300; ++i) {
      auto r = cli.Get("/admin/models");
      last = r ? std::to_string(r->status) + " " + r->body : "no response";
      if (r && r->status == 200) {
        const json list = json::parse(r->body);
        for (const auto& m : list.at("data"))
          if (m.at("id") == id && m.at("state") != "loading") return m.at("state").get<std::string>();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return "timeout; last /admin/models: " + last;
  };
  auto complete = [&](const std::string& model) {
    auto [st, j] =
        post("/v1/completions", json{{"model", model}, {"prompt", "Hello"}, {"max_tokens", 6}, {"temperature", 0}});
    EXPECT_EQ(st, 200) << j.dump();
    return j.is_object() && j.contains("choices") ? j["choices"][0]["text"].get<std::string>() : std::string("<error>");
  };

  const std::string reference = complete("g64");
  ASSERT_NE(reference, "<error>");

  for (const auto& [bad, type] : std::vector<std::pair<json, std::string>>{{"g32", "invalid_value"},
                                                                           {"G128-D-FIRST", "invalid_value"},
                                                                           {7, "invalid_type"},
                                                                           {json::array(), "invalid_type"}}) {
    auto [st, j] = post("/admin/models/load", json{{"id", "x"}, {"path", kDFirst}, {"q2_layout", bad}});
    EXPECT_EQ(st, 400) << j.dump();
    EXPECT_EQ(j["error"]["param"], "q2_layout") << j.dump();
    EXPECT_EQ(j["error"]["code"], type) << j.dump();
    if (type == "invalid_value") {
      EXPECT_EQ(j["error"]["message"], "Invalid 'q2_layout': unknown Q2_0 layout '" + bad.get<std::string>() +
                                           "' (expected g64, g128-d-first or g128-qs-first).");
    }
  }
  // g64 forced on a g128 file: refused while reading its header.
  {
    auto [st, j] = post("/admin/models/load", json{{"id", "x"}, {"path", kDFirst}, {"q2_layout", "g64"}});
    EXPECT_EQ(st, 400) << j.dump();
    EXPECT_NE(j["error"]["message"].get<std::string>().find(kDFirst + ": offset "), std::string::npos) << j.dump();
  }
  for (const auto& [id, path, layout] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"d", kDFirst, "g128-d-first"}, {"qs", kQsFirst, "g128-qs-first"}}) {
    auto [st, j] = post("/admin/models/load",
                        json{{"id", id}, {"path", path}, {"q2_layout", layout}, {"pool_size", 1}, {"ctx_size", 128}});
    ASSERT_EQ(st, 202) << j.dump();
    ASSERT_EQ(wait_state(id), "loaded");
    EXPECT_EQ(complete(id), reference) << id;
  }
  EXPECT_EQ(p.stop(), 0) << p.err();
}

// KV cache types: config keys cache-type-k / cache-type-v (checked by
// validate_serve_config), `serve -ctk / -ctv` (a bad value is exit 2), and
// the admin load fields cache_type_k / cache_type_v (400 naming the field).
// -np / --parallel (and the config's parallel) set the live sequences per
// model, whatever --pool-size is; the "loaded" line says how many; 16 by default.
TEST(ServeCli, ParallelFlagAndConfigKey) {
  BONSAI_REQUIRE_FILE(kG64);
  const std::string m = "g=" + kG64;
  // (serve_args gives --pool-size 1.)
  EXPECT_NE(loaded_line("g", {"-m", m}).find(": 16 parallel sequences"), std::string::npos);
  EXPECT_NE(loaded_line("g", {"-m", m, "-np", "3"}).find(": 3 parallel sequences"), std::string::npos);
  EXPECT_NE(loaded_line("g", {"-m", m, "--parallel", "5"}).find(": 5 parallel sequences"), std::string::npos);
  const fs::path toml = write_toml("parallel.toml", "parallel = 7\n");
  EXPECT_NE(loaded_line("g", {"-m", m, "--config", toml.string()}).find(": 7 parallel sequences"), std::string::npos);
  const auto [code, err] = startup_error({"-m", m, "-np", "0"});
  EXPECT_EQ(code, 2) << err;
  // The one ModelSpec parser's message (the admin body and the config say the same).
  EXPECT_NE(err.find("--parallel: expected an integer in [1, 256]"), std::string::npos) << err;
  // --queue-factor and --max-body are flags too (they were config keys only).
  EXPECT_NE(loaded_line("g", {"-m", m, "--queue-factor", "2", "--max-body", "100000"}), "");
  const auto [qcode, qerr] = startup_error({"-m", m, "--queue-factor", "0"});
  EXPECT_EQ(qcode, 2) << qerr;
}

// --api-key "$UNSET_VAR" is a usage error, not a server without authentication.
TEST(ServeCli, BlankApiKeyIsAUsageError) {
  BONSAI_REQUIRE_FILE(kG64);
  for (const char* key : {"", "   "}) {
    const auto [code, err] = startup_error({"-m", "g=" + kG64, "--api-key", key});
    EXPECT_EQ(code, 2) << err;
    EXPECT_NE(err.find("--api-key: the API key is blank"), std::string::npos) << err;
  }
}

TEST(ServeCli, ConfigCacheTypeKeys) {
  bonsai::server::ServeConfig cfg;
  EXPECT_EQ(cfg.cache_type_k, "f16");
  ASSERT_TRUE(bonsai::server::apply_serve_toml("cache-type-k = \"q8_0\"\ncache_type_v = \"f32\"\n", "t.toml", cfg));
  EXPECT_EQ(cfg.cache_type_k, "q8_0");
  EXPECT_EQ(cfg.cache_type_v, "f32");
  EXPECT_TRUE(bonsai::server::validate_serve_config(cfg));
  cfg.cache_type_v = "q4_0";
  auto bad = bonsai::server::validate_serve_config(cfg);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "cache-type-v: cache type 'q4_0' is not supported (f16, f32, q8_0)");
  // From the file: refused while reading, naming the file and the key.
  bonsai::server::ServeConfig from_file;
  auto read = bonsai::server::apply_serve_toml("cache-type-v = \"q4_0\"\n", "t.toml", from_file);
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error().message, "t.toml: key 'cache-type-v': cache type 'q4_0' is not supported (f16, f32, q8_0)");
}

TEST(ServeCli, CacheTypeFlagsAndAdminLoadFields) {
  BONSAI_REQUIRE_FILE(kG64);
  const auto [code, err] = startup_error({"-m", "g64=" + kG64, "-ctk", "q4_0"});
  EXPECT_EQ(code, 2) << err;
  EXPECT_NE(err.find("q4_0"), std::string::npos) << err;

  ServeProcess p(serve_args({"-m", "g64=" + kG64, "--models-max", "4", "-ctk", "q8_0", "-ctv", "q8_0"}));
  const int port = p.wait_listening();
  ASSERT_NE(port, 0) << p.err();
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  auto post = [&](const std::string& path, const json& body) -> std::pair<int, json> {
    auto r = cli.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  };
  auto complete = [&](const std::string& model) {
    auto [st, j] =
        post("/v1/completions", json{{"model", model}, {"prompt", "Hello"}, {"max_tokens", 4}, {"temperature", 0}});
    EXPECT_EQ(st, 200) << j.dump();
    return st;
  };
  EXPECT_EQ(complete("g64"), 200);  // served with q8_0 caches
  for (const auto& [field, bad, type] :
       std::vector<std::tuple<std::string, json, std::string>>{{"cache_type_k", "q4_0", "invalid_value"},
                                                               {"cache_type_v", "F16", "invalid_value"},
                                                               {"cache_type_k", 8, "invalid_type"}}) {
    auto [st, j] = post("/admin/models/load", json{{"id", "x"}, {"path", kG64}, {field, bad}});
    EXPECT_EQ(st, 400) << j.dump();
    EXPECT_EQ(j["error"]["param"], field) << j.dump();
    EXPECT_EQ(j["error"]["code"], type) << j.dump();
    if (type == "invalid_value") {
      EXPECT_EQ(j["error"]["message"], "Invalid '" + field + "': cache type '" + bad.get<std::string>() +
                                           "' is not supported (f16, f32, q8_0).");
    }
  }
  auto [st, j] = post("/admin/models/load", json{{"id", "f"},
                                                 {"path", kG64},
                                                 {"cache_type_k", "f32"},
                                                 {"cache_type_v", "f16"},
                                                 {"pool_size", 1},
                                                 {"ctx_size", 128}});
  ASSERT_EQ(st, 202) << j.dump();
  for (int i = 0; i < 300; ++i) {
    auto [cst, cj] = post("/v1/completions", json{{"model", "f"}, {"prompt", "Hi"}, {"max_tokens", 2}});
    if (cst == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(complete("f"), 200);
  EXPECT_EQ(p.stop(), 0) << p.err();
}

// Issue 33.4, end to end: `bonsai serve --parallel 4` with 4 streams
// generating and 4 queued behind them gets SIGTERM. It drains: /health
// answers 503 "draining", the 4 running streams finish with [DONE], the 4
// queued get 503 draining + Retry-After, and the process exits 0 within
// --drain-timeout. The running streams ask for 2,000 tokens (about a second
// on a fast machine), so they are still generating when the signal comes
// (sent as soon as /metrics shows 4 running and 4 waiting).
TEST(ServeCli, SigtermDrainsRunningStreamsAndRefusesQueuedOnes) {
  const std::string stories = bonsai::test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(stories);
  ServeProcess p({"-m", "stories=" + stories, "--port", "0", "-t", "1", "--pool-size", "4", "--parallel", "4", "-c",
                  "2048", "--drain-timeout", "60"});
  const int port = p.wait_listening();
  ASSERT_NE(port, 0) << p.err();
  struct Answer {
    int status = -1;
    std::string body, retry_after;
  };
  std::vector<Answer> answers(8);
  const std::string body =
      json{{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}}.dump();
  std::vector<std::thread> clients;
  auto send = [&](size_t i) {
    clients.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(120, 0);
      if (auto r = c.Post("/v1/completions", body, "application/json"))
        answers[i] = {r->status, r->body, r->get_header_value("Retry-After")};
    });
  };
  httplib::Client c("127.0.0.1", port);
  // Polls /metrics until both gauges of "stories" read as wanted (up to 30 s).
  auto gauges = [&](int running, int waiting) {
    const std::string want_r = "vllm:num_requests_running{model_name=\"stories\"} " + std::to_string(running) + "\n";
    const std::string want_w = "vllm:num_requests_waiting{model_name=\"stories\"} " + std::to_string(waiting) + "\n";
    for (int i = 0; i < 3000; ++i) {
      auto r = c.Get("/metrics");
      if (r && r->body.find(want_r) != std::string::npos && r->body.find(want_w) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  for (size_t i = 0; i < 4; ++i) send(i);
  EXPECT_TRUE(gauges(4, 0));  // EXPECT: the client threads must be joined
  for (size_t i = 4; i < 8; ++i) send(i);
  EXPECT_TRUE(gauges(4, 4));
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(p.pid(), SIGTERM);
  // Draining: /health says so (503) while the running streams finish.
  bool saw_draining = false;
  for (int i = 0; i < 500 && !saw_draining; ++i) {
    auto h = c.Get("/health");
    saw_draining = h && h->status == 503 && json::parse(h->body, nullptr, false)["status"] == "draining";
    if (!h) break;  // already stopped
    if (!saw_draining) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (auto& t : clients) t.join();
  const int code = p.wait_exit();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("drain_ms", static_cast<int>(took * 1000));
  EXPECT_EQ(code, 0) << p.err();
  EXPECT_LT(took, 60.0);
  EXPECT_TRUE(saw_draining);
  int done = 0, refused = 0;
  for (size_t i = 0; i < answers.size(); ++i) {
    const Answer& a = answers[i];
    if (a.status == 200) {
      const bool ends_done = a.body.size() >= 14 && a.body.compare(a.body.size() - 14, 14, "data: [DONE]\n\n") == 0;
      EXPECT_TRUE(ends_done) << i << ": " << a.body.substr(a.body.size() > 300 ? a.body.size() - 300 : 0);
      done += ends_done;
    } else {
      EXPECT_EQ(a.status, 503) << i << ": " << a.body;
      EXPECT_EQ(a.retry_after, "5") << i;
      EXPECT_EQ(json::parse(a.body, nullptr, false)["error"]["code"], "draining") << i << ": " << a.body;
      ++refused;
    }
  }
  EXPECT_EQ(done, 4);
  EXPECT_EQ(refused, 4);
  EXPECT_NE(p.err().find("SIGTERM, draining"), std::string::npos) << p.err();
}

// llama-server's -md / --model-draft: the draft model of speculative
// decoding, in serve (flag and config key) and in run (CLI11 read `-md F` as
// `-m d` before main.cpp passed it on as --model-draft). A draft with another
// vocabulary is refused at load naming both files; one with the model's
// tokenizer runs.
TEST(ServeCli, ModelDraftChecksTheTokenizerAtLoad) {
  BONSAI_REQUIRE_FILE(kG64);
  const std::string stories = bonsai::test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(stories);
  auto names_both = [&](const std::string& err) {
    return err.find(kG64) != std::string::npos && err.find(stories) != std::string::npos &&
           err.find("tokenizer") != std::string::npos;
  };
  for (const char* flag : {"-md", "--model-draft"}) {
    const auto [code, err] = startup_error({"-m", kG64, flag, stories});
    EXPECT_NE(code, 0) << flag << ": " << err;
    EXPECT_TRUE(names_both(err)) << flag << ": " << err;
  }
  // The config file names it too.
  const fs::path toml = write_toml("draft.toml", "model-draft = \"" + stories + "\"\n");
  const auto [code, err] = startup_error({"-m", kG64, "--config", toml.string()});
  EXPECT_NE(code, 0);
  EXPECT_TRUE(names_both(err)) << err;
  auto run = [&](const std::string& draft, int& status) {
    const std::string cmd =
        bonsai_bin() + " run -m " + kG64 + " -md " + draft + " -p hi -n 4 --temp 0 --ignore-eos 2>&1";
    std::FILE* f = ::popen(cmd.c_str(), "r");
    std::string out;
    if (f == nullptr) return out;
    char buf[512];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    status = ::pclose(f);
    return out;
  };
  int status = 0;
  std::string out = run(stories, status);
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  EXPECT_TRUE(names_both(out)) << out;
  out = run(kG64, status);  // the model itself as its draft: same tokenizer
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
}

// A port already in use is reported before any model loads (the port is
// bound first; a 27B load takes a minute): exit 1 naming the address, and no
// "loaded" line before it.
TEST(ServeCli, BusyPortIsReportedBeforeTheLoad) {
  BONSAI_REQUIRE_FILE(kG64);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string busy = std::to_string(ntohs(addr.sin_port));
  ServeProcess p({"--host", "127.0.0.1", "--port", busy, "-t", "1", "-c", "128", "-m", "g=" + kG64}, {});
  EXPECT_EQ(p.wait_listening(), 0) << p.err();
  EXPECT_EQ(p.wait_exit(), 1) << p.err();
  ::close(fd);
  EXPECT_NE(p.err().find("cannot listen on"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find(busy), std::string::npos) << p.err();
  EXPECT_EQ(p.err().find("loaded '"), std::string::npos) << p.err();
}

// -a / --alias names the one model: /v1/models lists the alias with its
// context length, answers report it; any other name means that model unless
// --strict-model-names. With two models --alias is refused.
TEST(ServeCli, AliasNamesTheOneModelAndAnyNameReachesIt) {
  BONSAI_REQUIRE_FILE(kG64);
  for (const char* flag : {"-a", "--alias"}) {
    ServeProcess p(serve_args({"-m", kG64, flag, "my-qwen"}));
    const int port = p.wait_listening();
    ASSERT_NE(port, 0) << p.err();
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    auto models = c.Get("/v1/models");
    ASSERT_TRUE(models);
    const json list = json::parse(models->body);
    ASSERT_EQ(list["data"].size(), 1u) << models->body;
    EXPECT_EQ(list["data"][0]["id"], "my-qwen");
    EXPECT_EQ(list["data"][0]["context_length"], 128);  // -c 128
    EXPECT_EQ(list["data"][0]["max_model_len"], 128);
    for (const char* name : {"my-qwen", "gpt-4o", "qwen3-tiny-q2_0-paired-g64"}) {
      const json body{{"model", name}, {"prompt", "Hello"}, {"max_tokens", 2}, {"temperature", 0}};
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 200) << name << ": " << r->body;
      EXPECT_EQ(json::parse(r->body)["model"], "my-qwen") << name;
    }
    EXPECT_EQ(p.stop(), 0) << p.err();
  }
  {
    ServeProcess p(serve_args({"-m", kG64, "--alias", "my-qwen", "--strict-model-names"}));
    const int port = p.wait_listening();
    ASSERT_NE(port, 0) << p.err();
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    const json body{{"model", "gpt-4o"}, {"prompt", "Hello"}, {"max_tokens", 2}};
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404) << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "model_not_found");
    auto ok = c.Post("/v1/completions", json{{"model", "my-qwen"}, {"prompt", "Hi"}, {"max_tokens", 1}}.dump(),
                     "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
    EXPECT_EQ(p.stop(), 0) << p.err();
  }
  const auto [code, err] = startup_error({"-m", "a=" + kG64, "-m", "b=" + kG64, "--alias", "x"});
  EXPECT_EQ(code, 2) << err;  // a usage error (README: "Exit status")
  EXPECT_NE(err.find("alias 'x' names the one model served, but 2 models are given"), std::string::npos) << err;
}

// An IPv6 host is bracketed in the URLs serve prints (was "http://::1:PORT",
// which no client parses), and "[::1]" is accepted as the address ::1 (was
// "not a numeric IP address", exit 1).
TEST(ServeCli, Ipv6HostIsBracketedInTheUrlAndAcceptedBracketed) {
  BONSAI_REQUIRE_FILE(kG64);
  for (const char* host : {"::1", "[::1]"}) {
    ServeProcess p(serve_args({"-m", kG64, "--host", host}));
    const int port = p.wait_listening(R"(listening on http://\[::1\]:(\d+) \(OpenAI API at http://\[::1\]:\d+/v1)");
    ASSERT_NE(port, 0) << host << "\n" << p.out() << p.err();
    EXPECT_NE(p.out().find("try: curl http://[::1]:" + std::to_string(port) + "/v1/chat/completions"),
              std::string::npos)
        << p.out();
    // It serves on ::1.
    const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    a.sin6_addr = in6addr_loopback;
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    const std::string req = "GET /health HTTP/1.1\r\nHost: [::1]\r\nConnection: close\r\n\r\n";
    ASSERT_EQ(::write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
    std::string resp;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) resp.append(buf, static_cast<size_t>(n));
    ::close(fd);
    EXPECT_EQ(resp.rfind("HTTP/1.1 200", 0), 0u) << resp;
    EXPECT_EQ(p.stop(), 0) << p.err();
  }
}

// Ollama's keep_alive does not unload the server's default model (the
// first -m, which requests without "model" get): clients such as Open WebUI
// send keep_alive with every request. Another model still expires.
TEST(ServeCli, KeepAliveExpiryLeavesTheDefaultModelLoaded) {
  BONSAI_REQUIRE_FILE(kG64);
  BONSAI_REQUIRE_FILE(kDFirst);
  ServeProcess p(serve_args({"-m", "main=" + kG64, "-m", "other=" + kDFirst}));
  const int port = p.wait_listening();
  ASSERT_NE(port, 0) << p.err();
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  for (const char* id : {"main", "other"}) {
    const json body{
        {"model", id}, {"prompt", "Hi"}, {"keep_alive", "1s"}, {"stream", false}, {"options", {{"num_predict", 1}}}};
    auto r = c.Post("/api/generate", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << id << ": " << r->body;
  }
  auto ps = [&] {
    std::map<std::string, std::string> expires;  // name -> expires_at
    auto r = c.Get("/api/ps");
    if (r && r->status == 200) {
      const json body = json::parse(r->body);
      for (const auto& m : body["models"]) expires[m["name"]] = m["expires_at"];
    }
    return expires;
  };
  EXPECT_EQ(ps()["main:latest"], "9999-12-31T23:59:59Z");  // no timer on the default model
  // "other" expires about 1 s after its request (a loaded machine: up to 60 s) ...
  for (int i = 0; i < 600 && ps().contains("other:latest"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto after = ps();
  EXPECT_FALSE(after.contains("other:latest"));
  // ... and "main", asked for the same keep-alive before it, is still loaded.
  EXPECT_TRUE(after.contains("main:latest"));
  EXPECT_EQ(p.stop(), 0) << p.err();
}

// -m DIR serves every .gguf model in the directory under its file name (was:
// "cannot load model 'DIR': not a regular file", exit 1); a vision projector
// (mmproj) is not a model; ID=DIR and a directory without models are usage errors.
TEST(ServeCli, ModelsDirectoryServesEachModelInIt) {
  BONSAI_REQUIRE_FILE(kG64);
  BONSAI_REQUIRE_FILE(kDFirst);
  const fs::path dir = scratch() / "models";
  fs::remove_all(dir);
  fs::create_directories(dir / "empty");
  fs::create_symlink(kG64, dir / "alpha.gguf");
  fs::create_symlink(kDFirst, dir / "beta.gguf");
  std::ofstream(dir / "mmproj-alpha-f16.gguf") << "not a language model";
  std::ofstream(dir / "notes.txt") << "x";
  {
    ServeProcess p(serve_args({"-m", (dir / "").string()}));  // a trailing '/' as shells complete it
    const int port = p.wait_listening();
    ASSERT_NE(port, 0) << p.err();
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    auto models = c.Get("/v1/models");
    ASSERT_TRUE(models);
    std::vector<std::string> ids;
    const json list = json::parse(models->body);
    for (const auto& m : list["data"]) ids.push_back(m["id"]);
    EXPECT_EQ(ids, (std::vector<std::string>{"alpha", "beta"})) << models->body;
    auto r = c.Post("/v1/completions", json{{"model", "beta"}, {"prompt", "Hi"}, {"max_tokens", 1}}.dump(),
                    "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(p.stop(), 0) << p.err();
  }
  const auto [named, named_err] = startup_error({"-m", "x=" + dir.string()});
  EXPECT_EQ(named, 2) << named_err;
  EXPECT_NE(named_err.find("a directory serves each of its models under its own file name"), std::string::npos)
      << named_err;
  const auto [empty, empty_err] = startup_error({"-m", (dir / "empty").string()});
  EXPECT_EQ(empty, 2) << empty_err;
  EXPECT_NE(empty_err.find("the directory holds no .gguf model"), std::string::npos) << empty_err;
  fs::remove_all(dir);
}

// A KV budget larger than the machine's available memory is reserved, not
// touched, at load, so serve used to start silently and fail under load; it
// now warns at start, naming the model, its estimate and what is available.
TEST(ServeCli, WarnsWhenTheKvBudgetExceedsAvailableMemory) {
  BONSAI_REQUIRE_FILE(kG64);
  auto available_mib = [] {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    uint64_t kib = 0;
    while (in >> key >> kib >> unit)
      if (key == "MemAvailable:") return kib / 1024;
    return uint64_t{0};
  };
  const std::vector<std::vector<std::string>> cases = {
      {"-m", "big=" + kG64, "-c", "40960", "-np", "256", "--kv-budget-tokens", "100000000"},  // ~95 GiB of KV
      {"-m", "big=" + kG64, "-c", "128"}};                                                    // a few MiB
  for (auto args : cases) {
    args.insert(args.begin(), {"--port", "0", "-t", "1", "--pool-size", "1"});
    ServeProcess p(args);
    ASSERT_NE(p.wait_listening(), 0) << p.err();
    const uint64_t avail = available_mib();
    EXPECT_EQ(p.stop(), 0);
    const std::string err = p.err();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(err, m, std::regex(R"(loaded 'big' from .*, ~(\d+) MiB)"))) << err;
    const uint64_t mib = std::stoull(m[1]);
    const bool warned = err.find("bonsai serve: warning: 'big' may use ~" + std::to_string(mib) +
                                 " MiB when its KV cache fills, more than the ") != std::string::npos;
    if (avail > 0 && mib > avail + avail / 10) {  // (available memory moves a little meanwhile)
      EXPECT_TRUE(warned) << err;
    }
    if (avail > 0 && mib < avail - avail / 10) {
      EXPECT_FALSE(warned) << err;
    }
  }
}

}  // namespace
