// ChatOutputParser: splits the text a Qwen3 / Qwen3.5 model generates into
// OpenAI's assistant-message parts as it streams: `reasoning_content` (the
// text inside <think>...</think>), `content`, and `tool_calls` (each
// <tool_call>...</tool_call> block).
//
// Formats (the chat templates, tokenizer.chat_template in the GGUF):
//   - reasoning: "<think>\n" REASONING "\n</think>\n\n" CONTENT; the
//     whitespace right after <think> and </think> is dropped, as llama-server's
//     `--reasoning-format deepseek` does. A generation that starts inside the
//     reasoning (the prompt ended in "<think>\n") sets
//     Options::starts_in_reasoning. A "</think>" that never comes leaves all
//     text as reasoning (finish_reason "length" mid-thought). With
//     Options::parse_reasoning false (--reasoning-format none) the text stays
//     content as written, and an answer that starts in reasoning gets the
//     "<think>\n" its prompt opened in front, so its tags are balanced.
//   - tool calls: "<tool_call>\n" JSON "\n</tool_call>", JSON an object with a
//     string "name" and "arguments" (an object, or a string holding JSON);
//     several may follow each other (parallel calls). A block whose JSON does
//     not parse, or lacks a string name, is kept as plain content (the client
//     sees what the model wrote rather than losing it).
//   - Only declared functions become tool calls: when Options::tools holds
//     the request's `tools`, a complete block calling a name that is not one
//     of its functions is kept as plain content, like a malformed block (the
//     client could not dispatch it; a forced call's grammar never writes one).
//   - A block the generation never closes (cut by max_tokens, or the model
//     stopped inside it) is dropped: no raw <tool_call> markup reaches
//     content, streamed or not; cut_tool_call() tells the caller, whose
//     finish_reason stays "length" for a cut.
//   - Qwen3.5 tool calls (Options::tool_call_syntax kXml), one function per
//     block:
//       <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
//     VALUE is the text up to the first "</parameter>", less one newline on
//     each side (the ones the template writes). It becomes a JSON string,
//     except where the request's tool declares parameter KEY with a schema
//     that does not resolve to a string ("type" other than "string", or a
//     type list without "string", or no "type"): then VALUE is read as JSON
//     and keeps its type when it parses (7, true, {"a": 1}), else stays a
//     string. This is llama.cpp's rule for this format (string-typed
//     parameters raw, others JSON). `arguments` is the object of the
//     parameters in the order written. A block that is not exactly that
//     shape is kept as plain content. Only the template's own syntax is
//     accepted: XML in a Qwen3 answer, or JSON in a Qwen3.5 one, is content.
//
// Streaming: feed() returns only text that can no longer change meaning. A
// chunk ending in a prefix of a tag ("<thi", "</tool_") is held back until
// the next chunk decides it; finish() releases whatever is left.
//
// Not thread-safe: one parser per choice of one request.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_template.h"  // ChatTemplate, ChatOptions, ToolCallSyntax

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
    bool parse_reasoning = true;   // false: <think> text stays in content (--reasoning-format none)
    bool parse_tool_calls = true;  // false: <tool_call> text stays in content (no tools in the request)
    bool starts_in_reasoning =
        false;  // the prompt already opened <think> (with !parse_reasoning: content opens "<think>\n")
    // The syntax inside <tool_call>...</tool_call>: the template's
    // (ChatTemplate::tool_call_syntax()).
    tokenizer::ToolCallSyntax tool_call_syntax = tokenizer::ToolCallSyntax::kJson;
    // The request's OpenAI `tools` array (read-only, shared by the parsers
    // of every choice): the declared function names (a call to another name
    // stays content) and, for kXml, the parameter schemas that say which
    // values keep a JSON type. nullptr: any name is a call and every XML
    // value is a string.
    std::shared_ptr<const nlohmann::ordered_json> tools;
    // The answer is only tool calls (tool_choice required / a named
    // function: its grammar writes nothing else): a cut that leaves the
    // start of another "<tool_call>" tag ("<tool") drops it, as a cut
    // inside a block is dropped, instead of returning it as content.
    bool only_tool_calls = false;
  };

  ChatOutputParser() : ChatOutputParser(Options{}) {}
  explicit ChatOutputParser(Options options);

  // Appends generated text (any split, UTF-8 or not: tags are ASCII).
  ChatOutputDelta feed(std::string_view text);
  // End of generation: releases held-back text. An unterminated <tool_call>
  // block is dropped (see cut_tool_call); unterminated reasoning is returned
  // as reasoning.
  ChatOutputDelta finish();
  // True when finish() dropped an unterminated <tool_call> block.
  bool cut_tool_call() const { return cut_call_; }

  // Every tool call parsed so far (the non-streaming response's tool_calls).
  const std::vector<ParsedToolCall>& tool_calls() const { return calls_; }

 private:
  enum class Mode { kContent, kReasoning, kToolCall };
  // Consumes as much of buf_ as is decided; appends to `out`.
  void drain(ChatOutputDelta& out, bool final);
  void emit_text(ChatOutputDelta& out, std::string_view text);
  void close_tool_call(ChatOutputDelta& out);
  // The block body `call_text_` as a Qwen3 JSON call / Qwen3.5 XML call;
  // false when it is not one.
  bool parse_json_call(ParsedToolCall& call) const;
  bool parse_xml_call(ParsedToolCall& call) const;
  // True when Options::tools is unset or declares a function `name`.
  bool declared(std::string_view name) const;

  Options opt_;
  Mode mode_ = Mode::kContent;
  std::string buf_;        // undecided text
  std::string call_text_;  // body of the <tool_call> block being read
  bool skip_ws_ = false;   // drop whitespace at the start of the next text (after a tag)
  bool cut_call_ = false;  // finish() dropped an unterminated block
  std::vector<ParsedToolCall> calls_;
};

// Whether a tool parameter's JSON Schema resolves to a string: "type"
// "string", or a type list that holds "string", after following a local
// "$ref" ("#/$defs/NAME", any JSON pointer into `root`, the tool's
// `parameters`; at most 16 hops) — llama.cpp's rule for the XML call format.
// Such a parameter's XML value is its raw text; any other declared
// parameter's value is JSON. Shared by the parser above and the forced-call
// grammar (server/structured_output.h), which must agree.
bool schema_resolves_to_string(const nlohmann::ordered_json& schema, const nlohmann::ordered_json* root = nullptr);

// The parser options for the answer to a chat rendered with `tmpl` and
// `chat`: the tool-call syntax is the template's; the answer starts in
// reasoning when the rendered prompt opened <think>
// (ChatTemplate::prompt_opens_reasoning); `chat.tools` is kept for the
// declared function names and the XML parameter types. `parse_reasoning` / `parse_tool_calls` as in Options.
ChatOutputParser::Options chat_output_options(const tokenizer::ChatTemplate& tmpl, const tokenizer::ChatOptions& chat,
                                              bool parse_reasoning, bool parse_tool_calls);

}  // namespace bonsai::engine
