// Anthropic's Messages API (src/server/routes_anthropic.*): the request
// translation and its 400s, the content blocks and their stream events;
// and over HTTP on an in-process Server (stories260K and the Qwen3
// fixture): text streamed and not, equal to chat completions of the same
// conversation (one preparation path), a forced tool_use and its
// tool_result continued, stop_sequences, count_tokens, errors in
// Anthropic's shape, x-api-key.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "engine/engine_pool.h"  // gguf_model_loader
#include "engine/model_pool.h"   // ModelPool
#include "server/routes_anthropic.h"
#include "server/server.h"

namespace bonsai::server {
namespace {

using nlohmann::json;
using OJson = nlohmann::ordered_json;

// ---- translation ------------------------------------------------------------

MessagesRequest parse_ok(const std::string& body, bool count_only = false) {
  MessagesRequest mr;
  auto e = parse_messages_request(body, mr, count_only);
  EXPECT_FALSE(e.has_value()) << body << " -> " << (e ? e->message : "");
  return mr;
}

TEST(AnthropicTranslate, SystemMessagesAndSamplingTakeChatShapes) {
  const MessagesRequest mr = parse_ok(R"({"model": "m", "max_tokens": 50,
      "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
      "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
                   {"role": "user", "content": [{"type": "text", "text": "Once"}, {"type": "text", "text": " more"}]}],
      "temperature": 0.5, "top_p": 0.9, "top_k": 7, "stop_sequences": ["END", "\n\n"], "stream": true,
      "metadata": {"user_id": "u1"}, "thinking": {"type": "disabled"}})");
  EXPECT_EQ(mr.chat["model"], "m");
  EXPECT_EQ(mr.chat["max_tokens"], 50);
  EXPECT_EQ(mr.chat["messages"], OJson::parse(R"([{"role": "system", "content": "Be brief.\n\nBe kind."},
      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
      {"role": "user", "content": "Once more"}])"));
  EXPECT_EQ(mr.chat["temperature"], 0.5);
  EXPECT_EQ(mr.chat["top_p"], 0.9);
  EXPECT_EQ(mr.chat["top_k"], 7);
  EXPECT_EQ(mr.chat["stop"], OJson::parse(R"(["END", "\n\n"])"));
  EXPECT_EQ(mr.stop_sequences, (std::vector<std::string>{"END", "\n\n"}));
  EXPECT_EQ(mr.chat["user"], "u1");
  EXPECT_EQ(mr.chat["chat_template_kwargs"], OJson::parse(R"({"enable_thinking": false})"));
  EXPECT_TRUE(mr.stream);
  EXPECT_EQ(parse_ok(R"({"max_tokens": 2048, "messages": [{"role": "user", "content": "x"}],
                         "thinking": {"type": "enabled", "budget_tokens": 1024}})")
                .chat["chat_template_kwargs"]["enable_thinking"],
            true);
  EXPECT_EQ(parse_ok(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                         "thinking": {"type": "adaptive"}})")
                .chat["chat_template_kwargs"]["enable_thinking"],
            true);
  // Absent: the model's default, as on chat completions.
  EXPECT_FALSE(parse_ok(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})")
                   .chat.contains("chat_template_kwargs"));
}

TEST(AnthropicTranslate, ToolUseAndToolResultBlocksBecomeToolCallsAndToolMessages) {
  const MessagesRequest mr = parse_ok(R"({"max_tokens": 50,
      "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
      "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
      "messages": [{"role": "user", "content": "Weather in Paris and Rome?"},
                   {"role": "assistant", "content": [{"type": "thinking", "thinking": "Two calls.", "signature": "x"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "Rain"}], "is_error": true},
                        {"type": "text", "text": "Thanks"}]}]})");
  EXPECT_EQ(mr.chat["messages"], OJson::parse(R"([{"role": "user", "content": "Weather in Paris and Rome?"},
      {"role": "assistant", "content": "Checking.", "reasoning_content": "Two calls.", "tool_calls": [
          {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
          {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
      {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: Rain"},
      {"role": "user", "content": "Thanks"}])"));
  EXPECT_EQ(mr.chat["tools"], OJson::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])"));
  EXPECT_EQ(mr.chat["tool_choice"], OJson::parse(R"({"type": "function", "function": {"name": "get_weather"}})"));
  EXPECT_EQ(mr.chat["parallel_tool_calls"], false);
  for (auto [choice, chat] :
       {std::pair{R"({"type": "auto"})", R"("auto")"}, std::pair{R"({"type": "any"})", R"("required")"},
        std::pair{R"({"type": "none"})", R"("none")"}}) {
    const MessagesRequest m = parse_ok(std::string(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": )") +
                                       choice + "}");
    EXPECT_EQ(m.chat["tool_choice"], OJson::parse(chat)) << choice;
  }
}

TEST(AnthropicTranslate, CountTokensNeedsNoMaxTokens) {
  const MessagesRequest mr = parse_ok(R"({"messages": [{"role": "user", "content": "x"}]})", true);
  EXPECT_FALSE(mr.chat.contains("max_tokens"));
  EXPECT_EQ(mr.chat["messages"].size(), 1u);
}

TEST(AnthropicTranslate, BadShapesAre400NamingTheAnthropicField) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"messages": [{"role": "user", "content": "x"}]})", "max_tokens"},
      {R"({"max_tokens": "5", "messages": [{"role": "user", "content": "x"}]})", "max_tokens"},
      {R"({"max_tokens": 5})", "messages"},
      {R"({"max_tokens": 5, "messages": []})", "messages"},
      {R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})", "messages[0].role"},
      {R"({"max_tokens": 5, "messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": 7}]})", "messages[0].content"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
           "content": [{"type": "image"}]}]}]})",
       "messages[0].content[0].content[0].type"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]})",
       "messages[0].content[0].tool_use_id"},
      {R"({"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f",
           "input": "x"}]}]})",
       "messages[0].content[0].input"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens": 5, "system": 3, "messages": [{"role": "user", "content": "x"}]})", "system"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]})",
       "tools[0].input_schema"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "bash_20250124",
           "name": "bash"}]})",
       "tools[0].type"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function"}})",
       "tool_choice.type"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool"}})",
       "tool_choice.name"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "on"}})",
       "thinking.type"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stop_sequences": "END"})",
       "stop_sequences"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stop_sequences": ["a", 1]})",
       "stop_sequences[1]"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stream": "yes"})", "stream"},
      // Anthropic's documented ranges: temperature [0, 1]; thinking.budget_tokens >= 1024 and < max_tokens.
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5})", "temperature"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": -0.1})", "temperature"},
      {R"({"max_tokens": 4096, "messages": [{"role": "user", "content": "x"}],
           "thinking": {"type": "enabled", "budget_tokens": 1023}})",
       "thinking.budget_tokens"},
      {R"({"max_tokens": 1024, "messages": [{"role": "user", "content": "x"}],
           "thinking": {"type": "enabled", "budget_tokens": 1024}})",
       "thinking.budget_tokens"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "metadata": {"user_id": 3}})",
       "metadata.user_id"},
      {R"([1, 2])", ""},
      {R"({"max_tokens": )", ""},
  };
  for (const Case& c : cases) {
    MessagesRequest mr;
    auto e = parse_messages_request(c.body, mr);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->status, 400) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << " -> " << e->message;
    if (*c.param) {
      EXPECT_NE(e->message.find(c.param), std::string::npos) << e->message;
    }
  }
}

TEST(AnthropicTranslate, ChatParamsAreRenamedAndErrorsTakeAnthropicsShape) {
  ApiError e = bad_request("Invalid 'stop': at most 16 stop sequences are allowed.", "stop");
  e = anthropic_error(e);
  EXPECT_EQ(e.param, "stop_sequences");
  EXPECT_EQ(e.message, "Invalid 'stop_sequences': at most 16 stop sequences are allowed.");
  EXPECT_EQ(anthropic_error(bad_request("x", "tools[2].function.parameters.type")).param, "tools[2].input_schema.type");
  EXPECT_EQ(anthropic_error(bad_request("x", "tools[0].function.name")).param, "tools[0].name");
  EXPECT_EQ(anthropic_error(bad_request("x", "tool_choice.function.name")).param, "tool_choice.name");
  EXPECT_EQ(anthropic_error(bad_request("x", "temperature")).param, "temperature");

  EXPECT_EQ(anthropic_error_json(bad_request("bad")),
            json::parse(R"({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}})"));
  const std::pair<int, const char*> types[] = {{400, "invalid_request_error"},
                                               {401, "authentication_error"},
                                               {403, "permission_error"},
                                               {404, "not_found_error"},
                                               {413, "request_too_large"},
                                               {429, "rate_limit_error"},
                                               {500, "api_error"},
                                               {503, "overloaded_error"},
                                               {529, "overloaded_error"},
                                               {499, "invalid_request_error"}};
  for (auto [status, type] : types) EXPECT_STREQ(anthropic_error_type(status), type) << status;
  EXPECT_TRUE(is_anthropic_path("/v1/messages"));
  EXPECT_TRUE(is_anthropic_path("/v1/messages/count_tokens"));
  EXPECT_FALSE(is_anthropic_path("/v1/messagesx"));
  EXPECT_FALSE(is_anthropic_path("/v1/chat/completions"));
}

// ---- content blocks -----------------------------------------------------------

TEST(AnthropicContent, ThinkingTextAndToolUseBecomeBlocksWithTheirEvents) {
  std::vector<json> evs;
  MessageContent c([&](const char* name, json data) {
    EXPECT_EQ(data["type"], name);
    evs.push_back(std::move(data));
  });
  engine::ChatOutputDelta d;
  d.reasoning = "Let me ";
  c.add(d);
  d.reasoning = "think.";
  c.add(d);
  d = {};
  d.content = "\n\n";  // blank: held, opens no block
  c.add(d);
  d.content = "Sure.";
  c.add(d);
  d = {};
  d.content = "\n";
  d.tool_calls.push_back({"get_weather", R"({"city":"Paris","days":2})"});
  c.add(d);
  c.finish();

  ASSERT_EQ(c.blocks().size(), 3u) << c.blocks().dump();
  EXPECT_EQ(c.blocks()[0], json::parse(R"({"type": "thinking", "thinking": "Let me think.", "signature": ""})"));
  EXPECT_EQ(c.blocks()[1], json::parse(R"({"type": "text", "text": "\n\nSure.\n"})"));
  const json& tu = c.blocks()[2];
  EXPECT_EQ(tu["type"], "tool_use");
  EXPECT_EQ(tu["name"], "get_weather");
  EXPECT_EQ(tu["input"], json::parse(R"({"city": "Paris", "days": 2})"));
  const std::string id = tu["id"];
  EXPECT_EQ(id.rfind("toolu_", 0), 0u);
  EXPECT_EQ(id.size(), 6u + 24u);
  EXPECT_EQ(c.text(), "\n\nSure.\n");
  EXPECT_TRUE(c.has_tool_use());

  std::vector<std::string> seq;
  for (const json& e : evs) {
    std::string s = e["type"];
    if (e.contains("delta")) s += ":" + e["delta"]["type"].get<std::string>();
    if (e.contains("content_block")) s += ":" + e["content_block"]["type"].get<std::string>();
    seq.push_back(s + "@" + std::to_string(e["index"].get<int>()));
  }
  const std::vector<std::string> want = {"content_block_start:thinking@0",
                                         "content_block_delta:thinking_delta@0",
                                         "content_block_delta:thinking_delta@0",
                                         "content_block_delta:signature_delta@0",
                                         "content_block_stop@0",
                                         "content_block_start:text@1",
                                         "content_block_delta:text_delta@1",
                                         "content_block_delta:text_delta@1",
                                         "content_block_stop@1",
                                         "content_block_start:tool_use@2",
                                         "content_block_delta:input_json_delta@2",
                                         "content_block_stop@2"};
  EXPECT_EQ(seq, want);
  EXPECT_EQ(evs[5]["content_block"], json::parse(R"({"type": "text", "text": ""})"));
  EXPECT_EQ(evs[6]["delta"]["text"], "\n\nSure.");
  EXPECT_EQ(evs[9]["content_block"]["input"], json::object());
  EXPECT_EQ(evs[9]["content_block"]["id"], id);
  EXPECT_EQ(json::parse(evs[10]["delta"]["partial_json"].get<std::string>()), tu["input"]);
}

TEST(AnthropicContent, EmptyAnswerHasNoBlocksAndABlankOneOneTextBlock) {
  MessageContent empty;
  empty.finish();
  EXPECT_EQ(empty.blocks(), json::array());
  MessageContent blank;
  engine::ChatOutputDelta d;
  d.content = "\n";
  blank.add(d);
  blank.finish();
  EXPECT_EQ(blank.blocks(), json::parse(R"([{"type": "text", "text": "\n"}])"));
  EXPECT_FALSE(blank.has_tool_use());
}

// ---- over HTTP --------------------------------------------------------------

const std::string kStories = test::shared_path("models/stories260K/stories260K.gguf");
const std::string kQwen = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");

// A Server on 127.0.0.1 (free port) serving "stories" (the default) and "qwen".
class AnthropicHttp : public ::testing::Test {
 protected:
  virtual std::string api_key() const { return {}; }
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
    so.api_key = api_key();
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
  // The events of a streamed create: each "event: T\ndata: {...}" with T == data.type.
  std::vector<json> stream(json body) const {
    body["stream"] = true;
    auto r = client().Post("/v1/messages", body.dump(), "application/json");
    std::vector<json> out;
    EXPECT_TRUE(r);
    if (!r) return out;
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    size_t at = 0;
    while (at < r->body.size()) {
      const size_t end = r->body.find("\n\n", at);
      EXPECT_NE(end, std::string::npos) << r->body.substr(at);
      if (end == std::string::npos) break;
      const std::string ev = r->body.substr(at, end - at);
      at = end + 2;
      const size_t nl = ev.find('\n');
      EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
      EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
      json data = json::parse(ev.substr(nl + 7));
      EXPECT_EQ(data["type"], ev.substr(7, nl - 7));
      out.push_back(std::move(data));
    }
    return out;
  }

  std::shared_ptr<engine::ModelPool> pool_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// The text of a Message's text blocks.
std::string text_of(const json& m) {
  std::string s;
  for (const json& b : m["content"])
    if (b["type"] == "text") s += b["text"].get<std::string>();
  return s;
}

// The streamed events, checked against Anthropic's documented order
// (message_start, ping, per block start / deltas / stop with indices 0, 1,
// ..., message_delta, message_stop), folded into the Message they describe.
json fold_stream(const std::vector<json>& evs) {
  EXPECT_GE(evs.size(), 4u);
  if (evs.size() < 4) return json();
  EXPECT_EQ(evs[0]["type"], "message_start");
  EXPECT_EQ(evs[1]["type"], "ping");
  json m = evs[0]["message"];
  EXPECT_EQ(m["content"], json::array());
  EXPECT_EQ(m["stop_reason"], nullptr);
  EXPECT_EQ(m["usage"]["output_tokens"], 0);
  std::vector<std::string> partial;  // input_json_delta text per block
  bool open = false;
  size_t i = 2;
  for (; i < evs.size() && evs[i]["type"] != "message_delta"; ++i) {
    const json& e = evs[i];
    const size_t index = e["index"];
    if (e["type"] == "content_block_start") {
      EXPECT_FALSE(open);
      EXPECT_EQ(index, m["content"].size());
      m["content"].push_back(e["content_block"]);
      partial.emplace_back();
      open = true;
    } else if (e["type"] == "content_block_delta") {
      EXPECT_TRUE(open);
      EXPECT_EQ(index + 1, m["content"].size());
      json& b = m["content"][index];
      const json& d = e["delta"];
      if (d["type"] == "text_delta") {
        b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
      } else if (d["type"] == "thinking_delta") {
        b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      } else if (d["type"] == "signature_delta") {
        b["signature"] = d["signature"];
      } else {
        EXPECT_EQ(d["type"], "input_json_delta");
        partial[index] += d["partial_json"].get<std::string>();
      }
    } else {
      EXPECT_EQ(e["type"], "content_block_stop");
      EXPECT_TRUE(open);
      EXPECT_EQ(index + 1, m["content"].size());
      if (m["content"][index]["type"] == "tool_use") m["content"][index]["input"] = json::parse(partial[index]);
      open = false;
    }
  }
  EXPECT_FALSE(open);
  EXPECT_EQ(i + 2, evs.size());
  if (i + 2 != evs.size()) return m;
  EXPECT_EQ(evs[i + 1]["type"], "message_stop");
  m["stop_reason"] = evs[i]["delta"]["stop_reason"];
  m["stop_sequence"] = evs[i]["delta"]["stop_sequence"];
  m["usage"]["output_tokens"] = evs[i]["usage"]["output_tokens"];
  return m;
}

TEST_F(AnthropicHttp, TextEqualsChatCompletionsOfTheSameConversation) {
  const json body{{"model", "stories"},
                  {"system", "Tell a story."},
                  {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                  {"max_tokens", 12},
                  {"temperature", 0}};
  auto [st, m] = post("/v1/messages", body, {{"anthropic-version", "2023-06-01"}});
  ASSERT_EQ(st, 200) << m.dump();
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "stories");
  const std::string id = m["id"];
  EXPECT_EQ(id.rfind("msg_", 0), 0u);
  ASSERT_EQ(m["content"].size(), 1u) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "text");

  const json chat{
      {"model", "stories"},
      {"messages",
       {{{"role", "system"}, {"content", "Tell a story."}}, {{"role", "user"}, {"content", "Once upon a time"}}}},
      {"max_tokens", 12},
      {"temperature", 0}};
  auto [cst, c] = post("/v1/chat/completions", chat);
  ASSERT_EQ(cst, 200) << c.dump();
  EXPECT_FALSE(text_of(m).empty());
  EXPECT_EQ(text_of(m), c["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(m["usage"],
            json({{"input_tokens", c["usage"]["prompt_tokens"]}, {"output_tokens", c["usage"]["completion_tokens"]}}));
  EXPECT_EQ(m["stop_reason"], c["choices"][0]["finish_reason"] == "length" ? "max_tokens" : "end_turn");
  EXPECT_EQ(m["stop_sequence"], nullptr);

  // count_tokens: the same prompt, counted without generating.
  json count_body = body;
  count_body.erase("max_tokens");
  count_body.erase("temperature");
  auto [nst, n] = post("/v1/messages/count_tokens", count_body);
  ASSERT_EQ(nst, 200) << n.dump();
  EXPECT_EQ(n, json({{"input_tokens", m["usage"]["input_tokens"]}}));
}

// A final assistant message is a prefill on every chat route: the answer
// continues it (stories260K continues "Once upon a" with " time"), as
// Anthropic documents, llama-server and Ollama do, and vLLM's
// continue_final_message asks; continue_final_message: false answers it as
// a new turn instead.
TEST_F(AnthropicHttp, FinalAssistantMessageIsContinuedOnEveryChatRoute) {
  const json msgs = {{{"role", "user"}, {"content", "Tell a story."}},
                     {{"role", "assistant"}, {"content", "Once upon a"}}};
  auto [st, m] =
      post("/v1/messages", json{{"model", "stories"}, {"messages", msgs}, {"max_tokens", 6}, {"temperature", 0}});
  ASSERT_EQ(st, 200) << m.dump();
  const std::string cont = text_of(m);
  EXPECT_EQ(cont.rfind(" time", 0), 0u) << cont;
  auto [cst, c] = post("/v1/chat/completions",
                       json{{"model", "stories"}, {"messages", msgs}, {"max_tokens", 6}, {"temperature", 0}});
  ASSERT_EQ(cst, 200) << c.dump();
  EXPECT_EQ(c["choices"][0]["message"]["content"], cont);
  EXPECT_EQ(c["usage"]["prompt_tokens"], m["usage"]["input_tokens"]);
  auto [ost, o] = post("/api/chat", json{{"model", "stories"},
                                         {"messages", msgs},
                                         {"stream", false},
                                         {"options", {{"num_predict", 6}, {"temperature", 0}}}});
  ASSERT_EQ(ost, 200) << o.dump();
  EXPECT_EQ(o["message"]["content"], cont);
  auto [kst, k] = post("/v1/messages/count_tokens", json{{"model", "stories"}, {"messages", msgs}});
  ASSERT_EQ(kst, 200) << k.dump();
  EXPECT_EQ(k["input_tokens"], m["usage"]["input_tokens"]);
  // Asked not to continue: a new assistant turn (a longer prompt, another answer).
  auto [nst, n] = post("/v1/chat/completions", json{{"model", "stories"},
                                                    {"messages", msgs},
                                                    {"continue_final_message", false},
                                                    {"max_tokens", 6},
                                                    {"temperature", 0}});
  ASSERT_EQ(nst, 200) << n.dump();
  EXPECT_GT(n["usage"]["prompt_tokens"].get<int>(), c["usage"]["prompt_tokens"].get<int>());
  EXPECT_NE(n["choices"][0]["message"]["content"], cont);
  // Nothing to continue: 400 naming messages.
  auto [bst, b] = post("/v1/chat/completions", json{{"model", "stories"},
                                                    {"messages", json::array({msgs[0]})},
                                                    {"continue_final_message", true},
                                                    {"max_tokens", 6}});
  EXPECT_EQ(bst, 400) << b.dump();
  EXPECT_EQ(b["error"]["param"], "messages");
}

TEST_F(AnthropicHttp, StreamedEventsInOrderMakeTheSameMessage) {
  const json body{
      {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}, {"max_tokens", 10}, {"temperature", 0}};
  auto [st, whole] = post("/v1/messages", body);
  ASSERT_EQ(st, 200) << whole.dump();
  const std::vector<json> evs = stream(body);
  json folded = fold_stream(evs);
  ASSERT_FALSE(folded.is_null());
  EXPECT_NE(folded["id"], whole["id"]);
  folded["id"] = whole["id"];
  EXPECT_EQ(folded, whole);  // content, stop_reason, usage: the non-streamed Message
  EXPECT_FALSE(text_of(folded).empty());
  size_t deltas = 0;
  for (const json& e : evs) deltas += e["type"] == "content_block_delta";
  EXPECT_GE(deltas, 2u);  // streamed as it came, not in one piece
}

const json kWeatherTool = json::parse(R"({"name": "get_weather", "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                     "required": ["city"], "additionalProperties": false}})");

TEST_F(AnthropicHttp, ForcedToolGivesToolUseAndItsResultContinues) {
  const json user = {{"role", "user"}, {"content", "What is the weather in Paris?"}};
  json body{{"model", "qwen"},         {"messages", {user}},
            {"tools", {kWeatherTool}}, {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}}},
            {"temperature", 0},        {"max_tokens", 300}};
  auto [st, m] = post("/v1/messages", body);
  ASSERT_EQ(st, 200) << m.dump();
  EXPECT_EQ(m["stop_reason"], "tool_use") << m.dump();
  json tool_use;
  for (const json& b : m["content"])
    if (b["type"] == "tool_use") tool_use = b;
  ASSERT_FALSE(tool_use.is_null()) << m.dump();
  EXPECT_EQ(tool_use["name"], "get_weather");
  EXPECT_EQ(tool_use["id"].get<std::string>().rfind("toolu_", 0), 0u);
  ASSERT_TRUE(tool_use["input"].is_object()) << tool_use.dump();
  ASSERT_TRUE(tool_use["input"]["city"].is_string()) << tool_use.dump();
  const std::string city = tool_use["input"]["city"];
  EXPECT_LE(std::count_if(city.begin(), city.end(), [](unsigned char ch) { return (ch & 0xC0) != 0x80; }), 16)
      << city;  // maxLength counts characters
  EXPECT_EQ(tool_use["input"].size(), 1u);

  // Streamed: the same blocks (a new id), the input as input_json_delta.
  json folded = fold_stream(stream(body));
  ASSERT_EQ(folded["content"].size(), m["content"].size()) << folded.dump();
  for (size_t k = 0; k < m["content"].size(); ++k) {
    json b = folded["content"][k];
    if (b["type"] == "tool_use") {
      EXPECT_EQ(b["id"].get<std::string>().rfind("toolu_", 0), 0u);
      b["id"] = m["content"][k]["id"];
    }
    EXPECT_EQ(b, m["content"][k]);
  }
  EXPECT_EQ(folded["stop_reason"], "tool_use");

  // The tool_result continues the conversation as the chat form of it does.
  const json assistant = {{"role", "assistant"}, {"content", m["content"]}};
  const json result = {
      {"role", "user"},
      {"content", {{{"type", "tool_result"}, {"tool_use_id", tool_use["id"]}, {"content", "Sunny, 21 degrees"}}}}};
  const json next{{"model", "qwen"},
                  {"messages", {user, assistant, result}},
                  {"tools", {kWeatherTool}},
                  {"temperature", 0},
                  {"max_tokens", 20}};
  auto [nst, n] = post("/v1/messages", next);
  ASSERT_EQ(nst, 200) << n.dump();
  json chat_assistant = {{"role", "assistant"},
                         {"content", text_of(m)},
                         {"tool_calls",
                          {{{"id", tool_use["id"]},
                            {"type", "function"},
                            {"function", {{"name", "get_weather"}, {"arguments", tool_use["input"].dump()}}}}}}};
  for (const json& b : m["content"])
    if (b["type"] == "thinking") chat_assistant["reasoning_content"] = b["thinking"];
  // In the order the route writes a tool (name, description, parameters): the template renders keys as given.
  const OJson fn{{"name", "get_weather"},
                 {"description", kWeatherTool["description"]},
                 {"parameters", OJson::parse(kWeatherTool["input_schema"].dump())}};
  const OJson chat{
      {"model", "qwen"},
      {"messages",
       {user, chat_assistant, {{"role", "tool"}, {"tool_call_id", tool_use["id"]}, {"content", "Sunny, 21 degrees"}}}},
      {"tools", {{{"type", "function"}, {"function", fn}}}},
      {"temperature", 0},
      {"max_tokens", 20}};
  auto cr = client().Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(cr);
  ASSERT_EQ(cr->status, 200) << cr->body;
  const json c = json::parse(cr->body);
  EXPECT_EQ(n["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
  const json& cm = c["choices"][0]["message"];
  EXPECT_EQ(text_of(n), cm["content"].is_string() ? cm["content"].get<std::string>() : std::string());

  // count_tokens with tools counts the tools' rendering too.
  json count_body = next;
  count_body.erase("max_tokens");
  auto [kst, k] = post("/v1/messages/count_tokens", count_body);
  ASSERT_EQ(kst, 200) << k.dump();
  EXPECT_EQ(k["input_tokens"], n["usage"]["input_tokens"]);
}

TEST_F(AnthropicHttp, StopSequenceEndsTheTextAndIsNamed) {
  const json body{
      {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}, {"max_tokens", 40}, {"temperature", 0}};
  auto [st, full] = post("/v1/messages", body);
  ASSERT_EQ(st, 200) << full.dump();
  const std::string text = text_of(full);
  ASSERT_GE(text.size(), 12u) << text;
  // A piece of the answer after its first few characters: the answer stops before its first occurrence.
  const std::string stop = text.substr(text.size() / 2, 3);
  const size_t at = text.find(stop);
  ASSERT_GT(at, 0u);
  json cut = body;
  cut["stop_sequences"] = {"never-in-this-story", stop};
  auto [cst, m] = post("/v1/messages", cut);
  ASSERT_EQ(cst, 200) << m.dump();
  EXPECT_EQ(m["stop_reason"], "stop_sequence") << m.dump();
  EXPECT_EQ(m["stop_sequence"], stop);
  EXPECT_EQ(text_of(m), text.substr(0, at));
  json folded = fold_stream(stream(cut));
  EXPECT_EQ(folded["stop_reason"], "stop_sequence");
  EXPECT_EQ(folded["stop_sequence"], stop);
  EXPECT_EQ(text_of(folded), text.substr(0, at));
  // Without a stop sequence in the request, the same answer ends as before.
  EXPECT_NE(full["stop_reason"], "stop_sequence");
  EXPECT_EQ(full["stop_sequence"], nullptr);
}

// <think> text is a "thinking" block before the text, streamed as
// thinking_delta events and a signature_delta (llama.cpp's `grammar` makes
// the random model write it); `thinking` disabled renders the prompt
// without it, as chat_template_kwargs.enable_thinking false does.
TEST_F(AnthropicHttp, ThinkTextBecomesAThinkingBlockStreamedAndNot) {
  const json body{{"model", "qwen"},
                  {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                  {"temperature", 0},
                  {"max_tokens", 100},
                  {"thinking", {{"type", "enabled"}}},  // a budget is >= 1024 and < max_tokens: over this context
                  {"grammar", R"(root ::= "<think>\nI should greet.\n</think>\n\nHello there")"}};
  auto [st, m] = post("/v1/messages", body);
  ASSERT_EQ(st, 200) << m.dump();
  EXPECT_EQ(m["stop_reason"], "end_turn");
  EXPECT_EQ(m["content"], json::parse(R"([{"type": "thinking", "thinking": "I should greet.", "signature": ""},
                                          {"type": "text", "text": "Hello there"}])"));
  const std::vector<json> evs = stream(body);
  json folded = fold_stream(evs);
  folded["id"] = m["id"];
  EXPECT_EQ(folded, m);
  std::vector<std::string> deltas;
  for (const json& e : evs)
    if (e["type"] == "content_block_delta") deltas.push_back(e["delta"]["type"]);
  ASSERT_GE(deltas.size(), 3u);
  EXPECT_EQ(deltas.front(), "thinking_delta");
  EXPECT_EQ(deltas.back(), "text_delta");
  EXPECT_NE(std::find(deltas.begin(), deltas.end(), "signature_delta"), deltas.end());

  json off = body;
  off["thinking"] = {{"type", "disabled"}};
  off.erase("grammar");
  off["max_tokens"] = 8;
  auto [ost, o] = post("/v1/messages", off);
  ASSERT_EQ(ost, 200) << o.dump();
  const json chat{{"model", "qwen"},
                  {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                  {"temperature", 0},
                  {"max_tokens", 8},
                  {"chat_template_kwargs", {{"enable_thinking", false}}}};
  auto [cst, c] = post("/v1/chat/completions", chat);
  ASSERT_EQ(cst, 200) << c.dump();
  EXPECT_EQ(o["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
  EXPECT_EQ(text_of(o), c["choices"][0]["message"]["content"].get<std::string>());
  json on = off;
  on["thinking"] = {{"type", "enabled"}};
  auto [nst, n] = post("/v1/messages", on);
  ASSERT_EQ(nst, 200) << n.dump();
  EXPECT_NE(n["usage"]["input_tokens"], o["usage"]["input_tokens"]);  // Qwen3's template differs by thinking
  json count_off = off;
  count_off.erase("max_tokens");
  auto [kst, k] = post("/v1/messages/count_tokens", count_off);
  ASSERT_EQ(kst, 200) << k.dump();
  EXPECT_EQ(k["input_tokens"], o["usage"]["input_tokens"]);
}

TEST_F(AnthropicHttp, ErrorsTakeAnthropicsShapeAndTheServerKeepsServing) {
  auto expect_error = [&](const std::string& path, const json& body, int status, const char* type,
                          const char* mentions) {
    auto [st, e] = post(path, body);
    EXPECT_EQ(st, status) << path << " " << body.dump() << " -> " << e.dump();
    EXPECT_EQ(e["type"], "error") << e.dump();
    EXPECT_EQ(e["error"]["type"], type) << e.dump();
    EXPECT_NE(e["error"]["message"].get<std::string>().find(mentions), std::string::npos) << e.dump();
  };
  const json user = json::array({{{"role", "user"}, {"content", "Hi"}}});
  expect_error("/v1/messages", {{"messages", user}}, 400, "invalid_request_error", "max_tokens");
  expect_error("/v1/messages", {{"messages", user}, {"max_tokens", 0}}, 400, "invalid_request_error", "max_tokens");
  expect_error("/v1/messages", {{"messages", user}, {"max_tokens", 5}, {"model", "nope"}}, 404, "not_found_error",
               "nope");
  expect_error(
      "/v1/messages",
      {{"messages",
        {{{"role", "user"}, {"content", {{{"type", "image"}, {"source", {{"type", "base64"}, {"data", ""}}}}}}}}},
       {"max_tokens", 5}},
      400, "invalid_request_error", "text only");
  json many = json::array();
  for (int k = 0; k < 17; ++k) many.push_back(std::string(1, static_cast<char>('a' + k)));
  expect_error("/v1/messages", {{"messages", user}, {"max_tokens", 5}, {"stop_sequences", many}}, 400,
               "invalid_request_error", "'stop_sequences'");
  expect_error("/v1/messages",
               {{"messages", user},
                {"max_tokens", 5},
                {"tools", {kWeatherTool}},
                {"tool_choice", {{"type", "tool"}, {"name", "nope"}}}},
               400, "invalid_request_error", "nope");
  expect_error("/v1/messages", {{"messages", user}, {"max_tokens", 5}, {"temperature", 3}}, 400,
               "invalid_request_error", "temperature");
  expect_error("/v1/messages", {{"messages", user}, {"max_tokens", 100000}}, 400, "invalid_request_error",
               "context length");
  expect_error("/v1/messages/count_tokens", {{"messages", "Hi"}}, 400, "invalid_request_error", "messages");
  expect_error("/v1/messages/batches", {{"requests", json::array()}}, 404, "not_found_error", "/v1/messages/batches");
  auto r = client().Get("/v1/messages");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "not_found_error");
  // Other routes keep OpenAI's shape.
  auto [cst, c] = post("/v1/chat/completions", {{"messages", "x"}});
  EXPECT_EQ(cst, 400);
  EXPECT_TRUE(c["error"].contains("param")) << c.dump();
  // Still serving.
  auto [st, m] = post("/v1/messages", {{"messages", user}, {"max_tokens", 3}});
  EXPECT_EQ(st, 200) << m.dump();
}

class AnthropicHttpSlowSteps : public AnthropicHttp {
 protected:
  engine::ModelPool::Loader loader() override {
    return engine::gguf_model_loader([](engine::SchedulerOptions& so) {
      so.on_step = [](int64_t, int64_t) { std::this_thread::sleep_for(std::chrono::milliseconds(10)); };
    });
  }
};

// A stream cut after it started (here: the server stops) ends with an
// `error` event in Anthropic's shape, and nothing after it.
TEST_F(AnthropicHttpSlowSteps, StreamCutMidwayEndsWithAnErrorEvent) {
  const json body{{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                  {"max_tokens", 400},
                  {"ignore_eos", true},
                  {"stream", true}};
  std::mutex mu;
  std::condition_variable cv;
  std::string got;
  int status = -1;
  std::thread reader([&] {
    auto c = client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/messages";
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
                            [&] { return got.find("text_delta") != std::string::npos || status != -1; }));
  }
  server_->stop();
  reader.join();
  EXPECT_EQ(status, 200);
  const size_t last = got.rfind("event: ");
  ASSERT_NE(last, std::string::npos) << got;
  const std::string ev = got.substr(last);
  ASSERT_EQ(ev.rfind("event: error\ndata: ", 0), 0u) << ev;
  const json data = json::parse(ev.substr(ev.find('\n') + 7));
  EXPECT_EQ(data["type"], "error");
  EXPECT_EQ(data["error"]["type"], "overloaded_error");  // 503 shutting_down
  EXPECT_FALSE(data["error"]["message"].get<std::string>().empty());
  EXPECT_EQ(got.find("message_stop"), std::string::npos);
}

class AnthropicHttpKey : public AnthropicHttp {
 protected:
  std::string api_key() const override { return "sk-test-key"; }
};

TEST_F(AnthropicHttpKey, XApiKeyOrBearerIsAcceptedAndA401IsAnthropicShaped) {
  const json body{{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}};
  auto [st, e] = post("/v1/messages/count_tokens", body);
  EXPECT_EQ(st, 401);
  EXPECT_EQ(e, json::parse(R"({"type": "error", "error": {"type": "authentication_error", "message":
      "You didn't provide an API key. Provide it in the Authorization header (Authorization: Bearer YOUR_KEY) or the x-api-key header."}})"));
  auto [wst, w] = post("/v1/messages", body, {{"x-api-key", "sk-test-kez"}});
  EXPECT_EQ(wst, 401);
  EXPECT_EQ(w["error"]["type"], "authentication_error");
  EXPECT_EQ(w["error"]["message"], "Incorrect API key provided.");
  auto [pst, p] = post("/v1/messages", body, {{"x-api-key", "sk-test-key-longer"}});
  EXPECT_EQ(pst, 401);
  auto [xst, x] = post("/v1/messages/count_tokens", body, {{"x-api-key", "sk-test-key"}});
  EXPECT_EQ(xst, 200) << x.dump();
  EXPECT_GT(x["input_tokens"].get<int64_t>(), 0);
  auto [bst, b] = post("/v1/messages/count_tokens", body, {{"Authorization", "Bearer sk-test-key"}});
  EXPECT_EQ(bst, 200) << b.dump();
  EXPECT_EQ(b, x);
  // A wrong Bearer next to the right x-api-key: the key is there, accepted.
  auto [mst, mm] =
      post("/v1/messages/count_tokens", body, {{"Authorization", "Bearer wrong"}, {"x-api-key", "sk-test-key"}});
  EXPECT_EQ(mst, 200) << mm.dump();
  // x-api-key on the other /v1 routes too (an Anthropic-configured client lists models); a 401 there is OpenAI's.
  auto c = client();
  auto models = c.Get("/v1/models", {{"x-api-key", "sk-test-key"}});
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  auto denied = c.Get("/v1/models", {{"x-api-key", "nope"}});
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->status, 401);
  EXPECT_EQ(json::parse(denied->body)["error"]["code"], "invalid_api_key");
  // An empty x-api-key is no key.
  auto [est, ee] = post("/v1/messages/count_tokens", body, {{"x-api-key", ""}});
  EXPECT_EQ(est, 401) << ee.dump();
}

// Sends `bytes` on a fresh connection to 127.0.0.1:`port` and reads until
// the server closes; returns {status, parsed body} (body null if not JSON).
std::pair<int, json> raw_exchange(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {-1, json()};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return {-1, json()};
  }
  timeval tv{.tv_sec = 30, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  // The server may answer (and close) before it has read everything.
  for (size_t at = 0; at < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) break;
    at += static_cast<size_t>(n);
  }
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  if (resp.rfind("HTTP/1.1 ", 0) != 0) return {-1, json()};
  const size_t body = resp.find("\r\n\r\n");
  return {std::stoi(resp.substr(9, 3)),
          json::parse(body == std::string::npos ? "" : resp.substr(body + 4), nullptr, false)};
}

// Errors the transport answers before any route runs (413 body too large,
// 431 header too large or too many fields, 404 unknown path) take the shape of the API the path belongs to, as 401
// does: Anthropic's under /v1/messages, Ollama's under /api/, else OpenAI's.
TEST_F(AnthropicHttp, TransportErrorsTakeTheShapeOfThePathsApi) {
  const std::string big_header = "X-Big: " + std::string(70000, 'a') + "\r\n";
  std::string many_fields;
  for (int i = 0; i < 300; ++i) many_fields += "X-F" + std::to_string(i) + ": 1\r\n";
  struct Case {
    const char* what;
    std::string headers;
    std::string method;
    int status;
  };
  const std::vector<Case> cases = {
      {"body too large", "Content-Length: 99999999\r\n", "POST", 413},
      {"header too large", big_header, "POST", 431},
      {"too many header fields", many_fields, "POST", 431},
  };
  for (const Case& c : cases) {
    for (const std::string path : {"/v1/messages", "/v1/messages/count_tokens", "/api/chat", "/v1/chat/completions"}) {
      SCOPED_TRACE(std::string(c.what) + " on " + path);
      const std::string query = path == "/v1/messages" ? "?beta=true" : "";  // the query is not the path
      const auto [status, body] =
          raw_exchange(port_, c.method + " " + path + query + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
                                  c.headers + "Content-Type: application/json\r\n\r\n");
      EXPECT_EQ(status, c.status) << body.dump();
      ASSERT_TRUE(body.is_object()) << body.dump();
      if (path.starts_with("/v1/messages")) {
        EXPECT_EQ(body["type"], "error") << body.dump();
        EXPECT_EQ(body["error"]["type"], anthropic_error_type(c.status)) << body.dump();
        EXPECT_TRUE(body["error"]["message"].is_string()) << body.dump();
        EXPECT_EQ(body.size(), 2u) << body.dump();
      } else if (path.starts_with("/api/")) {
        ASSERT_TRUE(body["error"].is_string()) << body.dump();
        EXPECT_FALSE(body["error"].get<std::string>().empty());
        EXPECT_EQ(body.size(), 1u) << body.dump();
      } else {
        ASSERT_TRUE(body["error"].is_object()) << body.dump();
        EXPECT_TRUE(body["error"]["message"].is_string()) << body.dump();
        EXPECT_TRUE(body["error"].contains("code")) << body.dump();
      }
    }
  }
  // An unknown path under /v1/messages: Anthropic's not_found_error.
  const auto [st, nf] = raw_exchange(port_, "GET /v1/messages/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(st, 404);
  EXPECT_EQ(nf["type"], "error") << nf.dump();
  EXPECT_EQ(nf["error"]["type"], "not_found_error") << nf.dump();
}

}  // namespace
}  // namespace bonsai::server
