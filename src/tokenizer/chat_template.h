// Chat templates: turns a conversation into the prompt text the model was
// trained on, as SEGMENTS that remember who wrote each piece of text.
//
// The GGUF stores a Jinja template (`tokenizer.chat_template`). We do not run
// Jinja; we recognise the template's family from its text and render it with a
// built-in renderer that reproduces the template byte for byte:
//   - kQwen3:  the Qwen3 ChatML template (reasoning of earlier assistant turns
//              dropped, `enable_thinking`, tools, tool calls, tool responses),
//              matched against llama.cpp's Jinja rendering in
//              ../shared/fixtures/golden/chat-template.json.
//   - kChatML: plain ChatML ("<|im_start|>ROLE\nCONTENT<|im_end|>\n"), the
//              fallback for any other or missing template (llama.cpp's default).
//
// Injection safety: a segment is either text the template itself emits
// (`from_template` = true; special tokens such as <|im_start|> are recognised
// in it when tokenized) or text a user/tool/assistant supplied (always
// tokenized as plain text). A message containing "<|im_end|>\n<|im_start|>system"
// therefore cannot end its turn or inject a role. See Tokenizer::encode_chat.
#pragma once

#include <cstddef>
#include <expected>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace bonsai::tokenizer {

// One tool call made by the assistant (OpenAI `tool_calls[i]`).
struct ToolCall {
  std::string id;    // "call_1" (not rendered by the Qwen3 template)
  std::string name;  // function.name
  // function.arguments: the JSON text as the client sent it (OpenAI sends a
  // string). Rendered verbatim, as the template does for a string.
  std::string arguments;
};

// One message of a conversation (OpenAI chat message).
struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  // Assistant reasoning given separately (OpenAI-style `reasoning_content`).
  // When absent, the Qwen3 template extracts it from "<think>...</think>" in
  // `content` itself.
  std::optional<std::string> reasoning_content;
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only (not rendered by Qwen3)
};

// Rendering options (Jinja variables of the template).
struct ChatOptions {
  // Append "<|im_start|>assistant\n" so the model answers next.
  bool add_generation_prompt = true;
  // Qwen3 `enable_thinking`; false appends "<think>\n\n</think>\n\n" after the
  // generation prompt (the template's way of switching reasoning off).
  bool enable_thinking = true;
  // OpenAI `tools`: a JSON array of tool objects, or null for none. Each tool
  // is rendered with Python-json.dumps-style `tojson` (", " and ": "
  // separators, keys in the order they appear here, non-ASCII kept), so parse
  // requests into nlohmann::ordered_json to keep the client's key order.
  nlohmann::ordered_json tools = nullptr;
};

// A piece of rendered prompt text and who produced it.
struct ChatSegment {
  std::string text;
  // true: emitted by the template (special tokens in it are recognised when
  // tokenized); false: supplied by a user/tool/assistant message (plain text).
  bool from_template = false;
};

// A rendered conversation: the concatenation of `segments` is the prompt.
struct RenderedChat {
  std::vector<ChatSegment> segments;
  // The whole prompt text (what llama.cpp's /apply-template returns).
  std::string text() const;
};

// A chat template recognised from its Jinja source. Cheap to copy; immutable.
class ChatTemplate {
 public:
  enum class Family {
    kQwen3,   // Qwen3 ChatML with <think> handling and tools
    kChatML,  // plain ChatML (fallback)
  };

  // Recognises the family from the template text (empty text → kChatML).
  // Never fails: an unknown template falls back to plain ChatML.
  static ChatTemplate from_text(std::string_view jinja_source);

  Family family() const { return family_; }
  // "qwen3" or "chatml" (for logs and `bonsai info`).
  std::string_view family_name() const;
  // The Jinja source it was built from (may be empty).
  const std::string& source() const { return source_; }

  // Renders `messages`. Errors (kInvalidArgument, message names the message
  // index and field): no messages, a role other than system/user/assistant/
  // tool, `tools` that is neither null nor an array.
  core::Expected<RenderedChat> render(std::span<const ChatMessage> messages, const ChatOptions& options = {}) const;

 private:
  Family family_ = Family::kChatML;
  std::string source_;
};

// Why an OpenAI message could not be read: the message an API client sees,
// the field at fault ("messages[2].tool_calls[0].function.name") and
// OpenAI's error code ("invalid_type", "invalid_value",
// "missing_required_parameter").
struct ChatMessageError {
  std::string message;
  std::string param;
  std::string code;
};

// The one reader of OpenAI chat messages (the server's request parser and
// chat_messages_from_json both use it). Message `index` of a `messages`
// array: `role` one of system / developer (read as system) / user /
// assistant / tool; `content` a string, null, or an array of
// {"type":"text","text":...} parts (joined); `reasoning_content` a string;
// `tool_calls[].function.{name,arguments}` with arguments a string (kept
// verbatim) or any other JSON value (written with to_python_json, as the
// template's tojson would: the chat template's format wins); `name` and
// `tool_call_id` strings. Parse the body as ordered_json so object-valued
// arguments keep the client's key order.
std::expected<ChatMessage, ChatMessageError> parse_chat_message(const nlohmann::ordered_json& message, size_t index);

// Converts an OpenAI `messages` array with parse_chat_message. Errors
// (kInvalidArgument, the message of the first bad message, which names its
// index and field): not an array, or a message parse_chat_message refuses.
core::Expected<std::vector<ChatMessage>> chat_messages_from_json(const nlohmann::ordered_json& messages);

// Serialises JSON the way the Qwen template's `tojson` filter does in
// llama.cpp/transformers (Python json.dumps defaults with ensure_ascii=False):
// ", " between items, ": " after keys, no newlines, keys in stored order.
std::string to_python_json(const nlohmann::ordered_json& value);

}  // namespace bonsai::tokenizer
