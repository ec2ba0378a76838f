// HTTP tests of issue 11 items 4 and 6: log probabilities (chat and legacy
// completions shapes, streamed and not, echo), logit_bias, /tokenize,
// /detokenize, /v1/embeddings and CORS, on an in-process Server over
// stories260K; and the acceptance check that the served logprobs equal
// `bonsai logits` (log-softmax of its logits, to 1e-4) at every position of
// a teacher-forced prompt of the Qwen3 fixture (runs the built binary).
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "engine/engine_pool.h"    // gguf_model_loader
#include "engine/model_pool.h"     // ModelPool
#include "server/routes_tokens.h"  // base64_encode
#include "server/server.h"

namespace bonsai::server {
namespace {

using nlohmann::json;

// A Server on 127.0.0.1 (free port) over one model `id` at `path`.
class Served {
 public:
  // `tune`: applied to the model's SchedulerOptions; `parallel`: ModelSpec::parallel.
  Served(const std::string& id, const std::string& path, int ctx, const std::string& cors = {},
         const std::string& api_key = {}, std::function<void(engine::SchedulerOptions&)> tune = {}, int parallel = 0) {
    pool_ = std::make_shared<engine::ModelPool>(2, 0, engine::gguf_model_loader(std::move(tune)),
                                                engine::gguf_model_estimator());
    engine::ModelSpec spec;
    spec.path = path;
    spec.pool_size = 2;
    spec.ctx_size = ctx;
    spec.parallel = parallel;
    pool_->loader_register(id, spec);
    ServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.default_model = id;
    so.default_spec = spec;
    so.http_threads = 8;
    so.cors_origin = cors;
    so.api_key = api_key;
    server_ = std::make_unique<Server>(pool_, so);
    auto port = server_->bind();
    EXPECT_TRUE(port.has_value());
    port_ = port.value_or(0);
    thread_ = std::thread([this] { server_->run(); });
  }
  ~Served() {
    server_->stop();
    thread_.join();
    server_.reset();
    pool_->wait_background();
  }
  engine::ModelPool& models() const { return *pool_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }
  std::pair<int, json> post(const std::string& path, const json& body) const {
    auto r = client().Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  // The SSE payloads of a streamed POST (without [DONE]).
  std::vector<json> stream(const std::string& path, const json& body) const {
    auto r = client().Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(r);
    std::vector<json> out;
    if (!r) return out;
    EXPECT_EQ(r->status, 200) << r->body;
    size_t at = 0;
    bool done = false;
    while (at < r->body.size()) {
      const size_t end = r->body.find("\n\n", at);
      if (end == std::string::npos) break;
      const std::string ev = r->body.substr(at, end - at);
      at = end + 2;
      EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
      if (ev == "data: [DONE]") {
        done = true;
        continue;
      }
      out.push_back(json::parse(ev.substr(6)));
    }
    EXPECT_TRUE(done);
    return out;
  }

 private:
  std::shared_ptr<engine::ModelPool> pool_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

const std::string kStories = test::shared_path("models/stories260K/stories260K.gguf");
const std::string kQwen = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");

class LogprobsHttp : public ::testing::Test {
 protected:
  void SetUp() override {
    BONSAI_REQUIRE_FILE(kStories);
    srv_ = std::make_unique<Served>("stories", kStories, 256);
  }
  std::unique_ptr<Served> srv_;
};

json chat_body(int max_tokens) {
  return json{{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
              {"max_tokens", max_tokens},
              {"temperature", 0},
              {"ignore_eos", true}};
}

TEST_F(LogprobsHttp, ChatShapeStreamedEqualsNonStreamed) {
  json body = chat_body(6);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  auto [st, j] = srv_->post("/v1/chat/completions", body);
  ASSERT_EQ(st, 200) << j.dump();
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.contains("content")) << j.dump();
  const json& content = lp["content"];
  ASSERT_EQ(content.size(), 6u) << lp.dump();
  std::string joined;
  for (const json& e : content) {
    ASSERT_TRUE(e["token"].is_string());
    ASSERT_TRUE(e["bytes"].is_array());
    std::string b;
    for (const json& x : e["bytes"]) b.push_back(static_cast<char>(x.get<int>()));
    EXPECT_EQ(b, e["token"].get<std::string>());  // stories' pieces are whole characters
    joined += b;
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
    EXPECT_DOUBLE_EQ(e["top_logprobs"][0]["logprob"].get<double>(), e["logprob"].get<double>());
    EXPECT_GE(e["top_logprobs"][1]["logprob"].get<double>(), e["top_logprobs"][2]["logprob"].get<double>());
  }
  EXPECT_EQ(joined, j["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);

  body["stream"] = true;
  json streamed = json::array();
  for (const json& ev : srv_->stream("/v1/chat/completions", body)) {
    const json& c = ev["choices"][0];
    ASSERT_TRUE(c.contains("logprobs")) << ev.dump();
    if (c["logprobs"].is_object())
      for (const json& e : c["logprobs"]["content"]) streamed.push_back(e);
  }
  EXPECT_EQ(streamed, content);
  // Without logprobs the field stays null.
  auto [st2, j2] = srv_->post("/v1/chat/completions", chat_body(2));
  ASSERT_EQ(st2, 200);
  EXPECT_TRUE(j2["choices"][0]["logprobs"].is_null());
}

TEST_F(LogprobsHttp, CompletionsLegacyShapeWithEchoStreamedAndNot) {
  const std::string prompt = "Once upon a time";
  json body{{"prompt", prompt},   {"max_tokens", 5}, {"temperature", 0},
            {"ignore_eos", true}, {"logprobs", 2},   {"echo", true}};
  auto [st, j] = srv_->post("/v1/completions", body);
  ASSERT_EQ(st, 200) << j.dump();
  const std::string text = j["choices"][0]["text"];
  const json& lp = j["choices"][0]["logprobs"];
  const size_t n = lp["tokens"].size();
  const int64_t n_prompt = j["usage"]["prompt_tokens"];
  ASSERT_EQ(n, static_cast<size_t>(n_prompt) + 5) << lp.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), n);
  ASSERT_EQ(lp["top_logprobs"].size(), n);
  ASSERT_EQ(lp["text_offset"].size(), n);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());  // the first prompt token has no context
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  // Echo returns the prompt as sent ("Once upon a time", as OpenAI does),
  // though its first token spells SentencePiece's dummy-prefix space
  // (" Once"): text_offset indexes the returned text, so the tokens' offsets
  // run one byte behind their spelled bytes (the first clamped to 0).
  int64_t off = 0;
  std::string rebuilt;
  for (size_t i = 0; i < n; ++i) {
    const std::string tok = lp["tokens"][i];
    EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), std::max<int64_t>(off - 1, 0)) << i;
    if (i >= static_cast<size_t>(n_prompt))  // an answer token is at its offset in the text
      EXPECT_EQ(text.substr(static_cast<size_t>(off - 1), tok.size()), tok) << i;
    off += static_cast<int64_t>(tok.size());
    rebuilt += tok;
    if (i == 0) continue;
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u) << lp["top_logprobs"][i].dump();
  }
  // The tokens' text is the returned text but for the dummy-prefix space
  // (BOS renders as nothing); echo puts the prompt first, as sent.
  EXPECT_EQ(" " + text, rebuilt);
  std::string echoed;
  for (size_t i = 0; i < static_cast<size_t>(n_prompt); ++i) echoed += lp["tokens"][i].get<std::string>();
  EXPECT_EQ(echoed, " " + prompt);
  EXPECT_EQ(text.rfind(prompt, 0), 0u) << text;
  // Generated (greedy) tokens: each is the top alternative.
  for (size_t i = static_cast<size_t>(n_prompt); i < n; ++i) {
    const std::string tok = lp["tokens"][i];
    ASSERT_TRUE(lp["top_logprobs"][i].contains(tok)) << i;
    EXPECT_DOUBLE_EQ(lp["top_logprobs"][i][tok].get<double>(), lp["token_logprobs"][i].get<double>());
  }

  // Streamed: the echo chunk first, then the answer; the concatenation equals the above.
  body["stream"] = true;
  json tokens = json::array(), token_lps = json::array(), offsets = json::array();
  std::string streamed_text;
  const auto events = srv_->stream("/v1/completions", body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0]["choices"][0]["text"], prompt);
  for (const json& ev : events) {
    const json& c = ev["choices"][0];
    streamed_text += c["text"].get<std::string>();
    if (!c["logprobs"].is_object()) continue;
    for (const json& t : c["logprobs"]["tokens"]) tokens.push_back(t);
    for (const json& t : c["logprobs"]["token_logprobs"]) token_lps.push_back(t);
    for (const json& t : c["logprobs"]["text_offset"]) offsets.push_back(t);
  }
  EXPECT_EQ(streamed_text, text);
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(token_lps, lp["token_logprobs"]);
  EXPECT_EQ(offsets, lp["text_offset"]);

  // Without echo: only the answer, offsets continuing after the prompt's bytes.
  body.erase("echo");
  body["stream"] = false;
  auto [st3, j3] = srv_->post("/v1/completions", body);
  ASSERT_EQ(st3, 200);
  EXPECT_EQ(j3["choices"][0]["logprobs"]["tokens"].size(), 5u);
  EXPECT_EQ(j3["choices"][0]["logprobs"]["text_offset"][0], lp["text_offset"][static_cast<size_t>(n_prompt)]);
  EXPECT_EQ(j3["choices"][0]["logprobs"]["token_logprobs"][0], lp["token_logprobs"][static_cast<size_t>(n_prompt)]);
  // n = 2: each choice echoes the prompt with its logprobs.
  body["echo"] = true;
  body["n"] = 2;
  body["temperature"] = 1.0;
  auto [st4, j4] = srv_->post("/v1/completions", body);
  ASSERT_EQ(st4, 200) << j4.dump();
  for (int c = 0; c < 2; ++c) {
    const json& l = j4["choices"][c]["logprobs"];
    ASSERT_EQ(l["tokens"].size(), n) << c;
    for (size_t i = 0; i < static_cast<size_t>(n_prompt); ++i)
      EXPECT_EQ(l["token_logprobs"][i], lp["token_logprobs"][i]);
  }
}

// Several prompts in one /v1/completions request (OpenAI's prompt array of
// strings or token arrays): n choices per prompt, choice index = prompt
// index * n + i, each the same as its prompt asked alone (greedy), echo and
// logprobs per choice, usage summed; streamed chunks carry their index.
TEST_F(LogprobsHttp, CompletionsTakeSeveralPrompts) {
  const json prompts = json::array({"Once upon", "Lily"});
  const json base{{"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 1}, {"echo", true}};
  std::vector<json> alone;
  int64_t prompt_tokens = 0;
  for (const json& p : prompts) {
    json b = base;
    b["prompt"] = p;
    auto [st, j] = srv_->post("/v1/completions", b);
    ASSERT_EQ(st, 200) << j.dump();
    prompt_tokens += j["usage"]["prompt_tokens"].get<int64_t>();
    alone.push_back(j["choices"][0]);
  }
  json body = base;
  body["prompt"] = prompts;
  body["n"] = 2;
  auto [st, j] = srv_->post("/v1/completions", body);
  ASSERT_EQ(st, 200) << j.dump();
  ASSERT_EQ(j["choices"].size(), 4u) << j.dump();
  for (int c = 0; c < 4; ++c) {
    const json& ch = j["choices"][c];
    EXPECT_EQ(ch["index"], c);
    const json& want = alone[static_cast<size_t>(c / 2)];
    EXPECT_EQ(ch["text"], want["text"]) << c;  // greedy: both choices of a prompt are its answer alone
    EXPECT_EQ(ch["logprobs"]["tokens"], want["logprobs"]["tokens"]) << c;
    EXPECT_EQ(ch["logprobs"]["text_offset"], want["logprobs"]["text_offset"]) << c;
  }
  EXPECT_NE(j["choices"][0]["text"], j["choices"][2]["text"]);
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], 16);

  // Streamed: each index's text concatenates to its non-streamed text.
  body["stream"] = true;
  std::map<int, std::string> texts;
  for (const json& ev : srv_->stream("/v1/completions", body))
    for (const json& c : ev["choices"]) texts[c["index"].get<int>()] += c["text"].get<std::string>();
  ASSERT_EQ(texts.size(), 4u);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(texts[c], j["choices"][c]["text"].get<std::string>()) << c;

  // Token-array prompts: the same answers as the text prompts' tokens.
  auto [st_t, tj] = srv_->post("/tokenize", json{{"content", "Once upon"}, {"add_special", true}});
  auto [st_u, uj] = srv_->post("/tokenize", json{{"content", "Lily"}, {"add_special", true}});
  ASSERT_EQ(st_t, 200) << tj.dump();
  ASSERT_EQ(st_u, 200) << uj.dump();
  json tb = base;
  tb.erase("echo");
  tb.erase("logprobs");
  tb["prompt"] = json::array({tj["tokens"], uj["tokens"]});
  auto [st2, j2] = srv_->post("/v1/completions", tb);
  ASSERT_EQ(st2, 200) << j2.dump();
  ASSERT_EQ(j2["choices"].size(), 2u);
  for (int c = 0; c < 2; ++c) {
    const std::string echoed_and_answer = alone[static_cast<size_t>(c)]["text"];
    const std::string answer = j2["choices"][c]["text"];
    ASSERT_GE(echoed_and_answer.size(), answer.size());
    EXPECT_EQ(echoed_and_answer.substr(echoed_and_answer.size() - answer.size()), answer) << c;
  }
  EXPECT_EQ(j2["usage"]["prompt_tokens"], prompt_tokens);

  // A prompt over the context names its index.
  json big = base;
  big["prompt"] = json::array({"Lily", std::string(4000, 'a')});
  auto [st3, j3] = srv_->post("/v1/completions", big);
  EXPECT_EQ(st3, 400) << j3.dump();
  EXPECT_EQ(j3["error"]["param"], "prompt[1]") << j3.dump();
}

// A chat template's refusal (raise_exception; Qwen3.5's "no user query
// found" for a conversation without a user query) is the same 400 on
// /v1/chat/completions as on /apply-template: param messages, code invalid_value.
TEST(TemplateErrors, RaiseExceptionIsInvalidValueOnEveryRoute) {
  const std::string q35 = test::shared_path("fixtures/qwen35/qwen35-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(q35);
  Served srv("qwen35", q35, 256);
  const json body{{"messages", {{{"role", "system"}, {"content", "You are terse."}}}}, {"max_tokens", 2}};
  for (const char* path : {"/apply-template", "/v1/chat/completions"}) {
    auto [st, j] = srv.post(path, body);
    EXPECT_EQ(st, 400) << path << " " << j.dump();
    EXPECT_EQ(j["error"]["param"], "messages") << path << " " << j.dump();
    EXPECT_EQ(j["error"]["code"], "invalid_value") << path << " " << j.dump();
    EXPECT_NE(j["error"]["message"].dump().find("user query"), std::string::npos) << j.dump();
  }
}

// A stop string: the tokens that completed it (their text never released)
// keep their logprobs in the answer, and the stream carries them with the
// finish chunk, so streamed == non-streamed on both routes.
TEST_F(LogprobsHttp, StopStringTokensStreamedAsNonStreamed) {
  const json base{{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
  auto [st0, j0] = srv_->post("/v1/completions", base);
  ASSERT_EQ(st0, 200) << j0.dump();
  const std::string free_text = j0["choices"][0]["text"];
  ASSERT_GE(free_text.size(), 24u) << free_text;
  // A stop string from the middle of the greedy answer (its first occurrence stops it).
  const std::string stop = free_text.substr(free_text.size() / 2, 3);
  for (const bool chat : {false, true}) {
    const char* path = chat ? "/v1/chat/completions" : "/v1/completions";
    json body = chat ? chat_body(24) : base;
    if (chat) {
      // The chat answer differs: take the stop string from it.
      auto [stc, jc] = srv_->post(path, body);
      ASSERT_EQ(stc, 200);
      const std::string t = jc["choices"][0]["message"]["content"];
      ASSERT_GE(t.size(), 12u) << t;
      body["stop"] = t.substr(t.size() / 2, 3);
      body["logprobs"] = true;
      body["top_logprobs"] = 2;
    } else {
      body["stop"] = stop;
      body["logprobs"] = 2;
    }
    auto [st, j] = srv_->post(path, body);
    ASSERT_EQ(st, 200) << j.dump();
    ASSERT_EQ(j["choices"][0]["finish_reason"], "stop") << path;
    const json& lp = j["choices"][0]["logprobs"];
    const std::string text = chat ? j["choices"][0]["message"]["content"] : j["choices"][0]["text"];
    std::string joined;
    const json& list = chat ? lp["content"] : lp["tokens"];
    for (const json& e : list) joined += chat ? e["token"].get<std::string>() : e.get<std::string>();
    // Every sampled token is listed: the text plus the stop string (and what its last token ran past).
    EXPECT_EQ(static_cast<int64_t>(list.size()), j["usage"]["completion_tokens"].get<int64_t>()) << path;
    EXPECT_EQ(joined.rfind(text, 0), 0u) << path << ": '" << joined << "' vs '" << text << "'";
    EXPECT_GT(joined.size(), text.size()) << path;

    body["stream"] = true;
    json streamed = chat ? json::array() : json::object();
    for (const json& ev : srv_->stream(path, body)) {
      const json& c = ev["choices"][0];
      if (!c["logprobs"].is_object()) continue;
      if (chat) {
        for (const json& e : c["logprobs"]["content"]) streamed.push_back(e);
      } else {
        for (auto it = c["logprobs"].begin(); it != c["logprobs"].end(); ++it)
          for (const json& v : it.value()) streamed[it.key()].push_back(v);
      }
    }
    EXPECT_EQ(streamed, chat ? lp["content"] : lp) << path;
  }
}

TEST_F(LogprobsHttp, BadValuesAre400NamingTheField) {
  struct Case {
    const char* path;
    json patch;
    const char* param;
  };
  const Case cases[] = {
      {"/v1/chat/completions", {{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {"/v1/chat/completions", {{"top_logprobs", 2}}, "top_logprobs"},  // without logprobs: true
      {"/v1/chat/completions", {{"logprobs", 1}}, "logprobs"},          // a boolean on chat
      {"/v1/completions", {{"logprobs", 21}}, "logprobs"},
      {"/v1/completions", {{"echo", "yes"}}, "echo"},
      {"/v1/chat/completions", {{"logit_bias", {{"99999", 5}}}}, "logit_bias"},  // outside the 512-token vocabulary
      {"/v1/completions", {{"logit_bias", {{"12", 101}}}}, "logit_bias"},
      {"/v1/completions", {{"logit_bias", {{"abc", 1}}}}, "logit_bias"},
  };
  for (const auto& c : cases) {
    json body = std::string(c.path) == "/v1/completions" ? json{{"prompt", "Once"}, {"max_tokens", 2}} : chat_body(2);
    body.update(c.patch);
    auto [st, j] = srv_->post(c.path, body);
    EXPECT_EQ(st, 400) << c.patch.dump() << " " << j.dump();
    EXPECT_EQ(j["error"]["param"], c.param) << c.patch.dump() << " " << j.dump();
  }
  auto [st, j] = srv_->post("/v1/chat/completions", [] {
    json b = chat_body(2);
    b["logit_bias"] = {{"99999", 5}};
    return b;
  }());
  EXPECT_NE(j["error"]["message"].get<std::string>().find("99999"), std::string::npos) << j.dump();
}

// logit_bias on both routes: -100 on every token but two leaves only those
// two in the answer; +100 on one forces it.
TEST_F(LogprobsHttp, LogitBiasSteersBothRoutes) {
  auto piece = [&](int id) {
    std::string t = srv_->post("/detokenize", json{{"tokens", {id}}}).second["content"];
    while (!t.empty() && t[0] == ' ') t.erase(0, 1);  // a lone piece loses its leading space
    return t;
  };
  const std::string p300 = piece(300), p301 = piece(301);
  ASSERT_FALSE(p300.empty());
  ASSERT_NE(p300, p301);
  for (const bool chat : {false, true}) {
    const char* path = chat ? "/v1/chat/completions" : "/v1/completions";
    json body = chat
                    ? chat_body(4)
                    : json{{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}};
    body["logprobs"] = chat ? json(true) : json(0);
    json bias = json::object();
    for (int id = 0; id < 512; ++id)
      if (id != 300 && id != 301) bias[std::to_string(id)] = -100;
    body["logit_bias"] = bias;
    auto [st, j] = srv_->post(path, body);
    ASSERT_EQ(st, 200) << j.dump().substr(0, 300);
    std::vector<std::string> toks;
    if (chat) {
      for (const json& e : j["choices"][0]["logprobs"]["content"]) toks.push_back(e["token"]);
    } else {
      for (const json& t : j["choices"][0]["logprobs"]["tokens"]) toks.push_back(t);
    }
    ASSERT_EQ(toks.size(), 4u) << path;
    for (std::string t : toks) {
      while (!t.empty() && t[0] == ' ') t.erase(0, 1);
      EXPECT_TRUE(t == p300 || t == p301) << path << ": '" << t << "' not '" << p300 << "' / '" << p301 << "'";
    }
    body["logit_bias"] = {{"300", 100}};  // forced
    auto [st3, j3] = srv_->post(path, body);
    ASSERT_EQ(st3, 200);
    auto [dst, dj] = srv_->post("/detokenize", json{{"tokens", {300, 300, 300, 300}}});
    ASSERT_EQ(dst, 200);
    std::string text =
        chat ? j3["choices"][0]["message"]["content"].get<std::string>() : j3["choices"][0]["text"].get<std::string>();
    std::string want = dj["content"];
    for (auto* s : {&text, &want})
      while (!s->empty() && (*s)[0] == ' ') s->erase(0, 1);
    EXPECT_EQ(text, want) << path;
  }
}

TEST_F(LogprobsHttp, TokenizeDetokenize) {
  auto [st, j] = srv_->post("/tokenize", json{{"content", "Hello world"}});
  ASSERT_EQ(st, 200) << j.dump();
  ASSERT_TRUE(j["tokens"].is_array());
  ASSERT_FALSE(j["tokens"].empty());
  auto [st2, j2] = srv_->post("/tokenize", json{{"content", "Hello world"}, {"add_special", true}});
  ASSERT_EQ(st2, 200);
  EXPECT_EQ(j2["tokens"].size(), j["tokens"].size() + 1);  // stories adds BOS (id 1)
  EXPECT_EQ(j2["tokens"][0], 1);
  auto [st3, j3] = srv_->post("/detokenize", json{{"tokens", j["tokens"]}, {"model", "stories"}});
  ASSERT_EQ(st3, 200);
  EXPECT_EQ(j3["content"], "Hello world");
  auto [st4, j4] = srv_->post("/tokenize", json{{"content", "Hello world"}, {"with_pieces", true}});
  ASSERT_EQ(st4, 200);
  std::string joined;
  for (size_t i = 0; i < j4["tokens"].size(); ++i) {
    EXPECT_EQ(j4["tokens"][i]["id"], j["tokens"][i]);
    joined += j4["tokens"][i]["piece"].get<std::string>();
  }
  EXPECT_EQ(joined, " Hello world");  // the pieces: SentencePiece's dummy-prefix space included
  // One model served: any model name is that model (llama-server's habit; strict_model_names: 404).
  EXPECT_EQ(srv_->post("/tokenize", json{{"content", "Hello world"}, {"model", "nope"}}).second, j);
  EXPECT_EQ(srv_->post("/tokenize", json{{"text", "x"}}).first, 400);
  auto [st5, j5] = srv_->post("/detokenize", json{{"tokens", {1, 100000}}});
  EXPECT_EQ(st5, 400);
  EXPECT_EQ(j5["error"]["param"], "tokens");
}

TEST_F(LogprobsHttp, EmbeddingsShapeNormAndDeterminism) {
  const json inputs = {"The cat sat on the mat.", "A bird flew over the sea.", "The cat sat on the mat."};
  auto [st, j] = srv_->post("/v1/embeddings", json{{"input", inputs}, {"model", "stories"}});
  ASSERT_EQ(st, 200) << j.dump();
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "stories");
  ASSERT_EQ(j["data"].size(), 3u);
  std::vector<std::vector<float>> v;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(j["data"][i]["object"], "embedding");
    EXPECT_EQ(j["data"][i]["index"], i);
    v.push_back(j["data"][i]["embedding"].get<std::vector<float>>());
    double n2 = 0;
    for (float x : v.back()) n2 += static_cast<double>(x) * x;
    EXPECT_NEAR(std::sqrt(n2), 1.0, 1e-5);
  }
  EXPECT_EQ(v[0], v[2]);  // equal inputs, equal embeddings
  EXPECT_NE(v[0], v[1]);
  // The embedding sequences gave their KV blocks back: nothing pinned, and
  // nothing kept as prompt cache (an embedding's input is not published).
  {
    const auto lm = srv_->models().peek("stories");
    ASSERT_TRUE(lm && lm->kv_pool);
    const auto u = lm->kv_pool->usage();
    EXPECT_EQ(u.pinned, 0);
    EXPECT_EQ(u.cached, 0);
    EXPECT_EQ(u.indexed, 0);
  }
  // usage counts every input's tokens.
  int64_t total = 0;
  for (const json& s : inputs)
    total += static_cast<int64_t>(
        srv_->post("/tokenize", json{{"content", s}, {"add_special", true}}).second["tokens"].size());
  EXPECT_EQ(j["usage"]["prompt_tokens"], total);
  EXPECT_EQ(j["usage"]["total_tokens"], total);
  // Token-id input = the same text; base64 = the same floats, little-endian.
  auto ids = srv_->post("/tokenize", json{{"content", inputs[0]}, {"add_special", true}}).second["tokens"];
  auto [st2, j2] = srv_->post("/v1/embeddings", json{{"input", ids}, {"encoding_format", "base64"}});
  ASSERT_EQ(st2, 200) << j2.dump();
  const std::string raw(reinterpret_cast<const char*>(v[0].data()), v[0].size() * sizeof(float));
  EXPECT_EQ(j2["data"][0]["embedding"].get<std::string>(), base64_encode(raw));
  // Errors name the field.
  for (const json& bad :
       {json{{"input", ""}}, json{{"input", json::array()}}, json{{"input", {1, 99999}}},
        json{{"input", "x"}, {"encoding_format", "hex"}}, json{{"input", "x"}, {"dimensions", 8}}, json::object()}) {
    auto [bst, bj] = srv_->post("/v1/embeddings", bad);
    EXPECT_EQ(bst, 400) << bad.dump() << bj.dump();
  }
}

// An embeddings request while a streamed completion runs: both are jobs of
// the model's scheduler (the embedding's tokens share forward steps with the
// stream's decode), and both answers equal what each gives alone.
TEST_F(LogprobsHttp, EmbeddingsBesideAStreamingCompletion) {
  ASSERT_EQ(srv_->post("/tokenize", json{{"content", "x"}}).first, 200);  // loads the model
  const auto lm = srv_->models().peek("stories");
  ASSERT_TRUE(lm && lm->scheduler);
  const json emb_body = {{"input", {"The cat sat on the mat.", "A bird flew over the sea."}}};
  auto [st0, alone] = srv_->post("/v1/embeddings", emb_body);
  ASSERT_EQ(st0, 200) << alone.dump();
  json cbody = chat_body(150);
  auto [st1, text_alone] = srv_->post("/v1/chat/completions", cbody);
  ASSERT_EQ(st1, 200) << text_alone.dump();
  const uint64_t embeddings_before = lm->scheduler->stats().embeddings;
  EXPECT_EQ(embeddings_before, 2u);  // the two inputs above ran as scheduler sequences

  cbody["stream"] = true;
  std::vector<json> chunks;
  const uint64_t seq0 = lm->scheduler->stats().sequences;
  std::thread streamer([&] { chunks = srv_->stream("/v1/chat/completions", cbody); });
  // Once the stream runs, the embeddings arrive.
  for (int i = 0; i < 5000 && lm->scheduler->stats().sequences == seq0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto [st2, beside] = srv_->post("/v1/embeddings", emb_body);
  streamer.join();
  ASSERT_EQ(st2, 200) << beside.dump();
  ASSERT_EQ(beside["data"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(beside["data"][i]["embedding"], alone["data"][i]["embedding"]) << i;
  std::string streamed;
  for (const json& c : chunks)
    if (c.contains("choices") && !c["choices"].empty() && c["choices"][0]["delta"].contains("content"))
      streamed += c["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(streamed, text_alone["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(lm->scheduler->stats().embeddings, embeddings_before + 2);
}

// A busy model (its one sequence slot, -np 1, runs a long completion whose
// steps take >= 2 ms each): an embeddings request waits in the model's
// scheduler queue (the HTTP thread does not run it), is answered once the
// slot frees (the completion's client leaves), and a client that leaves
// while queued gives up its place.
TEST(LogprobsHttpBusy, EmbeddingsQueueInTheSchedulerWhenBusy) {
  BONSAI_REQUIRE_FILE(kStories);
  Served srv(
      "stories", kStories, 2048, {}, {},
      [](engine::SchedulerOptions& so) {
        so.on_step = [](int64_t, int64_t) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
      },
      /*parallel=*/1);
  ASSERT_EQ(srv.post("/tokenize", json{{"content", "x"}}).first, 200);  // loads the model
  const auto lm = srv.models().peek("stories");
  ASSERT_TRUE(lm && lm->scheduler);
  auto wait_for = [&](auto pred) {
    for (int i = 0; i < 5000 && !pred(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return pred();
  };
  // A completion of 1,900 tokens (>= 3.8 s of steps) whose client leaves
  // after `leave`: it holds the slot until the server notices.
  auto occupy = [&](std::chrono::milliseconds leave) {
    return std::thread([&srv, leave] {
      httplib::Client c = srv.client();
      c.set_read_timeout(leave);
      json body{{"prompt", "Once upon a time"}, {"max_tokens", 1900}, {"ignore_eos", true}, {"temperature", 0}};
      EXPECT_FALSE(c.Post("/v1/completions", body.dump(), "application/json"));
    });
  };
  const uint64_t before = lm->scheduler->stats().embeddings;
  {
    std::thread busy = occupy(std::chrono::milliseconds(1500));
    ASSERT_TRUE(wait_for([&] { return lm->scheduler->stats().running == 1; }));
    std::pair<int, json> got;
    std::thread client([&] { got = srv.post("/v1/embeddings", json{{"input", {"one", "two", "three"}}}); });
    EXPECT_TRUE(wait_for([&] { return lm->scheduler->stats().waiting == 1; }));  // queued as one job
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(lm->scheduler->stats().embeddings, before);  // not started while the slot is busy
    EXPECT_EQ(lm->scheduler->stats().waiting, 1);
    busy.join();  // its client left: the completion is cancelled, the scheduler runs the embeddings
    client.join();
    ASSERT_EQ(got.first, 200) << got.second.dump();
    ASSERT_EQ(got.second["data"].size(), 3u);  // batch input: one vector per string, in order
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(got.second["data"][i]["index"], i);
    EXPECT_EQ(lm->scheduler->stats().embeddings, before + 3);
    // The same count in /metrics.
    auto metrics = srv.client().Get("/metrics");
    ASSERT_TRUE(metrics);
    const std::string name = "bonsai_embedding_sequences_total{model=\"stories\"} ";
    const size_t at = metrics->body.find(name);
    ASSERT_NE(at, std::string::npos) << metrics->body;
    EXPECT_EQ(std::stod(metrics->body.substr(at + name.size())), static_cast<double>(before + 3));
  }
  {
    std::thread busy = occupy(std::chrono::milliseconds(1500));
    ASSERT_TRUE(wait_for([&] { return lm->scheduler->stats().running == 1; }));
    httplib::Client c = srv.client();
    c.set_read_timeout(0, 200000);  // leaves after 200 ms, while queued
    std::thread client([&] {
      auto r = c.Post("/v1/embeddings", json{{"input", "gone"}}.dump(), "application/json");
      EXPECT_FALSE(r);
    });
    EXPECT_TRUE(wait_for([&] { return lm->scheduler->stats().waiting == 1; }));
    client.join();
    EXPECT_TRUE(wait_for([&] { return lm->scheduler->stats().waiting == 0; }));  // cancelled: left the queue
    EXPECT_EQ(lm->scheduler->stats().embeddings, before + 3);                    // never started
    busy.join();
  }
}

TEST(Base64, Rfc4648Vectors) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foob"), "Zm9vYg==");
  EXPECT_EQ(base64_encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_encode(std::string("\xff\xfe\x00", 3)), "//4A");
}

TEST(Cors, OffByDefaultAllowedOriginsAndPreflight) {
  BONSAI_REQUIRE_FILE(kStories);
  {
    Served off("stories", kStories, 128);
    auto r = off.client().Get("/v1/models", {{"Origin", "https://app.example"}});
    ASSERT_TRUE(r);
    EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
  }
  Served on("stories", kStories, 128, "https://app.example, https://b.example");
  auto c = on.client();
  auto r = c.Get("/v1/models", {{"Origin", "https://b.example"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "https://b.example");
  EXPECT_EQ(r->get_header_value("Vary"), "Origin");
  auto other = c.Get("/v1/models", {{"Origin", "https://evil.example"}});
  ASSERT_TRUE(other);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
  // Preflight: answered before routing and authorization.
  httplib::Request pre;
  pre.method = "OPTIONS";
  pre.path = "/v1/chat/completions";
  pre.headers = {{"Origin", "https://app.example"},
                 {"Access-Control-Request-Method", "POST"},
                 {"Access-Control-Request-Headers", "authorization, content-type, x-stainless-os"}};
  httplib::Response pres;
  httplib::Error err;
  ASSERT_TRUE(c.send(pre, pres, err));
  EXPECT_EQ(pres.status, 204);
  EXPECT_EQ(pres.get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_NE(pres.get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_EQ(pres.get_header_value("Access-Control-Allow-Headers"), "authorization, content-type, x-stainless-os");
  // "*" allows any origin; a POST's answer carries it too.
  Served any("stories", kStories, 128, "*");
  auto ra = any.client().Post("/v1/completions", {{"Origin", "https://x.example"}},
                              json{{"prompt", "Once"}, {"max_tokens", 1}}.dump(), "application/json");
  ASSERT_TRUE(ra);
  EXPECT_EQ(ra->status, 200);
  EXPECT_EQ(ra->get_header_value("Access-Control-Allow-Origin"), "*");
  // A streamed answer and an error answer carry it too.
  auto rs = any.client().Post("/v1/completions", {{"Origin", "https://x.example"}},
                              json{{"prompt", "Once"}, {"max_tokens", 2}, {"stream", true}}.dump(), "application/json");
  ASSERT_TRUE(rs);
  EXPECT_EQ(rs->status, 200);
  EXPECT_NE(rs->body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(rs->get_header_value("Access-Control-Allow-Origin"), "*");
  auto r404 = any.client().Get("/nope", {{"Origin", "https://x.example"}});
  ASSERT_TRUE(r404);
  EXPECT_EQ(r404->status, 404);
  EXPECT_EQ(r404->get_header_value("Access-Control-Allow-Origin"), "*");
  // With an API key: the preflight (no credentials) is answered, the request
  // without the key is a 401 the browser can read.
  Served keyed("stories", kStories, 128, "https://app.example", "s3cret");
  auto kc = keyed.client();
  httplib::Response kpres;
  ASSERT_TRUE(kc.send(pre, kpres, err));
  EXPECT_EQ(kpres.status, 204);
  auto r401 = kc.Post("/v1/completions", {{"Origin", "https://app.example"}},
                      json{{"prompt", "Once"}, {"max_tokens", 1}}.dump(), "application/json");
  ASSERT_TRUE(r401);
  EXPECT_EQ(r401->status, 401);
  EXPECT_EQ(r401->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  auto t401 =
      kc.Post("/tokenize", {{"Origin", "https://app.example"}}, json{{"content", "x"}}.dump(), "application/json");
  ASSERT_TRUE(t401);
  EXPECT_EQ(t401->status, 401);  // /tokenize and /detokenize need the key too
}

// ---- Acceptance: served logprobs == `bonsai logits` at every position --------------------

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << cmd;
  return out;
}

TEST(LogprobsAcceptance, EqualBonsaiLogitsAtEveryTeacherForcedPosition) {
  BONSAI_REQUIRE_FILE(kQwen);
  Served srv("tiny", kQwen, 128);
  // A teacher-forced prompt (echo: every position's logprob of the given
  // next token) and one greedy token after it.
  auto [tst, tj] = srv.post("/tokenize", json{{"content", "The quick brown fox jumps over the lazy dog. 1234"}});
  ASSERT_EQ(tst, 200);
  const std::vector<int32_t> prompt = tj["tokens"].get<std::vector<int32_t>>();
  ASSERT_GE(prompt.size(), 10u);
  json body{{"prompt", prompt},   {"max_tokens", 1}, {"temperature", 0},
            {"ignore_eos", true}, {"logprobs", 5},   {"echo", true}};
  auto [st, j] = srv.post("/v1/completions", body);
  ASSERT_EQ(st, 200) << j.dump();
  const json& lp = j["choices"][0]["logprobs"];
  const size_t n = lp["tokens"].size();
  ASSERT_EQ(n, prompt.size() + 1);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());

  std::string ids;
  for (size_t i = 0; i < prompt.size(); ++i) ids += (i ? "," : "") + std::to_string(prompt[i]);
  const std::string bin = (test::binary_dir() / "apps" / "bonsai" / "bonsai").string();
  const std::string out =
      run_capture(bin + " logits -m " + kQwen + " --ids " + ids + " --top-k 151936 --json -t 1 2>/dev/null");
  const json ref = json::parse(out, nullptr, false);
  ASSERT_FALSE(ref.is_discarded()) << out.substr(0, 200);
  ASSERT_EQ(ref["top"].size(), prompt.size());
  size_t checked = 0;
  for (size_t pos = 1; pos < n; ++pos) {
    // Row pos-1 of `bonsai logits`: every [id, logit] pair, largest first; log-softmax in double.
    const json& row = ref["top"][pos - 1];
    ASSERT_EQ(row.size(), 151936u);
    const double mx = row[0][1].get<double>();
    double sum = 0;
    std::vector<double> logit(151936);
    for (const json& e : row) {
      logit[e[0].get<size_t>()] = e[1].get<double>();
      sum += std::exp(e[1].get<double>() - mx);
    }
    const double lse = mx + std::log(sum);
    // The prompt's next token, or (last position) the greedy one = the arg-max.
    const double want = pos < prompt.size() ? logit[static_cast<size_t>(prompt[pos])] - lse : mx - lse;
    EXPECT_NEAR(lp["token_logprobs"][pos].get<double>(), want, 1e-4) << "position " << pos;
    // The alternatives: the row's five largest (their texts may coincide,
    // e.g. partial UTF-8 pieces, so the listed values are a subset).
    const json& tops = lp["top_logprobs"][pos];
    ASSERT_GE(tops.size(), 1u);
    ASSERT_LE(tops.size(), 5u);
    double best = -INFINITY;
    for (auto it = tops.begin(); it != tops.end(); ++it) {
      const double v = it.value().get<double>();
      best = std::max(best, v);
      bool found = false;
      for (size_t k = 0; k < 5; ++k) found = found || std::fabs(v - (row[k][1].get<double>() - lse)) <= 1e-4;
      EXPECT_TRUE(found) << "position " << pos << ": " << it.key() << " " << v;
    }
    EXPECT_NEAR(best, mx - lse, 1e-4) << "position " << pos;
    ++checked;
  }
  EXPECT_EQ(checked, prompt.size());
}

}  // namespace
}  // namespace bonsai::server
