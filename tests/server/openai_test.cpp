// OpenAI request validation and response/chunk/SSE builders.
#include "server/openai.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

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
  EXPECT_EQ(r.messages[1].content, "Hi \nthere");  // text parts joined with "\n" (llama-server, vLLM)
  EXPECT_EQ(*r.sampling.max_tokens, 12);
  EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*r.sampling.top_p, 0.9f);
  EXPECT_EQ(*r.sampling.top_k, 20);
  EXPECT_FLOAT_EQ(*r.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(*r.sampling.repeat_penalty, 1.1f);
  EXPECT_FLOAT_EQ(*r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(*r.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(*r.sampling.seed, 42u);
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"\n\n", "END"}));
}

// seed -1 is llama.cpp's "random": a fresh seed per request (never the same
// fixed 2^64-1); a missing seed stays unset (the server's default applies).
TEST(OpenAiParse, SeedMinusOneIsAFreshRandomSeed) {
  for (Endpoint ep : {Endpoint::kChat, Endpoint::kCompletion}) {
    const std::string input =
        ep == Endpoint::kChat ? R"("messages":[{"role":"user","content":"x"}])" : R"("prompt":"x")";
    std::vector<uint64_t> seen;
    for (int i = 0; i < 3; ++i) {
      CompletionRequest r;
      ASSERT_FALSE(parse("{" + input + R"(,"seed":-1})", ep, r));
      ASSERT_TRUE(r.sampling.seed.has_value());
      EXPECT_NE(*r.sampling.seed, std::numeric_limits<uint64_t>::max());
      for (uint64_t s : seen) EXPECT_NE(*r.sampling.seed, s);
      seen.push_back(*r.sampling.seed);
    }
    CompletionRequest r;
    ASSERT_FALSE(parse("{" + input + R"(,"seed":5})", ep, r));
    EXPECT_EQ(r.sampling.seed, std::optional<uint64_t>(5));
    ASSERT_FALSE(parse("{" + input + "}", ep, r));
    EXPECT_FALSE(r.sampling.seed.has_value());
  }
}

// llama-server's per-request reasoning_format overrides --reasoning-format;
// OpenAI's reasoning_effort "none" turns thinking off unless
// chat_template_kwargs.enable_thinking says otherwise.
TEST(OpenAiParse, ReasoningFormatAndEffort) {
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  CompletionRequest a;
  ASSERT_FALSE(parse("{" + msgs + R"(,"reasoning_format":"none"})", Endpoint::kChat, a));
  EXPECT_EQ(a.parse_reasoning, std::optional<bool>(false));
  CompletionRequest b;
  ASSERT_FALSE(parse("{" + msgs + R"(,"reasoning_format":"deepseek"})", Endpoint::kChat, b));
  EXPECT_EQ(b.parse_reasoning, std::optional<bool>(true));
  CompletionRequest c;
  ASSERT_FALSE(parse("{" + msgs + "}", Endpoint::kChat, c));
  EXPECT_FALSE(c.parse_reasoning.has_value());
  EXPECT_TRUE(c.enable_thinking);
  CompletionRequest d;
  ASSERT_FALSE(parse("{" + msgs + R"(,"reasoning_effort":"none"})", Endpoint::kChat, d));
  EXPECT_FALSE(d.enable_thinking);
  CompletionRequest e;
  ASSERT_FALSE(parse("{" + msgs + R"(,"reasoning_effort":"high"})", Endpoint::kChat, e));
  EXPECT_TRUE(e.enable_thinking);
  CompletionRequest f;
  ASSERT_FALSE(parse("{" + msgs + R"(,"reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":true}})",
                     Endpoint::kChat, f));
  EXPECT_TRUE(f.enable_thinking);
  CompletionRequest g;
  auto err = parse("{" + msgs + R"(,"reasoning_format":"xml"})", Endpoint::kChat, g);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->param, "reasoning_format");
  err = parse("{" + msgs + R"(,"reasoning_effort":"max"})", Endpoint::kChat, g);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->param, "reasoning_effort");
}

// An assistant message may leave content out (null) when it calls tools.
TEST(OpenAiParse, AssistantContentMayBeNullWithToolCalls) {
  CompletionRequest r;
  EXPECT_FALSE(parse(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,
      "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"c","content":"1"}]})",
                     Endpoint::kChat, r));
  CompletionRequest m;
  auto e = parse(R"({"messages":[{"role":"user"}]})", Endpoint::kChat, m);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "missing_required_parameter");
}

TEST(OpenAiParse, CompletionPromptForms) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"prompt":"abc","stop":"x"})", Endpoint::kCompletion, r));
  EXPECT_EQ(r.prompt, "abc");
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"x"});
  EXPECT_FALSE(r.sampling.max_tokens.has_value());
  ASSERT_FALSE(parse(R"({"prompt":["only"]})", Endpoint::kCompletion, r));
  EXPECT_EQ(r.prompt, "only");
  ASSERT_FALSE(parse(R"({"prompt":[1,2,3]})", Endpoint::kCompletion, r));
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  ASSERT_FALSE(parse(R"({"prompt":"a","logit_bias":{"7":-100,"42":2.5}})", Endpoint::kCompletion, r));
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{42, 2.5f}, {7, -100.0f}}));
  // Several prompts (strings or token arrays, mixed): one entry each, the single fields unused.
  CompletionRequest b;
  ASSERT_FALSE(parse(R"({"prompt":["a",[1,403],"b"],"n":2})", Endpoint::kCompletion, b));
  ASSERT_EQ(b.prompts.size(), 3u);
  EXPECT_EQ(b.prompts[0].text, "a");
  EXPECT_EQ(b.prompts[1].ids, (std::vector<int32_t>{1, 403}));
  EXPECT_EQ(b.prompts[2].text, "b");
  EXPECT_TRUE(b.prompt.empty());
  EXPECT_TRUE(b.prompt_ids.empty());
  EXPECT_EQ(b.n, 2);
  CompletionRequest one;
  ASSERT_FALSE(parse(R"({"prompt":[[5,6]]})", Endpoint::kCompletion, one));
  EXPECT_EQ(one.prompt_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(one.prompts.empty());
  // Bad batches: 400s naming the element, or `prompt` for a batch over the cap.
  auto param_of = [](const std::string& body) {
    CompletionRequest x;
    auto e = parse(body, Endpoint::kCompletion, x);
    return e ? e->param : std::string("(accepted)");
  };
  EXPECT_EQ(param_of(R"({"prompt":["a",5]})"), "(accepted)");  // one mixed prompt (llama-server's)
  EXPECT_EQ(param_of(R"({"prompt":["a",5.5]})"), "prompt");
  EXPECT_EQ(param_of(R"({"prompt":["a",[1,"b",-1]]})"), "prompt[1]");
  EXPECT_EQ(param_of(R"({"prompt":[1,"a"],"suffix":"c"})"), "suffix");
  EXPECT_EQ(param_of(R"({"prompt":["a",[]]})"), "prompt[1]");
  EXPECT_EQ(param_of(R"({"prompt":["a",[1,-2]]})"), "prompt[1]");
  EXPECT_EQ(param_of(R"({"prompt":["a","b"],"suffix":"c"})"), "suffix");
  json many = json::array();
  for (int i = 0; i <= kMaxPrompts; ++i) many.push_back("p");
  EXPECT_EQ(param_of(json{{"prompt", many}}.dump()), "prompt");
  many.erase(many.begin());
  EXPECT_EQ(param_of(json{{"prompt", many}}.dump()), "(accepted)");
  EXPECT_EQ(param_of(json{{"prompt", many}, {"n", 2}}.dump()), "prompt");  // 128 choices
}

// llama-server's mixed prompt: token ids and strings in one array are one
// prompt, in order (strings tokenized by prepare_completion); an array of
// prompts may hold mixed ones.
TEST(OpenAiParse, MixedPromptsKeepIdsAndTextsInOrder) {
  auto piece = [](const engine::PromptPiece& p) { return p.id >= 0 ? std::to_string(p.id) : "'" + p.text + "'"; };
  auto pieces = [&](const std::vector<engine::PromptPiece>& ps) {
    std::string out;
    for (const auto& p : ps) out += (out.empty() ? "" : " ") + piece(p);
    return out;
  };
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"prompt":[1,"Once upon",13,"a"]})", Endpoint::kCompletion, r));
  EXPECT_EQ(pieces(r.prompt_pieces), "1 'Once upon' 13 'a'");
  EXPECT_TRUE(r.prompt_ids.empty());
  EXPECT_TRUE(r.prompt.empty());
  EXPECT_TRUE(r.prompts.empty());
  CompletionRequest b;
  ASSERT_FALSE(parse(R"({"prompt":[[1,"x"],"y",[2,3]]})", Endpoint::kCompletion, b));
  ASSERT_EQ(b.prompts.size(), 3u);
  EXPECT_EQ(pieces(b.prompts[0].pieces), "1 'x'");
  EXPECT_EQ(b.prompts[1].text, "y");
  EXPECT_EQ(b.prompts[2].ids, (std::vector<int32_t>{2, 3}));
  // Only strings: several prompts, as before.
  CompletionRequest s;
  ASSERT_FALSE(parse(R"({"prompt":["x","y"]})", Endpoint::kCompletion, s));
  EXPECT_EQ(s.prompts.size(), 2u);
  EXPECT_TRUE(s.prompt_pieces.empty());
}

// llama-server's per-request cache_prompt: default true, false recorded, a non-boolean a 400.
TEST(OpenAiParse, CachePrompt) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"prompt":"x"})", Endpoint::kCompletion, r));
  EXPECT_TRUE(r.cache_prompt);
  ASSERT_FALSE(parse(R"({"prompt":"x","cache_prompt":false})", Endpoint::kCompletion, r));
  EXPECT_FALSE(r.cache_prompt);
  ASSERT_FALSE(parse(R"({"messages":[{"role":"user","content":"x"}],"cache_prompt":false})", Endpoint::kChat, r));
  EXPECT_FALSE(r.cache_prompt);
  auto e = parse(R"({"prompt":"x","cache_prompt":"no"})", Endpoint::kCompletion, r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "cache_prompt");
}

// Text parts are joined with "\n" (llama.cpp's common_chat_msgs_to_json_oaicompat,
// vLLM): none before the first non-empty text.
TEST(OpenAiParse, TextPartsJoinWithNewlines) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},
      {"type":"text","text":"b"},{"type":"text","text":"c"}]},
      {"role":"user","content":[{"type":"text","text":""},{"type":"text","text":"d"}]}]})",
                     Endpoint::kChat, r));
  EXPECT_EQ(r.messages[0].content, "a\nb\nc");
  EXPECT_EQ(r.messages[1].content, "d");
}

// OpenAI's deprecated function calling maps onto tools: functions ->
// tools, function_call -> tool_choice, a role "function" message -> a tool
// message, an assistant function_call -> a tool call; errors name the old fields.
TEST(OpenAiParse, LegacyFunctionsMapOntoTools) {
  const std::string fns =
      R"("functions":[{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}])";
  const std::string msgs = R"("messages":[{"role":"user","content":"Weather in Paris?"}])";
  CompletionRequest r;
  ASSERT_FALSE(parse("{" + msgs + "," + fns + "}", Endpoint::kChat, r));
  ASSERT_TRUE(r.tools.is_array());
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0]["type"], "function");
  EXPECT_EQ(r.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.tools[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
  EXPECT_FALSE(r.forced_tool_call);
  // function_call {"name"}: the named tool is forced (a grammar), as tool_choice {"type": "function", ...}.
  CompletionRequest f;
  ASSERT_FALSE(parse("{" + msgs + "," + fns + R"(,"function_call":{"name":"get_weather"}})", Endpoint::kChat, f));
  EXPECT_TRUE(f.forced_tool_call);
  ASSERT_TRUE(f.sampling.grammar.has_value());
  EXPECT_NE(*f.sampling.grammar, nullptr);
  CompletionRequest n;
  ASSERT_FALSE(parse("{" + msgs + "," + fns + R"(,"function_call":"none"})", Endpoint::kChat, n));
  EXPECT_TRUE(n.tool_choice_none);
  // The old conversation shapes.
  CompletionRequest c;
  ASSERT_FALSE(parse(R"({"messages":[{"role":"user","content":"Weather?"},
      {"role":"assistant","content":null,"function_call":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
      {"role":"function","name":"get_weather","content":"Sunny"}],)" +
                         fns + "}",
                     Endpoint::kChat, c));
  ASSERT_EQ(c.messages.size(), 3u);
  ASSERT_EQ(c.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(c.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(c.messages[1].tool_calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(c.messages[2].role, "tool");
  EXPECT_EQ(c.messages[2].content, "Sunny");
  EXPECT_EQ(c.messages[2].tool_call_id, c.messages[1].tool_calls[0].id);
  // Errors name the fields the client sent.
  auto param_of = [](const std::string& body) {
    CompletionRequest x;
    auto e = parse(body, Endpoint::kChat, x);
    return e ? e->param : std::string("(accepted)");
  };
  EXPECT_EQ(param_of("{" + msgs + R"(,"functions":{"name":"f"}})"), "functions");
  EXPECT_EQ(param_of("{" + msgs + R"(,"functions":[{"name":"bad name"}]})"), "functions[0].name");
  EXPECT_EQ(param_of("{" + msgs + R"(,"functions":[{"name":"f"}],"function_call":{"name":"g"}})"), "function_call");
  EXPECT_EQ(param_of("{" + msgs + R"(,"functions":[{"name":"f"}],"function_call":"sometimes"})"), "function_call");
  EXPECT_EQ(param_of("{" + msgs + R"(,"function_call":{}})"), "function_call.name");
  EXPECT_EQ(param_of(R"({"messages":[{"role":"function","content":"x"}]})"), "messages[0].name");
  CompletionRequest x;
  auto e = parse("{" + msgs + R"(,"functions":[{"name":"f"}],"function_call":{"name":"g"}})", Endpoint::kChat, x);
  ASSERT_TRUE(e.has_value());
  EXPECT_NE(e->message.find("'function_call'"), std::string::npos) << e->message;
  EXPECT_EQ(e->message.find("tool_choice"), std::string::npos) << e->message;
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
      // OpenAI requires content for user, system, developer and tool messages.
      {R"({"messages":[{"role":"user"}]})", Endpoint::kChat, "messages[0].content"},
      {R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":null}]})", Endpoint::kChat,
       "messages[1].content"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"tool","tool_call_id":"c"}]})", Endpoint::kChat,
       "messages[1].content"},
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

// OpenAI `tools` entries are {"type":"function","function":{"name":...}}:
// "tools":[5] and other malformed entries used to pass straight to the chat
// template. Each is a 400 whose param and message name the bad entry/field.
struct ToolCase {
  const char* extra;  // fields appended to a valid chat body
  const char* param;
  const char* code;
  const char* message;
};

TEST(OpenAiParse, MalformedToolsAndToolChoiceAre400NamingTheField) {
  const ToolCase cases[] = {
      {R"("tools":[5])", "tools[0]", "invalid_type",
       "Invalid type for 'tools[0]': expected an object, but got integer."},
      {R"("tools":{"type":"function"})", "tools", "invalid_type",
       "Invalid type for 'tools': expected an array, but got object."},
      {R"("tools":[{"type":"function","function":{"name":"f"}},"g"])", "tools[1]", "invalid_type",
       "Invalid type for 'tools[1]': expected an object, but got string."},
      {R"("tools":[{"function":{"name":"f"}}])", "tools[0].type", "missing_required_parameter",
       "Missing required parameter: 'tools[0].type'."},
      {R"("tools":[{"type":"retrieval","function":{"name":"f"}}])", "tools[0].type", "invalid_value",
       "Invalid value for 'tools[0].type': \"retrieval\". Supported values are: 'function'."},
      {R"("tools":[{"type":1,"function":{"name":"f"}}])", "tools[0].type", "invalid_type",
       "Invalid type for 'tools[0].type': expected a string, but got integer."},
      {R"("tools":[{"type":"function"}])", "tools[0].function", "missing_required_parameter",
       "Missing required parameter: 'tools[0].function'."},
      {R"("tools":[{"type":"function","function":"f"}])", "tools[0].function", "invalid_type",
       "Invalid type for 'tools[0].function': expected an object, but got string."},
      {R"("tools":[{"type":"function","function":{"description":"d"}}])", "tools[0].function.name",
       "missing_required_parameter", "Missing required parameter: 'tools[0].function.name'."},
      {R"("tools":[{"type":"function","function":{"name":7}}])", "tools[0].function.name", "invalid_type",
       "Invalid type for 'tools[0].function.name': expected a string, but got integer."},
      {R"("tools":[{"type":"function","function":{"name":""}}])", "tools[0].function.name", "empty_string",
       "Invalid 'tools[0].function.name': empty string. Expected a string with minimum length 1."},
      {R"("tools":[{"type":"function","function":{"name":"get weather"}}])", "tools[0].function.name", "invalid_value",
       "Invalid 'tools[0].function.name': string does not match pattern. Expected a string that matches the "
       "pattern '^[a-zA-Z0-9_-]{1,64}$'."},
      {R"("tools":[{"type":"function","function":{"name":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}}])",
       "tools[0].function.name", "invalid_value",
       "Invalid 'tools[0].function.name': string does not match pattern. Expected a string that matches the "
       "pattern '^[a-zA-Z0-9_-]{1,64}$'."},
      {R"("tools":[{"type":"function","function":{"name":"f","description":["d"]}}])", "tools[0].function.description",
       "invalid_type", "Invalid type for 'tools[0].function.description': expected a string, but got array."},
      {R"("tools":[{"type":"function","function":{"name":"f","parameters":"{}"}}])", "tools[0].function.parameters",
       "invalid_type",
       "Invalid type for 'tools[0].function.parameters': expected an object (a JSON Schema), but got string."},
      {R"("tools":[{"type":"function","function":{"name":"f","strict":"yes"}}])", "tools[0].function.strict",
       "invalid_type", "Invalid type for 'tools[0].function.strict': expected a boolean, but got string."},
      {R"("tool_choice":5)", "tool_choice", "invalid_type",
       "Invalid type for 'tool_choice': expected a string or an object, but got integer."},
      {R"("tool_choice":"always")", "tool_choice", "invalid_value",
       "Invalid value for 'tool_choice': \"always\". Supported values are: 'none', 'auto' and 'required'."},
      {R"("tool_choice":"required")", "tool_choice", "invalid_value",
       "Invalid value for 'tool_choice': 'required' is only allowed when 'tools' are specified."},
      {R"("tool_choice":{"type":"function"})", "tool_choice.function", "missing_required_parameter",
       "Missing required parameter: 'tool_choice.function'."},
      {R"("tool_choice":{"type":"function","function":{"name":"g"}},"tools":[{"type":"function","function":{"name":"f"}}])",
       "tool_choice.function.name", "invalid_value",
       "Invalid value for 'tool_choice': no function named \"g\" is declared in 'tools'."},
      {R"("tool_choice":{"function":{"name":"f"}})", "tool_choice.type", "missing_required_parameter",
       "Missing required parameter: 'tool_choice.type'."},
      {R"("parallel_tool_calls":"yes")", "parallel_tool_calls", "invalid_type",
       "Invalid type for 'parallel_tool_calls': expected a boolean, but got string."},
  };
  for (const auto& c : cases) {
    const std::string body = std::string(R"({"messages":[{"role":"user","content":"x"}],)") + c.extra + "}";
    CompletionRequest r;
    auto e = parse(body, Endpoint::kChat, r);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->status, 400) << body;
    EXPECT_EQ(e->type, "invalid_request_error") << body;
    EXPECT_EQ(e->param, c.param) << body << " -> " << e->message;
    EXPECT_EQ(e->code, c.code) << body << " -> " << e->message;
    EXPECT_EQ(e->message, c.message) << body;
    EXPECT_EQ(e->to_json()["error"]["param"], c.param);
  }
}

// Well-formed tools and tool_choice still parse, and reach the template in
// the client's key order.
TEST(OpenAiParse, WellFormedToolsAndToolChoiceAreAccepted) {
  const std::string tools =
      R"([{"type":"function","function":{"name":"get_weather","description":"Weather","strict":true,)"
      R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},)"
      R"({"type":"function","function":{"name":"now"}}])";
  for (const char* choice :
       {R"("auto")", R"("none")", R"("required")", R"({"type":"function","function":{"name":"now"}})", "null"}) {
    const std::string body = R"({"messages":[{"role":"user","content":"x"}],"tools":)" + tools +
                             R"(,"parallel_tool_calls":false,"tool_choice":)" + choice + "}";
    CompletionRequest r;
    auto e = parse(body, Endpoint::kChat, r);
    ASSERT_FALSE(e.has_value()) << choice << " -> " << e->message;
    ASSERT_TRUE(r.tools.is_array());
    ASSERT_EQ(r.tools.size(), 2u);
    EXPECT_EQ(r.tools[0]["function"]["name"], "get_weather");
    EXPECT_EQ(r.tools[0]["function"].begin().key(), "name");  // document order kept
    EXPECT_EQ(r.tools[1]["function"]["name"], "now");
  }
  // "tools": [] and "tool_choice": "none"/"auto" without tools are fine.
  CompletionRequest r;
  EXPECT_FALSE(
      parse(R"({"messages":[{"role":"user","content":"x"}],"tools":[],"tool_choice":"none"})", Endpoint::kChat, r));
  EXPECT_FALSE(parse(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"auto"})", Endpoint::kChat, r));
}

// response_format, user, logprobs/top_logprobs, echo and messages[].name
// were ignored whatever their type.
TEST(OpenAiParse, OtherOptionalFieldsOfTheWrongTypeAre400) {
  const BadCase cases[] = {
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":"json"})", Endpoint::kChat, "response_format"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{}})", Endpoint::kChat, "response_format.type"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})", Endpoint::kChat,
       "response_format.type"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})", Endpoint::kChat,
       "response_format.json_schema"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"schema":{}}}})",
       Endpoint::kChat, "response_format.json_schema.name"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":[]}}})",
       Endpoint::kChat, "response_format.json_schema.schema"},
      {R"({"prompt":"x","response_format":{"type":5}})", Endpoint::kCompletion, "response_format.type"},
      {R"({"messages":[{"role":"user","content":"x"}],"user":42})", Endpoint::kChat, "user"},
      {R"({"messages":[{"role":"user","content":"x","name":1}]})", Endpoint::kChat, "messages[0].name"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":1})", Endpoint::kChat, "logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":21})", Endpoint::kChat, "top_logprobs"},
      {R"({"prompt":"x","logprobs":true})", Endpoint::kCompletion, "logprobs"},
      {R"({"prompt":"x","logprobs":21})", Endpoint::kCompletion, "logprobs"},
      {R"({"prompt":"x","echo":"no"})", Endpoint::kCompletion, "echo"},
      {R"({"prompt":"x","n":"2"})", Endpoint::kCompletion, "n"},
      {R"({"prompt":"x","n":1.5})", Endpoint::kCompletion, "n"},
      {R"({"prompt":"x","stop":{"a":1}})", Endpoint::kCompletion, "stop"},
      {R"({"prompt":"x","stop":[null]})", Endpoint::kCompletion, "stop[0]"},
      {R"({"prompt":"x","logit_bias":{"5":true}})", Endpoint::kCompletion, "logit_bias.5"},
      {R"({"prompt":"x","logit_bias":{"-1":1}})", Endpoint::kCompletion, "logit_bias"},
  };
  for (const auto& c : cases) {
    CompletionRequest r;
    auto e = parse(c.body, c.ep, r);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->status, 400) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << " -> " << e->message;
    EXPECT_NE(e->message.find(c.param), std::string::npos) << e->message;
  }
  // The well-formed variants pass.
  CompletionRequest r;
  for (
      const char* body :
      {R"({"messages":[{"role":"user","content":"x","name":"bob"}],"response_format":{"type":"json_object"},"user":"u","logprobs":false,"top_logprobs":0})",
       R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object"},"strict":true}}})",
       R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"}})"}) {
    auto e = parse(body, Endpoint::kChat, r);
    EXPECT_FALSE(e.has_value()) << body << " -> " << e->message;
  }
  auto e = parse(R"({"prompt":"x","logprobs":null,"echo":false,"n":2.0})", Endpoint::kCompletion, r);
  ASSERT_FALSE(e.has_value()) << e->message;
  EXPECT_EQ(r.n, 2);
}

// Log probabilities and echo are parsed (they were refused as unsupported
// before they were computed); a suffix asks for fill-in-the-middle (with a
// text prompt only); best_of > 1 still is refused.
TEST(OpenAiParse, LogprobsEchoAndSuffixAreParsedBestOfRefused) {
  CompletionRequest r;
  ASSERT_FALSE(
      parse(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":3})", Endpoint::kChat, r)
          .has_value());
  EXPECT_EQ(r.sampling.logprobs, 3);
  CompletionRequest r0;
  ASSERT_FALSE(
      parse(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})", Endpoint::kChat, r0).has_value());
  EXPECT_EQ(r0.sampling.logprobs, 0);  // the sampled token's only
  CompletionRequest r1;
  ASSERT_FALSE(parse(R"({"prompt":"x","logprobs":5,"echo":true})", Endpoint::kCompletion, r1).has_value());
  EXPECT_EQ(r1.sampling.logprobs, 5);
  EXPECT_TRUE(r1.echo);
  CompletionRequest r2;
  ASSERT_FALSE(parse(R"({"prompt":"x","logprobs":20})", Endpoint::kCompletion, r2).has_value());
  EXPECT_EQ(r2.sampling.logprobs, 20);
  EXPECT_FALSE(r2.echo);
  CompletionRequest r3;
  ASSERT_FALSE(parse(R"({"prompt":"x"})", Endpoint::kCompletion, r3).has_value());
  EXPECT_EQ(r3.sampling.logprobs, -1);  // off by default
  EXPECT_FALSE(r3.fim.has_value());
  CompletionRequest r4;
  ASSERT_FALSE(parse(R"({"prompt":"def f(","suffix":"\nf(1)\n"})", Endpoint::kCompletion, r4).has_value());
  ASSERT_TRUE(r4.fim.has_value());
  EXPECT_EQ(r4.prompt, "def f(");
  EXPECT_EQ(r4.fim->suffix, "\nf(1)\n");
  EXPECT_TRUE(r4.fim->middle.empty());
  struct Case {
    const char* body;
    Endpoint ep;
    const char* param;
    const char* code;
  };
  const Case cases[] = {
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", Endpoint::kChat, "top_logprobs",
       "invalid_value"},  // only with logprobs: true
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", Endpoint::kChat,
       "top_logprobs", "invalid_value"},
      {R"({"prompt":"x","logprobs":-1})", Endpoint::kCompletion, "logprobs", "invalid_value"},
      {R"({"prompt":[1,2],"suffix":"tail"})", Endpoint::kCompletion, "suffix", "invalid_value"},
      {R"({"prompt":"x","best_of":3})", Endpoint::kCompletion, "best_of", "unsupported_value"},
  };
  for (const auto& c : cases) {
    CompletionRequest q;
    auto e = parse(c.body, c.ep, q);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->status, 400) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body;
    EXPECT_EQ(e->code, c.code) << c.body;
  }
  std::optional<ApiError> e;
  // Values that ask for nothing pass.
  EXPECT_FALSE(
      parse(R"({"messages":[{"role":"user","content":"x"}],"logprobs":false,"top_logprobs":0})", Endpoint::kChat, r)
          .has_value());
  EXPECT_FALSE(parse(R"({"prompt":"x","logprobs":null,"echo":false})", Endpoint::kCompletion, r).has_value());
  CompletionRequest r5;
  EXPECT_FALSE(parse(R"({"prompt":"x","suffix":"","best_of":1})", Endpoint::kCompletion, r5).has_value());
  EXPECT_FALSE(r5.fim.has_value());  // an empty suffix is none
  EXPECT_FALSE(parse(R"({"prompt":"x","suffix":null})", Endpoint::kCompletion, r).has_value());
  // A wrong type or range is invalid, not unsupported.
  e = parse(R"({"prompt":"x","best_of":0})", Endpoint::kCompletion, r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "best_of");
  EXPECT_EQ(e->code, "invalid_value");
  e = parse(R"({"prompt":"x","suffix":5})", Endpoint::kCompletion, r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "suffix");
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
  EXPECT_EQ(r.sampling.max_tokens, 2147483647);
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

// One OpenAI message reader (tokenizer::parse_chat_message) serves the
// server and the tokenizer's chat_messages_from_json. Object-valued tool-call
// arguments are written the way the chat template's tojson writes them (the
// client's key order, ", " and ": ", non-ASCII kept), not as a compact dump
// with sorted keys (what the server's own parser did before): the rendered
// prompt must be what the model was trained on.
TEST(OpenAiParse, ObjectToolCallArgumentsAreWrittenInTheTemplatesFormat) {
  const std::string messages =
      R"([{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[)"
      R"({"id":"c1","type":"function","function":{"name":"get_weather","arguments":)"
      R"({"zeta":1,"alpha":{"city":"Zürich","days":[1,2]}}}},)"
      R"({"id":"c2","type":"function","function":{"name":"ping","arguments":"{\"b\":1,\"a\":2}"}}]}])";
  CompletionRequest r;
  auto e = parse(R"({"messages":)" + messages + "}", Endpoint::kChat, r);
  ASSERT_FALSE(e.has_value()) << e->message;
  ASSERT_EQ(r.messages.size(), 2u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 2u);
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"zeta": 1, "alpha": {"city": "Zürich", "days": [1, 2]}})");
  EXPECT_EQ(r.messages[1].tool_calls[1].arguments, R"({"b":1,"a":2})");  // a string: verbatim
  auto direct = tokenizer::chat_messages_from_json(nlohmann::ordered_json::parse(messages));
  ASSERT_TRUE(direct.has_value()) << direct.error().message;
  ASSERT_EQ(direct->size(), 2u);
  EXPECT_EQ((*direct)[1].tool_calls[0].arguments, r.messages[1].tool_calls[0].arguments);
  // And so the Qwen3 template renders the call as its Jinja tojson does.
  const auto tmpl = tokenizer::ChatTemplate::from_text("<|im_start|> <think> reasoning_content");
  auto rendered = tmpl.render(r.messages);
  ASSERT_TRUE(rendered.has_value()) << rendered.error().message;
  EXPECT_NE(rendered->text().find(
                R"({"name": "get_weather", "arguments": {"zeta": 1, "alpha": {"city": "Zürich", "days": [1, 2]}}})"),
            std::string::npos)
      << rendered->text();
}

// Message errors keep OpenAI's shape (param and code) through the shared reader.
TEST(OpenAiParse, MessageErrorsNameTheField) {
  CompletionRequest r;
  auto e = parse(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"function":{}}]}]})",
                 Endpoint::kChat, r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->param, "messages[1].tool_calls[0].function.name");
  EXPECT_EQ(e->code, "missing_required_parameter");
  e = parse(R"({"messages":[{"role":"robot","content":"x"}]})", Endpoint::kChat, r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "messages[0].role");
  EXPECT_EQ(e->code, "invalid_value");
  e = parse(R"({"messages":[{"role":"user","content":5}]})", Endpoint::kChat, r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "messages[0].content");
  EXPECT_EQ(e->code, "invalid_type");
  e = parse(R"({"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":"x"}]})",
            Endpoint::kChat, r);
  ASSERT_FALSE(e.has_value()) << e->message;
  EXPECT_EQ(r.messages[0].role, "system");
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
  EXPECT_FALSE(
      parse(R"({"prompt":"[[[[[[{{{{\"]]]","extra":)" + nested(kMaxJsonDepth - 1) + "}", Endpoint::kCompletion, r)
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

// Reasoning and tool calls in the chat shapes (OpenAI "chat.completion" /
// "chat.completion.chunk"; reasoning_content as llama-server and vLLM name it).
TEST(OpenAiBuild, ChatReasoningAndToolCallShapes) {
  ResponseMeta meta{new_response_id(Endpoint::kChat), 1, "m", Endpoint::kChat};
  Choice thought{"4", "stop", "2+2 is 4", {}};
  Choice call{"", "tool_calls", "", {{"get_weather", "{\"city\":\"Paris\"}"}, {"ping", "{}"}}};
  json r = build_response(meta, {thought, call}, Usage{3, 4});
  const json& m0 = r["choices"][0]["message"];
  EXPECT_EQ(m0["content"], "4");
  EXPECT_EQ(m0["reasoning_content"], "2+2 is 4");
  EXPECT_FALSE(m0.contains("tool_calls"));
  const json& m1 = r["choices"][1]["message"];
  EXPECT_TRUE(m1["content"].is_null());  // a message that only calls tools
  EXPECT_FALSE(m1.contains("reasoning_content"));
  ASSERT_EQ(m1["tool_calls"].size(), 2u);
  EXPECT_EQ(m1["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m1["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m1["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");  // a JSON string
  const std::string id0 = m1["tool_calls"][0]["id"], id1 = m1["tool_calls"][1]["id"];
  EXPECT_EQ(id0.rfind("call_", 0), 0u);
  EXPECT_EQ(id0.size(), 5u + 24u);
  EXPECT_NE(id0, id1);
  EXPECT_EQ(r["choices"][1]["finish_reason"], "tool_calls");

  json rc = build_reasoning_chunk(meta, 1, "hmm");
  EXPECT_EQ(rc["object"], "chat.completion.chunk");
  EXPECT_EQ(rc["choices"][0]["index"], 1);
  EXPECT_EQ(rc["choices"][0]["delta"], json({{"reasoning_content", "hmm"}}));
  EXPECT_TRUE(rc["choices"][0]["finish_reason"].is_null());
  json tc = build_tool_call_chunk(meta, 0, 1, call.tool_calls[1], "call_x");
  const json& d = tc["choices"][0]["delta"]["tool_calls"];
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]["index"], 1);
  EXPECT_EQ(d[0]["id"], "call_x");
  EXPECT_EQ(d[0]["type"], "function");
  EXPECT_EQ(d[0]["function"]["name"], "ping");
  EXPECT_EQ(d[0]["function"]["arguments"], "{}");
}

// tool_choice "none" keeps <tool_call> text as content; any other choice parses it.
TEST(OpenAiParse, ToolChoiceNoneIsRecorded) {
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f"}}])";
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  CompletionRequest r;
  ASSERT_FALSE(parse("{" + msgs + "," + tools + R"(,"tool_choice":"none"})", Endpoint::kChat, r).has_value());
  EXPECT_TRUE(r.tool_choice_none);
  CompletionRequest a;
  ASSERT_FALSE(parse("{" + msgs + "," + tools + R"(,"tool_choice":"auto"})", Endpoint::kChat, a).has_value());
  EXPECT_FALSE(a.tool_choice_none);
  CompletionRequest b;
  ASSERT_FALSE(parse("{" + msgs + "," + tools + "}", Endpoint::kChat, b).has_value());
  EXPECT_FALSE(b.tool_choice_none);
}

TEST(Sse, FramingIsOneLinePerEvent) {
  std::string ev = sse_event(json{{"content", "a\nb"}});
  EXPECT_EQ(ev, "data: {\"content\":\"a\\nb\"}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

// The two logprobs shapes: chat (OpenAI's content list with bytes) and the
// legacy completions lists; NaN (echo's first token) is null; partial UTF-8
// tokens show U+FFFD in "token" and their exact bytes in "bytes".
TEST(OpenAiBuild, LogprobsShapes) {
  const std::vector<LogprobEntry> entries = {
      {"He", std::numeric_limits<float>::quiet_NaN(), {}},
      {"llo", -0.25f, {{"llo", -0.25f}, {"lp", -2.0f}}},
      {"\xe4", -1.5f, {{"\xe4", -1.5f}, {"\xe5", -1.75f}}},  // two partial characters: one key
  };
  const json chat = build_chat_logprobs(entries);
  ASSERT_EQ(chat["content"].size(), 3u);
  EXPECT_TRUE(chat["refusal"].is_null());
  EXPECT_EQ(chat["content"][0]["token"], "He");
  EXPECT_TRUE(chat["content"][0]["logprob"].is_null());
  EXPECT_EQ(chat["content"][0]["bytes"], json({72, 101}));
  EXPECT_EQ(chat["content"][1]["logprob"], -0.25);
  EXPECT_EQ(chat["content"][1]["top_logprobs"][1], json({{"token", "lp"}, {"logprob", -2.0}, {"bytes", {108, 112}}}));
  EXPECT_EQ(chat["content"][2]["token"], "\xef\xbf\xbd");
  EXPECT_EQ(chat["content"][2]["bytes"], json({0xe4}));

  const json legacy = build_completion_logprobs(entries, 10);
  EXPECT_EQ(legacy["tokens"], json({"He", "llo", "\xef\xbf\xbd"}));
  EXPECT_EQ(legacy["token_logprobs"], json({nullptr, -0.25, -1.5}));
  EXPECT_TRUE(legacy["top_logprobs"][0].is_null());
  EXPECT_EQ(legacy["top_logprobs"][1], json({{"llo", -0.25}, {"lp", -2.0}}));
  EXPECT_EQ(legacy["top_logprobs"][2], json({{"\xef\xbf\xbd", -1.5}}));  // the likelier of the two
  EXPECT_EQ(legacy["text_offset"], json({10, 12, 15}));

  json acc = nullptr;
  append_logprobs(acc, build_completion_logprobs({entries[0]}, 0));
  append_logprobs(acc, build_completion_logprobs({entries[1], entries[2]}, 2));
  append_logprobs(acc, nullptr);
  EXPECT_EQ(acc, build_completion_logprobs(entries, 0));
  json cacc = nullptr;
  append_logprobs(cacc, build_chat_logprobs({entries[0]}));
  append_logprobs(cacc, build_chat_logprobs({entries[1], entries[2]}));
  EXPECT_EQ(cacc, chat);

  // In a response and a chunk.
  ResponseMeta meta{"cmpl-x", 1, "m", Endpoint::kCompletion};
  Choice ch{"Hello", "stop", {}, {}, legacy};
  const json resp = build_response(meta, {ch}, Usage{1, 3});
  EXPECT_EQ(resp["choices"][0]["logprobs"], legacy);
  EXPECT_EQ(build_content_chunk(meta, 0, "He", legacy)["choices"][0]["logprobs"], legacy);
  EXPECT_TRUE(build_content_chunk(meta, 0, "He")["choices"][0]["logprobs"].is_null());
}

}  // namespace
}  // namespace bonsai::server
