// llama-server habits (issue 32 item 7), in process over stories260K and the
// Qwen3 fixture: llama.cpp's /completion (= /v1/completions' text at
// temperature 0), its stream framing and stop fields, /infill and
// /v1/completions `suffix` (the FIM prompt, checked token for token against
// /tokenize), /props, /slots, 405 + Allow, 415 for encoded bodies, HEAD,
// context_length in /v1/models, and any model name reaching the one model
// served unless strict_model_names.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "engine/model_pool.h"  // ModelPool::peek (the scheduler's slots)
#include "engine/scheduler.h"
#include "server/server.h"

namespace bonsai::server {
namespace {

using nlohmann::json;

const std::string kStories = test::shared_path("models/stories260K/stories260K.gguf");
const std::string kQwen = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");

// A Server on 127.0.0.1 (free port) serving "stories" (the default, context
// 256, loaded) and, unless one_model(), "qwen" (context 512, loads on use).
class LlamaRoutes : public ::testing::Test {
 protected:
  virtual bool one_model() const { return false; }
  virtual void customize(ServerOptions&) {}
  virtual int qwen_ctx_size() const { return 512; }  // 0: the model's own context (capped at 4096)

  void SetUp() override {
    BONSAI_REQUIRE_FILE(kStories);
    if (!one_model()) BONSAI_REQUIRE_FILE(kQwen);
    pool_ = std::make_shared<engine::ModelPool>(2, 0, engine::gguf_model_loader(), engine::gguf_model_estimator());
    engine::ModelSpec spec;
    spec.pool_size = 1;
    spec.ctx_size = 256;
    spec.path = kStories;
    pool_->loader_register("stories", spec);
    auto m = pool_->acquire("stories");
    ASSERT_TRUE(m.has_value()) << m.error().message;
    m->release();
    if (!one_model()) {
      spec.ctx_size = qwen_ctx_size();
      spec.path = kQwen;
      pool_->loader_register("qwen", spec);
    }
    ServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.default_model = "stories";
    so.http_threads = 4;
    customize(so);
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
    c.set_read_timeout(120, 0);
    return c;
  }
  std::pair<int, json> post(const std::string& path, const json& body, const httplib::Headers& headers = {}) const {
    auto r = client().Post(path.c_str(), headers, body.dump(), "application/json");
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::pair<int, json> get(const std::string& path) const {
    auto r = client().Get(path.c_str());
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  // The token ids of `text` by /tokenize (special-token text recognised).
  std::vector<int> tokenize(const std::string& model, const std::string& text) const {
    auto [st, j] = post("/tokenize", json{{"model", model}, {"content", text}});
    EXPECT_EQ(st, 200) << j.dump();
    return j["tokens"].get<std::vector<int>>();
  }

  std::shared_ptr<engine::ModelPool> pool_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// The data: payloads of a llama.cpp stream ("data: {...}\n\n" each, no [DONE]).
std::vector<json> data_lines(const std::string& body) {
  std::vector<json> out;
  size_t at = 0;
  while (at < body.size()) {
    const size_t end = body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << body.substr(at);
    if (end == std::string::npos) break;
    const std::string ev = body.substr(at, end - at);
    at = end + 2;
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    out.push_back(json::parse(ev.substr(6), nullptr, false));
    EXPECT_FALSE(out.back().is_discarded()) << ev;
  }
  return out;
}

TEST_F(LlamaRoutes, CompletionTextEqualsV1CompletionsAtTemperatureZero) {
  const std::string prompt = "Once upon a time";
  auto [st_v1, v1] =
      post("/v1/completions", json{{"model", "stories"}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}});
  ASSERT_EQ(st_v1, 200) << v1.dump();
  for (const char* path : {"/completion", "/completions"}) {
    auto [st, r] = post(path, json{{"prompt", prompt}, {"n_predict", 24}, {"temperature", 0}, {"return_tokens", true}});
    ASSERT_EQ(st, 200) << path << " " << r.dump();
    EXPECT_EQ(r["content"], v1["choices"][0]["text"]) << path;
    EXPECT_EQ(r["stop"], true);
    EXPECT_EQ(r["model"], "stories");
    EXPECT_EQ(r["tokens_predicted"], v1["usage"]["completion_tokens"]);
    EXPECT_EQ(r["tokens_evaluated"], v1["usage"]["prompt_tokens"]);
    EXPECT_EQ(r["tokens_evaluated"], tokenize("stories", prompt).size() + 1);  // + BOS (llama vocabulary)
    EXPECT_EQ(r["truncated"], false);
    const bool limit = v1["choices"][0]["finish_reason"] == "length";
    EXPECT_EQ(r["stop_type"], limit ? "limit" : "eos");
    EXPECT_EQ(r["stopped_limit"], limit);
    EXPECT_EQ(r["stopped_eos"], !limit);
    EXPECT_EQ(r["has_new_line"], r["content"].get<std::string>().find('\n') != std::string::npos);
    // The prompt as its tokens spell it (the BOS is a control token: its text).
    EXPECT_EQ(r["prompt"], "<s> " + prompt) << r["prompt"];
    EXPECT_EQ(r["generation_settings"]["n_predict"], 24);
    EXPECT_EQ(r["generation_settings"]["n_ctx"], 256);
    EXPECT_EQ(r["generation_settings"]["temperature"], 0.0);
    EXPECT_EQ(r["generation_settings"]["model"], "stories");
    EXPECT_EQ(r["timings"]["predicted_n"], r["tokens_predicted"]);
    EXPECT_GE(r["timings"]["predicted_ms"].get<double>(), 0.0);
    EXPECT_EQ(r["timings"]["prompt_n"].get<int>() + r["tokens_cached"].get<int>(), r["tokens_evaluated"].get<int>());
    // return_tokens: the generated ids, which spell the content.
    ASSERT_TRUE(r["tokens"].is_array());
    if (limit) {
      EXPECT_EQ(r["tokens"].size(), r["tokens_predicted"].get<size_t>());
    }
    auto [st_d, d] = post("/detokenize", json{{"model", "stories"}, {"tokens", r["tokens"]}});
    ASSERT_EQ(st_d, 200);
    EXPECT_EQ(d["content"], r["content"]);
  }
  // The prompt as token ids gives the same text.
  std::vector<int> ids = tokenize("stories", prompt);
  ids.insert(ids.begin(), 1);  // BOS
  auto [st_ids, by_ids] = post("/completion", json{{"prompt", ids}, {"n_predict", 24}, {"temperature", 0}});
  ASSERT_EQ(st_ids, 200) << by_ids.dump();
  EXPECT_EQ(by_ids["content"], v1["choices"][0]["text"]);
  EXPECT_EQ(by_ids["tokens"], json::array());  // without return_tokens
}

TEST_F(LlamaRoutes, StreamedPiecesMakeTheTextAndTheLastLineHasTheStats) {
  const json body{{"prompt", "The little dog"}, {"n_predict", 20}, {"temperature", 0}};
  auto [st, whole] = post("/completion", body);
  ASSERT_EQ(st, 200) << whole.dump();
  json sbody = body;
  sbody["stream"] = true;
  auto r = client().Post("/completion", sbody.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_EQ(r->body.find("[DONE]"), std::string::npos);
  const std::vector<json> lines = data_lines(r->body);
  ASSERT_GE(lines.size(), 2u);
  std::string text;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["stop"], false) << lines[i].dump();
    EXPECT_EQ(lines[i]["index"], 0);
    text += lines[i]["content"].get<std::string>();
  }
  EXPECT_EQ(text, whole["content"]);
  const json& last = lines.back();
  EXPECT_EQ(last["stop"], true);
  EXPECT_EQ(last["content"], "");
  EXPECT_EQ(last["tokens_predicted"], whole["tokens_predicted"]);
  EXPECT_EQ(last["stop_type"], whole["stop_type"]);
  EXPECT_EQ(last["generation_settings"]["stream"], true);
}

TEST_F(LlamaRoutes, StopWordIsReportedAndCutsTheText) {
  auto [st, free] = post("/completion", json{{"prompt", "Once upon a time"}, {"n_predict", 40}, {"temperature", 0}});
  ASSERT_EQ(st, 200);
  const std::string text = free["content"].get<std::string>();
  // A word from the middle of the greedy text: the stopped answer ends before it.
  const size_t at = text.find(' ', text.size() / 2);
  ASSERT_NE(at, std::string::npos) << text;
  const size_t end = text.find(' ', at + 1);
  const std::string word = text.substr(at, (end == std::string::npos ? text.size() : end) - at);
  ASSERT_GT(word.size(), 1u) << text;
  auto [st2, r] =
      post("/completion",
           json{{"prompt", "Once upon a time"}, {"n_predict", 40}, {"temperature", 0}, {"stop", json::array({word})}});
  ASSERT_EQ(st2, 200) << r.dump();
  EXPECT_EQ(r["stop_type"], "word") << r.dump();
  EXPECT_EQ(r["stopping_word"], word);
  EXPECT_EQ(r["stopped_word"], true);
  EXPECT_EQ(r["content"], text.substr(0, text.find(word)));
}

// stop_type / stopped_* say what ended the generation, streamed or not:
// "word" (and which) for a stop string, "limit" for n_predict, "eos" only for EOS.
TEST_F(LlamaRoutes, StopTypeIsWordLimitOrEosStreamedAndNot) {
  auto ask = [this](json body, bool stream) {
    body["stream"] = stream;
    if (!stream) return post("/completion", body).second;
    auto r = client().Post("/completion", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200);
    if (!r) return json();
    const std::vector<json> lines = data_lines(r->body);
    EXPECT_FALSE(lines.empty());
    if (lines.empty()) return json();
    json last = lines.back();
    std::string text;
    for (size_t i = 0; i + 1 < lines.size(); ++i) text += lines[i]["content"].get<std::string>();
    last["content"] = text;
    return last;
  };
  auto [st, free] = post("/completion", json{{"prompt", "Once"}, {"n_predict", 20}, {"temperature", 0}});
  ASSERT_EQ(st, 200) << free.dump();
  const std::string text = free["content"].get<std::string>();
  ASSERT_NE(text.find("girl"), std::string::npos) << text;  // stories260K's greedy text after "Once"
  for (bool stream : {false, true}) {
    const json w = ask(json{{"prompt", "Once"}, {"n_predict", 20}, {"temperature", 0}, {"stop", {"girl"}}}, stream);
    EXPECT_EQ(w["stop_type"], "word") << stream << " " << w.dump();
    EXPECT_EQ(w["stopping_word"], "girl") << stream;
    EXPECT_EQ(w["stopped_word"], true) << stream;
    EXPECT_EQ(w["stopped_eos"], false) << stream;
    EXPECT_EQ(w["stopped_limit"], false) << stream;
    EXPECT_EQ(w["content"], text.substr(0, text.find("girl"))) << stream;

    const json l = ask(json{{"prompt", "Once"}, {"n_predict", 3}, {"temperature", 0}}, stream);
    EXPECT_EQ(l["stop_type"], "limit") << stream << " " << l.dump();
    EXPECT_EQ(l["stopped_limit"], true) << stream;
    EXPECT_EQ(l["stopped_eos"], false) << stream;
    EXPECT_EQ(l["stopped_word"], false) << stream;
    EXPECT_EQ(l["stopping_word"], "") << stream;
    EXPECT_EQ(l["tokens_predicted"], 3) << stream;

    // EOS (id 2 in stories260K's vocabulary) made the likeliest token: it ends the answer.
    const json e = ask(json{{"prompt", "Once upon a time"},
                            {"n_predict", 20},
                            {"temperature", 0},
                            {"logit_bias", json::array({json::array({2, 100})})}},
                       stream);
    EXPECT_EQ(e["tokens_predicted"], 1) << e.dump();
    EXPECT_EQ(e["content"], "") << e.dump();
    EXPECT_EQ(e["stop_type"], "eos") << stream << " " << e.dump();
    EXPECT_EQ(e["stopped_eos"], true) << stream;
    EXPECT_EQ(e["stopped_word"], false) << stream;
    EXPECT_EQ(e["stopped_limit"], false) << stream;
  }
}

// n_predict 0 (llama.cpp: "no tokens will be generated but the prompt is
// evaluated into the cache"): an empty content, the prompt counted, stop_type limit.
TEST_F(LlamaRoutes, NPredictZeroEvaluatesThePromptOnly) {
  const std::string prompt = "Once upon a time";
  for (bool stream : {false, true}) {
    json body{{"prompt", prompt}, {"n_predict", 0}, {"temperature", 0}, {"stream", stream}};
    auto r = client().Post("/completion", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j;
    if (stream) {
      const std::vector<json> lines = data_lines(r->body);
      ASSERT_FALSE(lines.empty());
      j = lines.back();
      for (size_t i = 0; i + 1 < lines.size(); ++i) EXPECT_EQ(lines[i]["content"], "") << lines[i].dump();
    } else {
      j = json::parse(r->body);
    }
    EXPECT_EQ(j["content"], "") << j.dump();
    EXPECT_EQ(j["tokens_predicted"], 0) << j.dump();
    EXPECT_EQ(j["tokens_evaluated"], tokenize("stories", prompt).size() + 1) << j.dump();  // + BOS
    EXPECT_EQ(j["stop_type"], "limit") << j.dump();
    EXPECT_EQ(j["stopped_limit"], true);
    EXPECT_EQ(j["generation_settings"]["n_predict"], 0);
    EXPECT_EQ(j["timings"]["predicted_n"], 0);
    EXPECT_EQ(j["timings"]["prompt_n"].get<int>() + j["tokens_cached"].get<int>(), j["tokens_evaluated"].get<int>());
  }
}

// A prompt that fills the context is refused for what it is, whatever
// n_predict says (-1 used to read "you requested 256 tokens" of a 256 maximum).
TEST_F(LlamaRoutes, PromptThatFillsTheContextIsRefusedForItsLength) {
  std::vector<int> ids(300, 403);
  ids[0] = 1;  // BOS
  for (int n_predict : {-1, 8}) {
    auto [st, j] = post("/completion", json{{"prompt", ids}, {"n_predict", n_predict}});
    EXPECT_EQ(st, 400) << j.dump();
    EXPECT_EQ(j["error"]["code"], "context_length_exceeded") << j.dump();
    EXPECT_EQ(j["error"]["message"],
              "This model's maximum context length is 256 tokens. However, the prompt is 300 tokens, which leaves "
              "no room for the completion. Please reduce the length of the prompt.")
        << j.dump();
  }
}

// n_probs: llama-server's completion_probabilities, one entry per generated
// token ({id, token, bytes, logprob, top_logprobs: n_probs of {id, token,
// bytes, logprob}}), equal to /v1/completions' logprobs; streamed per piece.
TEST_F(LlamaRoutes, NProbsGivesCompletionProbabilities) {
  const std::string prompt = "Once upon a time";
  auto [st, r] =
      post("/completion",
           json{{"prompt", prompt}, {"n_predict", 6}, {"temperature", 0}, {"n_probs", 3}, {"return_tokens", true}});
  ASSERT_EQ(st, 200) << r.dump();
  auto [st_v1, v1] =
      post("/v1/completions",
           json{{"model", "stories"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 3}});
  ASSERT_EQ(st_v1, 200) << v1.dump();
  const json& probs = r["completion_probabilities"];
  ASSERT_TRUE(probs.is_array()) << r.dump();
  ASSERT_EQ(probs.size(), r["tokens"].size()) << r.dump();
  const json& lp = v1["choices"][0]["logprobs"];
  std::string text;
  for (size_t i = 0; i < probs.size(); ++i) {
    const json& p = probs[i];
    EXPECT_EQ(p["id"], r["tokens"][i]);
    EXPECT_EQ(p["token"], lp["tokens"][i]);
    text += p["token"].get<std::string>();
    std::string from_bytes;
    for (const json& b : p["bytes"]) from_bytes.push_back(static_cast<char>(b.get<int>()));
    EXPECT_EQ(from_bytes, p["token"].get<std::string>());
    EXPECT_NEAR(p["logprob"].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-5);
    ASSERT_EQ(p["top_logprobs"].size(), 3u) << p.dump();
    EXPECT_EQ(p["top_logprobs"][0]["id"], p["id"]);  // greedy: the sampled token is the most likely
    EXPECT_NEAR(p["top_logprobs"][0]["logprob"].get<double>(), p["logprob"].get<double>(), 1e-6);
    for (size_t k = 1; k < 3; ++k)
      EXPECT_LE(p["top_logprobs"][k]["logprob"].get<double>(), p["top_logprobs"][k - 1]["logprob"].get<double>());
    EXPECT_EQ(p["top_logprobs"].size(), lp["top_logprobs"][i].size());
  }
  EXPECT_EQ(text, r["content"]);
  EXPECT_EQ(r["generation_settings"]["n_probs"], 3);
  // Streamed: each piece carries the probabilities of the tokens it releases.
  auto s = client().Post(
      "/completion",
      json{{"prompt", prompt}, {"n_predict", 6}, {"temperature", 0}, {"n_probs", 3}, {"stream", true}}.dump(),
      "application/json");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200) << s->body;
  json streamed = json::array();
  for (const json& line : data_lines(s->body))
    if (line.contains("completion_probabilities"))
      for (const json& p : line["completion_probabilities"]) streamed.push_back(p);
  EXPECT_EQ(streamed, probs);
  // Without n_probs: no such field.
  auto [st0, r0] = post("/completion", json{{"prompt", prompt}, {"n_predict", 2}});
  EXPECT_FALSE(r0.contains("completion_probabilities")) << r0.dump();
}

TEST_F(LlamaRoutes, BadNativeFieldsAre400NamingThem) {
  struct Case {
    json body;
    const char* param;
  };
  const std::vector<Case> cases = {
      {json{{"prompt", "x"}, {"n_predict", -2.5}}, "n_predict"},
      {json{{"prompt", "x"}, {"n_predict", "many"}}, "n_predict"},
      {json{{"prompt", "x"}, {"temperature", 9}}, "temperature"},
      {json{{"n_predict", 4}}, "prompt"},
      {json{{"prompt", "x"}, {"n_probs", 3.5}}, "n_probs"},
      {json{{"prompt", "x"}, {"n_probs", 21}}, "n_probs"},
      {json{{"prompt", "x"}, {"logit_bias", json::array({json::array({1})})}}, "logit_bias"},
      {json{{"prompt", "x"}, {"return_tokens", "yes"}}, "return_tokens"},
  };
  for (const auto& c : cases) {
    auto [st, j] = post("/completion", c.body);
    EXPECT_EQ(st, 400) << c.body.dump() << " " << j.dump();
    EXPECT_EQ(j["error"]["param"], c.param) << c.body.dump() << " " << j.dump();
  }
  auto [st, j] = post("/infill", json{{"input_prefix", "a"}, {"input_extra", json::array({json{{"text", 5}}})}});
  EXPECT_EQ(st, 400);
  EXPECT_EQ(j["error"]["param"], "input_extra[0].text") << j.dump();
  // A seed of -1 is llama.cpp's "random"; a logit_bias pair with false bans the token.
  auto [st_ok, ok] = post(
      "/completion",
      json{
          {"prompt", "Once"}, {"n_predict", 3}, {"seed", -1}, {"logit_bias", json::array({json::array({13, false})})}});
  EXPECT_EQ(st_ok, 200) << ok.dump();
  EXPECT_EQ(ok["generation_settings"]["logit_bias"], json::array({json::array({13, -100.0})}));
}

// stories260K's vocabulary has no FIM tokens: /infill and `suffix` are a 400 saying so.
TEST_F(LlamaRoutes, FimWithoutFimTokensIs400) {
  auto [st, j] = post("/infill", json{{"input_prefix", "a"}, {"input_suffix", "b"}});
  EXPECT_EQ(st, 400);
  EXPECT_EQ(j["error"]["code"], "unsupported_value") << j.dump();
  EXPECT_NE(j["error"]["message"].get<std::string>().find("<|fim_prefix|>"), std::string::npos) << j.dump();
  auto [st2, j2] = post("/v1/completions", json{{"model", "stories"}, {"prompt", "a"}, {"suffix", "b"}});
  EXPECT_EQ(st2, 400);
  EXPECT_EQ(j2["error"]["param"], "suffix") << j2.dump();
  // An empty suffix is no suffix (OpenAI's default).
  auto [st3, j3] =
      post("/v1/completions", json{{"model", "stories"}, {"prompt", "a"}, {"suffix", ""}, {"max_tokens", 1}});
  EXPECT_EQ(st3, 200) << j3.dump();
}

// The Qwen3 vocabulary has <|fim_prefix|> <|fim_suffix|> <|fim_middle|> (and
// <|file_sep|>): /infill builds prefix-suffix-middle exactly, and
// /v1/completions with `suffix` builds the same prompt.
TEST_F(LlamaRoutes, InfillBuildsTheFimPromptExactly) {
  const std::string prefix = "def add(a, b):\n", suffix = "\n\nprint(add(1, 2))\n", middle = "    return";
  auto [st, r] = post("/infill", json{{"model", "qwen"},
                                      {"input_prefix", prefix},
                                      {"input_suffix", suffix},
                                      {"prompt", middle},
                                      {"n_predict", 8},
                                      {"temperature", 0}});
  ASSERT_EQ(st, 200) << r.dump();
  const std::string want = "<|fim_prefix|>" + prefix + "<|fim_suffix|>" + suffix + "<|fim_middle|>" + middle;
  EXPECT_EQ(r["prompt"], want);
  EXPECT_EQ(r["model"], "qwen");
  // Token for token: the FIM tokens are single ids and the texts tokenized as they are.
  const std::vector<int> ids = tokenize("qwen", want);
  EXPECT_EQ(r["tokens_evaluated"], ids.size());
  const std::vector<int> pre = tokenize("qwen", "<|fim_prefix|>"), suf = tokenize("qwen", "<|fim_suffix|>"),
                         mid = tokenize("qwen", "<|fim_middle|>");
  ASSERT_EQ(pre.size(), 1u);
  ASSERT_EQ(suf.size(), 1u);
  ASSERT_EQ(mid.size(), 1u);
  EXPECT_EQ(ids.front(), pre[0]);
  const std::vector<int> p_ids = tokenize("qwen", prefix);
  EXPECT_EQ(ids[1 + p_ids.size()], suf[0]);

  // /v1/completions `suffix` (OpenAI's field): the same prompt, the same text.
  auto [st2, v1] =
      post("/v1/completions",
           json{{"model", "qwen"}, {"prompt", prefix}, {"suffix", suffix}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(st2, 200) << v1.dump();
  auto [st3, no_middle] = post(
      "/infill",
      json{
          {"model", "qwen"}, {"input_prefix", prefix}, {"input_suffix", suffix}, {"n_predict", 8}, {"temperature", 0}});
  ASSERT_EQ(st3, 200) << no_middle.dump();
  EXPECT_EQ(v1["usage"]["prompt_tokens"], no_middle["tokens_evaluated"]);
  EXPECT_EQ(v1["choices"][0]["text"], no_middle["content"]);
  // suffix with a token-id prompt: refused (FIM needs the text).
  auto [st4, j4] = post("/v1/completions", json{{"model", "qwen"}, {"prompt", json::array({1, 2})}, {"suffix", "x"}});
  EXPECT_EQ(st4, 400);
  EXPECT_EQ(j4["error"]["param"], "suffix");

  // input_extra: each file after <|file_sep|>, before the FIM block.
  auto [st5, extra] =
      post("/infill", json{{"model", "qwen"},
                           {"input_prefix", prefix},
                           {"input_suffix", suffix},
                           {"input_extra", json::array({json{{"filename", "util.py"}, {"text", "X = 1\n"}},
                                                        json{{"filename", "b.py"}, {"text", "Y"}}})},
                           {"n_predict", 2},
                           {"temperature", 0}});
  ASSERT_EQ(st5, 200) << extra.dump();
  const std::string want_extra = "<|file_sep|>util.py\nX = 1\n<|file_sep|>b.py\nY<|fim_prefix|>" + prefix +
                                 "<|fim_suffix|>" + suffix + "<|fim_middle|>";
  EXPECT_EQ(extra["prompt"], want_extra);
  EXPECT_EQ(extra["tokens_evaluated"], tokenize("qwen", want_extra).size());
}

TEST_F(LlamaRoutes, PropsAndSlotsDescribeTheModel) {
  auto [st, p] = get("/props");
  ASSERT_EQ(st, 200) << p.dump();
  EXPECT_EQ(p["model_alias"], "stories");
  EXPECT_EQ(p["model_path"], kStories);
  EXPECT_EQ(p["default_generation_settings"]["n_ctx"], 256);
  EXPECT_EQ(p["default_generation_settings"]["params"]["n_ctx"], 256);
  EXPECT_TRUE(p["default_generation_settings"]["params"].contains("temperature"));
  EXPECT_EQ(p["bos_token"], "<s>");
  EXPECT_EQ(p["eos_token"], "</s>");
  EXPECT_TRUE(p["chat_template"].is_string());
  EXPECT_EQ(p["modalities"]["vision"], false);
  const int total = p["total_slots"].get<int>();
  const auto lm = pool_->peek("stories");
  ASSERT_TRUE(lm && lm->scheduler);
  EXPECT_EQ(total, lm->scheduler->options().max_sequences);
  EXPECT_GE(total, 1);
  auto [st2, s] = get("/slots");
  ASSERT_EQ(st2, 200) << s.dump();
  ASSERT_TRUE(s.is_array());
  ASSERT_EQ(s.size(), static_cast<size_t>(total));
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i]["id"], i);
    EXPECT_EQ(s[i]["n_ctx"], 256);
    EXPECT_EQ(s[i]["is_processing"], false);  // nothing runs
  }
  // ?model= picks the model (qwen loads on use; its template is Qwen3's ChatML).
  auto [st3, q] = get("/props?model=qwen");
  ASSERT_EQ(st3, 200) << q.dump();
  EXPECT_EQ(q["model_alias"], "qwen");
  EXPECT_EQ(q["default_generation_settings"]["n_ctx"], 512);
  EXPECT_NE(q["chat_template"].get<std::string>().find("<|im_start|>"), std::string::npos);
  auto [st4, none] = get("/slots?model=nope");
  EXPECT_EQ(st4, 404) << none.dump();
}

TEST_F(LlamaRoutes, WrongMethodIs405WithAllow) {
  auto c = client();
  struct Case {
    std::string method, path, allow;
  };
  for (const Case& k : {Case{"GET", "/v1/completions", "POST"}, Case{"POST", "/health", "GET, HEAD"},
                        Case{"DELETE", "/v1/models", "GET, HEAD"}, Case{"PUT", "/completion", "POST"},
                        Case{"POST", "/props", "GET, HEAD"}, Case{"POST", "/v1/responses/abc", "GET, HEAD, DELETE"},
                        // Ollama's routes under its /api/* catch-all (which answers 404 for other paths)
                        Case{"GET", "/api/chat", "POST"}, Case{"POST", "/api/tags", "GET, HEAD"},
                        Case{"GET", "/api/generate", "POST"}}) {
    httplib::Request req;
    req.method = k.method;
    req.path = k.path;
    if (k.method != "GET" && k.method != "DELETE") req.body = "{}";
    auto r = c.send(req);
    ASSERT_TRUE(r) << k.method << " " << k.path;
    EXPECT_EQ(r->status, 405) << k.method << " " << k.path << " " << r->body;
    EXPECT_EQ(r->get_header_value("Allow"), k.allow) << k.method << " " << k.path;
    const json j = json::parse(r->body, nullptr, false);
    if (k.path.rfind("/api/", 0) == 0) {
      // Ollama's paths answer in Ollama's error shape, {"error": "..."}.
      ASSERT_TRUE(j["error"].is_string()) << r->body;
      EXPECT_NE(j["error"].get<std::string>().find(k.method), std::string::npos) << r->body;
    } else {
      EXPECT_EQ(j["error"]["code"], "method_not_allowed") << r->body;
    }
  }
  // A path no route has is still a 404 (under /api/ too); HEAD of an exact GET route is still served.
  auto r = c.Get("/no/such/route");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(r->get_header_value("Allow").empty());
  r = c.Get("/api/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  r = c.Head("/api/tags");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// llama-server also serves the OpenAI routes without /v1: the same answers.
TEST_F(LlamaRoutes, OpenAiRoutesWithoutV1AreAliases) {
  auto [st, models] = get("/models");
  ASSERT_EQ(st, 200) << models.dump();
  EXPECT_EQ(models, get("/v1/models").second);
  const json chat{{"model", "stories"},
                  {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                  {"max_tokens", 8},
                  {"temperature", 0}};
  auto [st_c, c] = post("/chat/completions", chat);
  ASSERT_EQ(st_c, 200) << c.dump();
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"], post("/v1/chat/completions", chat).second["choices"][0]["message"]);
  const json emb{{"model", "stories"}, {"input", "Once upon a time"}};
  auto [st_e, e] = post("/embeddings", emb);
  ASSERT_EQ(st_e, 200) << e.dump();
  EXPECT_EQ(e["data"], post("/v1/embeddings", emb).second["data"]);
}

// /tokenize with_pieces: a special token's piece is its text, as llama-server's.
TEST_F(LlamaRoutes, TokenizePiecesOfSpecialTokensAreTheirText) {
  auto [st, j] =
      post("/tokenize", json{{"model", "qwen"}, {"content", "<|im_start|>user\nhi<|im_end|>"}, {"with_pieces", true}});
  ASSERT_EQ(st, 200) << j.dump();
  ASSERT_GE(j["tokens"].size(), 4u) << j.dump();
  EXPECT_EQ(j["tokens"].front()["piece"], "<|im_start|>") << j.dump();
  EXPECT_EQ(j["tokens"].back()["piece"], "<|im_end|>") << j.dump();
  std::string text;
  for (const json& t : j["tokens"]) text += t["piece"].get<std::string>();
  EXPECT_EQ(text, "<|im_start|>user\nhi<|im_end|>");
}

TEST_F(LlamaRoutes, EncodedBodyIs415AndIdentityIsServed) {
  const std::string body = json{{"model", "stories"}, {"prompt", "Once"}, {"max_tokens", 2}}.dump();
  for (const char* coding : {"gzip", "br", "deflate, gzip"}) {
    auto r = client().Post("/v1/completions", {{"Content-Encoding", coding}}, body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 415) << coding << " " << r->body;
    EXPECT_EQ(r->get_header_value("Accept-Encoding"), "identity");
    const json j = json::parse(r->body, nullptr, false);
    EXPECT_EQ(j["error"]["code"], "unsupported_media_type") << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find("Content-Encoding"), std::string::npos);
  }
  auto ok = client().Post("/v1/completions", {{"Content-Encoding", "identity"}}, body, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST_F(LlamaRoutes, HeadHealthIs200WithoutABody) {
  auto g = client().Get("/health");
  ASSERT_TRUE(g);
  ASSERT_EQ(g->status, 200);
  auto h = client().Head("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_TRUE(h->body.empty());
  EXPECT_EQ(h->get_header_value("Content-Type"), "application/json");
  auto m = client().Head("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_TRUE(m->body.empty());
}

TEST_F(LlamaRoutes, ModelsGiveTheContextLength) {
  auto [st, list] = get("/v1/models");
  ASSERT_EQ(st, 200);
  ASSERT_EQ(list["data"].size(), 2u) << list.dump();
  for (const json& m : list["data"]) {
    const int want = m["id"] == "stories" ? 256 : 512;  // loaded: its n_ctx; registered: its ctx-size
    EXPECT_EQ(m["context_length"], want) << m.dump();
    EXPECT_EQ(m["max_model_len"], want) << m.dump();
  }
  auto [st2, one] = get("/v1/models/stories");
  ASSERT_EQ(st2, 200);
  EXPECT_EQ(one["context_length"], 256);
  // Two models served: an unknown name is not guessed.
  auto [st3, j] = post("/v1/completions", json{{"model", "gpt-4o"}, {"prompt", "x"}, {"max_tokens", 1}});
  EXPECT_EQ(st3, 404);
  EXPECT_EQ(j["error"]["code"], "model_not_found");
}

// A registered model with no ctx-size of its own, not loaded: /v1/models
// reads its context from the GGUF header (context_length, capped at 4096)
// without loading it, and says the same once it is loaded.
class LlamaRoutesOwnContext : public LlamaRoutes {
 protected:
  int qwen_ctx_size() const override { return 0; }
};

TEST_F(LlamaRoutesOwnContext, ModelsGiveTheContextOfAModelNotLoaded) {
  auto context_of = [this](const std::string& id) -> json {
    auto [st, list] = get("/v1/models");
    EXPECT_EQ(st, 200);
    for (const json& m : list["data"])
      if (m["id"] == id) return m;
    return json();
  };
  ASSERT_EQ(pool_->peek("qwen"), nullptr);  // registered, not loaded
  const json before = context_of("qwen");
  ASSERT_TRUE(before.contains("context_length")) << before.dump();
  EXPECT_EQ(pool_->peek("qwen"), nullptr);  // listing did not load it
  auto [st1, one] = get("/v1/models/qwen");
  ASSERT_EQ(st1, 200);
  EXPECT_EQ(one["context_length"], before["context_length"]);
  // Loaded: its n_ctx is the number listed before.
  auto [st, r] = post("/v1/completions", json{{"model", "qwen"}, {"prompt", "Hi"}, {"max_tokens", 1}});
  ASSERT_EQ(st, 200) << r.dump();
  auto lm = pool_->peek("qwen");
  ASSERT_NE(lm, nullptr);
  EXPECT_EQ(before["context_length"], lm->n_ctx);
  EXPECT_EQ(before["max_model_len"], lm->n_ctx);
  EXPECT_EQ(context_of("qwen")["context_length"], lm->n_ctx);
  EXPECT_GT(lm->n_ctx, 512);  // the fixture's own context, not a ctx-size
}

// llama-server's mixed prompt: ids kept, strings tokenized (BOS only before
// a string that comes first), concatenated: the same answer as those ids.
TEST_F(LlamaRoutes, MixedPromptIsItsIdsAndTokenizedTextsInOrder) {
  const std::vector<int> once = tokenize("stories", "Once upon");
  const std::vector<int> time = tokenize("stories", "a time");
  auto answer = [this](const json& prompt) {
    auto [st, r] = post("/completion", json{{"prompt", prompt}, {"n_predict", 12}, {"temperature", 0}});
    EXPECT_EQ(st, 200) << prompt.dump() << " " << r.dump();
    return r;
  };
  std::vector<int> ids = {1};  // BOS, then the texts' tokens
  ids.insert(ids.end(), once.begin(), once.end());
  ids.insert(ids.end(), time.begin(), time.end());
  const json by_ids = answer(ids);
  for (const json& mixed : {json::array({1, "Once upon", "a time"}), json::array({"Once upon", "a time", 1}), [&] {
                              json m = json::array({"Once upon"});  // first a text: BOS added (llama vocabulary)
                              for (int id : time) m.push_back(id);
                              return m;
                            }()}) {
    const json r = answer(mixed);
    std::vector<int> want = ids;
    if (mixed.back() == 1) {  // ["Once upon", "a time", 1]: BOS + texts, then the id 1
      want.push_back(1);
      EXPECT_EQ(r["tokens_evaluated"], want.size()) << mixed.dump();
      EXPECT_EQ(r["prompt"], answer(want)["prompt"]) << mixed.dump();
      EXPECT_EQ(r["content"], answer(want)["content"]) << mixed.dump();
      continue;
    }
    EXPECT_EQ(r["tokens_evaluated"], want.size()) << mixed.dump();
    EXPECT_EQ(r["prompt"], by_ids["prompt"]) << mixed.dump();
    EXPECT_EQ(r["content"], by_ids["content"]) << mixed.dump();
  }
  // /v1/completions reads it the same way.
  auto [st, v1] =
      post("/v1/completions",
           json{{"prompt", json::array({1, "Once upon", "a time"})}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(st, 200) << v1.dump();
  EXPECT_EQ(v1["choices"][0]["text"], by_ids["content"]);
  EXPECT_EQ(v1["usage"]["prompt_tokens"], ids.size());
  // An id outside the vocabulary is a 400 naming the prompt.
  auto [bst, bad] = post("/completion", json{{"prompt", json::array({1, "x", 99999})}, {"n_predict", 1}});
  EXPECT_EQ(bst, 400) << bad.dump();
  EXPECT_EQ(bad["error"]["param"], "prompt") << bad.dump();
}

// llama-server's logit_bias with text: every token of the text gets the
// bias, as [["text", bias]] or {"text": bias}; false bans them.
TEST_F(LlamaRoutes, LogitBiasTakesTextAsLlamaServerDoes) {
  const std::vector<int> girl = tokenize("stories", "girl");
  ASSERT_FALSE(girl.empty());
  auto ask = [this](const json& bias) {
    auto [st, r] = post("/completion", json{{"prompt", "Once upon a time"},
                                            {"n_predict", 6},
                                            {"temperature", 0},
                                            {"return_tokens", true},
                                            {"logit_bias", bias}});
    EXPECT_EQ(st, 200) << bias.dump() << " " << r.dump();
    return r;
  };
  json want = json::array();
  for (int id : girl) want.push_back(json::array({id, 100.0}));
  const json pushed = ask(json::array({json::array({"girl", 100})}));
  EXPECT_EQ(pushed["generation_settings"]["logit_bias"], want);
  ASSERT_EQ(pushed["tokens"].size(), 6u) << pushed.dump();
  for (const json& t : pushed["tokens"])  // +100 on the text's tokens: only they are picked
    EXPECT_NE(std::find(girl.begin(), girl.end(), t.get<int>()), girl.end()) << pushed.dump();
  const json as_object = ask(json{{"girl", 100}});
  EXPECT_EQ(as_object["generation_settings"]["logit_bias"], want);
  EXPECT_EQ(as_object["tokens"], pushed["tokens"]);
  // false: never; an id pair and a text pair together (ids first, then the text's tokens).
  const json banned = ask(json::array({json::array({"girl", false}), json::array({13, -1})}));
  json want_banned = json::array({json::array({13, -1.0})});
  for (int id : girl) want_banned.push_back(json::array({id, -100.0}));
  EXPECT_EQ(banned["generation_settings"]["logit_bias"], want_banned);
  for (const json& t : banned["tokens"])
    EXPECT_EQ(std::find(girl.begin(), girl.end(), t.get<int>()), girl.end()) << banned.dump();
  // The id forms still work ([[id, bias]] and {"id": bias}).
  const json by_id = ask(json{{std::to_string(girl[0]), 100}});
  EXPECT_EQ(by_id["generation_settings"]["logit_bias"], json::array({json::array({girl[0], 100.0})}));
  for (const json& bad : {json::array({json::array({"girl", 101})}), json::array({json::array({"girl"})}),
                          json::array({json::array({"girl", "x"})}), json{{"girl", true}}}) {
    auto [st, j] = post("/completion", json{{"prompt", "x"}, {"n_predict", 1}, {"logit_bias", bad}});
    EXPECT_EQ(st, 400) << bad.dump() << " " << j.dump();
    EXPECT_EQ(j["error"]["param"], "logit_bias") << j.dump();
  }
}

// llama-server's per-request cache_prompt false: the request reuses no
// cached prefix and leaves none behind (tokens_cached 0 and every prompt
// token computed); the answer is the same (batch invariance).
TEST_F(LlamaRoutes, CachePromptFalseNeitherReusesNorLeavesThePrefix) {
  std::string prompt;
  for (int i = 0; i < 6; ++i) prompt += "Once upon a time there was a little girl. ";
  auto ask = [&](std::optional<bool> cache) {
    json b{{"prompt", prompt}, {"n_predict", 4}, {"temperature", 0}};
    if (cache) b["cache_prompt"] = *cache;
    auto [st, r] = post("/completion", b);
    EXPECT_EQ(st, 200) << r.dump();
    return r;
  };
  const json a = ask(false);
  const json b = ask(false);
  const json c = ask(std::nullopt);  // nothing left by a and b
  const json d = ask(std::nullopt);  // c left its prompt
  const json e = ask(false);         // a cached prefix there, not reused
  for (const json* r : {&a, &b, &c, &e}) {
    EXPECT_EQ((*r)["tokens_cached"], 0) << r->dump();
    EXPECT_EQ((*r)["timings"]["prompt_n"], (*r)["tokens_evaluated"]) << r->dump();
  }
  EXPECT_GT(d["tokens_cached"].get<int>(), 32) << d.dump();
  EXPECT_EQ(d["timings"]["prompt_n"].get<int>() + d["tokens_cached"].get<int>(), d["tokens_evaluated"].get<int>());
  for (const json* r : {&b, &c, &d, &e}) EXPECT_EQ((*r)["content"], a["content"]);
  auto [st, j] = post("/completion", json{{"prompt", "x"}, {"cache_prompt", "no"}});
  EXPECT_EQ(st, 400);
  EXPECT_EQ(j["error"]["param"], "cache_prompt") << j.dump();
}

// One model served: any name reaches it and the answer names the model that served it.
class LlamaRoutesOneModel : public LlamaRoutes {
 protected:
  bool one_model() const override { return true; }
};

TEST_F(LlamaRoutesOneModel, AnyModelNameIsTheOneModel) {
  for (const char* name : {"gpt-4o", "stories", "anything/at-all"}) {
    auto [st, j] = post("/v1/completions", json{{"model", name}, {"prompt", "Once"}, {"max_tokens", 2}});
    EXPECT_EQ(st, 200) << name << " " << j.dump();
    EXPECT_EQ(j["model"], "stories") << name;
    auto [st2, c] =
        post("/v1/chat/completions", json{{"model", name},
                                          {"messages", json::array({json{{"role", "user"}, {"content", "hi"}}})},
                                          {"max_tokens", 2}});
    EXPECT_EQ(st2, 200) << name << " " << c.dump();
    auto [st3, n] = post("/completion", json{{"model", name}, {"prompt", "Once"}, {"n_predict", 2}});
    EXPECT_EQ(st3, 200) << name << " " << n.dump();
    EXPECT_EQ(n["model"], "stories");
  }
}

class LlamaRoutesStrict : public LlamaRoutesOneModel {
 protected:
  void customize(ServerOptions& o) override { o.strict_model_names = true; }
};

TEST_F(LlamaRoutesStrict, UnknownNameIs404) {
  auto [st, j] = post("/v1/completions", json{{"model", "gpt-4o"}, {"prompt", "Once"}, {"max_tokens", 2}});
  EXPECT_EQ(st, 404) << j.dump();
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  auto [st2, ok] = post("/v1/completions", json{{"model", "stories"}, {"prompt", "Once"}, {"max_tokens", 2}});
  EXPECT_EQ(st2, 200) << ok.dump();
}

// With --api-key the native routes are behind it, as /v1 is; /health is not.
class LlamaRoutesKey : public LlamaRoutesOneModel {
 protected:
  void customize(ServerOptions& o) override { o.api_key = "test-key"; }
};

TEST_F(LlamaRoutesKey, NativeRoutesNeedTheKey) {
  for (const char* path : {"/props", "/slots", "/models"}) {  // /models: /v1/models' alias
    auto [st, j] = get(path);
    EXPECT_EQ(st, 401) << path;
  }
  auto [st, j] = post("/completion", json{{"prompt", "x"}, {"n_predict", 1}});
  EXPECT_EQ(st, 401);
  for (const char* path : {"/chat/completions", "/embeddings"}) {
    auto [st_a, a] = post(path, json{{"messages", json::array()}, {"input", "x"}});
    EXPECT_EQ(st_a, 401) << path;
  }
  auto [st2, ok] = post("/completion", json{{"prompt", "x"}, {"n_predict", 1}}, {{"Authorization", "Bearer test-key"}});
  EXPECT_EQ(st2, 200) << ok.dump();
  auto h = client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

}  // namespace
}  // namespace bonsai::server
