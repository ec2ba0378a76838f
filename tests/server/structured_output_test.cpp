// Structured outputs: request fields -> grammar (server/structured_output.h).
// Each grammar is checked by feeding it texts it must accept and texts it
// must refuse (structured::GrammarState), and the 400s by their param and message.
#include "server/structured_output.h"

#include <gtest/gtest.h>

#include <string>

#include "server/openai.h"
#include "structured/grammar.h"
#include "structured/token_mask.h"

namespace bonsai::server {
namespace {

using nlohmann::ordered_json;

// True when `text` is a complete sentence of `g`.
bool accepts(const std::shared_ptr<const structured::Grammar>& g, const std::string& text) {
  auto st = structured::GrammarState::create(g);
  if (!st) return false;
  return st->accept_bytes(text).has_value() && st->can_end();
}

std::shared_ptr<const structured::Grammar> compile(const std::string& gbnf) {
  auto g = structured::Grammar::parse(gbnf);
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.error().message) << "\n" << gbnf;
  return g ? *g : nullptr;
}

const char* kTools = R"([
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
  {"type": "function", "function": {"name": "now"}},
  {"type": "function", "function": {"name": "find", "parameters": {"$defs": {"id": {"type": "string", "pattern": "^[A-Z][0-9]$"}},
    "type": "object", "properties": {"id": {"$ref": "#/$defs/id"}}, "required": ["id"]}}}
])";

const std::string kAdd = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": -2}}\n</tool_call>";
const std::string kNow = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
const std::string kFind = "<tool_call>\n{\"name\": \"find\", \"arguments\": {\"id\": \"Q7\"}}\n</tool_call>";

TEST(StructuredOutput, PrefixRenamesRulesOnly) {
  const std::string in = "root ::= a-b \"root x\" [a-z]{2,3} # root\na-b ::= \"\\\"q\\\"\" | [\\]r]\n";
  const std::string out = prefix_gbnf_rules(in, "p-");
  EXPECT_EQ(out, "p-root ::= p-a-b \"root x\" [a-z]{2,3} # root\np-a-b ::= \"\\\"q\\\"\" | [\\]r]\n");
  auto g = compile("root ::= p-root\n" + out);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(accepts(g, "\"q\"root xab"));
}

TEST(StructuredOutput, ToolCallGrammarAcceptsValidCallsOnly) {
  const auto tools = ordered_json::parse(kTools);
  std::string gbnf;
  ASSERT_FALSE(tool_call_gbnf(tools, std::nullopt, /*parallel=*/true, gbnf).has_value());
  auto g = compile(gbnf);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(accepts(g, kAdd));
  EXPECT_TRUE(accepts(g, kNow));
  EXPECT_TRUE(accepts(g, kFind));  // $ref resolved in the tool's own document
  EXPECT_TRUE(accepts(g, kAdd + "\n" + kFind));
  std::string calls = kNow;
  for (int i = 1; i < kMaxParallelToolCalls; ++i) calls += "\n" + kNow;
  EXPECT_TRUE(accepts(g, calls));
  EXPECT_FALSE(accepts(g, calls + "\n" + kNow));  // at most kMaxParallelToolCalls
  EXPECT_FALSE(accepts(g, "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>"));  // Qwen3's spacing
  EXPECT_FALSE(accepts(g, ""));
  EXPECT_FALSE(accepts(g, "<tool_call>\n{\"name\": \"sub\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(accepts(g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"));
  EXPECT_FALSE(accepts(g, "<tool_call>\n{\"name\": \"find\", \"arguments\": {\"id\": \"q7\"}}\n</tool_call>"));
  EXPECT_FALSE(accepts(g, "hello " + kAdd));

  ASSERT_FALSE(tool_call_gbnf(tools, std::nullopt, /*parallel=*/false, gbnf).has_value());
  auto one = compile(gbnf);
  EXPECT_TRUE(accepts(one, kAdd));
  EXPECT_FALSE(accepts(one, kAdd + "\n" + kNow));

  ASSERT_FALSE(tool_call_gbnf(tools, std::string("find"), true, gbnf).has_value());
  auto named = compile(gbnf);
  EXPECT_TRUE(accepts(named, kFind));
  EXPECT_TRUE(accepts(named, kFind + "\n" + kFind));
  EXPECT_FALSE(accepts(named, kAdd));
}

OutputGrammar build(const std::string& body, Endpoint ep = Endpoint::kChat) {
  OutputGrammar og;
  auto e = build_output_grammar(ordered_json::parse(body), ep, og);
  EXPECT_FALSE(e.has_value()) << (e ? e->message : "");
  return og;
}

ApiError build_error(const std::string& body, Endpoint ep = Endpoint::kChat) {
  OutputGrammar og;
  auto e = build_output_grammar(ordered_json::parse(body), ep, og);
  EXPECT_TRUE(e.has_value()) << body;
  return e ? *e : ApiError{};
}

TEST(StructuredOutput, ResponseFormatGrammarAndJsonSchemaFields) {
  auto rf = build(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true,
                     "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}}})");
  ASSERT_NE(rf.grammar, nullptr);
  EXPECT_EQ(rf.source, "response_format");
  EXPECT_TRUE(accepts(rf.grammar, R"({"ok": true})"));
  EXPECT_FALSE(accepts(rf.grammar, R"({"ok": 1})"));
  auto obj = build(R"({"response_format": {"type": "json_object"}})");
  EXPECT_TRUE(accepts(obj.grammar, R"({"a": [1, "x", null]})"));
  EXPECT_FALSE(accepts(obj.grammar, "[1]"));
  EXPECT_EQ(build(R"({"response_format": {"type": "text"}})").grammar, nullptr);
  auto gr = build(R"({"grammar": "root ::= [0-9]+"})", Endpoint::kCompletion);
  EXPECT_TRUE(accepts(gr.grammar, "42"));
  EXPECT_FALSE(accepts(gr.grammar, "4a"));
  auto js = build(R"({"json_schema": {"enum": ["a", "b"]}})", Endpoint::kCompletion);
  EXPECT_TRUE(accepts(js.grammar, "\"b\""));
  EXPECT_FALSE(accepts(js.grammar, "\"c\""));
}

TEST(StructuredOutput, ErrorsNameTheFieldAndTheKeyword) {
  ApiError e = build_error(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                              "schema": {"type": "object", "patternProperties": {}}}}})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "response_format.json_schema.schema");
  EXPECT_NE(e.message.find("patternProperties"), std::string::npos) << e.message;
  e = build_error(R"({"json_schema": {"type": "number", "multipleOf": 3}})", Endpoint::kCompletion);
  EXPECT_EQ(e.param, "json_schema");
  EXPECT_NE(e.message.find("multipleOf"), std::string::npos) << e.message;
  e = build_error(R"({"grammar": "root ::= nope"})");
  EXPECT_EQ(e.param, "grammar");
  EXPECT_NE(e.message.find("nope"), std::string::npos) << e.message;
  e = build_error(R"({"grammar": 5})");
  EXPECT_EQ(e.param, "grammar");
  e = build_error(R"({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""})");
  EXPECT_EQ(e.param, "grammar");
  e = build_error(R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                     "properties": {"a": {"type": "string", "not": {}}}}}}], "tool_choice": "required"})");
  EXPECT_EQ(e.param, "tools[0].function.parameters");
  EXPECT_NE(e.message.find("'not'"), std::string::npos) << e.message;
}

TEST(StructuredOutput, ToolChoiceModes) {
  const std::string tools = std::string(R"("tools": )") + kTools;
  auto req = build("{" + tools + R"(, "tool_choice": "required"})");
  ASSERT_NE(req.grammar, nullptr);
  EXPECT_TRUE(req.forced_tool_call);
  EXPECT_EQ(req.source, "tool_choice");
  EXPECT_TRUE(accepts(req.grammar, kAdd + "\n" + kNow));
  auto one = build("{" + tools + R"(, "tool_choice": "required", "parallel_tool_calls": false})");
  EXPECT_FALSE(accepts(one.grammar, kAdd + "\n" + kNow));
  auto named = build("{" + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "now"}}})");
  EXPECT_TRUE(accepts(named.grammar, kNow));
  EXPECT_FALSE(accepts(named.grammar, kAdd));
  // auto / default: unconstrained, unless content is constrained: then either.
  EXPECT_EQ(build("{" + tools + "}").grammar, nullptr);
  EXPECT_EQ(build("{" + tools + R"(, "tool_choice": "auto"})").grammar, nullptr);
  auto either = build("{" + tools + R"(, "response_format": {"type": "json_object"}})");
  ASSERT_NE(either.grammar, nullptr);
  EXPECT_FALSE(either.forced_tool_call);
  EXPECT_TRUE(accepts(either.grammar, kAdd));
  EXPECT_TRUE(accepts(either.grammar, R"({"x": 1})"));
  auto none = build("{" + tools + R"(, "tool_choice": "none", "response_format": {"type": "json_object"}})");
  EXPECT_FALSE(accepts(none.grammar, kAdd));
  EXPECT_TRUE(accepts(none.grammar, R"({"x": 1})"));
  // The legacy route has no tools.
  EXPECT_EQ(build("{" + tools + R"(, "tool_choice": "required"})", Endpoint::kCompletion).grammar, nullptr);
}

TEST(StructuredOutput, ParseCompletionRequestCarriesTheGrammar) {
  CompletionRequest cr;
  auto e = parse_completion_request(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": "now"}}], "tool_choice": "required"})",
                                    Endpoint::kChat, cr);
  ASSERT_FALSE(e.has_value()) << e->message;
  ASSERT_NE(*cr.sampling.grammar, nullptr);
  EXPECT_TRUE(cr.forced_tool_call);
  EXPECT_TRUE(accepts(*cr.sampling.grammar, kNow));
  e = parse_completion_request(
      R"({"prompt": "x", "json_schema": {"type": "object", "properties": {"a": {"not": {}}}}})", Endpoint::kCompletion,
      cr);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "json_schema");
  e = parse_completion_request(R"({"prompt": "x"})", Endpoint::kCompletion, cr);
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(*cr.sampling.grammar, nullptr);
}

}  // namespace
}  // namespace bonsai::server
