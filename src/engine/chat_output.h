// ChatOutputParser: splits the text a Qwen3 model generates into OpenAI's
// assistant-message parts as it streams: `reasoning_content` (the text inside
// <think>...</think>), `content`, and `tool_calls` (each
// <tool_call>{"name": ..., "arguments": ...}</tool_call> block).
//
// Formats (Qwen3's chat template, tokenizer.chat_template in the GGUF):
//   - reasoning: "<think>\n" REASONING "\n</think>\n\n" CONTENT; the
//     whitespace right after <think> and </think> is dropped, as llama-server's
//     `--reasoning-format deepseek` does. A generation that starts inside the
//     reasoning (the prompt ended in "<think>\n") sets
//     Options::starts_in_reasoning. A "</think>" that never comes leaves all
//     text as reasoning (finish_reason "length" mid-thought).
//   - tool calls: "<tool_call>\n" JSON "\n</tool_call>", JSON an object with a
//     string "name" and "arguments" (an object, or a string holding JSON);
//     several may follow each other (parallel calls). A block whose JSON does
//     not parse, or lacks a string name, is kept as plain content (the client
//     sees what the model wrote rather than losing it).
//
// Streaming: feed() returns only text that can no longer change meaning. A
// chunk ending in a prefix of a tag ("<thi", "</tool_") is held back until
// the next chunk decides it; finish() releases whatever is left.
//
// Not thread-safe: one parser per choice of one request.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace bonsai::engine {

// One parsed tool call (OpenAI `tool_calls[i].function`).
struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text of the arguments object (compact, as nlohmann::json::dump)
};

// What one feed()/finish() call adds. All parts are empty when nothing is ready.
struct ChatOutputDelta {
  std::string reasoning;                   // new reasoning_content text
  std::string content;                     // new content text
  std::vector<ParsedToolCall> tool_calls;  // tool calls completed by this chunk, in order
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ChatOutputParser {
 public:
  struct Options {
    bool parse_reasoning = true;       // false: <think> text stays in content (--reasoning-format none)
    bool parse_tool_calls = true;      // false: <tool_call> text stays in content (no tools in the request)
    bool starts_in_reasoning = false;  // the prompt already opened <think>
  };

  ChatOutputParser() : ChatOutputParser(Options{}) {}
  explicit ChatOutputParser(Options options);

  // Appends generated text (any split, UTF-8 or not: tags are ASCII).
  ChatOutputDelta feed(std::string_view text);
  // End of generation: releases held-back text. An unterminated <tool_call>
  // block is returned as content; unterminated reasoning as reasoning.
  ChatOutputDelta finish();

  // Every tool call parsed so far (the non-streaming response's tool_calls).
  const std::vector<ParsedToolCall>& tool_calls() const { return calls_; }

 private:
  enum class Mode { kContent, kReasoning, kToolCall };
  // Consumes as much of buf_ as is decided; appends to `out`.
  void drain(ChatOutputDelta& out, bool final);
  void emit_text(ChatOutputDelta& out, std::string_view text);
  void close_tool_call(ChatOutputDelta& out);

  Options opt_;
  Mode mode_ = Mode::kContent;
  std::string buf_;        // undecided text
  std::string call_text_;  // body of the <tool_call> block being read
  bool skip_ws_ = false;   // drop whitespace at the start of the next text (after a tag)
  std::vector<ParsedToolCall> calls_;
};

}  // namespace bonsai::engine
