// Structured outputs: request fields -> grammar (server/structured_output.h).
// Each grammar is checked by feeding it texts it must accept and texts it
// must refuse (structured::GrammarState), and the 400s by their param and message.
#include "server/structured_output.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "engine/chat_output.h"  // ChatOutputParser (the XML grammar and parser agree)
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

// The schemas zod 4's zodResponseFormat sends (openai 6: z.toJSONSchema,
// draft-7, strict) for z.email(), z.uuid(), z.url(), z.iso.date(),
// z.iso.datetime(), .positive(), .min(0.5), .multipleOf(5): accepted (were
// 400s), each grammar taking a value zod accepts and refusing one it rejects.
TEST(StructuredOutput, ZodFormatsAndNumberChecksAreAccepted) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {R"({"type":"string","format":"email","pattern":"^(?:[A-Za-z0-9_'+\\-]+\\.)*[A-Za-z0-9_'+\\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"})",
       R"("ann.lee@mail.example.org")", R"("ann.@mail.example.org")"},
      {R"({"type":"string","format":"uuid","pattern":"^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$"})",
       R"("3f2b8c1e-9d4a-4b6e-8f00-1a2b3c4d5e6f")", R"("3f2b8c1e-9d4a-0b6e-8f00-1a2b3c4d5e6f")"},
      {R"({"type":"string","format":"uri"})", R"("https://example.com/a/b?x=1#top")", R"("example.com")"},
      {R"({"type":"string","format":"date","pattern":"^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))$"})",
       R"("2024-02-29")", R"("2023-02-29")"},
      {R"({"type":"string","format":"date-time","pattern":"^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))T(?:(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d+)?(?:Z))$"})",
       R"("2024-05-01T12:30:00.25Z")", R"("2024-05-01T12:30:00+02:00")"},
      {R"({"type":"number","exclusiveMinimum":0})", "0.001", "0"},
      {R"({"type":"number","minimum":0.5})", "0.5", "0.49"},
      {R"({"type":"number","multipleOf":5})", "-15", "12"},
  };
  for (const auto& [schema, good, bad] : cases) {
    SCOPED_TRACE(schema);
    const std::string body = R"({"response_format": {"type": "json_schema", "json_schema": {"name": "v", "strict": true,
        "schema": {"type": "object", "properties": {"v": )" +
                             schema + R"(}, "required": ["v"], "additionalProperties": false}}}})";
    auto rf = build(body);
    EXPECT_TRUE(accepts(rf.grammar, R"({"v": )" + good + "}"));
    EXPECT_FALSE(accepts(rf.grammar, R"({"v": )" + bad + "}"));
  }
}

TEST(StructuredOutput, ErrorsNameTheFieldAndTheKeyword) {
  ApiError e = build_error(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                              "schema": {"type": "object", "patternProperties": {}}}}})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "response_format.json_schema.schema");
  EXPECT_NE(e.message.find("patternProperties"), std::string::npos) << e.message;
  e = build_error(R"({"json_schema": {"type": "number", "multipleOf": 1234567}})", Endpoint::kCompletion);
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

// Large enums (a tester's 2,049 values gave a false 503 "model was
// unloaded": the matcher's start state needed one parse stack per value).
// As JSON Schema `enum` or an `anyOf` of `const`s they are a prefix tree and
// work at any size; a GBNF alternation too wide to start is a 400 naming the
// field, never an engine failure.
TEST(StructuredOutput, LargeEnumsWorkAndTooWideGrammarsAre400) {
  std::string values, consts, alts;
  for (int i = 0; i < 5000; ++i) {
    values += (i ? ",\"v" : "\"v") + std::to_string(i) + "\"";
    consts += (i ? ",{\"const\":\"v" : "{\"const\":\"v") + std::to_string(i) + "\",\"title\":\"t\"}";
  }
  for (int i = 0; i < 2049; ++i) alts += (i ? " | \\\"a" : "\\\"a") + std::to_string(i) + "\\\"";
  for (const std::string& schema : {"{\"enum\":[" + values + "]}", "{\"anyOf\":[" + consts + "]}"}) {
    auto rf = build(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": )" + schema +
                    "}}}");
    ASSERT_NE(rf.grammar, nullptr) << schema.substr(0, 40);
    for (const char* ok : {"\"v0\"", "\"v4999\"", "\"v10\"", "\"v1\""}) EXPECT_TRUE(accepts(rf.grammar, ok)) << ok;
    for (const char* bad : {"\"v5000\"", "\"v\"", "\"v01\"", "\"v49999\""})
      EXPECT_FALSE(accepts(rf.grammar, bad)) << bad;
  }
  ApiError e = build_error(R"({"grammar": "root ::= )" + alts + R"("})", Endpoint::kCompletion);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "grammar");
  EXPECT_NE(e.message.find("parse-stack"), std::string::npos) << e.message;
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

// ---- Qwen3.5: XML tool calls (GrammarForm kXml) ----

const std::string kAddXml =
    "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n-2\n</parameter>\n</function>\n"
    "</tool_call>";
const std::string kNowXml = "<tool_call>\n<function=now>\n</function>\n</tool_call>";
// find's id is a $ref to a string schema: written raw, as the template writes strings.
const std::string kFindXml =
    "<tool_call>\n<function=find>\n<parameter=id>\nQ7\n</parameter>\n</function>\n</tool_call>";
// note(text: string, tags: array, level: integer optional).
const char* kNoteTool = R"({"type": "function", "function": {"name": "note", "parameters": {"type": "object",
    "properties": {"text": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "level": {"type": "integer"}}, "required": ["text", "tags"]}}})";

std::string note_call(const std::string& text, const std::string& rest = "") {
  return "<tool_call>\n<function=note>\n<parameter=text>\n" + text +
         "\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n" + rest + "</function>\n</tool_call>";
}

TEST(StructuredOutput, XmlToolCallGrammarAcceptsTheQwen35FormOnly) {
  auto tools = ordered_json::parse(kTools);
  tools.push_back(ordered_json::parse(kNoteTool));
  std::string gbnf;
  ASSERT_FALSE(tool_call_gbnf(tools, std::nullopt, true, gbnf, tokenizer::ToolCallSyntax::kXml).has_value());
  auto g = compile(gbnf);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(accepts(g, kAddXml));
  EXPECT_TRUE(accepts(g, kNowXml));
  EXPECT_TRUE(accepts(g, kFindXml));
  EXPECT_TRUE(accepts(g, kAddXml + "\n" + kNowXml + "\n" + kFindXml));
  // String values: any text without "</parameter>", newlines and tags included.
  EXPECT_TRUE(accepts(g, note_call("line 1\n<b>bold</b> </param a<b\n\n  São 🦙")));
  EXPECT_TRUE(accepts(g, note_call("")));
  EXPECT_TRUE(accepts(g, note_call(std::string(5000, 'x') + "\n" + std::string(3000, '<'))));  // long: no deep stacks
  EXPECT_TRUE(accepts(g, note_call("x", "<parameter=level>\n3\n</parameter>\n")));
  EXPECT_FALSE(accepts(g, note_call("a</parameter>b")));
  EXPECT_FALSE(accepts(g, note_call("x", "<parameter=level>\nhigh\n</parameter>\n")));  // not an integer
  EXPECT_FALSE(
      accepts(g, "<tool_call>\n<function=note>\n<parameter=text>\nx\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(g, "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(g,
                       "<tool_call>\n<function=add>\n<parameter=a>\nx\n</parameter>\n<parameter=b>\n2\n</parameter>\n"
                       "</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(g, "<tool_call>\n<function=sub>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(g, kAdd));  // Qwen3's JSON form
  EXPECT_FALSE(accepts(g, ""));
  std::string one;
  ASSERT_FALSE(tool_call_gbnf(tools, std::string("now"), false, one, tokenizer::ToolCallSyntax::kXml).has_value());
  auto g1 = compile(one);
  ASSERT_NE(g1, nullptr);
  EXPECT_TRUE(accepts(g1, kNowXml));
  EXPECT_FALSE(accepts(g1, kNowXml + "\n" + kNowXml));
  EXPECT_FALSE(accepts(g1, kAddXml));
}

// What the grammar lets the model write, the parser reads back as the call
// (the two share engine::schema_resolves_to_string).
TEST(StructuredOutput, XmlToolCallGrammarAndParserAgree) {
  auto tools = ordered_json::parse(kTools);
  tools.push_back(ordered_json::parse(kNoteTool));
  std::string gbnf;
  ASSERT_FALSE(tool_call_gbnf(tools, std::nullopt, true, gbnf, tokenizer::ToolCallSyntax::kXml).has_value());
  auto g = compile(gbnf);
  ASSERT_NE(g, nullptr);
  const std::string text =
      kAddXml + "\n" + kFindXml + "\n" + note_call("7\n<i>", "<parameter=level>\n2\n</parameter>\n");
  ASSERT_TRUE(accepts(g, text));
  engine::ChatOutputParser::Options opt;
  opt.tool_call_syntax = tokenizer::ToolCallSyntax::kXml;
  opt.tools = std::make_shared<const ordered_json>(tools);
  engine::ChatOutputParser p(opt);
  auto d = p.feed(text);
  auto f = p.finish();
  EXPECT_EQ(d.content + f.content, "");
  ASSERT_EQ(p.tool_calls().size(), 3u);
  EXPECT_EQ(p.tool_calls()[0].arguments, R"({"a":1,"b":-2})");
  EXPECT_EQ(p.tool_calls()[1].arguments, R"({"id":"Q7"})");
  EXPECT_EQ(p.tool_calls()[2].name, "note");
  EXPECT_EQ(p.tool_calls()[2].arguments, R"({"text":"7\n<i>","tags":["a","b"],"level":2})");
}

// A prompt that opened <think>: reasoning first, then "</think>\n\n", then
// what is constrained (forced calls or a response format).
TEST(StructuredOutput, OpenReasoningComesBeforeTheConstrainedAnswer) {
  const std::string tools = std::string(R"("tools": )") + kTools;
  OutputGrammar og;
  const GrammarForm form{tokenizer::ToolCallSyntax::kXml, /*opens_reasoning=*/true};
  ASSERT_FALSE(build_output_grammar(ordered_json::parse("{" + tools + R"(, "tool_choice": "required"})"),
                                    Endpoint::kChat, og, form)
                   .has_value());
  ASSERT_NE(og.grammar, nullptr);
  EXPECT_TRUE(og.forced_tool_call);
  EXPECT_TRUE(accepts(og.grammar, "The user wants a sum.\n<think> </thin\n</think>\n\n" + kAddXml));
  EXPECT_TRUE(accepts(og.grammar, "</think>\n\n" + kNowXml + "\n" + kAddXml));
  EXPECT_FALSE(accepts(og.grammar, kAddXml));  // the open <think> must be closed first
  EXPECT_FALSE(accepts(og.grammar, "a</think>\n\nb</think>\n\n" + kAddXml));
  EXPECT_FALSE(accepts(og.grammar, "</think>\n\n" + kAdd));
  OutputGrammar rf;
  ASSERT_FALSE(build_output_grammar(ordered_json::parse(R"({"response_format": {"type": "json_object"}})"),
                                    Endpoint::kChat, rf, form)
                   .has_value());
  EXPECT_TRUE(accepts(rf.grammar, "hmm\n</think>\n\n{\"a\": 1}"));
  EXPECT_FALSE(accepts(rf.grammar, "{\"a\": 1}"));
  // The default form is Qwen3's, unchanged.
  EXPECT_TRUE(accepts(build("{" + tools + R"(, "tool_choice": "required"})").grammar, kAdd));
}

TEST(StructuredOutput, TextWithoutPatternRules) {
  auto g = compile("root ::= t-0 \"!\"\n" + text_without_gbnf("</x>", "t"));
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"!", "a!", "<<</x!", "</ x>!", "<</</x<>!", "</x!"}) EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {"</x>!", "a<</x>b!", "</x></x>!"}) EXPECT_FALSE(accepts(g, bad)) << bad;
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
