// Ollama's API (src/server/routes_ollama.*): keep_alive, the chat and
// generate translations and their 400s, model names; and over HTTP on an
// in-process Server (stories260K and the Qwen3 fixture): /api/version,
// /api/tags, /api/show, /api/ps; /api/chat and /api/generate streamed
// (NDJSON) and not, equal to chat completions / completions of the same
// input at temperature 0 with counts equal to their usage; format (JSON
// Schema), tools, thinking; /api/embed and /api/embeddings equal to
// /v1/embeddings; keep_alive 0 unloads; errors as {"error": "..."}; --api-key.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "engine/engine_pool.h"  // gguf_model_loader
#include "engine/model_pool.h"   // ModelPool
#include "server/routes_ollama.h"
#include "server/server.h"

namespace bonsai::server {
namespace {

using nlohmann::json;
using OJson = nlohmann::ordered_json;

// ---- translation ------------------------------------------------------------

TEST(OllamaTranslate, KeepAliveIsSecondsOrAGoDuration) {
  const std::vector<std::pair<std::string, double>> ok = {
      {R"({"keep_alive": "5m"})", 300},     {R"({"keep_alive": "1h30m"})", 5400}, {R"({"keep_alive": "300ms"})", 0.3},
      {R"({"keep_alive": "0"})", 0},        {R"({"keep_alive": 0})", 0},          {R"({"keep_alive": -1})", -1},
      {R"({"keep_alive": "-1m"})", -60},    {R"({"keep_alive": "10"})", 10},      {R"({"keep_alive": "1.5h"})", 5400},
      {R"({"keep_alive": "2s500ms"})", 2.5}};
  for (const auto& [body, want] : ok) {
    std::optional<double> s;
    auto e = parse_keep_alive(OJson::parse(body), s);
    ASSERT_FALSE(e.has_value()) << body << " -> " << e->message;
    ASSERT_TRUE(s.has_value()) << body;
    EXPECT_NEAR(*s, want, 1e-9) << body;
  }
  std::optional<double> s = 1;
  EXPECT_FALSE(parse_keep_alive(OJson::parse("{}"), s).has_value());
  EXPECT_FALSE(s.has_value());
  for (const char* body : {R"({"keep_alive": "5x"})", R"({"keep_alive": "m"})", R"({"keep_alive": ""})",
                           R"({"keep_alive": true})", R"({"keep_alive": "5m3"})"}) {
    auto e = parse_keep_alive(OJson::parse(body), s);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->param, "keep_alive");
    EXPECT_NE(e->message.find("keep_alive"), std::string::npos) << e->message;
  }
}

TEST(OllamaTranslate, ChatMapsMessagesOptionsFormatAndThink) {
  OJson chat;
  auto e = ollama_chat_body(OJson::parse(R"({"model": "m:latest", "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": "hi"},
      {"role": "assistant", "content": "", "thinking": "hmm",
       "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1, "a": "b"}}}]},
      {"role": "tool", "content": "42", "tool_name": "f"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
      "format": "json", "think": false, "stream": false, "keep_alive": "1m",
      "options": {"num_predict": 7, "temperature": 0.5, "top_k": 3, "top_p": 0.9, "min_p": 0.1, "seed": 4,
                  "stop": ["x"], "repeat_penalty": 1.1, "presence_penalty": 0.2, "frequency_penalty": 0.3,
                  "num_ctx": 4096, "mirostat": 0}})"),
                            chat);
  ASSERT_FALSE(e.has_value()) << e->message;
  const OJson want = OJson::parse(R"({"model": "m:latest", "response_format": {"type": "json_object"},
      "chat_template_kwargs": {"enable_thinking": false}, "max_tokens": 7, "temperature": 0.5, "top_k": 3,
      "top_p": 0.9, "min_p": 0.1, "seed": 4, "stop": ["x"], "repeat_penalty": 1.1, "presence_penalty": 0.2,
      "frequency_penalty": 0.3, "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": "hi"},
      {"role": "assistant", "content": "", "reasoning_content": "hmm",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1, "a": "b"}}}]},
      {"role": "tool", "content": "42", "name": "f"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})");
  EXPECT_EQ(chat.dump(), want.dump());

  // A schema: json_schema; num_predict -1: no max_tokens; think "high": thinking on.
  ASSERT_FALSE(ollama_chat_body(OJson::parse(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "format": {"type": "object"}, "think": "high", "options": {"num_predict": -1}})"),
                                chat)
                   .has_value());
  EXPECT_EQ(chat["response_format"].dump(),
            R"({"type":"json_schema","json_schema":{"name":"format","schema":{"type":"object"},"strict":true}})");
  EXPECT_FALSE(chat.contains("max_tokens"));
  EXPECT_EQ(chat["chat_template_kwargs"]["enable_thinking"], true);
}

TEST(OllamaTranslate, BadChatShapesAre400NamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"messages": []})", "model"},
      {R"({"model": 3, "messages": []})", "model"},
      {R"({"model": "m"})", "messages"},
      {R"({"model": "m", "messages": {}})", "messages"},
      {R"({"model": "m", "messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"model": "m", "messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]})", "messages[0].images"},
      {R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{}]}]})",
       "messages[0].tool_calls[0].function"},
      {R"({"model": "m", "messages": [], "format": "xml"})", "format"},
      {R"({"model": "m", "messages": [], "format": 3})", "format"},
      {R"({"model": "m", "messages": [], "think": "max"})", "think"},
      {R"({"model": "m", "messages": [], "options": 1})", "options"},
      {R"({"model": "m", "messages": [], "options": {"num_predict": "7"}})", "options.num_predict"},
      {R"({"model": "m", "messages": [], "tools": {}})", "tools"},
  };
  for (const auto& [body, param] : cases) {
    OJson chat;
    auto e = ollama_chat_body(OJson::parse(body), chat);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->status, 400) << body;
    EXPECT_EQ(e->param, param) << body << " -> " << e->message;
    EXPECT_NE(e->message.find(param), std::string::npos) << e->message;
  }
}

TEST(OllamaTranslate, GenerateIsChatWithSystemOrRawCompletions) {
  OJson out;
  Endpoint ep = Endpoint::kCompletion;
  ASSERT_FALSE(ollama_generate_body(OJson::parse(R"({"model": "m", "prompt": "p", "system": "s"})"), out, ep));
  EXPECT_EQ(ep, Endpoint::kChat);
  EXPECT_EQ(out["messages"].dump(), R"([{"role":"system","content":"s"},{"role":"user","content":"p"}])");
  ASSERT_FALSE(
      ollama_generate_body(OJson::parse(R"({"model": "m", "prompt": "p", "system": "s", "raw": true})"), out, ep));
  EXPECT_EQ(ep, Endpoint::kCompletion);
  EXPECT_EQ(out["prompt"], "p");
  EXPECT_FALSE(out.contains("messages"));
  // A suffix: fill in the middle, as /v1/completions' suffix (prompt = the prefix; system unused).
  ASSERT_FALSE(
      ollama_generate_body(OJson::parse(R"({"model": "m", "prompt": "p", "suffix": "q", "system": "s"})"), out, ep));
  EXPECT_EQ(ep, Endpoint::kCompletion);
  EXPECT_EQ(out["prompt"], "p");
  EXPECT_EQ(out["suffix"], "q");
  EXPECT_FALSE(out.contains("messages"));
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model": "m", "prompt": "p", "suffix": 3})", "suffix"},
           {R"({"model": "m", "prompt": "p", "template": "t"})", "template"},
           {R"({"model": "m", "prompt": "p", "images": ["x"]})", "images"},
           {R"({"model": "m", "prompt": "p", "context": [1, 2]})", "context"},
           {R"({"model": "m", "prompt": 1})", "prompt"},
           {R"({"model": "m", "prompt": "p", "raw": 1})", "raw"}}) {
    auto e = ollama_generate_body(OJson::parse(body), out, ep);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->param, param) << body;
  }
  // An empty suffix / context is what clients send by default: accepted.
  EXPECT_FALSE(
      ollama_generate_body(OJson::parse(R"({"model": "m", "prompt": "p", "suffix": "", "context": []})"), out, ep));
}

TEST(OllamaTranslate, ModelNamesTakeLatest) {
  const std::vector<std::string> ids = {"qwen", "stories", "x:7b"};
  EXPECT_EQ(resolve_ollama_model("qwen", ids), "qwen");
  EXPECT_EQ(resolve_ollama_model("qwen:latest", ids), "qwen");
  EXPECT_EQ(resolve_ollama_model("x:7b", ids), "x:7b");
  EXPECT_EQ(resolve_ollama_model("qwen:7b", ids), "qwen:7b");  // another tag: not ours (404 later)
  EXPECT_EQ(resolve_ollama_model("nope:latest", ids), "nope:latest");
  EXPECT_EQ(ollama_model_name("qwen"), "qwen:latest");
  EXPECT_EQ(ollama_model_name("x:7b"), "x:7b");
}

// ---- over HTTP --------------------------------------------------------------

const std::string kStories = test::shared_path("models/stories260K/stories260K.gguf");
const std::string kQwen = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");

// A Server on 127.0.0.1 (free port) serving "stories" (the default) and "qwen".
class OllamaHttp : public ::testing::Test {
 protected:
  virtual void options(ServerOptions&) {}
  virtual engine::ModelPool::Loader loader() { return engine::gguf_model_loader(); }

  void SetUp() override {
    BONSAI_REQUIRE_FILE(kStories);
    BONSAI_REQUIRE_FILE(kQwen);
    pool_ = std::make_shared<engine::ModelPool>(2, 0, loader(), engine::gguf_model_estimator());
    engine::ModelSpec spec;
    spec.pool_size = 1;
    spec.ctx_size = 512;
    spec.path = kStories;
    pool_->loader_register("stories", spec);
    spec.path = kQwen;
    pool_->loader_register("qwen", spec);
    ServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.default_model = "stories";
    so.http_threads = 4;
    options(so);
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
  std::pair<int, json> post(const std::string& path, const json& body) const {
    auto r = client().Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::pair<int, json> get(const std::string& path) const {
    auto r = client().Get(path.c_str());
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  // The NDJSON lines of a streamed call (stream absent: Ollama's default).
  std::vector<json> lines(const std::string& path, json body) const {
    body.erase("stream");
    auto r = client().Post(path.c_str(), body.dump(), "application/json");
    std::vector<json> out;
    EXPECT_TRUE(r);
    if (!r) return out;
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/x-ndjson");
    std::istringstream in(r->body);
    for (std::string line; std::getline(in, line);) {
      json j = json::parse(line, nullptr, false);
      EXPECT_TRUE(j.is_object()) << line;
      out.push_back(std::move(j));
    }
    EXPECT_EQ(r->body.back(), '\n');
    return out;
  }
  bool loaded(const std::string& id) const {
    for (const auto& m : pool_->list())
      if (m.id == id && m.state == engine::ModelState::kLoaded) return true;
    return false;
  }

  std::shared_ptr<engine::ModelPool> pool_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// The counts and times every final answer carries.
void expect_final(const json& r, const json& usage) {
  EXPECT_EQ(r["done"], true) << r.dump();
  EXPECT_EQ(r["prompt_eval_count"], usage["prompt_tokens"]) << r.dump();
  EXPECT_EQ(r["eval_count"], usage["completion_tokens"]) << r.dump();
  for (const char* k : {"total_duration", "load_duration", "prompt_eval_duration", "eval_duration"})
    EXPECT_TRUE(r[k].is_number_integer() && r[k].get<int64_t>() >= 0) << k << " " << r.dump();
  EXPECT_GE(r["total_duration"].get<int64_t>(),
            r["prompt_eval_duration"].get<int64_t>() + r["eval_duration"].get<int64_t>());
  EXPECT_GT(r["total_duration"].get<int64_t>(), 0);
  EXPECT_EQ(r["created_at"].get<std::string>().back(), 'Z');
}

TEST_F(OllamaHttp, VersionTagsShowAndPs) {
  auto [vst, v] = get("/api/version");
  ASSERT_EQ(vst, 200);
  EXPECT_EQ(v["version"], std::string(kOllamaApiVersion));

  auto [tst, tags] = get("/api/tags");
  ASSERT_EQ(tst, 200) << tags.dump();
  ASSERT_EQ(tags["models"].size(), 2u) << tags.dump();
  const json& q = tags["models"][0];  // ids in order: qwen, stories
  EXPECT_EQ(q["name"], "qwen:latest");
  EXPECT_EQ(q["model"], "qwen:latest");
  EXPECT_EQ(q["size"], std::filesystem::file_size(kQwen));
  EXPECT_EQ(q["details"]["format"], "gguf");
  EXPECT_EQ(q["details"]["family"], "qwen3");
  EXPECT_EQ(q["details"]["families"], json::array({"qwen3"}));
  EXPECT_EQ(q["digest"].get<std::string>().size(), 16u);
  EXPECT_EQ(tags["models"][1]["name"], "stories:latest");
  EXPECT_EQ(tags["models"][1]["details"]["family"], "llama");
  EXPECT_NE(tags["models"][1]["digest"], q["digest"]);

  auto [sst, show] = post("/api/show", {{"model", "qwen:latest"}});
  ASSERT_EQ(sst, 200) << show.dump();
  EXPECT_NE(show["template"].get<std::string>().find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(show["details"], q["details"]);
  EXPECT_EQ(show["model_info"]["general.architecture"], "qwen3");
  EXPECT_GT(show["model_info"]["general.parameter_count"].get<int64_t>(), 0);
  EXPECT_TRUE(show["model_info"]["qwen3.context_length"].is_number_integer());
  const json caps = show["capabilities"];
  for (const char* c : {"completion", "tools", "thinking"})
    EXPECT_NE(std::find(caps.begin(), caps.end(), c), caps.end()) << c << " " << caps.dump();
  auto [s2, show2] = post("/api/show", {{"model", "stories"}});
  ASSERT_EQ(s2, 200);
  const json caps2 = show2["capabilities"];
  EXPECT_EQ(std::find(caps2.begin(), caps2.end(), "tools"), caps2.end()) << caps2.dump();

  auto [nst, none] = post("/api/show", {{"model", "nope"}});
  EXPECT_EQ(nst, 404);
  EXPECT_TRUE(none["error"].is_string()) << none.dump();

  // Nothing loaded yet; an empty chat loads the model.
  auto [pst, ps] = get("/api/ps");
  ASSERT_EQ(pst, 200);
  EXPECT_EQ(ps["models"], json::array());
  auto [lst, load] = post("/api/chat", {{"model", "stories:latest"}, {"messages", json::array()}, {"stream", false}});
  ASSERT_EQ(lst, 200) << load.dump();
  EXPECT_EQ(load["done_reason"], "load");
  EXPECT_EQ(load["done"], true);
  EXPECT_EQ(load["model"], "stories:latest");
  auto [pst2, ps2] = get("/api/ps");
  ASSERT_EQ(ps2["models"].size(), 1u) << ps2.dump();
  EXPECT_EQ(ps2["models"][0]["name"], "stories:latest");
  EXPECT_EQ(ps2["models"][0]["context_length"], 512);
  EXPECT_GT(ps2["models"][0]["size"].get<int64_t>(), 0);
  EXPECT_TRUE(ps2["models"][0]["expires_at"].is_string());
  // keep_alive 0 with an empty prompt unloads it.
  auto [ust, unload] = post("/api/generate", {{"model", "stories"}, {"keep_alive", 0}, {"stream", false}});
  ASSERT_EQ(ust, 200) << unload.dump();
  EXPECT_EQ(unload["done_reason"], "unload");
  EXPECT_FALSE(loaded("stories"));
  EXPECT_EQ(get("/api/ps").second["models"], json::array());
}

TEST_F(OllamaHttp, ChatEqualsChatCompletionsStreamedAndNot) {
  const json messages = {{{"role", "system"}, {"content", "Tell a story."}},
                         {{"role", "user"}, {"content", "Once upon a time"}}};
  const json body{{"model", "stories:latest"},
                  {"messages", messages},
                  {"stream", false},
                  {"options", {{"temperature", 0}, {"num_predict", 12}}}};
  auto [st, r] = post("/api/chat", body);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["model"], "stories:latest");
  EXPECT_EQ(r["message"]["role"], "assistant");
  auto [cst, c] = post("/v1/chat/completions",
                       {{"model", "stories"}, {"messages", messages}, {"temperature", 0}, {"max_tokens", 12}});
  ASSERT_EQ(cst, 200) << c.dump();
  const std::string text = c["choices"][0]["message"]["content"];
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(r["message"]["content"], text);
  EXPECT_EQ(r["done_reason"], c["choices"][0]["finish_reason"]);
  expect_final(r, c["usage"]);

  const std::vector<json> ls = lines("/api/chat", body);
  ASSERT_GE(ls.size(), 2u);
  std::string streamed;
  for (size_t i = 0; i + 1 < ls.size(); ++i) {
    EXPECT_EQ(ls[i]["done"], false) << ls[i].dump();
    EXPECT_EQ(ls[i]["model"], "stories:latest");
    EXPECT_EQ(ls[i]["message"]["role"], "assistant");
    streamed += ls[i]["message"]["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(ls.back()["message"]["content"], "");
  EXPECT_EQ(ls.back()["done_reason"], r["done_reason"]);
  expect_final(ls.back(), c["usage"]);
}

TEST_F(OllamaHttp, GenerateEqualsChatWithSystemAndRawEqualsCompletions) {
  const json body{{"model", "stories"},
                  {"prompt", "Once upon a time"},
                  {"system", "Tell a story."},
                  {"stream", false},
                  {"options", {{"temperature", 0}, {"num_predict", 10}}}};
  auto [st, r] = post("/api/generate", body);
  ASSERT_EQ(st, 200) << r.dump();
  auto [cst, c] =
      post("/v1/chat/completions",
           {{"model", "stories"},
            {"messages",
             {{{"role", "system"}, {"content", "Tell a story."}}, {{"role", "user"}, {"content", "Once upon a time"}}}},
            {"temperature", 0},
            {"max_tokens", 10}});
  ASSERT_EQ(cst, 200) << c.dump();
  EXPECT_EQ(r["response"], c["choices"][0]["message"]["content"]);
  EXPECT_FALSE(r.contains("message"));
  expect_final(r, c["usage"]);

  json raw = body;
  raw["raw"] = true;
  raw["options"]["num_predict"] = 16;
  auto [rst, rr] = post("/api/generate", raw);
  ASSERT_EQ(rst, 200) << rr.dump();
  auto [pst, p] = post("/v1/completions",
                       {{"model", "stories"}, {"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 16}});
  ASSERT_EQ(pst, 200) << p.dump();
  EXPECT_EQ(rr["response"], p["choices"][0]["text"]);
  EXPECT_FALSE(rr["response"].get<std::string>().empty());
  expect_final(rr, p["usage"]);

  const std::vector<json> ls = lines("/api/generate", raw);
  ASSERT_GE(ls.size(), 2u);
  std::string streamed;
  for (size_t i = 0; i + 1 < ls.size(); ++i) streamed += ls[i]["response"].get<std::string>();
  EXPECT_EQ(streamed, rr["response"]);
  expect_final(ls.back(), p["usage"]);
}

// /api/generate with a suffix fills in the middle on the Qwen3 vocabulary
// (its FIM tokens), the same text and prompt count as /v1/completions'
// suffix; stories260K has no FIM tokens: /infill's 400, Ollama-shaped.
TEST_F(OllamaHttp, GenerateSuffixFillsInTheMiddle) {
  const std::string prefix = "def add(a, b):\n", suffix = "\n\nprint(add(1, 2))\n";
  auto [st, r] = post("/api/generate", {{"model", "qwen"},
                                        {"prompt", prefix},
                                        {"suffix", suffix},
                                        {"stream", false},
                                        {"options", {{"temperature", 0}, {"num_predict", 8}}}});
  ASSERT_EQ(st, 200) << r.dump();
  auto [vst, v] =
      post("/v1/completions",
           {{"model", "qwen"}, {"prompt", prefix}, {"suffix", suffix}, {"temperature", 0}, {"max_tokens", 8}});
  ASSERT_EQ(vst, 200) << v.dump();
  EXPECT_EQ(r["response"], v["choices"][0]["text"]);
  EXPECT_EQ(r["prompt_eval_count"], v["usage"]["prompt_tokens"]);
  EXPECT_EQ(r["eval_count"], v["usage"]["completion_tokens"]);
  auto [ist, i] = post("/infill", {{"model", "stories"}, {"input_prefix", "a"}, {"input_suffix", "b"}});
  ASSERT_EQ(ist, 400) << i.dump();
  auto [sst, s] = post("/api/generate", {{"model", "stories"}, {"prompt", "a"}, {"suffix", "b"}, {"stream", false}});
  EXPECT_EQ(sst, 400) << s.dump();
  EXPECT_EQ(s["error"], i["error"]["message"]) << s.dump();
}

TEST_F(OllamaHttp, FormatSchemaGivesJsonThatFitsIt) {
  const std::string schema =
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": false})";
  const std::string body = R"({"model": "qwen", "stream": false, "options": {"temperature": 0, "num_predict": 200},
      "messages": [{"role": "user", "content": "Give a name and an age."}], "format": )" +
                           schema + "}";
  auto r = client().Post("/api/chat", body, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json resp = json::parse(r->body);
  EXPECT_EQ(resp["done_reason"], "stop") << r->body;
  const json v = json::parse(resp["message"]["content"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(v.is_object()) << r->body;
  EXPECT_TRUE(v["name"].is_string());
  EXPECT_LE(v["name"].get<std::string>().size(), 8u);
  EXPECT_TRUE(v["age"].is_number_integer());
  EXPECT_EQ(v.size(), 2u);
  const std::string chat = R"({"model": "qwen", "messages": [{"role": "user", "content": "Give a name and an age."}],
      "temperature": 0, "max_tokens": 200, "response_format": {"type": "json_schema", "json_schema": {"name": "format",
      "strict": true, "schema": )" +
                           schema + "}}}";
  auto c = client().Post("/v1/chat/completions", chat, "application/json");
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200) << c->body;
  EXPECT_EQ(resp["message"]["content"], json::parse(c->body)["choices"][0]["message"]["content"]);

  // "json": any JSON object.
  auto [jst, j] = post("/api/generate", {{"model", "qwen"},
                                         {"prompt", "A JSON object please."},
                                         {"format", "json"},
                                         {"stream", false},
                                         {"options", {{"temperature", 0}, {"num_predict", 60}}}});
  ASSERT_EQ(jst, 200) << j.dump();
  if (j["done_reason"] == "stop") {
    EXPECT_TRUE(json::parse(j["response"].get<std::string>(), nullptr, false).is_object()) << j.dump();
  }
}

const json kWeatherTool = json::parse(R"({"type": "function", "function": {"name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                   "required": ["city"], "additionalProperties": false}}})");

// The random-weight fixture calls a tool only when made to: tool_choice
// "required" with parallel_tool_calls false (bonsai extension fields; Ollama has neither).
TEST_F(OllamaHttp, ToolCallsAreObjectsAndTheirResultsContinue) {
  const json body{{"model", "qwen"},
                  {"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
                  {"tools", {kWeatherTool}},
                  {"tool_choice", "required"},
                  {"parallel_tool_calls", false},
                  {"stream", false},
                  {"options", {{"temperature", 0}, {"num_predict", 300}}}};
  auto [st, r] = post("/api/chat", body);
  ASSERT_EQ(st, 200) << r.dump();
  ASSERT_EQ(r["message"]["tool_calls"].size(), 1u) << r.dump();
  const json& call = r["message"]["tool_calls"][0];
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["function"]["index"], 0);
  ASSERT_TRUE(call["function"]["arguments"].is_object()) << r.dump();
  EXPECT_TRUE(call["function"]["arguments"]["city"].is_string());
  EXPECT_EQ(r["done_reason"], "stop");

  const std::vector<json> ls = lines("/api/chat", body);
  json streamed_calls = json::array();
  for (const json& l : ls)
    if (l["message"].contains("tool_calls"))
      for (const json& c : l["message"]["tool_calls"]) streamed_calls.push_back(c["function"]);
  ASSERT_EQ(streamed_calls.size(), 1u);
  EXPECT_EQ(streamed_calls[0], call["function"]);  // temperature 0: the same call
  EXPECT_EQ(ls.back()["done"], true);

  // The call and its result sent back: the same prompt as chat's tool_calls + tool message.
  const json follow{{"model", "qwen"},
                    {"messages",
                     {{{"role", "user"}, {"content", "What is the weather in Paris?"}},
                      {{"role", "assistant"}, {"content", ""}, {"tool_calls", {{{"function", call["function"]}}}}},
                      {{"role", "tool"}, {"content", "Sunny, 21 C"}, {"tool_name", "get_weather"}}}},
                    {"tools", {kWeatherTool}},
                    {"stream", false},
                    {"options", {{"temperature", 0}, {"num_predict", 8}}}};
  auto [fst, f] = post("/api/chat", follow);
  ASSERT_EQ(fst, 200) << f.dump();
  const json chat{{"model", "qwen"},
                  {"messages",
                   {{{"role", "user"}, {"content", "What is the weather in Paris?"}},
                    {{"role", "assistant"},
                     {"content", ""},
                     {"tool_calls",
                      {{{"id", "call_1"},
                        {"type", "function"},
                        {"function", {{"name", "get_weather"}, {"arguments", call["function"]["arguments"]}}}}}}},
                    {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "Sunny, 21 C"}}}},
                  {"tools", {kWeatherTool}},
                  {"temperature", 0},
                  {"max_tokens", 8}};
  auto [cst, c] = post("/v1/chat/completions", chat);
  ASSERT_EQ(cst, 200) << c.dump();
  EXPECT_EQ(f["prompt_eval_count"], c["usage"]["prompt_tokens"]);
  EXPECT_EQ(f["message"]["content"],
            c["choices"][0]["message"]["content"].is_string() ? c["choices"][0]["message"]["content"] : json(""));
}

// think false renders the prompt as chat_template_kwargs.enable_thinking false does.
TEST_F(OllamaHttp, ThinkFalseIsEnableThinkingFalse) {
  const json msgs = {{{"role", "user"}, {"content", "Hi"}}};
  auto count = [&](const json& extra) {
    json body{{"model", "qwen"}, {"messages", msgs}, {"stream", false}, {"options", {{"num_predict", 1}}}};
    body.update(extra);
    auto [st, r] = post("/api/chat", body);
    EXPECT_EQ(st, 200) << r.dump();
    return r["prompt_eval_count"].get<int64_t>();
  };
  auto [cst, c] = post("/v1/chat/completions", {{"model", "qwen"},
                                                {"messages", msgs},
                                                {"max_tokens", 1},
                                                {"chat_template_kwargs", {{"enable_thinking", false}}}});
  ASSERT_EQ(cst, 200) << c.dump();
  EXPECT_EQ(count({{"think", false}}), c["usage"]["prompt_tokens"]);
  EXPECT_LT(count({{"think", true}}), c["usage"]["prompt_tokens"]);  // no empty <think></think> appended
  EXPECT_EQ(count({{"think", "low"}}), count({{"think", true}}));
}

// <think> text is message.thinking (llama.cpp's `grammar`, a bonsai extension, makes the random model write it).
TEST_F(OllamaHttp, ThinkTextIsThinking) {
  const json body{{"model", "qwen"},
                  {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                  {"grammar", R"(root ::= "<think>\nI should greet.\n</think>\n\nHello there")"},
                  {"stream", false},
                  {"options", {{"temperature", 0}, {"num_predict", 100}}}};
  auto [st, r] = post("/api/chat", body);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["message"]["thinking"], "I should greet.");
  EXPECT_EQ(r["message"]["content"], "Hello there");
  std::string thinking, content;
  for (const json& l : lines("/api/chat", body)) {
    if (l["message"].contains("thinking")) thinking += l["message"]["thinking"].get<std::string>();
    content += l["message"]["content"].get<std::string>();
  }
  EXPECT_EQ(thinking, "I should greet.");
  EXPECT_EQ(content, "Hello there");
}

// /api/embed's truncate (default true): an input longer than the context
// (512) is cut to its first 512 tokens, equal to embedding those tokens;
// truncate false keeps the 400. /api/generate's context error (truncate
// false) names the prompt, not "messages".
TEST_F(OllamaHttp, EmbedTruncatesToTheContextUnlessTruncateFalse) {
  std::string text;
  while (text.size() < 4000) text += "Once upon a time there was a cat. ";
  auto [tst, t] = post("/tokenize", {{"model", "stories"}, {"content", text}, {"add_special", true}});
  ASSERT_EQ(tst, 200) << t.dump();
  std::vector<int> ids = t["tokens"].get<std::vector<int>>();
  ASSERT_GT(ids.size(), 512u);
  ids.resize(512);
  for (const json& extra : {json::object(), json{{"truncate", true}}}) {
    json body{{"model", "stories"}, {"input", {text, "a cat"}}};
    body.update(extra);
    auto [st, r] = post("/api/embed", body);
    ASSERT_EQ(st, 200) << r.dump();
    ASSERT_EQ(r["embeddings"].size(), 2u);
    auto [ost, o] = post("/v1/embeddings", {{"model", "stories"}, {"input", json::array({ids})}});
    ASSERT_EQ(ost, 200) << o.dump();
    EXPECT_EQ(r["embeddings"][0], o["data"][0]["embedding"]);
    auto [cst, c] = post("/tokenize", {{"model", "stories"}, {"content", "a cat"}, {"add_special", true}});
    ASSERT_EQ(cst, 200);
    EXPECT_EQ(r["prompt_eval_count"].get<size_t>(), 512 + c["tokens"].size());
  }
  auto [fst, f] = post("/api/embed", {{"model", "stories"}, {"input", text}, {"truncate", false}});
  EXPECT_EQ(fst, 400) << f.dump();
  EXPECT_NE(f["error"].get<std::string>().find("context length"), std::string::npos) << f.dump();
  auto [bst, b] = post("/api/embed", {{"model", "stories"}, {"input", "a"}, {"truncate", "yes"}});
  EXPECT_EQ(bst, 400) << b.dump();
  EXPECT_NE(b["error"].get<std::string>().find("truncate"), std::string::npos) << b.dump();

  auto [gst, g] =
      post("/api/generate", {{"model", "stories"}, {"prompt", text + text}, {"stream", false}, {"truncate", false}});
  ASSERT_EQ(gst, 400) << g.dump();
  EXPECT_EQ(g["error"].get<std::string>().find("messages"), std::string::npos) << g.dump();
  EXPECT_NE(g["error"].get<std::string>().find("prompt"), std::string::npos) << g.dump();
}

// Ollama cuts a conversation longer than the context instead of refusing
// it: /api/chat drops the oldest messages but the system one (the last
// always stays) until the prompt fits (the model's 512, or options.num_ctx),
// which is the answer to the longest tail of the conversation that fits.
TEST_F(OllamaHttp, ChatDropsTheOldestMessagesButTheSystemOneToFit) {
  std::string para;
  while (para.size() < 500) para += "The cat sat on the mat and looked at the dog. ";
  const json system{{"role", "system"}, {"content", "You tell short stories."}};
  std::vector<json> rest;
  for (int i = 0; i < 6; ++i) {
    rest.push_back(json{{"role", "user"}, {"content", std::to_string(i) + " " + para}});
    rest.push_back(json{{"role", "assistant"}, {"content", "Story " + std::to_string(i) + "."}});
  }
  rest.push_back(json{{"role", "user"}, {"content", "Tell me about the cat."}});
  auto chat = [this, &system](const std::vector<json>& msgs, size_t from, json extra) {
    json messages = json::array({system});
    for (size_t i = from; i < msgs.size(); ++i) messages.push_back(msgs[i]);
    json body{{"model", "stories"},
              {"messages", messages},
              {"stream", false},
              {"options", {{"temperature", 0}, {"num_predict", 1}}}};
    body.update(extra, /*merge_objects=*/true);
    return post("/api/chat", body);
  };
  for (const int64_t limit : {int64_t{511}, int64_t{199}}) {
    SCOPED_TRACE("prompt limit " + std::to_string(limit));
    json extra = limit == 511 ? json::object() : json{{"options", {{"num_ctx", limit + 1}}}};
    auto [st, cut] = chat(rest, 0, extra);
    ASSERT_EQ(st, 200) << cut.dump();
    EXPECT_LE(cut["prompt_eval_count"].get<int64_t>(), limit) << cut.dump();
    // The longest tail that fits, sent as is (truncate false), gives the same prompt and answer.
    size_t from = 0;
    json want;
    for (; from < rest.size(); ++from) {
      auto [wst, w] = chat(rest, from, json{{"truncate", false}});
      if (wst == 200 && w["prompt_eval_count"].get<int64_t>() <= limit) {
        want = w;
        break;
      }
    }
    ASSERT_GT(from, 0u);
    ASSERT_LT(from, rest.size()) << "no tail fits";
    EXPECT_EQ(cut["prompt_eval_count"], want["prompt_eval_count"]);
    EXPECT_EQ(cut["message"]["content"], want["message"]["content"]);
  }
  // Sent as is, the whole conversation is a 400; so is a last message that alone does not fit.
  auto [fst, f] = chat(rest, 0, json{{"truncate", false}});
  EXPECT_EQ(fst, 400) << f.dump();
  std::string huge;
  while (huge.size() < 6000) huge += para;
  auto [hst, h] = chat({json{{"role", "user"}, {"content", huge}}}, 0, json::object());
  EXPECT_EQ(hst, 400) << h.dump();
  EXPECT_NE(h["error"].get<std::string>().find("context length"), std::string::npos) << h.dump();
}

// /api/generate keeps the end of a prompt longer than the context: raw, the
// BOS and the last 507 tokens (num_predict 4 left to answer), the answer
// to exactly those tokens; templated, the end of the prompt inside the template.
TEST_F(OllamaHttp, GenerateKeepsTheEndOfAPromptLongerThanTheContext) {
  std::string text;
  for (int i = 0; text.size() < 4000; ++i) text += "Once upon a time there was cat number " + std::to_string(i) + ". ";
  auto [tst, t] = post("/tokenize", {{"model", "stories"}, {"content", text}});
  ASSERT_EQ(tst, 200) << t.dump();
  std::vector<int> ids = t["tokens"].get<std::vector<int>>();
  ASSERT_GT(ids.size(), 600u);
  std::vector<int> tail = {1};  // BOS
  tail.insert(tail.end(), ids.end() - 507, ids.end());
  const json opts{{"temperature", 0}, {"num_predict", 4}};
  auto [rst, raw] = post("/api/generate",
                         {{"model", "stories"}, {"prompt", text}, {"raw", true}, {"stream", false}, {"options", opts}});
  ASSERT_EQ(rst, 200) << raw.dump();
  EXPECT_EQ(raw["prompt_eval_count"], 508);
  auto [cst, c] = post("/completion", {{"prompt", tail}, {"n_predict", 4}, {"temperature", 0}});
  EXPECT_EQ(raw["eval_count"], c["tokens_predicted"]);
  ASSERT_EQ(cst, 200) << c.dump();
  EXPECT_EQ(raw["response"], c["content"]);
  // The room kept is num_predict's (at most half the context), else a quarter of the context.
  auto [lst, l] = post("/api/generate", {{"model", "stories"},
                                         {"prompt", text},
                                         {"raw", true},
                                         {"stream", false},
                                         {"options", {{"temperature", 0}, {"num_predict", 50}}}});
  ASSERT_EQ(lst, 200) << l.dump();
  EXPECT_EQ(l["prompt_eval_count"], 462) << l.dump();
  auto [qst, q] = post("/api/generate", {{"model", "stories"}, {"prompt", text}, {"raw", true}, {"stream", false}});
  ASSERT_EQ(qst, 200) << q.dump();
  EXPECT_EQ(q["prompt_eval_count"], 384) << q.dump();
  // Templated: the prompt's end inside the chat template.
  auto [gst, g] = post("/api/generate", {{"model", "stories"}, {"prompt", text}, {"stream", false}, {"options", opts}});
  ASSERT_EQ(gst, 200) << g.dump();
  EXPECT_LE(g["prompt_eval_count"].get<int>(), 508);
  EXPECT_GT(g["prompt_eval_count"].get<int>(), 400);
  auto [nst, n] = post("/api/generate",
                       {{"model", "stories"}, {"prompt", text}, {"stream", false}, {"options", {{"num_ctx", 100}}}});
  ASSERT_EQ(nst, 200) << n.dump();
  EXPECT_LE(n["prompt_eval_count"].get<int>(), 75);
  EXPECT_GT(n["prompt_eval_count"].get<int>(), 40);
  auto [bst, b] = post("/api/generate", {{"model", "stories"}, {"prompt", "x"}, {"options", {{"num_ctx", "big"}}}});
  EXPECT_EQ(bst, 400) << b.dump();
  EXPECT_NE(b["error"].get<std::string>().find("num_ctx"), std::string::npos) << b.dump();
}

TEST_F(OllamaHttp, EmbedEqualsV1Embeddings) {
  auto [st, r] = post("/api/embed", {{"model", "stories:latest"}, {"input", {"Once upon a time", "a cat"}}});
  ASSERT_EQ(st, 200) << r.dump();
  auto [ost, o] = post("/v1/embeddings", {{"model", "stories"}, {"input", {"Once upon a time", "a cat"}}});
  ASSERT_EQ(ost, 200) << o.dump();
  EXPECT_EQ(r["model"], "stories:latest");
  ASSERT_EQ(r["embeddings"].size(), 2u);
  EXPECT_EQ(r["embeddings"][0], o["data"][0]["embedding"]);
  EXPECT_EQ(r["embeddings"][1], o["data"][1]["embedding"]);
  EXPECT_EQ(r["prompt_eval_count"], o["usage"]["prompt_tokens"]);
  EXPECT_GT(r["total_duration"].get<int64_t>(), 0);
  EXPECT_GT(r["load_duration"].get<int64_t>(), 0);
  EXPECT_LE(r["load_duration"].get<int64_t>(), r["total_duration"].get<int64_t>());

  auto [dst, d] = post("/api/embed", {{"model", "stories"}, {"input", "a cat"}, {"dimensions", 8}});
  ASSERT_EQ(dst, 200) << d.dump();
  ASSERT_EQ(d["embeddings"].size(), 1u);
  ASSERT_EQ(d["embeddings"][0].size(), 8u);
  double norm = 0;
  for (const json& x : d["embeddings"][0]) norm += x.get<double>() * x.get<double>();
  EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-5);

  auto [lst, l] = post("/api/embeddings", {{"model", "stories"}, {"prompt", "a cat"}});
  ASSERT_EQ(lst, 200) << l.dump();
  EXPECT_EQ(l["embedding"], o["data"][1]["embedding"]);
  auto [est, e] = post("/api/embeddings", {{"model", "stories"}, {"prompt", ""}});
  ASSERT_EQ(est, 200);
  EXPECT_EQ(e["embedding"], json::array());

  // keep_alive 0: unloaded once answered.
  ASSERT_TRUE(loaded("stories"));
  auto [kst, k] = post("/api/embed", {{"model", "stories"}, {"input", "a"}, {"keep_alive", "0s"}});
  ASSERT_EQ(kst, 200) << k.dump();
  EXPECT_FALSE(loaded("stories"));
}

TEST_F(OllamaHttp, KeepAliveZeroUnloadsAfterTheAnswer) {
  auto [st, r] = post("/api/generate", {{"model", "stories"},
                                        {"prompt", "Once"},
                                        {"keep_alive", 0},
                                        {"stream", false},
                                        {"options", {{"num_predict", 3}}}});
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["done"], true);
  EXPECT_FALSE(loaded("stories"));
  auto [st2, r2] = post("/api/generate", {{"model", "stories"},
                                          {"prompt", "Once"},
                                          {"keep_alive", "5m"},
                                          {"stream", false},
                                          {"options", {{"num_predict", 3}}}});
  ASSERT_EQ(st2, 200) << r2.dump();
  EXPECT_TRUE(loaded("stories"));
}

// An RFC 3339 UTC time as /api/ps writes it ("2026-01-02T03:04:05.123456789Z",
// or without the fraction); nullopt when it is not one.
std::optional<std::chrono::system_clock::time_point> parse_rfc3339(const std::string& s) {
  std::tm tm{};
  int frac_at = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                  &tm.tm_sec, &frac_at) != 6 ||
      s.empty() || s.back() != 'Z')
    return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  auto t = std::chrono::system_clock::from_time_t(timegm(&tm));
  if (s[static_cast<size_t>(frac_at)] == '.') {
    const std::string frac = s.substr(static_cast<size_t>(frac_at) + 1, s.size() - static_cast<size_t>(frac_at) - 2);
    t += std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::duration<double>(std::stod("0." + frac)));
  }
  return t;
}

// keep_alive D > 0: the model is unloaded once idle for D, with no request
// needed to notice it, and /api/ps's expires_at says when; a negative one
// (and none) keeps it: expires_at far ahead. /api/embed sets it too.
TEST_F(OllamaHttp, KeepAliveUnloadsTheModelOnceIdleThatLong) {
  using std::chrono::system_clock;
  const json user = json::array({{{"role", "user"}, {"content", "x"}}});
  auto expires_at = [&](const std::string& name) -> std::string {
    const json ps = get("/api/ps").second;
    for (const json& m : ps["models"])
      if (m["name"] == name) return m["expires_at"].get<std::string>();
    return "";
  };
  // "5m": expires five minutes after the answer.
  auto [st, r] = post("/api/chat", {{"model", "stories"},
                                    {"messages", user},
                                    {"stream", false},
                                    {"keep_alive", "5m"},
                                    {"options", {{"num_predict", 2}}}});
  ASSERT_EQ(st, 200) << r.dump();
  const auto answered = system_clock::now();
  auto when = parse_rfc3339(expires_at("stories:latest"));
  ASSERT_TRUE(when.has_value()) << expires_at("stories:latest");
  EXPECT_GE(*when, answered + std::chrono::seconds(295));
  EXPECT_LE(*when, system_clock::now() + std::chrono::seconds(301));
  // Negative: kept (until evicted or unloaded).
  std::tie(st, r) = post("/api/generate", {{"model", "stories"}, {"keep_alive", -1}, {"stream", false}});
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(expires_at("stories:latest"), "9999-12-31T23:59:59Z");
  // "1s" on a generation; "qwen" is loaded without one and stays.
  std::tie(st, r) = post("/api/chat", {{"model", "qwen"}, {"messages", json::array()}, {"stream", false}});
  ASSERT_EQ(st, 200) << r.dump();
  std::tie(st, r) = post("/api/generate", {{"model", "stories"},
                                           {"prompt", "Once upon a time"},
                                           {"stream", false},
                                           {"keep_alive", "1s"},
                                           {"options", {{"num_predict", 2}}}});
  ASSERT_EQ(st, 200) << r.dump();
  const auto t0 = std::chrono::steady_clock::now();
  when = parse_rfc3339(expires_at("stories:latest"));
  ASSERT_TRUE(when.has_value()) << expires_at("stories:latest");
  EXPECT_LE(*when, system_clock::now() + std::chrono::seconds(1));
  EXPECT_GE(*when, system_clock::now() - std::chrono::seconds(1));
  while (loaded("stories") && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(loaded("stories"));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(900));
  EXPECT_EQ(expires_at("stories:latest"), "");  // not in /api/ps any more
  EXPECT_TRUE(loaded("qwen"));
  EXPECT_EQ(expires_at("qwen:latest"), "9999-12-31T23:59:59Z");
  // /api/embed: the same; the next request loads the model again.
  std::tie(st, r) = post("/api/embed", {{"model", "stories"}, {"input", "a"}, {"keep_alive", 1}});
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_TRUE(loaded("stories"));
  EXPECT_FALSE(expires_at("stories:latest").empty());
  EXPECT_NE(expires_at("stories:latest"), "9999-12-31T23:59:59Z");
  for (int i = 0; i < 500 && loaded("stories"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(loaded("stories"));
  // Bad durations on every route that takes one: Ollama-shaped 400s naming keep_alive.
  for (const auto& [path, body] : std::vector<std::pair<std::string, json>>{
           {"/api/chat", {{"model", "stories"}, {"messages", user}, {"keep_alive", "5 minutes"}}},
           {"/api/chat", {{"model", "stories"}, {"messages", user}, {"keep_alive", "1h-5m"}}},
           {"/api/generate", {{"model", "stories"}, {"prompt", "x"}, {"keep_alive", "m5"}}},
           {"/api/generate", {{"model", "stories"}, {"keep_alive", ""}}},
           {"/api/embed", {{"model", "stories"}, {"input", "a"}, {"keep_alive", "5d"}}},
           {"/api/embed", {{"model", "stories"}, {"input", "a"}, {"keep_alive", json::array()}}}}) {
    auto [bst, b] = post(path, body);
    EXPECT_EQ(bst, 400) << path << " " << body.dump() << " -> " << b.dump();
    ASSERT_TRUE(b.is_object() && b["error"].is_string()) << b.dump();
    EXPECT_EQ(b.size(), 1u) << b.dump();
    EXPECT_NE(b["error"].get<std::string>().find("keep_alive"), std::string::npos) << b.dump();
  }
  EXPECT_FALSE(loaded("stories"));  // a refused request loads nothing
}

TEST_F(OllamaHttp, ErrorsAreOllamaShapedAndTheServerKeepsServing) {
  struct Case {
    std::string path;
    std::string body;
    int status;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {"/api/chat", R"({"model": "nope", "messages": [{"role": "user", "content": "x"}]})", 404, "nope"},
      {"/api/chat", R"({"messages": [{"role": "user", "content": "x"}]})", 400, "model"},
      {"/api/chat", R"({"model": "stories", "messages": [{"role": "user", "content": "x"}],
                        "options": {"temperature": "hot"}})",
       400, "options.temperature"},
      {"/api/chat", R"({"model": "stories", "messages": [{"role": "robot", "content": "x"}]})", 400,
       "messages[0].role"},
      {"/api/generate", R"({"model": "stories", "prompt": "x", "keep_alive": "soon"})", 400, "keep_alive"},
      {"/api/generate", R"({"model": "stories", "prompt": "x", "options": {"top_p": 7}})", 400, "options.top_p"},
      {"/api/embed", R"({"model": "stories"})", 400, "input"},
      {"/api/embed", R"({"model": "stories", "input": [1]})", 400, "input[0]"},
      {"/api/chat", "{not json", 400, "JSON"},
      {"/api/pull", R"({"model": "llama3"})", 501, "GGUF"},
      {"/api/nothing", "{}", 404, "/api/nothing"},
  };
  for (const auto& c : cases) {
    auto r = client().Post(c.path.c_str(), c.body, "application/json");
    ASSERT_TRUE(r) << c.path;
    EXPECT_EQ(r->status, c.status) << c.path << " " << c.body << " -> " << r->body;
    EXPECT_NE(r->get_header_value("Content-Type").find("application/json"), std::string::npos);
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j["error"].is_string()) << r->body;  // not OpenAI's {"error": {...}}
    EXPECT_EQ(j.size(), 1u) << r->body;
    EXPECT_NE(j["error"].get<std::string>().find(c.mentions), std::string::npos) << r->body;
  }
  auto [pst, p] = post("/api/pull", {{"model", "stories:latest"}, {"stream", false}});
  EXPECT_EQ(pst, 200);
  EXPECT_EQ(p["status"], "success");
  auto d = client().Delete("/api/delete", R"({"model": "stories"})", "application/json");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 501);
  EXPECT_TRUE(json::parse(d->body)["error"].is_string());
  auto [st, r] = post("/api/chat", {{"model", "stories"},
                                    {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                    {"stream", false},
                                    {"options", {{"num_predict", 2}}}});
  EXPECT_EQ(st, 200) << r.dump();
}

class OllamaHttpKey : public OllamaHttp {
 protected:
  void options(ServerOptions& so) override { so.api_key = "sekrit"; }
};

TEST_F(OllamaHttpKey, ApiRoutesNeedTheKey) {
  for (const char* path : {"/api/tags", "/api/ps", "/api/version", "/api/nothing"}) {
    auto [st, r] = get(path);
    EXPECT_EQ(st, 401) << path;
    EXPECT_TRUE(r["error"].is_string()) << r.dump();
  }
  auto [st, r] = post("/api/chat", {{"model", "stories"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_EQ(st, 401);
  EXPECT_TRUE(r["error"].is_string()) << r.dump();
  httplib::Client c = client();
  c.set_bearer_token_auth("sekrit");
  auto ok = c.Get("/api/tags");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(json::parse(ok->body)["models"].size(), 2u);
}

class OllamaHttpSlowSteps : public OllamaHttp {
 protected:
  engine::ModelPool::Loader loader() override {
    return engine::gguf_model_loader([](engine::SchedulerOptions& so) {
      so.on_step = [](int64_t, int64_t) { std::this_thread::sleep_for(std::chrono::milliseconds(10)); };
    });
  }
};

// A stream cut after it started (here: the server stops) ends with Ollama's
// error line {"error": "..."} (the client raises it), and nothing after.
TEST_F(OllamaHttpSlowSteps, StreamCutMidwayEndsWithAnErrorLine) {
  const json body{
      {"model", "stories"}, {"prompt", "Once upon a time"}, {"raw", true}, {"options", {{"num_predict", 400}}}};
  std::mutex mu;
  std::condition_variable cv;
  std::string got;
  int status = -1;
  std::thread reader([&] {
    auto c = client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/api/generate";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      std::lock_guard lock(mu);
      got.append(data, n);
      cv.notify_all();
      return true;
    };
    auto r = c.send(req);
    std::lock_guard lock(mu);
    status = r ? r->status : -2;
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60),
                            [&] { return got.find("\"done\":false") != std::string::npos || status != -1; }));
  }
  server_->stop();
  reader.join();
  EXPECT_EQ(status, 200);
  ASSERT_FALSE(got.empty());
  ASSERT_EQ(got.back(), '\n');
  const size_t prev = got.rfind('\n', got.size() - 2);
  const json last = json::parse(got.substr(prev == std::string::npos ? 0 : prev + 1));
  ASSERT_TRUE(last["error"].is_string()) << got;
  EXPECT_NE(last["error"].get<std::string>().find("shutting down"), std::string::npos) << last.dump();
  EXPECT_EQ(last.size(), 1u);
  EXPECT_EQ(got.find("\"done\":true"), std::string::npos);
}

}  // namespace
}  // namespace bonsai::server
