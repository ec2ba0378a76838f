// Prometheus exposition and the serve TOML config.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <utility>
#include <vector>

#include "server/config.h"
#include "server/metrics.h"

namespace bonsai::server {
namespace {

TEST(Metrics, ExpositionFormat) {
  MetricsRegistry m;
  m.declare("t_requests_total", "Requests.", MetricType::kCounter);
  m.declare("t_gauge", "A gauge\nwith newline.", MetricType::kGauge);
  m.declare("t_latency_seconds", "Latency.", MetricType::kHistogram, {0.1, 1});
  m.inc("t_requests_total", {{"route", "/v1/models"}, {"status", "200"}});
  m.inc("t_requests_total", {{"route", "/v1/models"}, {"status", "200"}}, 2);
  m.inc("t_requests_total", {{"route", "a\"b\\c"}, {"status", "500"}});
  m.set("t_gauge", {}, 2.5);
  m.observe("t_latency_seconds", {{"model", "x"}}, 0.05);
  m.observe("t_latency_seconds", {{"model", "x"}}, 0.5);
  m.observe("t_latency_seconds", {{"model", "x"}}, 7);
  EXPECT_EQ(m.value("t_requests_total", {{"route", "/v1/models"}, {"status", "200"}}), 3);
  EXPECT_EQ(m.histogram_count("t_latency_seconds", {{"model", "x"}}), 3u);
  const std::string text = m.expose();
  const std::string want =
      "# HELP t_gauge A gauge\\nwith newline.\n"
      "# TYPE t_gauge gauge\n"
      "t_gauge 2.5\n"
      "# HELP t_latency_seconds Latency.\n"
      "# TYPE t_latency_seconds histogram\n"
      "t_latency_seconds_bucket{model=\"x\",le=\"0.1\"} 1\n"
      "t_latency_seconds_bucket{model=\"x\",le=\"1\"} 2\n"
      "t_latency_seconds_bucket{model=\"x\",le=\"+Inf\"} 3\n"
      "t_latency_seconds_sum{model=\"x\"} 7.55\n"
      "t_latency_seconds_count{model=\"x\"} 3\n"
      "# HELP t_requests_total Requests.\n"
      "# TYPE t_requests_total counter\n"
      "t_requests_total{route=\"/v1/models\",status=\"200\"} 3\n"
      "t_requests_total{route=\"a\\\"b\\\\c\",status=\"500\"} 1\n";
  EXPECT_EQ(text, want);
  m.clear("t_gauge");
  EXPECT_EQ(m.value("t_gauge", {}), 0);
}

TEST(Config, ModelArg) {
  auto a = parse_model_arg("tiny=/x/y.gguf");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->id, "tiny");
  EXPECT_EQ(a->path, "/x/y.gguf");
  auto b = parse_model_arg("/models/stories260K.gguf");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->id, "stories260K");
  // A split model's part names the set (gguf-split names); other names keep their stem.
  EXPECT_EQ(parse_model_arg("/m/Bonsai-8B-Q1_0-00002-of-00003.gguf")->id, "Bonsai-8B-Q1_0");
  EXPECT_EQ(parse_model_arg("/m/Bonsai-8B-00002-of-3.gguf")->id, "Bonsai-8B-00002-of-3");
  EXPECT_EQ(parse_model_arg("/m/-00001-of-00002.gguf")->id, "-00001-of-00002");
  EXPECT_FALSE(parse_model_arg("=/x.gguf").has_value());
  EXPECT_FALSE(parse_model_arg("id=").has_value());
  // Ids name models in URLs, /metrics labels and logs: no path climbing, control characters or whitespace.
  EXPECT_EQ(parse_model_arg("org/tiny=/x/y.gguf")->id, "org/tiny");
  for (const char* bad :
       {"../x=/x.gguf", "a/../b=/x.gguf", "/abs=/x.gguf", "..=/x.gguf", "a b=/x.gguf", "a\tb=/x.gguf", "a\\b=/x.gguf"})
    EXPECT_FALSE(parse_model_arg(bad).has_value()) << bad;
  EXPECT_FALSE(model_id_error("ok-1.5_B").has_value());
  EXPECT_TRUE(model_id_error("../x").has_value());
  EXPECT_TRUE(model_id_error(std::string(257, 'x')).has_value());
  // Regression: a path with '=' in it was split into id "/runs/lr" and path "3/m.gguf".
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "bonsai_cfg_lr=3e-4";
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "m.gguf").string();
  std::fclose(std::fopen(file.c_str(), "wb"));
  auto c = parse_model_arg(file);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->id, "m");
  EXPECT_EQ(c->path, file);
  auto d = parse_model_arg("mine=" + file);  // ID=FILE still works with such a file
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->id, "mine");
  EXPECT_EQ(d->path, file);
  std::filesystem::remove_all(dir);
}

TEST(Config, TomlKeysAndPreload) {
  ServeConfig c;
  auto r = apply_serve_toml(R"(
model = ["a=/m/a.gguf"]
pool-size = 2
models_max = 3
mem-budget = 512
ctx-size = 1024
threads = 2
host = "127.0.0.1"
port = 9000
api-key = "k"
timeout = 12.5
[models]
b = "/m/b.gguf"
[router]
preload = ["b"]
)",
                            "serve.toml", c);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ASSERT_EQ(c.models.size(), 2u);
  EXPECT_EQ(c.models[0].id, "a");
  EXPECT_EQ(c.models[1].id, "b");
  EXPECT_EQ(c.models[1].path, "/m/b.gguf");
  EXPECT_EQ(c.pool_size, 2);
  EXPECT_EQ(c.models_max, 3);
  EXPECT_EQ(c.mem_budget_mb, 512u);
  EXPECT_EQ(c.ctx_size, 1024);
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(c.port, 9000);
  EXPECT_EQ(c.api_key, "k");
  EXPECT_DOUBLE_EQ(c.timeout_s, 12.5);
  EXPECT_TRUE(c.preload_set);
  EXPECT_EQ(c.preload, std::vector<std::string>{"b"});
  EXPECT_TRUE(validate_serve_config(c).has_value());
}

// parallel (-np): live sequences per model, 16 unless set, 1..kMaxParallel
// (256 since issue 31's one ModelSpec parser: the admin route's bound; it was
// 1..1024, and 0 passed the file and failed validate_serve_config only).
TEST(Config, ParallelKey) {
  ServeConfig c;
  EXPECT_EQ(c.parallel, kDefaultParallel);
  EXPECT_EQ(kDefaultParallel, 16);
  EXPECT_EQ(kMaxParallel, 256);
  ASSERT_TRUE(apply_serve_toml("parallel = 3\n", "p.toml", c).has_value());
  EXPECT_EQ(c.parallel, 3);
  c.models = {{"a", "/a.gguf"}};
  EXPECT_TRUE(validate_serve_config(c).has_value());
  auto zero_key = apply_serve_toml("parallel = 0\n", "p.toml", c);
  ASSERT_FALSE(zero_key.has_value());
  EXPECT_EQ(zero_key.error().message, "p.toml: key 'parallel': expected an integer in [1, 256]");
  c.parallel = 0;
  auto zero = validate_serve_config(c);
  ASSERT_FALSE(zero.has_value());
  EXPECT_EQ(zero.error().message, "parallel: expected an integer in [1, 256]");
  auto neg = apply_serve_toml("parallel = -2\n", "p.toml", c);
  ASSERT_FALSE(neg.has_value());
  EXPECT_NE(neg.error().message.find("p.toml: key 'parallel'"), std::string::npos) << neg.error().message;
}

// An API key that is given is never blank (`api-key = "${UNSET}"` would
// otherwise turn authentication off); admin-open is a boolean.
TEST(Config, BlankApiKeyAndAdminOpen) {
  ServeConfig c;
  for (const char* text : {"api-key = \"\"\n", "api-key = \"  \"\n", "api_key = \"\\t\"\n"}) {
    auto r = apply_serve_toml(text, "k.toml", c);
    ASSERT_FALSE(r.has_value()) << text;
    EXPECT_NE(r.error().message.find("k.toml: key 'api"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("blank"), std::string::npos) << r.error().message;
  }
  ASSERT_TRUE(apply_serve_toml("api-key = \"k1\"\nadmin-open = true\n", "k.toml", c).has_value());
  EXPECT_EQ(c.api_key, "k1");
  EXPECT_TRUE(c.admin_open);
  EXPECT_FALSE(apply_serve_toml("admin-open = 1\n", "k.toml", c).has_value());
  EXPECT_TRUE(is_blank_key(""));
  EXPECT_TRUE(is_blank_key(" \t\n"));
  EXPECT_FALSE(is_blank_key(" k "));
  for (const char* h : {"127.0.0.1", "localhost", "::1", "127.1.2.3"}) EXPECT_TRUE(is_loopback_host(h)) << h;
  for (const char* h : {"0.0.0.0", "10.0.0.1", "::", "192.168.1.2", "128.0.0.1", "127.example.com", "127.0.0.1.nip.io"})
    EXPECT_FALSE(is_loopback_host(h)) << h;
}

// The serve flags that had no config key (issue 33 item 5) take one of
// the same name, with the flag's ranges.
TEST(Config, FlagsHaveConfigKeys) {
  ServeConfig c;
  auto r = apply_serve_toml(R"(
batch-size = 64
seed = 42
reasoning-format = "none"
no-cache-prompt = true
max-connections = 10
header-timeout = 2.5
body-timeout = 3
keep_alive_timeout = 4
write-timeout = 5
step-budget-ms = 40
drain-timeout = 7.5
)",
                            "f.toml", c);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(c.batch_size, 64);
  EXPECT_TRUE(c.seed_set);
  EXPECT_EQ(c.seed, 42u);
  EXPECT_EQ(c.reasoning_format, "none");
  EXPECT_TRUE(c.no_cache_prompt);
  EXPECT_EQ(c.max_connections, 10);
  EXPECT_DOUBLE_EQ(c.header_timeout_s, 2.5);
  EXPECT_DOUBLE_EQ(c.body_timeout_s, 3);
  EXPECT_DOUBLE_EQ(c.keep_alive_timeout_s, 4);
  EXPECT_DOUBLE_EQ(c.write_timeout_s, 5);
  EXPECT_DOUBLE_EQ(c.step_budget_ms, 40);
  EXPECT_DOUBLE_EQ(c.drain_timeout_s, 7.5);
  EXPECT_DOUBLE_EQ(ServeConfig{}.drain_timeout_s, 30);
  for (const char* bad :
       {"reasoning-format = \"raw\"\n", "seed = -1\n", "batch-size = 2000000\n", "max-connections = 0\n",
        "header-timeout = 0\n", "write-timeout = \"5\"\n", "no-cache-prompt = 1\n", "step-budget-ms = -3\n",
        "drain-timeout = -1\n", "drain-timeout = \"30\"\n"}) {
    ServeConfig d;
    auto e = apply_serve_toml(bad, "f.toml", d);
    ASSERT_FALSE(e.has_value()) << bad;
    EXPECT_NE(e.error().message.find("f.toml: key '"), std::string::npos) << e.error().message;
  }
}

TEST(Config, TomlErrorsNameFileAndKey) {
  ServeConfig c;
  auto bad_type = apply_serve_toml("port = \"80\"\n", "s.toml", c);
  ASSERT_FALSE(bad_type.has_value());
  EXPECT_NE(bad_type.error().message.find("s.toml: key 'port'"), std::string::npos) << bad_type.error().message;
  auto unknown = apply_serve_toml("pool_sise = 2\n", "s.toml", c);
  ASSERT_FALSE(unknown.has_value());
  EXPECT_NE(unknown.error().message.find("pool_sise"), std::string::npos);
  auto syntax = apply_serve_toml("port = = 1\n", "s.toml", c);
  ASSERT_FALSE(syntax.has_value());
  EXPECT_NE(syntax.error().message.find("s.toml:1"), std::string::npos) << syntax.error().message;
  ServeConfig d;
  d.models = {{"a", "/a.gguf"}};
  d.preload = {"zzz"};
  EXPECT_FALSE(validate_serve_config(d).has_value());
  d.preload.clear();
  d.port = 70000;
  EXPECT_FALSE(validate_serve_config(d).has_value());
  EXPECT_EQ(load_serve_toml("/nonexistent/serve.toml", d).error().code, core::Errc::kNotFound);
}

// Regression: int keys were truncated from int64 (port = 2^32 + 8080 served
// on 8080, pool-size = 2^32 + 1 gave 1 replica) instead of being refused.
// The model keys have the one ModelSpec parser's ranges (issue 31): their
// message gives the range instead of "too large (at most 2147483647)".
TEST(Config, TomlIntegersTooLargeForTheirKeyAreRefused) {
  for (const auto& [text, want] : std::vector<std::pair<const char*, const char*>>{
           {"port = 4294975376\n", "expected an integer in [0, 65535]"},
           {"pool-size = 4294967297\n", "expected an integer in [0, 256]"},
           {"ctx-size = 9999999999\n", "expected an integer in [0, 1000000]"},
           {"queue-factor = 2147483648\n", "expected an integer in [1, 1048576]"}}) {
    ServeConfig c;
    auto r = apply_serve_toml(text, "s.toml", c);
    ASSERT_FALSE(r.has_value()) << text << " -> port " << c.port << ", pool " << c.pool_size;
    EXPECT_NE(r.error().message.find(want), std::string::npos) << r.error().message;
  }
  ServeConfig c;
  ASSERT_TRUE(apply_serve_toml("mem-budget = 8589934592\nmax-body = 8589934592\n", "s.toml", c).has_value());
  EXPECT_EQ(c.mem_budget_mb, 8589934592ull);
  // The KV budget is a token count (int64): larger than an int is fine.
  ASSERT_TRUE(apply_serve_toml("kv-budget-tokens = 4294967296\n", "s.toml", c).has_value());
  EXPECT_EQ(c.kv_budget_tokens, 4294967296ll);
  EXPECT_FALSE(apply_serve_toml("kv-budget-tokens = -1\n", "s.toml", c).has_value());
}

}  // namespace
}  // namespace bonsai::server
