// A hybrid (qwen35) model's recurrent state in /admin/models and /metrics:
// the state budget of its parallel sequences, the state-snapshot budget of
// its prompt cache, what is held now, and the model's mem_bytes counting
// both. In-process Server over ../shared/fixtures/qwen35/qwen35-tiny-q1_0.gguf
// (skips without it).
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "common/test_util.h"
#include "engine/engine_pool.h"  // gguf_model_loader, model_footprint
#include "model/kv_cache.h"      // KvCache::recurrent_bytes
#include "model/model.h"         // Model::load
#include "server/server.h"

namespace bonsai::server {
namespace {

using nlohmann::json;

TEST(StateMetrics, AdminModelsAndMetricsCountTheRecurrentState) {
  const std::string path = test::shared_path("fixtures/qwen35/qwen35-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(path);
  auto m = model::Model::load(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const uint64_t state = model::KvCache::recurrent_bytes((*m)->config());
  ASSERT_GT(state, 0u);

  auto pool = std::make_shared<engine::ModelPool>(1, 0, engine::gguf_model_loader(), engine::gguf_model_estimator());
  engine::ModelSpec spec;
  spec.path = path;
  spec.pool_size = 1;
  spec.ctx_size = 128;
  spec.parallel = 3;
  pool->loader_register("q35", spec);
  {
    auto h = pool->acquire("q35");
    ASSERT_TRUE(h.has_value()) << h.error().message;
  }
  ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.default_model = "q35";
  so.default_spec = spec;
  Server server(pool, so);
  auto port = server.bind();
  ASSERT_TRUE(port.has_value()) << port.error().message;
  std::thread t([&] { server.run(); });
  httplib::Client c("127.0.0.1", *port);
  c.set_read_timeout(30, 0);

  // One request, so the state has been allocated (and freed) once.
  json body{{"model", "q35"}, {"prompt", "hello world"}, {"max_tokens", 3}, {"temperature", 0}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;

  auto list = c.Get("/admin/models");
  ASSERT_TRUE(list);
  ASSERT_EQ(list->status, 200) << list->body;
  const json rows = json::parse(list->body, nullptr, false);
  json row;
  for (const auto& x : rows["data"].is_array() ? rows["data"] : rows)
    if (x.value("id", "") == "q35") row = x;
  ASSERT_TRUE(row.is_object()) << list->body;
  auto fp = engine::model_footprint(path, 128, 1, {}, model::KvType::kF16, model::KvType::kF16, 0, 3);
  ASSERT_TRUE(fp.has_value());
  EXPECT_EQ(row["recurrent_state_budget_bytes"], 3 * state);  // -np 3 sequences
  EXPECT_EQ(row["state_snapshot_budget_bytes"], 2 * state);   // two per context of the KV budget (one here)
  EXPECT_EQ(row["mem_bytes"], fp->total_bytes());
  EXPECT_EQ(fp->total_bytes(), fp->mapped_bytes + fp->kv_bytes + 3 * state + 2 * state);
  EXPECT_EQ(row["recurrent_states"], 0);  // the request ended: its state is gone
  EXPECT_EQ(row["recurrent_state_bytes"], 0);
  EXPECT_LE(row["state_snapshot_bytes"].get<uint64_t>(), 2 * state);
  EXPECT_TRUE(row.contains("kv_pinned_bytes"));

  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  for (const char* want :
       {"\nbonsai_recurrent_state_bytes{model=\"q35\"} 0\n", "\nbonsai_state_snapshot_bytes{model=\"q35\"} ",
        "\nbonsai_state_snapshot_hits_total{model=\"q35\"} 0\n",
        "\nbonsai_state_snapshot_evictions_total{model=\"q35\"} ", "# TYPE bonsai_recurrent_state_bytes gauge",
        "# TYPE bonsai_state_snapshot_hits_total counter"})
    EXPECT_NE(metrics->body.find(want), std::string::npos) << want;

  server.stop();
  t.join();
  pool->wait_background();
}

// A hybrid model never speculates (Sequence::propose), so a draft model or an
// n-gram spec-type given for one is dropped at load: no proposer, and the
// draft model is neither loaded nor counted in the model's memory (it was
// loaded and its ~35 MiB counted for nothing).
TEST(StateMetrics, AHybridModelLoadsNoDraftModel) {
  const std::string path = test::shared_path("fixtures/qwen35/qwen35-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(path);
  auto pool = std::make_shared<engine::ModelPool>(2, 0, engine::gguf_model_loader(), engine::gguf_model_estimator());
  engine::ModelSpec plain;
  plain.path = path;
  plain.pool_size = 1;
  plain.ctx_size = 128;
  engine::ModelSpec draft = plain, ngram = plain;
  draft.model_draft = path;
  ngram.spec.type = engine::SpecType::kNgram;
  pool->loader_register("plain", plain);
  pool->loader_register("draft", draft);
  pool->loader_register("ngram", ngram);
  uint64_t plain_bytes = 0;
  for (const char* id : {"plain", "draft", "ngram"}) {
    auto h = pool->acquire(id);
    ASSERT_TRUE(h.has_value()) << id << ": " << h.error().message;
    const auto& lm = h->shared();
    ASSERT_NE(lm->scheduler, nullptr);
    EXPECT_EQ(lm->scheduler->options().spec.type, engine::SpecType::kNone) << id;
    EXPECT_FALSE(lm->scheduler->options().spec.proposer) << id;
    if (plain_bytes == 0) plain_bytes = lm->mem_bytes;
    EXPECT_EQ(lm->mem_bytes, plain_bytes) << id;
    h->release();
    ASSERT_TRUE(pool->unload(id).has_value()) << id;
  }
}

}  // namespace
}  // namespace bonsai::server
