// OpenAI's Responses API (src/server/routes_responses.*): the request
// translation and its 400s, the output items and their stream events, the
// bounded store; and over HTTP on an in-process Server (stories260K and the
// Qwen3 fixture): text streamed and not, equal to chat completions of the
// same conversation (one preparation path), max_output_tokens -> incomplete,
// function tools and function_call_output, json_schema, previous_response_id,
// store: false, GET / DELETE.
#include <gtest/gtest.h>
#include <httplib.h>

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
#include "server/routes_responses.h"
#include "server/server.h"

namespace bonsai::server {
namespace {

using nlohmann::json;
using OJson = nlohmann::ordered_json;

// ---- translation ------------------------------------------------------------

ResponsesRequest parse_ok(const std::string& body) {
  ResponsesRequest rr;
  auto e = parse_responses_request(body, rr);
  EXPECT_FALSE(e.has_value()) << body << " -> " << (e ? e->message : "");
  return rr;
}

TEST(ResponsesTranslate, StringInputIsOneUserMessage) {
  auto rr = parse_ok(R"({"model": "m", "input": "Hi", "instructions": "Be brief", "max_output_tokens": 7,
                         "temperature": 0.5, "store": false, "stream": true, "metadata": {"k": "v"}})");
  EXPECT_EQ(rr.input_messages, OJson::parse(R"([{"role": "user", "content": "Hi"}])"));
  EXPECT_EQ(rr.instructions, "Be brief");
  EXPECT_EQ(rr.chat["max_completion_tokens"], 7);
  EXPECT_EQ(rr.chat["temperature"], 0.5);
  EXPECT_EQ(rr.chat["model"], "m");
  EXPECT_FALSE(rr.store);
  EXPECT_TRUE(rr.stream);
  EXPECT_EQ(rr.echo["instructions"], "Be brief");
  EXPECT_EQ(rr.echo["metadata"], json({{"k", "v"}}));
  EXPECT_EQ(rr.echo["max_output_tokens"], 7);
  EXPECT_EQ(rr.echo["tool_choice"], "auto");
  EXPECT_EQ(rr.echo["text"], json::parse(R"({"format": {"type": "text"}})"));
}

TEST(ResponsesTranslate, ItemsMapOntoChatMessagesAndToolCalls) {
  auto rr = parse_ok(R"({"input": [
      {"role": "developer", "content": "sys"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                       {"type": "input_text", "text": "b"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
      {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{\"x\":1}"},
      {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "one"},
      {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "two"}]}]})");
  const OJson want = OJson::parse(R"([
      {"role": "developer", "content": "sys"},
      {"role": "user", "content": "a\nb"},
      {"role": "assistant", "content": "Let me look.", "reasoning_content": "hmm",
       "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
                      {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "one"},
      {"role": "tool", "tool_call_id": "call_2", "content": "two"}])");
  EXPECT_EQ(rr.input_messages.dump(), want.dump());
}

TEST(ResponsesTranslate, ToolsTextFormatAndToolChoiceTakeChatShapes) {
  auto rr = parse_ok(R"({"input": "x",
      "tools": [{"type": "function", "name": "get_weather", "description": "d",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}],
      "tool_choice": {"type": "function", "name": "get_weather"},
      "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": true}},
      "reasoning": {"effort": "none"}})");
  EXPECT_EQ(rr.chat["tools"].dump(),
            OJson::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "d",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}}])")
                .dump());
  EXPECT_EQ(rr.chat["tool_choice"].dump(), R"({"type":"function","function":{"name":"get_weather"}})");
  EXPECT_EQ(rr.chat["response_format"].dump(),
            R"({"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object"},"strict":true}})");
  EXPECT_EQ(rr.chat["chat_template_kwargs"].dump(), R"({"enable_thinking":false})");
  // The Response repeats the tools in their Responses shape.
  EXPECT_EQ(rr.echo["tools"][0]["name"], "get_weather");
  EXPECT_EQ(rr.echo["reasoning"]["effort"], "none");
  auto obj = parse_ok(R"({"input": "x", "text": {"format": {"type": "json_object"}}})");
  EXPECT_EQ(obj.chat["response_format"].dump(), R"({"type":"json_object"})");
}

TEST(ResponsesTranslate, BadShapesAre400NamingTheResponsesField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({})", "input"},
      {R"({"input": 5})", "input"},
      {R"({"input": [{"type": "bogus"}]})", "input[0].type"},
      {R"({"input": [{"role": "robot", "content": "x"}]})", "input[0].role"},
      {R"({"input": [{"role": "user"}]})", "input[0].content"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})",
       "input[0].content[0].type"},
      {R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})", "input[0].call_id"},
      {R"({"input": [{"type": "function_call_output", "call_id": "c"}]})", "input[0].output"},
      {R"({"input": "x", "instructions": 3})", "instructions"},
      {R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type"},
      {R"({"input": "x", "tools": [{"type": "function"}]})", "tools[0].name"},
      {R"({"input": "x", "tool_choice": {"type": "file_search"}})", "tool_choice.type"},
      {R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}})", "text.format.schema"},
      {R"({"input": "x", "text": {"format": {"type": "xml"}}})", "text.format.type"},
      {R"({"input": "x", "store": "yes"})", "store"},
      {R"({"input": "x", "metadata": {"a": 1}})", "metadata.a"},
      {R"({"input": "x", "previous_response_id": 7})", "previous_response_id"},
  };
  for (const auto& [body, param] : cases) {
    ResponsesRequest rr;
    auto e = parse_responses_request(body, rr);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->status, 400) << body;
    EXPECT_EQ(e->param, param) << body << " -> " << e->message;
    EXPECT_NE(e->message.find(param), std::string::npos) << e->message;
  }
  ResponsesRequest rr;
  auto e = parse_responses_request("{\"input\": ", rr);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "invalid_json");
}

TEST(ResponsesTranslate, ChatParamsAreRenamed) {
  EXPECT_EQ(responses_param("max_completion_tokens"), "max_output_tokens");
  EXPECT_EQ(responses_param("response_format.json_schema.schema"), "text.format.schema");
  EXPECT_EQ(responses_param("response_format.type"), "text.format.type");
  EXPECT_EQ(responses_param("tools[3].function.name"), "tools[3].name");
  EXPECT_EQ(responses_param("tool_choice.function.name"), "tool_choice.name");
  EXPECT_EQ(responses_param("messages[2].content"), "input");
  EXPECT_EQ(responses_param("temperature"), "temperature");
  ApiError e = bad_request("Invalid value for 'max_completion_tokens': 0 is not in [1, 5].", "max_completion_tokens");
  e = responses_error(e);
  EXPECT_EQ(e.param, "max_output_tokens");
  EXPECT_EQ(e.message, "Invalid value for 'max_output_tokens': 0 is not in [1, 5].");
}

// ---- output items and events ----------------------------------------------

TEST(ResponsesOutput, ReasoningTextAndToolCallsBecomeItemsWithTheirEvents) {
  std::vector<std::pair<std::string, json>> events;
  ResponseOutput out([&](const char* type, json f) { events.emplace_back(type, std::move(f)); });
  engine::ChatOutputDelta d1;
  d1.reasoning = "think";
  out.add(d1);
  engine::ChatOutputDelta d2;
  d2.reasoning = "ing";
  d2.content = "Hello";
  out.add(d2);
  engine::ChatOutputDelta d3;
  d3.content = " world";
  d3.tool_calls.push_back({"f", R"({"a":1})"});
  out.add(d3);
  engine::ChatOutputDelta d4;
  d4.content = "\n\n";  // blank text after a call opens no message
  out.add(d4);
  out.finish(false);

  const json& items = out.items();
  ASSERT_EQ(items.size(), 3u) << items.dump();
  EXPECT_EQ(items[0]["type"], "reasoning");
  EXPECT_EQ(items[0]["content"][0], json({{"type", "reasoning_text"}, {"text", "thinking"}}));
  EXPECT_EQ(items[1]["type"], "message");
  EXPECT_EQ(items[1]["status"], "completed");
  EXPECT_EQ(items[1]["content"][0]["type"], "output_text");
  EXPECT_EQ(items[1]["content"][0]["text"], "Hello world");
  EXPECT_EQ(items[2]["type"], "function_call");
  EXPECT_EQ(items[2]["name"], "f");
  EXPECT_EQ(items[2]["arguments"], R"({"a":1})");
  EXPECT_EQ(items[2]["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(out.text(), "Hello world");

  std::vector<std::string> types;
  for (const auto& [t, f] : events) types.push_back(t);
  const std::vector<std::string> want = {"response.output_item.added",
                                         "response.content_part.added",
                                         "response.reasoning_text.delta",
                                         "response.reasoning_text.delta",
                                         "response.reasoning_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.content_part.added",
                                         "response.output_text.delta",
                                         "response.output_text.delta",
                                         "response.output_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.done",
                                         "response.output_item.done"};
  EXPECT_EQ(types, want);
  EXPECT_EQ(events[9].second["delta"], "Hello");
  EXPECT_EQ(events[9].second["output_index"], 1);
  EXPECT_EQ(events[9].second["item_id"], items[1]["id"]);
  EXPECT_EQ(events[11].second["text"], "Hello world");
  EXPECT_EQ(events[13].second["item"], items[1]);
  EXPECT_EQ(events.back().second["item"], items[2]);

  const OJson msg = out.assistant_message();
  EXPECT_EQ(msg["content"], "Hello world");
  EXPECT_EQ(msg["reasoning_content"], "thinking");
  EXPECT_EQ(msg["tool_calls"][0]["id"], items[2]["call_id"]);
}

TEST(ResponsesOutput, EmptyAnswerIsOneEmptyMessageAndACutOneIsIncomplete) {
  ResponseOutput empty;
  empty.finish(false);
  ASSERT_EQ(empty.items().size(), 1u);
  EXPECT_EQ(empty.items()[0]["content"][0]["text"], "");
  ResponseOutput cut;
  engine::ChatOutputDelta d;
  d.content = "Once";
  cut.add(d);
  cut.finish(true);
  EXPECT_EQ(cut.items()[0]["status"], "incomplete");
}

TEST(ResponsesStore, BoundedByCountAndBytesLeastRecentlyUsedFirst) {
  ResponseStore s(3, 1 << 20);
  for (const char* id : {"a", "b", "c"}) s.put(id, json{{"id", id}}, OJson::array());
  ASSERT_NE(s.get("a"), nullptr);  // a is now the most recent: b goes first
  s.put("d", json{{"id", "d"}}, OJson::array());
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s.get("b"), nullptr);
  EXPECT_NE(s.get("a"), nullptr);
  EXPECT_EQ(s.get("d")->response["id"], "d");
  EXPECT_TRUE(s.erase("d"));
  EXPECT_FALSE(s.erase("d"));
  EXPECT_EQ(s.size(), 2u);

  ResponseStore small(100, 200);
  const std::string big(150, 'x');
  small.put("one", json{{"t", big}}, OJson::array());
  EXPECT_EQ(small.size(), 1u);
  EXPECT_LE(small.bytes(), 200u);
  small.put("two", json{{"t", big}}, OJson::array());  // both would be over 200 bytes: one goes
  EXPECT_EQ(small.size(), 1u);
  EXPECT_EQ(small.get("one"), nullptr);
  small.put("huge", json{{"t", std::string(300, 'y')}}, OJson::array());  // above the bound: not kept
  EXPECT_EQ(small.get("huge"), nullptr);
  EXPECT_NE(small.get("two"), nullptr);
}

// ---- over HTTP --------------------------------------------------------------

const std::string kStories = test::shared_path("models/stories260K/stories260K.gguf");
const std::string kQwen = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");

// A Server on 127.0.0.1 (free port) serving "stories" (the default) and "qwen".
class ResponsesHttp : public ::testing::Test {
 protected:
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
  std::pair<int, json> call(const std::string& method, const std::string& path) const {
    auto c = client();
    auto r = method == "GET" ? c.Get(path.c_str()) : c.Delete(path.c_str());
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  // The typed events of a streamed create: each "event: T\ndata: {...}" with
  // T == data.type; sequence numbers 0, 1, 2, ...
  std::vector<json> stream(json body) const {
    body["stream"] = true;
    auto r = client().Post("/v1/responses", body.dump(), "application/json");
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
      EXPECT_EQ(data["sequence_number"], out.size());
      out.push_back(std::move(data));
    }
    return out;
  }

  std::shared_ptr<engine::ModelPool> pool_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// The text of a Response's message items.
std::string output_text(const json& r) {
  std::string s;
  for (const json& item : r["output"])
    if (item["type"] == "message")
      for (const json& part : item["content"])
        if (part["type"] == "output_text") s += part["text"].get<std::string>();
  return s;
}

const json* item_of(const json& r, const std::string& type) {
  for (const json& item : r["output"])
    if (item["type"] == type) return &item;
  return nullptr;
}

TEST_F(ResponsesHttp, TextEqualsChatCompletionsOfTheSameConversation) {
  const json body{
      {"model", "stories"}, {"input", "Once upon a time"}, {"instructions", "Tell a story."}, {"max_output_tokens", 12},
      {"temperature", 0},   {"metadata", {{"run", "1"}}}};
  auto [st, r] = post("/v1/responses", body);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(r["model"], "stories");
  EXPECT_EQ(r["instructions"], "Tell a story.");
  EXPECT_EQ(r["metadata"], json({{"run", "1"}}));
  EXPECT_GT(r["created_at"].get<int64_t>(), 1700000000);
  ASSERT_EQ(r["output"].size(), 1u) << r.dump();
  EXPECT_EQ(r["output"][0]["role"], "assistant");
  EXPECT_EQ(r["output"][0]["id"].get<std::string>().rfind("msg_", 0), 0u);

  const json chat{
      {"model", "stories"},
      {"messages",
       {{{"role", "system"}, {"content", "Tell a story."}}, {{"role", "user"}, {"content", "Once upon a time"}}}},
      {"max_tokens", 12},
      {"temperature", 0}};
  auto [cst, c] = post("/v1/chat/completions", chat);
  ASSERT_EQ(cst, 200) << c.dump();
  EXPECT_EQ(output_text(r), c["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_FALSE(output_text(r).empty());
  const json& u = r["usage"];
  EXPECT_EQ(u["input_tokens"], c["usage"]["prompt_tokens"]);
  EXPECT_EQ(u["output_tokens"], c["usage"]["completion_tokens"]);
  EXPECT_EQ(u["total_tokens"], u["input_tokens"].get<int64_t>() + u["output_tokens"].get<int64_t>());
  EXPECT_TRUE(u["input_tokens_details"]["cached_tokens"].is_number_integer());
  EXPECT_EQ(u["output_tokens_details"]["reasoning_tokens"], 0);
  const bool cut = c["choices"][0]["finish_reason"] == "length";
  EXPECT_EQ(r["status"], cut ? "incomplete" : "completed");
}

TEST_F(ResponsesHttp, StreamedEventsInOrderAndTheirDeltasMakeTheText) {
  const json body{{"input", "Once upon a time"}, {"max_output_tokens", 10}, {"temperature", 0}, {"ignore_eos", true}};
  auto [st, whole] = post("/v1/responses", body);
  ASSERT_EQ(st, 200) << whole.dump();
  EXPECT_EQ(whole["status"], "incomplete");
  EXPECT_EQ(whole["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(whole["usage"]["output_tokens"], 10);
  EXPECT_EQ(whole["output"][0]["status"], "incomplete");

  const std::vector<json> evs = stream(body);
  ASSERT_GE(evs.size(), 9u);
  std::vector<std::string> types;
  for (const json& e : evs) types.push_back(e["type"]);
  EXPECT_EQ(types[0], "response.created");
  EXPECT_EQ(types[1], "response.in_progress");
  EXPECT_EQ(types[2], "response.output_item.added");
  EXPECT_EQ(types[3], "response.content_part.added");
  const size_t n = types.size();
  EXPECT_EQ(types[n - 4], "response.output_text.done");
  EXPECT_EQ(types[n - 3], "response.content_part.done");
  EXPECT_EQ(types[n - 2], "response.output_item.done");
  EXPECT_EQ(types[n - 1], "response.incomplete");  // cut by max_output_tokens: the last event
  EXPECT_EQ(evs[0]["response"]["status"], "in_progress");
  EXPECT_EQ(evs[0]["response"]["output"], json::array());
  const std::string id = evs[0]["response"]["id"];
  std::string deltas;
  for (size_t i = 4; i < n - 4; ++i) {
    EXPECT_EQ(types[i], "response.output_text.delta");
    EXPECT_EQ(evs[i]["output_index"], 0);
    EXPECT_EQ(evs[i]["content_index"], 0);
    EXPECT_EQ(evs[i]["item_id"], evs[2]["item"]["id"]);
    deltas += evs[i]["delta"].get<std::string>();
  }
  EXPECT_EQ(deltas, output_text(whole));  // temperature 0: the same text as the non-streamed one
  EXPECT_EQ(evs[n - 4]["text"], deltas);
  const json& final_r = evs[n - 1]["response"];
  EXPECT_EQ(final_r["id"], id);
  EXPECT_EQ(final_r["status"], "incomplete");
  EXPECT_EQ(output_text(final_r), deltas);
  EXPECT_EQ(final_r["output"][0], evs[n - 2]["item"]);
  EXPECT_EQ(final_r["usage"]["output_tokens"], 10);
  // The streamed response was stored as it ended.
  auto [gst, got] = call("GET", "/v1/responses/" + id);
  ASSERT_EQ(gst, 200) << got.dump();
  EXPECT_EQ(got, final_r);
}

const json kWeatherTool = json::parse(R"({"type": "function", "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                   "required": ["city"], "additionalProperties": false}})");

TEST_F(ResponsesHttp, RequiredToolGivesAFunctionCallItemAndItsOutputContinues) {
  json body{{"model", "qwen"},
            {"input", "What is the weather in Paris?"},
            {"tools", {kWeatherTool}},
            {"tool_choice", "required"},
            {"parallel_tool_calls", false},
            {"temperature", 0},
            {"max_output_tokens", 300}};
  auto [st, r] = post("/v1/responses", body);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["status"], "completed") << r.dump();
  const json* fc = item_of(r, "function_call");
  ASSERT_NE(fc, nullptr) << r.dump();
  EXPECT_EQ((*fc)["name"], "get_weather");
  EXPECT_EQ((*fc)["status"], "completed");
  EXPECT_EQ((*fc)["id"].get<std::string>().rfind("fc_", 0), 0u);
  const std::string call_id = (*fc)["call_id"];
  EXPECT_EQ(call_id.rfind("call_", 0), 0u);
  const json args = json::parse((*fc)["arguments"].get<std::string>());
  ASSERT_TRUE(args.is_object());
  EXPECT_TRUE(args["city"].is_string()) << args.dump();
  EXPECT_EQ(r["tools"][0]["name"], "get_weather");  // the Responses shape, repeated

  // Streamed: the call's arguments events.
  const std::vector<json> evs = stream(body);
  ASSERT_FALSE(evs.empty());
  bool saw_delta = false, saw_done = false;
  for (const json& e : evs) {
    if (e["type"] == "response.function_call_arguments.delta") saw_delta = true;
    if (e["type"] == "response.function_call_arguments.done") {
      saw_done = true;
      EXPECT_EQ(e["name"], "get_weather");
      EXPECT_TRUE(json::parse(e["arguments"].get<std::string>()).is_object());
    }
  }
  EXPECT_TRUE(saw_delta && saw_done);
  EXPECT_EQ(evs.back()["type"], "response.completed");

  // The call's output, as items: the same prompt as chat's assistant tool_calls + tool message.
  json items = json::array(
      {{{"role", "user"}, {"content", "What is the weather in Paris?"}},
       {{"type", "function_call"}, {"call_id", call_id}, {"name", "get_weather"}, {"arguments", (*fc)["arguments"]}},
       {{"type", "function_call_output"}, {"call_id", call_id}, {"output", "Sunny, 21 C"}}});
  json follow{
      {"model", "qwen"}, {"input", items}, {"tools", {kWeatherTool}}, {"temperature", 0}, {"max_output_tokens", 8}};
  auto [fst, f] = post("/v1/responses", follow);
  ASSERT_EQ(fst, 200) << f.dump();
  // In document order: the template renders each tool's keys as given (name, description, parameters).
  const OJson chat{{"model", "qwen"},
                   {"messages",
                    {{{"role", "user"}, {"content", "What is the weather in Paris?"}},
                     {{"role", "assistant"},
                      {"content", nullptr},
                      {"tool_calls",
                       {{{"id", call_id},
                         {"type", "function"},
                         {"function", {{"name", "get_weather"}, {"arguments", (*fc)["arguments"]}}}}}}},
                     {{"role", "tool"}, {"tool_call_id", call_id}, {"content", "Sunny, 21 C"}}}},
                   {"tools",
                    {{{"type", "function"},
                      {"function",
                       {{"name", "get_weather"},
                        {"description", kWeatherTool["description"].get<std::string>()},
                        {"parameters", OJson::parse(kWeatherTool["parameters"].dump())}}}}}},
                   {"temperature", 0},
                   {"max_tokens", 8}};
  auto cr = client().Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(cr);
  ASSERT_EQ(cr->status, 200) << cr->body;
  const json c = json::parse(cr->body);
  EXPECT_EQ(f["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
  EXPECT_EQ(output_text(f), c["choices"][0]["message"]["content"].is_string()
                                ? c["choices"][0]["message"]["content"].get<std::string>()
                                : std::string());

  // The same through previous_response_id: the stored conversation holds the call.
  json cont{
      {"model", "qwen"},
      {"previous_response_id", r["id"]},
      {"input", json::array({{{"type", "function_call_output"}, {"call_id", call_id}, {"output", "Sunny, 21 C"}}})},
      {"tools", {kWeatherTool}},
      {"temperature", 0},
      {"max_output_tokens", 8}};
  auto [pst, p] = post("/v1/responses", cont);
  ASSERT_EQ(pst, 200) << p.dump();
  EXPECT_EQ(p["previous_response_id"], r["id"]);
  EXPECT_EQ(p["usage"]["input_tokens"], f["usage"]["input_tokens"]);
  EXPECT_EQ(output_text(p), output_text(f));
}

TEST_F(ResponsesHttp, JsonSchemaFormatGivesJsonThatFitsTheSchemaAsChatsResponseFormatDoes) {
  // Kept in document order (the grammar writes properties in schema order).
  const std::string schema =
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": false})";
  const std::string body = R"({"model": "qwen", "input": "Give a name and an age.", "temperature": 0,
      "max_output_tokens": 200, "text": {"format": {"type": "json_schema", "name": "person", "strict": true,
      "schema": )" + schema +
                           "}}}";
  auto r = client().Post("/v1/responses", body, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json resp = json::parse(r->body);
  EXPECT_EQ(resp["status"], "completed") << r->body;
  EXPECT_EQ(resp["text"]["format"]["name"], "person");
  const json v = json::parse(output_text(resp), nullptr, false);
  ASSERT_TRUE(v.is_object()) << output_text(resp);
  EXPECT_TRUE(v["name"].is_string());
  EXPECT_TRUE(v["age"].is_number_integer());
  EXPECT_EQ(v.size(), 2u);
  const std::string chat = R"({"model": "qwen", "messages": [{"role": "user", "content": "Give a name and an age."}],
      "temperature": 0, "max_tokens": 200, "response_format": {"type": "json_schema", "json_schema": {"name": "person",
      "strict": true, "schema": )" +
                           schema + "}}}";
  auto c = client().Post("/v1/chat/completions", chat, "application/json");
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200) << c->body;
  EXPECT_EQ(output_text(resp), json::parse(c->body)["choices"][0]["message"]["content"].get<std::string>());
}

// <think> text is a "reasoning" item before the message, streamed as
// reasoning_text events (llama.cpp's `grammar` makes the random model write it).
TEST_F(ResponsesHttp, ThinkTextBecomesAReasoningItemStreamedAndNot) {
  const json body{{"model", "qwen"},
                  {"input", "Hi"},
                  {"temperature", 0},
                  {"max_output_tokens", 100},
                  {"grammar", R"(root ::= "<think>\nI should greet.\n</think>\n\nHello there")"}};
  auto [st, r] = post("/v1/responses", body);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["status"], "completed") << r.dump();
  ASSERT_EQ(r["output"].size(), 2u) << r.dump();
  const json& rs = r["output"][0];
  EXPECT_EQ(rs["type"], "reasoning");
  EXPECT_EQ(rs["id"].get<std::string>().rfind("rs_", 0), 0u);
  EXPECT_EQ(rs["summary"], json::array());
  EXPECT_EQ(rs["content"], json::parse(R"([{"type": "reasoning_text", "text": "I should greet."}])"));
  EXPECT_EQ(output_text(r), "Hello there");

  const std::vector<json> evs = stream(body);
  std::string reasoning, text;
  std::vector<std::string> types;
  for (const json& e : evs) {
    types.push_back(e["type"]);
    if (e["type"] == "response.reasoning_text.delta") {
      EXPECT_EQ(e["output_index"], 0);
      reasoning += e["delta"].get<std::string>();
    }
    if (e["type"] == "response.output_text.delta") {
      EXPECT_EQ(e["output_index"], 1);
      text += e["delta"].get<std::string>();
    }
  }
  EXPECT_EQ(reasoning, "I should greet.");
  EXPECT_EQ(text, "Hello there");
  ASSERT_GE(types.size(), 12u);
  EXPECT_EQ(types[2], "response.output_item.added");
  EXPECT_EQ(evs[2]["item"]["type"], "reasoning");
  EXPECT_EQ(evs[3]["part"]["type"], "reasoning_text");
  EXPECT_NE(std::find(types.begin(), types.end(), "response.reasoning_text.done"), types.end());
  const json& final_r = evs.back()["response"];
  EXPECT_EQ(evs.back()["type"], "response.completed");
  ASSERT_EQ(final_r["output"].size(), 2u);
  EXPECT_EQ(final_r["output"][0]["content"], rs["content"]);
  EXPECT_EQ(output_text(final_r), "Hello there");
}

TEST_F(ResponsesHttp, PreviousResponseIdContinuesTheStoredConversation) {
  auto [st, r1] = post(
      "/v1/responses",
      json{{"input", "Once upon a time"}, {"max_output_tokens", 6}, {"temperature", 0}, {"instructions", "Be kind."}});
  ASSERT_EQ(st, 200) << r1.dump();
  auto [st2, r2] = post(
      "/v1/responses",
      json{{"input", "The end"}, {"previous_response_id", r1["id"]}, {"max_output_tokens", 6}, {"temperature", 0}});
  ASSERT_EQ(st2, 200) << r2.dump();
  EXPECT_EQ(r2["previous_response_id"], r1["id"]);
  EXPECT_TRUE(r2["instructions"].is_null());  // instructions are not carried over
  json chat{{"messages",
             {{{"role", "user"}, {"content", "Once upon a time"}},
              {{"role", "assistant"}, {"content", output_text(r1)}},
              {{"role", "user"}, {"content", "The end"}}}},
            {"max_tokens", 6},
            {"temperature", 0}};
  auto [cst, c] = post("/v1/chat/completions", chat);
  ASSERT_EQ(cst, 200) << c.dump();
  EXPECT_EQ(r2["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
  EXPECT_EQ(output_text(r2), c["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_GT(r2["usage"]["input_tokens"].get<int64_t>(), r1["usage"]["input_tokens"].get<int64_t>());

  // GET returns it; DELETE removes it; then both are 404, and so is a continuation.
  auto [gst, g] = call("GET", "/v1/responses/" + r1["id"].get<std::string>());
  ASSERT_EQ(gst, 200);
  EXPECT_EQ(g, r1);
  auto [dst, d] = call("DELETE", "/v1/responses/" + r1["id"].get<std::string>());
  ASSERT_EQ(dst, 200) << d.dump();
  EXPECT_EQ(d, json({{"id", r1["id"]}, {"object", "response.deleted"}, {"deleted", true}}));
  EXPECT_EQ(call("GET", "/v1/responses/" + r1["id"].get<std::string>()).first, 404);
  EXPECT_EQ(call("DELETE", "/v1/responses/" + r1["id"].get<std::string>()).first, 404);
  auto [nst, nf] = post("/v1/responses", json{{"input", "x"}, {"previous_response_id", r1["id"]}});
  EXPECT_EQ(nst, 404) << nf.dump();
  EXPECT_EQ(nf["error"]["param"], "previous_response_id");
  EXPECT_EQ(nf["error"]["code"], "previous_response_not_found");
}

TEST_F(ResponsesHttp, StoreFalseIsNotKept) {
  auto [st, r] = post("/v1/responses", json{{"input", "Hi"}, {"max_output_tokens", 2}, {"store", false}});
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["store"], false);
  const std::string id = r["id"];
  auto [gst, g] = call("GET", "/v1/responses/" + id);
  EXPECT_EQ(gst, 404) << g.dump();
  EXPECT_EQ(g["error"]["message"], "Response with id '" + id + "' not found.");
  auto [pst, p] = post("/v1/responses", json{{"input", "x"}, {"previous_response_id", id}});
  EXPECT_EQ(pst, 404) << p.dump();
  EXPECT_EQ(p["error"]["message"], "Previous response with id '" + id + "' not found.");
}

TEST_F(ResponsesHttp, BadInputIs400NamingTheFieldAndTheServerKeepsServing) {
  const std::vector<std::pair<json, std::string>> cases = {
      {json{{"model", "stories"}}, "input"},
      {json{{"input", "x"}, {"max_output_tokens", 0}}, "max_output_tokens"},
      {json{{"input", "x"}, {"temperature", 5}}, "temperature"},
      {json{{"input", "x"}, {"tools", {{{"type", "function"}, {"name", "a b"}}}}}, "tools[0].name"},
      {json{{"input", "x"}, {"tools", {kWeatherTool}}, {"tool_choice", {{"type", "function"}, {"name", "nope"}}}},
       "tool_choice.name"},
      {json{{"input", "x"}, {"tool_choice", "required"}}, "tool_choice"},
      {json{{"input", "x"},
            {"text", {{"format", {{"type", "json_schema"}, {"name", "s"}, {"schema", {{"type", "nonsense"}}}}}}}},
       "text.format.schema"},
      {json{{"input", json::array({{{"type", "function_call_output"}, {"output", "x"}}})}}, "input[0].call_id"},
      {json{{"input", "x"}, {"model", "no-such-model"}}, "model"},
  };
  for (const auto& [body, param] : cases) {
    auto [st, j] = post("/v1/responses", body);
    EXPECT_TRUE(st == 400 || st == 404) << body.dump() << " -> " << st;
    ASSERT_TRUE(j.contains("error")) << j.dump();
    if (param != "model") {
      EXPECT_EQ(j["error"]["param"], param) << body.dump() << " -> " << j.dump();
    }
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
  auto [st, ok] = post("/v1/responses", json{{"input", "Hi"}, {"max_output_tokens", 2}});
  EXPECT_EQ(st, 200) << ok.dump();
}

// A function_call_output answers a function_call before it (in this input
// or the stored conversation): else OpenAI's 400 naming the call_id.
TEST_F(ResponsesHttp, FunctionCallOutputWithoutItsCallIs400NamingTheCallId) {
  const json orphan{{"type", "function_call_output"}, {"call_id", "call_nope"}, {"output", "x"}};
  const json call{{"type", "function_call"}, {"call_id", "call_1"}, {"name", "f"}, {"arguments", "{}"}};
  const json answer{{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "one"}};
  const std::vector<json> inputs = {
      json::array({{{"role", "user"}, {"content", "Hi"}}, orphan}),
      json::array({{{"role", "user"}, {"content", "Hi"}}, call, answer, orphan}),
      json::array({{{"role", "user"}, {"content", "Hi"}}, orphan, call}),  // the call comes after its output
  };
  for (const json& input : inputs) {
    auto [st, j] = post("/v1/responses", json{{"input", input}, {"max_output_tokens", 2}});
    EXPECT_EQ(st, 400) << input.dump() << " -> " << j.dump();
    EXPECT_EQ(j["error"]["param"], "input") << j.dump();
    EXPECT_EQ(j["error"]["message"], "No tool call found for function call output with call_id call_nope.") << j.dump();
  }
  // The matched pair alone is served.
  auto [st, ok] =
      post("/v1/responses", json{{"model", "qwen"},
                                 {"input", json::array({{{"role", "user"}, {"content", "Hi"}}, call, answer})},
                                 {"max_output_tokens", 2}});
  EXPECT_EQ(st, 200) << ok.dump();
}

// Scheduler steps slowed to 10 ms, so a stream is still running when the server stops.
class ResponsesHttpSlowSteps : public ResponsesHttp {
 protected:
  engine::ModelPool::Loader loader() override {
    return engine::gguf_model_loader([](engine::SchedulerOptions& so) {
      so.on_step = [](int64_t, int64_t) { std::this_thread::sleep_for(std::chrono::milliseconds(10)); };
    });
  }
};

// A stream cut after it started (here: the server stops) ends with
// response.failed, its Response "failed" with the error, and nothing after.
TEST_F(ResponsesHttpSlowSteps, StreamCutMidwayEndsWithResponseFailed) {
  const json body{{"input", "Once upon a time"}, {"max_output_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
  std::mutex mu;
  std::condition_variable cv;
  std::string got;
  int status = -1;
  std::thread reader([&] {
    auto c = client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/responses";
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
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] {
      return got.find("response.output_text.delta") != std::string::npos || status != -1;
    }));
  }
  server_->stop();
  reader.join();
  EXPECT_EQ(status, 200);
  const size_t last = got.rfind("event: ");
  ASSERT_NE(last, std::string::npos) << got;
  const std::string ev = got.substr(last);
  ASSERT_EQ(ev.rfind("event: response.failed\ndata: ", 0), 0u) << ev;
  const json data = json::parse(ev.substr(ev.find('\n') + 7));
  EXPECT_EQ(data["response"]["status"], "failed");
  EXPECT_EQ(data["response"]["error"]["code"], "shutting_down");
  EXPECT_FALSE(data["response"]["error"]["message"].get<std::string>().empty());
  EXPECT_EQ(data["response"]["output"][0]["type"], "message");  // what was sent before the cut
}

}  // namespace
}  // namespace bonsai::server
