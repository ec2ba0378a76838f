// ChatOutputParser: reasoning / content / tool-call split of Qwen3 output
// (JSON tool calls) and Qwen3.5 output (XML tool calls), whole and streamed
// in every split.
#include "engine/chat_output.h"

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace bonsai::engine {
namespace {

struct Collected {
  std::string reasoning, content;
  std::vector<ParsedToolCall> calls;
};

void add(Collected& c, const ChatOutputDelta& d) {
  c.reasoning += d.reasoning;
  c.content += d.content;
  c.calls.insert(c.calls.end(), d.tool_calls.begin(), d.tool_calls.end());
}

// Feeds `text` in pieces of `step` bytes (0: all at once), then finish().
Collected run(std::string_view text, size_t step, ChatOutputParser::Options opt = {}) {
  ChatOutputParser p(opt);
  Collected c;
  if (step == 0) step = text.size() + 1;
  for (size_t i = 0; i < text.size(); i += step) add(c, p.feed(text.substr(i, step)));
  add(c, p.finish());
  EXPECT_EQ(p.tool_calls().size(), c.calls.size());
  return c;
}

// Every chunking gives the same result as the whole text.
void expect_all_splits(std::string_view text, const std::string& reasoning, const std::string& content,
                       const std::vector<std::pair<std::string, std::string>>& calls,
                       ChatOutputParser::Options opt = {}) {
  for (size_t step : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{7}, size_t{13}}) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Collected c = run(text, step, opt);
    EXPECT_EQ(c.reasoning, reasoning);
    EXPECT_EQ(c.content, content);
    ASSERT_EQ(c.calls.size(), calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(c.calls[i].name, calls[i].first);
      EXPECT_EQ(c.calls[i].arguments, calls[i].second);
    }
  }
}

TEST(ChatOutput, PlainTextIsContent) {
  expect_all_splits("Hello <b>world</b> a < b, 2 <3", "", "Hello <b>world</b> a < b, 2 <3", {});
}

TEST(ChatOutput, ThinkBlockBecomesReasoning) {
  expect_all_splits("<think>\nLet me think.\nTwo lines.\n</think>\n\nThe answer is 4.", "Let me think.\nTwo lines.",
                    "The answer is 4.", {});
}

TEST(ChatOutput, EmptyThinkBlock) { expect_all_splits("<think>\n\n</think>\n\nHi", "", "Hi", {}); }

TEST(ChatOutput, ReasoningFormatNoneKeepsRawText) {
  ChatOutputParser::Options opt;
  opt.parse_reasoning = false;
  expect_all_splits("<think>\nx\n</think>\n\nHi", "", "<think>\nx\n</think>\n\nHi", {}, opt);
}

TEST(ChatOutput, StartsInReasoningWhenThePromptOpenedIt) {
  ChatOutputParser::Options opt;
  opt.starts_in_reasoning = true;
  expect_all_splits("\nhmm\n</think>\n\nok", "hmm", "ok", {}, opt);
}

// --reasoning-format none on an answer that starts inside the reasoning the
// prompt opened: content is the raw text with that "<think>\n" in front, so
// its </think> is balanced; tool calls after it are still parsed.
TEST(ChatOutput, ReasoningFormatNoneKeepsTheOpenedThinkTag) {
  ChatOutputParser::Options opt;
  opt.parse_reasoning = false;
  opt.starts_in_reasoning = true;
  expect_all_splits("hmm\n</think>\n\nok", "", "<think>\nhmm\n</think>\n\nok", {}, opt);
  expect_all_splits("", "", "<think>\n", {}, opt);  // nothing generated: the tag the prompt opened
  opt.tool_call_syntax = tokenizer::ToolCallSyntax::kXml;
  expect_all_splits("x\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>", "",
                    "<think>\nx\n</think>\n\n", {{"f", "{}"}}, opt);
  // Not opened by the prompt: nothing added.
  opt.starts_in_reasoning = false;
  expect_all_splits("ok", "", "ok", {}, opt);
}

TEST(ChatOutput, UnterminatedThinkStaysReasoning) {
  expect_all_splits("<think>\nstill thinking  ", "still thinking  ", "", {});
}

TEST(ChatOutput, ToolCallIsParsed) {
  expect_all_splits(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>", "",
      "", {{"get_weather", "{\"city\":\"Paris\",\"days\":2}"}});
}

TEST(ChatOutput, ParallelToolCallsAfterReasoningAndText) {
  expect_all_splits(
      "<think>\nneed two\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": [1, 2]}\"}\n</tool_call>",
      "need two", "Checking.\n", {{"a", "{}"}, {"b", "{\"x\":[1,2]}"}});
}

TEST(ChatOutput, MissingArgumentsAreAnEmptyObject) {
  expect_all_splits("<tool_call>{\"name\": \"ping\"}</tool_call>", "", "", {{"ping", "{}"}});
}

TEST(ChatOutput, BadToolCallJsonIsKeptAsContent) {
  const std::string bad = "<tool_call>\n{\"name\": \"a\", \"arguments\": {oops}\n</tool_call>";
  expect_all_splits(bad, "", bad, {});
  const std::string noname = "<tool_call>{\"arguments\": {}}</tool_call>";
  expect_all_splits(noname, "", noname, {});
  const std::string badstr = "<tool_call>{\"name\": \"a\", \"arguments\": \"not json\"}</tool_call>";
  expect_all_splits(badstr, "", badstr, {});
}

// A block cut by max_tokens (never closed) is neither a call nor content,
// streamed in any split; cut_tool_call() reports it.
TEST(ChatOutput, UnterminatedToolCallIsDroppedAtFinish) {
  expect_all_splits("ok <tool_call>\n{\"name\": \"a\"", "", "ok ", {});
  const std::string done = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  expect_all_splits("A " + done + "\n<tool_call>\n{\"name\": \"b\", \"argu", "", "A ", {{"a", R"({"x":1})"}});
  for (size_t step : {size_t{1}, size_t{4}, size_t{100}}) {
    ChatOutputParser p;
    const std::string text = "A " + done + "\n<tool_call>\n{\"name\": \"b\", \"argu";
    std::string content;
    for (size_t i = 0; i < text.size(); i += step) content += p.feed(text.substr(i, step)).content;
    EXPECT_FALSE(p.cut_tool_call());
    content += p.finish().content;
    EXPECT_TRUE(p.cut_tool_call());
    EXPECT_EQ(content, "A ");
  }
  ChatOutputParser whole;
  whole.feed("A " + done);
  whole.finish();
  EXPECT_FALSE(whole.cut_tool_call());
}

// A forced answer (only_tool_calls: tool_choice required / named) cut
// right after a call, in the next call's opening tag, returns the complete
// call and no "<tool" content (a tester saw content "<tool" from Qwen3.5);
// without the option the same tail is text the model wrote.
TEST(ChatOutput, ForcedCallsDropACutOpeningTag) {
  const std::string done = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  ChatOutputParser::Options forced;
  forced.only_tool_calls = true;
  for (const std::string& tail : {std::string("\n<tool"), std::string("<"), std::string("\n<tool_call")}) {
    SCOPED_TRACE(tail);
    expect_all_splits(done + tail, "", "", {{"a", R"({"x":1})"}}, forced);
    ChatOutputParser p(forced);
    p.feed(done + tail);
    p.finish();
    EXPECT_TRUE(p.cut_tool_call());
  }
  // (The whitespace after a closed call is dropped, as always.)
  expect_all_splits(done + "\n<tool", "", "<tool", {{"a", R"({"x":1})"}});
  // Text that is not a tag prefix stays (the grammar would not write it).
  expect_all_splits(done + " <b", "", "<b", {{"a", R"({"x":1})"}}, forced);
}

// With the request's tools given, only their functions become calls; a call
// to any other name is the model's text (JSON form; the XML form below).
TEST(ChatOutput, UndeclaredFunctionStaysContent) {
  ChatOutputParser::Options opt;
  opt.tools = std::make_shared<const nlohmann::ordered_json>(nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])"));
  const std::string other = "<tool_call>\n{\"name\": \"delete_all\", \"arguments\": {}}\n</tool_call>";
  const std::string ok = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  expect_all_splits(other + ok, "", other, {{"get_weather", R"({"city":"Oslo"})"}}, opt);
  // A prefix or a case variant of a declared name is not it.
  const std::string near =
      "<tool_call>{\"name\": \"get_weathe\"}</tool_call><tool_call>{\"name\": \"Get_weather\"}</tool_call>";
  expect_all_splits(near, "", near, {}, opt);
}

TEST(ChatOutput, ToolParsingOffKeepsText) {
  ChatOutputParser::Options opt;
  opt.parse_tool_calls = false;
  const std::string t = "<tool_call>{\"name\": \"a\"}</tool_call>";
  expect_all_splits(t, "", t, {}, opt);
}

TEST(ChatOutput, PartialTagIsHeldBackThenReleased) {
  ChatOutputParser p;
  auto d = p.feed("Hi <thi");
  EXPECT_EQ(d.content, "Hi ");
  d = p.feed("s is not a tag");
  EXPECT_EQ(d.content, "<this is not a tag");
  d = p.feed(" <tool_");
  EXPECT_EQ(d.content, " ");
  d = p.finish();
  EXPECT_EQ(d.content, "<tool_");
}

TEST(ChatOutput, MultibyteUtf8PassesThroughUnchanged) {
  expect_all_splits("<think>\n\xe4\xb8\xad\xe6\x96\x87\n</think>\n\n\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80",
                    "\xe4\xb8\xad\xe6\x96\x87", "\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80", {});
}

// ---- Qwen3.5: XML tool calls ----

// The request's tools: get_weather(city: string, days: integer,
// units: ["string", "null"]), set(flag: boolean, obj: object, list: array,
// n: ["integer", "null"], any: no type).
std::shared_ptr<const nlohmann::ordered_json> weather_tools() {
  return std::make_shared<const nlohmann::ordered_json>(nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": ["string", "null"]}}}}},
    {"type": "function", "function": {"name": "set", "parameters": {"type": "object", "properties": {
      "flag": {"type": "boolean"}, "obj": {"type": "object"}, "list": {"type": "array"},
      "n": {"type": ["integer", "null"]}, "any": {"description": "no type"}}}}}])"));
}

ChatOutputParser::Options xml_options(bool starts_in_reasoning = false) {
  ChatOutputParser::Options opt;
  opt.tool_call_syntax = tokenizer::ToolCallSyntax::kXml;
  opt.tools = weather_tools();
  opt.starts_in_reasoning = starts_in_reasoning;
  return opt;
}

const std::string kWeatherCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "</function>\n</tool_call>";

TEST(ChatOutputXml, ToolCallIsParsedWithDeclaredTypes) {
  expect_all_splits(kWeatherCall, "", "", {{"get_weather", R"({"city":"Paris","days":3})"}}, xml_options());
}

TEST(ChatOutputXml, ReasoningFromTheOpenedThinkThenTextThenParallelCalls) {
  // As a Qwen3.5 answer comes after a prompt ending "<think>\n".
  const std::string text = "Need the weather.\n</think>\n\nLet me check.\n\n" + kWeatherCall +
                           "\n<tool_call>\n<function=set>\n<parameter=flag>\ntrue\n</parameter>\n<parameter=obj>\n"
                           "{\"a\": [1, \"é\"]}\n</parameter>\n<parameter=list>\n[1, 2]\n</parameter>\n<parameter=n>\n"
                           "null\n</parameter>\n<parameter=any>\n4.5\n</parameter>\n</function>\n</tool_call>\n";
  expect_all_splits(text, "Need the weather.", "Let me check.\n\n",
                    {{"get_weather", R"({"city":"Paris","days":3})"},
                     {"set", R"({"flag":true,"obj":{"a":[1,"é"]},"list":[1,2],"n":null,"any":4.5})"}},
                    xml_options(/*starts_in_reasoning=*/true));
}

TEST(ChatOutputXml, StringTypedUndeclaredAndUnparsableValuesStayStrings) {
  // city is a string even when it looks like a number; days that is not JSON
  // stays the model's text; an undeclared parameter or tool is a string;
  // ["string", "null"] resolves to a string.
  expect_all_splits(
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n<parameter=days>\nthree\n"
      "</parameter>\n<parameter=units>\nnull\n</parameter>\n<parameter=extra>\n7\n</parameter>\n</function>\n"
      "</tool_call>",
      "", "", {{"get_weather", R"({"city":"123","days":"three","units":"null","extra":"7"})"}}, xml_options());
  // A function the request does not declare is not a call: its block stays
  // content.
  const std::string unknown =
      "<tool_call>\n<function=unknown>\n<parameter=x>\n{\"a\": 1}\n</parameter>\n</function>\n</tool_call>";
  expect_all_splits(unknown + kWeatherCall, "", unknown, {{"get_weather", R"({"city":"Paris","days":3})"}},
                    xml_options());
  // No tools given at all: every value is a string.
  ChatOutputParser::Options no_tools;
  no_tools.tool_call_syntax = tokenizer::ToolCallSyntax::kXml;
  expect_all_splits(kWeatherCall, "", "", {{"get_weather", R"({"city":"Paris","days":"3"})"}}, no_tools);
}

TEST(ChatOutputXml, ValuesKeepNewlinesAngleBracketsAndUnicode) {
  // Only the template's newline on each side of a value is dropped.
  expect_all_splits(
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n\nSão Paulo <b>&</b>\n2 < 3\n<parameter=x> 世界 "
      "🦙\n\n"
      "</parameter>\n</function>\n</tool_call>",
      "", "", {{"get_weather", "{\"city\":\"\\nSão Paulo <b>&</b>\\n2 < 3\\n<parameter=x> 世界 🦙\\n\"}"}},
      xml_options());
  // No parameters, and values written without the newlines.
  ChatOutputParser::Options any_name = xml_options();
  any_name.tools = nullptr;  // no tools given: any name is a call
  expect_all_splits("<tool_call><function=ping></function></tool_call>", "", "", {{"ping", "{}"}}, any_name);
  expect_all_splits("<tool_call><function=get_weather><parameter=days>5</parameter></function></tool_call>", "", "",
                    {{"get_weather", R"({"days":5})"}}, xml_options());
}

TEST(ChatOutputXml, MalformedBlocksAreKeptAsContent) {
  for (const std::string bad : {
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",   // no
                                                                                                        // </parameter>
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",  // no
                                                                                                        // </function>
           "<tool_call>\n<function=>\n</function>\n</tool_call>",                                       // no name
           "<tool_call>\n<function=a\nb>\n</function>\n</tool_call>",                          // name over lines
           "<tool_call>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",                 // no function
           "<tool_call>\n<function=a>\n</function>\n<function=b>\n</function>\n</tool_call>",  // two functions
           "<tool_call>\n<function=a>\ntext\n</function>\n</tool_call>",                       // stray text
           "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>",                  // Qwen3's JSON form
       }) {
    SCOPED_TRACE(bad);
    expect_all_splits("Before " + bad + " after", "", "Before " + bad + "after", {}, xml_options());
  }
  // Unterminated (cut by max_tokens): dropped, no markup in content.
  const std::string cut = "x <tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
  expect_all_splits(cut, "", "x ", {}, xml_options());
}

TEST(ChatOutputXml, Qwen3ParserDoesNotAcceptXml) {
  // The JSON syntax (Qwen3) leaves an XML block as content.
  expect_all_splits(kWeatherCall, "", kWeatherCall, {});
}

TEST(ChatOutputXml, EveryTwoPieceSplitGivesTheSameCalls) {
  const std::string text = "R\n</think>\n\nOK " + kWeatherCall + " done";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ChatOutputParser p(xml_options(true));
    Collected c;
    add(c, p.feed(std::string_view(text).substr(0, cut)));
    add(c, p.feed(std::string_view(text).substr(cut)));
    add(c, p.finish());
    ASSERT_EQ(c.calls.size(), 1u) << cut;
    EXPECT_EQ(c.calls[0].arguments, R"({"city":"Paris","days":3})") << cut;
    EXPECT_EQ(c.reasoning, "R") << cut;
    EXPECT_EQ(c.content, "OK done") << cut;
  }
}

TEST(ChatOutputXml, OptionsFollowTheTemplate) {
  const auto q35 = tokenizer::ChatTemplate::from_text("<|im_start|> <think> reasoning_content <function= <parameter=");
  const auto q3 = tokenizer::ChatTemplate::from_text("<|im_start|> <think> reasoning_content");
  tokenizer::ChatOptions chat;
  chat.tools = *weather_tools();
  auto o = chat_output_options(q35, chat, true, true);
  EXPECT_EQ(o.tool_call_syntax, tokenizer::ToolCallSyntax::kXml);
  EXPECT_TRUE(o.starts_in_reasoning);
  ASSERT_NE(o.tools, nullptr);
  EXPECT_EQ(o.tools->size(), 2u);
  chat.enable_thinking = false;
  EXPECT_FALSE(chat_output_options(q35, chat, true, true).starts_in_reasoning);
  o = chat_output_options(q3, chat, true, false);
  EXPECT_EQ(o.tool_call_syntax, tokenizer::ToolCallSyntax::kJson);
  EXPECT_FALSE(o.starts_in_reasoning);
  EXPECT_FALSE(o.parse_tool_calls);
  // Qwen3 keeps the tools too: their names are the declared functions.
  ASSERT_NE(o.tools, nullptr);
  EXPECT_EQ(o.tools->size(), 2u);
}

}  // namespace
}  // namespace bonsai::engine
