// In-process HTTP tests of the server (src/server/server.cpp): a Server on
// 127.0.0.1 (any free port) over a ModelPool with the real stories260K model
// (1 MiB, fast), driven with httplib::Client. Regression tests for bugs that
// real clients hit and the unit tests (openai_test.cpp) cannot see.
#include "server/server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <thread>

#include "common/test_util.h"

namespace bonsai::server {
namespace {

using nlohmann::json;

// A served pool with model "stories" (pool size 1, context 256) on a free port.
class ServerHttp : public ::testing::Test {
 protected:
  void SetUp() override {
    stories_ = bonsai::test::shared_path("models/stories260K/stories260K.gguf");
    BONSAI_REQUIRE_FILE(stories_);
    pool_ = std::make_shared<engine::ModelPool>(2, 0, engine::gguf_model_loader(), engine::gguf_model_estimator());
    spec_.path = stories_;
    spec_.pool_size = 1;
    spec_.ctx_size = 256;
    pool_->loader_register("stories", spec_);
    auto m = pool_->acquire("stories");
    ASSERT_TRUE(m.has_value()) << m.error().message;
    pool_->release(*m);
    ServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.default_model = "stories";
    so.default_spec = spec_;
    so.http_threads = 8;
    server_ = std::make_unique<Server>(pool_, so);
    auto port = server_->bind();
    ASSERT_TRUE(port.has_value()) << port.error().message;
    port_ = *port;
    thread_ = std::thread([this] { server_->run(); });
  }

  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
    server_.reset();
    if (pool_) pool_->wait_background();
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    return c;
  }

  // POST `body` with `content_type`; returns {status, parsed body} (null if not JSON).
  std::pair<int, json> post(const std::string& path, const std::string& body,
                            const std::string& content_type = "application/json") const {
    auto c = client();
    auto r = c.Post(path.c_str(), body, content_type.c_str());
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  std::string stories_;
  engine::ModelSpec spec_;
  std::shared_ptr<engine::ModelPool> pool_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

json completion_body(const std::string& prompt, int max_tokens) {
  return json{{"model", "stories"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

// `curl -d` sends Content-Type application/x-www-form-urlencoded; httplib
// caps such bodies at 8 KiB (413) before any handler runs. The API reads
// JSON whatever the content type says, up to the configured body limit.
TEST_F(ServerHttp, FormUrlencodedContentTypeIsReadAsJsonBeyond8KiB) {
  const std::string long_prompt(12000, 'x');
  json req = completion_body("Once upon a time", 4);
  req["user"] = long_prompt;  // an ignored field: a big body, a short prompt
  const std::string body = req.dump();
  ASSERT_GT(body.size(), 8192u);
  auto [st_json, j_json] = post("/v1/completions", body);
  ASSERT_EQ(st_json, 200) << j_json.dump();
  auto [st_form, j_form] = post("/v1/completions", body, "application/x-www-form-urlencoded");
  ASSERT_EQ(st_form, 200) << j_form.dump();
  EXPECT_EQ(j_form["choices"][0]["text"], j_json["choices"][0]["text"]);
  // Admin routes read their body the same way.
  auto [st_admin, j_admin] = post("/admin/models/unload", json{{"id", "nope"}, {"pad", long_prompt}}.dump(),
                                  "application/x-www-form-urlencoded");
  EXPECT_EQ(st_admin, 404) << j_admin.dump();
  // A multipart body is no JSON: 400 in OpenAI's error shape (not a 500).
  auto [st_mp, j_mp] = post("/v1/completions", "--xyz\r\n\r\n", "multipart/form-data; boundary=xyz");
  EXPECT_EQ(st_mp, 400) << j_mp.dump();
  EXPECT_TRUE(j_mp.contains("error")) << j_mp.dump();
}

// The configured limit still holds, with every content type.
TEST_F(ServerHttp, BodyAboveTheLimitIs413) {
  const std::string big = completion_body(std::string((4u << 20) + 10, 'a'), 1).dump();
  for (const char* ct : {"application/json", "application/x-www-form-urlencoded"}) {
    auto [st, j] = post("/v1/completions", big, ct);
    EXPECT_EQ(st, 413) << ct;
    EXPECT_EQ(j["error"]["code"], "request_too_large") << ct << " " << j.dump();
  }
}

// Regression: an admin load that is refused (bad file, or the id is busy)
// must not re-point the id's registration; the model must still reload
// from its own file after an unload.
TEST_F(ServerHttp, RefusedAdminLoadDoesNotRepointAServedModel) {
  const std::string garbage = ::testing::TempDir() + "/bonsai_server_http_garbage.gguf";
  {
    std::FILE* f = std::fopen(garbage.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("not a gguf file at all", f);
    std::fclose(f);
  }
  const json want = post("/v1/completions", completion_body("Once upon a time", 6).dump()).second;
  ASSERT_TRUE(want.contains("choices")) << want.dump();

  auto [st_load, j_load] = post("/admin/models/load", json{{"id", "stories"}, {"path", garbage}}.dump());
  EXPECT_GE(st_load, 400) << j_load.dump();
  auto [st_load2, j_load2] = post("/admin/models/load", json{{"id", "stories"}, {"path", stories_}, {"ctx_size", 8}}.dump());
  EXPECT_EQ(st_load2, 409) << j_load2.dump();

  auto [st_unload, j_unload] = post("/admin/models/unload", json{{"id", "stories"}}.dump());
  ASSERT_EQ(st_unload, 200) << j_unload.dump();
  auto [st, got] = post("/v1/completions", completion_body("Once upon a time", 6).dump());
  ASSERT_EQ(st, 200) << got.dump();
  EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]);
  auto lm = pool_->peek("stories");
  ASSERT_NE(lm, nullptr);
  EXPECT_EQ(lm->spec.path, stories_);
  EXPECT_EQ(lm->n_ctx, 256);

  // A new id whose file is bad is not advertised afterwards.
  auto [st_new, j_new] = post("/admin/models/load", json{{"id", "junk"}, {"path", garbage}}.dump());
  EXPECT_GE(st_new, 400) << j_new.dump();
  auto c = client();
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->body.find("junk"), std::string::npos) << models->body;
  auto one = c.Get("/v1/models/junk");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 404);
  std::remove(garbage.c_str());
}

}  // namespace
}  // namespace bonsai::server
