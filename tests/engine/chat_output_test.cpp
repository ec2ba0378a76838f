// ChatOutputParser: reasoning / content / tool-call split of Qwen3 output,
// whole and streamed in every split.
#include "engine/chat_output.h"

#include <gtest/gtest.h>

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

TEST(ChatOutput, UnterminatedToolCallIsContentAtFinish) {
  expect_all_splits("ok <tool_call>\n{\"name\": \"a\"", "", "ok <tool_call>\n{\"name\": \"a\"", {});
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

}  // namespace
}  // namespace bonsai::engine
