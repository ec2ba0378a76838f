// OpenAI request validation and response/chunk/SSE builders.
#include "server/openai.h"

#include <gtest/gtest.h>

namespace bonsai::server {
namespace {

using nlohmann::json;

std::optional<ApiError> parse(const std::string& body, Endpoint ep, CompletionRequest& out) {
  return parse_completion_request(body, ep, out);
}

TEST(OpenAiParse, FullChatRequest) {
  CompletionRequest r;
  auto e = parse(R"({"model":"m","messages":[{"role":"system","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"Hi "},{"type":"text","text":"there"}]}],
      "max_completion_tokens":12,"temperature":0.5,"top_p":0.9,"top_k":20,"min_p":0.1,"repeat_penalty":1.1,
      "presence_penalty":0.5,"frequency_penalty":-0.5,"seed":42,"n":2,"stream":true,
      "stream_options":{"include_usage":true},"stop":["\n\n","END"],"user":"ignored","logit_bias":{}})",
                 Endpoint::kChat, r);
  ASSERT_FALSE(e.has_value()) << e->message;
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Hi there");
  EXPECT_EQ(*r.max_tokens, 12);
  EXPECT_FLOAT_EQ(*r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*r.top_p, 0.9f);
  EXPECT_EQ(*r.top_k, 20);
  EXPECT_FLOAT_EQ(*r.min_p, 0.1f);
  EXPECT_FLOAT_EQ(*r.repeat_penalty, 1.1f);
  EXPECT_FLOAT_EQ(*r.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(*r.frequency_penalty, -0.5f);
  EXPECT_EQ(*r.seed, 42u);
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "END"}));
}

TEST(OpenAiParse, CompletionPromptForms) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"prompt":"abc","stop":"x"})", Endpoint::kCompletion, r));
  EXPECT_EQ(r.prompt, "abc");
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_FALSE(r.max_tokens.has_value());
  ASSERT_FALSE(parse(R"({"prompt":["only"]})", Endpoint::kCompletion, r));
  EXPECT_EQ(r.prompt, "only");
  ASSERT_FALSE(parse(R"({"prompt":[1,2,3]})", Endpoint::kCompletion, r));
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  ASSERT_FALSE(parse(R"({"prompt":"a","logit_bias":{"7":-100,"42":2.5}})", Endpoint::kCompletion, r));
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, float>>{{42, 2.5f}, {7, -100.0f}}));
  auto e = parse(R"({"prompt":["a","b"]})", Endpoint::kCompletion, r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "prompt");
}

struct BadCase {
  const char* body;
  Endpoint ep;
  const char* param;
};

TEST(OpenAiParse, WrongTypesAndRangesAre400NamingTheField) {
  const BadCase cases[] = {
      {R"({"messages":"hi"})", Endpoint::kChat, "messages"},
      {R"({"messages":[]})", Endpoint::kChat, "messages"},
      {R"({"model":"m"})", Endpoint::kChat, "messages"},
      {R"({"messages":[{"content":"x"}]})", Endpoint::kChat, "messages[0].role"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", Endpoint::kChat, "messages[0].role"},
      {R"({"messages":[{"role":"user","content":5}]})", Endpoint::kChat, "messages[0].content"},
      {R"({"messages":[{"role":"user","content":"x"}],"model":3})", Endpoint::kChat, "model"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", Endpoint::kChat, "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":3})", Endpoint::kChat, "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", Endpoint::kChat, "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", Endpoint::kChat, "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"10"})", Endpoint::kChat, "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":0})", Endpoint::kChat, "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":1000})", Endpoint::kChat, "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", Endpoint::kChat, "stream"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":5})", Endpoint::kChat, "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":["a",1]})", Endpoint::kChat, "stop[1]"},
      {R"({"messages":[{"role":"user","content":"x"}],"seed":"1"})", Endpoint::kChat, "seed"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_p":1.5})", Endpoint::kChat, "top_p"},
      {R"({"messages":[{"role":"user","content":"x"}],"presence_penalty":-3})", Endpoint::kChat, "presence_penalty"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":1}})", Endpoint::kChat,
       "stream_options.include_usage"},
      {R"({"prompt":5})", Endpoint::kCompletion, "prompt"},
      {R"({"prompt":"x","logit_bias":[1]})", Endpoint::kCompletion, "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"abc":1}})", Endpoint::kCompletion, "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"5":101}})", Endpoint::kCompletion, "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"5":"1"}})", Endpoint::kCompletion, "logit_bias.5"},
      {R"({"max_tokens":5})", Endpoint::kCompletion, "prompt"},
  };
  for (const auto& c : cases) {
    CompletionRequest r;
    auto e = parse(c.body, c.ep, r);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->status, 400) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << " -> " << e->message;
    EXPECT_EQ(e->type, "invalid_request_error");
  }
}

// An integral float out of range is an out-of-range value, not a wrong type.
TEST(OpenAiParse, IntegralFloatOutOfRangeIsInvalidValue) {
  CompletionRequest r;
  for (const char* body : {R"({"prompt":"x","max_tokens":1e300})", R"({"prompt":"x","max_tokens":-1e300})",
                           R"({"prompt":"x","max_tokens":4294967296.0})", R"({"prompt":"x","n":1e19})"}) {
    auto e = parse(body, Endpoint::kCompletion, r);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->code, "invalid_value") << body << " -> " << e->message;
  }
  ASSERT_FALSE(parse(R"({"prompt":"x","max_tokens":2147483647.0})", Endpoint::kCompletion, r).has_value());
  EXPECT_EQ(r.max_tokens, 2147483647);
}

TEST(OpenAiParse, MalformedJson) {
  CompletionRequest r;
  for (const char* body : {"{", "", "[1,2]", "null", "{\"messages\": [}"}) {
    auto e = parse(body, Endpoint::kChat, r);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->code, "invalid_json") << body;
  }
}

// Regression: deep nesting in tool-call arguments (re-serialised with a
// recursive dump) overflowed the stack and crashed the server.
TEST(OpenAiParse, DeepNestingIsRefusedNotACrash) {
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  const int deep = 1'000'000;
  const std::string body =
      R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[)"
      R"({"id":"a","type":"function","function":{"name":"f","arguments":)" +
      nested(deep) + "}}]}]}";
  CompletionRequest r;
  auto e = parse(body, Endpoint::kChat, r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->code, "invalid_json");
  // Also in an ignored field, and for /v1/completions.
  e = parse(R"({"prompt":"x","extra":)" + nested(deep) + "}", Endpoint::kCompletion, r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "invalid_json");
  // Ordinary nesting, and brackets inside strings, are fine.
  EXPECT_FALSE(parse(R"({"prompt":"[[[[[[{{{{\"]]]","extra":)" + nested(kMaxJsonDepth - 1) + "}",
                     Endpoint::kCompletion, r)
                   .has_value());
  EXPECT_TRUE(json_nesting_exceeds(nested(kMaxJsonDepth + 1), kMaxJsonDepth));
  EXPECT_FALSE(json_nesting_exceeds(nested(kMaxJsonDepth), kMaxJsonDepth));
  EXPECT_FALSE(json_nesting_exceeds(R"(["[[[[", "\"[[["])", 1));
}

TEST(OpenAiError, Shape) {
  json j = bad_request("bad", "temperature", "invalid_value").to_json();
  EXPECT_EQ(j, json::parse(R"({"error":{"message":"bad","type":"invalid_request_error","param":"temperature",
                                "code":"invalid_value"}})"));
  ApiError o = overloaded("busy");
  EXPECT_EQ(o.status, 503);
  EXPECT_EQ(o.retry_after_s, 1);
  EXPECT_TRUE(o.to_json()["error"]["param"].is_null());
}

TEST(OpenAiBuild, ChatResponseAndChunks) {
  ResponseMeta meta{new_response_id(Endpoint::kChat), 1700000000, "m", Endpoint::kChat};
  EXPECT_EQ(meta.id.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(meta.id.size(), 9u + 24u);
  json r = build_response(meta, {{"hello", "stop"}, {"yo", "length"}}, Usage{5, 7});
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][0]["message"], json::parse(R"({"role":"assistant","content":"hello"})"));
  EXPECT_EQ(r["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(r["usage"], json::parse(R"({"prompt_tokens":5,"completion_tokens":7,"total_tokens":12})"));

  json role = build_role_chunk(meta, 1);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"], json::parse(R"({"role":"assistant","content":""})"));
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  json piece = build_content_chunk(meta, 0, "caf\xc3\xa9");
  EXPECT_EQ(piece["choices"][0]["delta"]["content"], "caf\xc3\xa9");
  json fin = build_finish_chunk(meta, 1, "stop");
  EXPECT_EQ(fin["choices"][0]["delta"], json::object());
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "stop");
  json usage = build_usage_chunk(meta, Usage{1, 2});
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 3);
}

TEST(OpenAiBuild, CompletionShapes) {
  ResponseMeta meta{new_response_id(Endpoint::kCompletion), 1, "m", Endpoint::kCompletion};
  EXPECT_EQ(meta.id.rfind("cmpl-", 0), 0u);
  json r = build_response(meta, {{"text!", "stop"}}, Usage{1, 1});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], "text!");
  json c = build_content_chunk(meta, 0, "ab");
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "ab");
  EXPECT_EQ(build_finish_chunk(meta, 0, "length")["choices"][0]["finish_reason"], "length");
}

TEST(Sse, FramingIsOneLinePerEvent) {
  std::string ev = sse_event(json{{"content", "a\nb"}});
  EXPECT_EQ(ev, "data: {\"content\":\"a\\nb\"}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

}  // namespace
}  // namespace bonsai::server
