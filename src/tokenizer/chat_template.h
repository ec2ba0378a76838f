// Chat templates: turns a conversation into the prompt text the model was
// trained on, as SEGMENTS that remember who wrote each piece of text.
//
// The GGUF stores a Jinja template (`tokenizer.chat_template`). By default
// (`--jinja`, ChatTemplate::load) it is rendered by our Jinja interpreter
// (tokenizer/jinja.h), whatever the model; a template the interpreter cannot
// parse is refused at load, naming the construct (never a silent fallback).
// The template's FAMILY is also recognised from its text: it decides how the
// model's answer is parsed (tool_call_syntax, prompt_opens_reasoning). With
// `--no-jinja`, or a built-in `--chat-template NAME`, the family's built-in
// renderer is used instead; each reproduces its template byte for byte:
//   - kQwen3:  the Qwen3 ChatML template (reasoning of earlier assistant turns
//              dropped, `enable_thinking`, tools, tool calls, tool responses),
//              matched against llama.cpp's Jinja rendering in
//              ../shared/fixtures/golden/chat-template.json.
//   - kQwen35: the Qwen3.5 template (PrismML's 27B models; llama.cpp's
//              models/templates/Qwen3.5-4B.jinja): ChatML with every text
//              trimmed, a <think> block on every assistant turn after the last
//              user query, the generation prompt opening "<think>\n" (closed
//              at once with enable_thinking=false), and tool calls in XML:
//                <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>
//              matched against Jinja2's rendering of the template stored in
//              ../shared/fixtures/qwen35 (tests/tokenizer/gen_qwen35_chat_cases.py).
//   - kChatML: plain ChatML ("<|im_start|>ROLE\nCONTENT<|im_end|>\n"), the
//              built-in renderer for any other or missing template with
//              --no-jinja, and for a model without a template (llama.cpp's
//              default).
//
// Injection safety: a segment is either text the template itself emits
// (`from_template` = true; special tokens such as <|im_start|> are recognised
// in it when tokenized) or text a user/tool/assistant supplied (always
// tokenized as plain text). A message containing "<|im_end|>\n<|im_start|>system"
// therefore cannot end its turn or inject a role. See Tokenizer::encode_chat.
#pragma once

#include <cstddef>
#include <expected>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace bonsai::tokenizer {

namespace jinja {
class Template;
}

// One tool call made by the assistant (OpenAI `tool_calls[i]`).
struct ToolCall {
  std::string id;    // "call_1" (not rendered by the Qwen3 / Qwen3.5 templates)
  std::string name;  // function.name
  // function.arguments: the JSON text as the client sent it (OpenAI sends a
  // string). Qwen3 renders it verbatim, as the template does for a string;
  // Qwen3.5 needs a JSON object (its template iterates the arguments' items)
  // and refuses anything else; empty: no arguments.
  std::string arguments;
};

// One message of a conversation (OpenAI chat message).
struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  // `content` was null or absent (an assistant turn with only tool calls).
  // A Jinja template sees null (DeepSeek's tests `content is none`) unless
  // it cannot render null content (Qwen3 concatenates it): then "".
  bool content_null = false;
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
  // Qwen3 / Qwen3.5 `enable_thinking`; false appends "<think>\n\n</think>\n\n"
  // after the generation prompt (the templates' way of switching reasoning
  // off). true: Qwen3 adds nothing, Qwen3.5 opens "<think>\n".
  bool enable_thinking = true;
  // OpenAI `tools`: a JSON array of tool objects, or null for none. Each tool
  // is rendered with Python-json.dumps-style `tojson` (", " and ": "
  // separators, keys in the order they appear here, non-ASCII kept), so parse
  // requests into nlohmann::ordered_json to keep the client's key order.
  nlohmann::ordered_json tools = nullptr;
  // Continue the last message, an assistant message (a "prefill": Anthropic's
  // Messages API, vLLM's `continue_final_message`, llama-server and Ollama
  // with a final assistant message): the prompt ends right after its content,
  // with no end-of-turn and no generation prompt (add_generation_prompt is
  // then ignored), so the model's answer continues that text.
  bool continue_final_message = false;
};

// How a template's model writes a tool call inside <tool_call>...</tool_call>.
enum class ToolCallSyntax {
  kJson,  // Qwen3: {"name": NAME, "arguments": {...}}
  kXml,   // Qwen3.5: <function=NAME> <parameter=KEY>VALUE</parameter>... </function>
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

// How a model's chat template is chosen (`bonsai serve/run/chat` flags, as
// llama.cpp's llama-server spells them).
struct ChatTemplateOptions {
  // --jinja (default) / --no-jinja: render the template with the Jinja
  // interpreter, or with the built-in renderer of its recognised family.
  bool jinja = true;
  // --chat-template NAME|TEMPLATE, or the text of --chat-template-file:
  // replaces the GGUF's template. A built-in name (builtin_template_names)
  // selects that built-in renderer; any other text is a Jinja template.
  // Empty: the GGUF's `tokenizer.chat_template`.
  std::string override_template;
};

// The names --chat-template accepts for a built-in renderer: "chatml",
// "qwen3", "qwen35".
std::span<const std::string_view> builtin_template_names();

// A chat template recognised from its Jinja source. Cheap to copy; immutable.
class ChatTemplate {
 public:
  enum class Family {
    kQwen3,   // Qwen3 ChatML with <think> handling and tools
    kQwen35,  // Qwen3.5: <think> on every late assistant turn, XML tool calls
    kChatML,  // plain ChatML (fallback)
  };

  // Recognises the family from the template text (empty text → kChatML):
  // kQwen35 by its XML tool-call markers ("<function=", "<parameter=") with
  // ChatML and <think>/reasoning_content handling (Qwen3-Coder's template,
  // which has the XML calls but no <think>, stays ChatML); kQwen3 by ChatML
  // with <think>/reasoning_content. Never fails: an unknown template falls
  // back to plain ChatML.
  static ChatTemplate from_text(std::string_view jinja_source);

  // The template a model renders with: `options.override_template` if
  // given, else `gguf_source` (the GGUF's `tokenizer.chat_template`; empty:
  // none, then built-in ChatML as llama.cpp does). A built-in name or
  // options.jinja == false: the family's built-in renderer (from_text).
  // Otherwise the Jinja interpreter renders the text, with `bos_token` /
  // `eos_token` set to the given texts (the model's BOS / EOS tokens as
  // llama.cpp passes them; "" when the vocabulary has none).
  // Errors (kUnsupported): the interpreter cannot parse the template; the
  // message names the construct and its line and points to
  // `--chat-template chatml` / `--no-jinja`.
  static core::Expected<ChatTemplate> load(std::string_view gguf_source, const ChatTemplateOptions& options,
                                           std::string bos_token, std::string eos_token);

  // True when render() runs the Jinja interpreter (load with jinja on).
  bool uses_jinja() const { return jinja_ != nullptr; }

  Family family() const { return family_; }
  // "qwen3", "qwen35" or "chatml" (for logs and `bonsai info`).
  std::string_view family_name() const;
  // The syntax the family's model writes tool calls in (kXml for kQwen35,
  // kJson otherwise).
  ToolCallSyntax tool_call_syntax() const;
  // True when render(..., options) ends inside an open <think> block, so
  // the model's answer starts with reasoning and no "<think>" of its own
  // (kQwen35 with add_generation_prompt and enable_thinking, not continuing
  // a final message).
  bool prompt_opens_reasoning(const ChatOptions& options) const;
  // The Jinja source it was built from (may be empty).
  const std::string& source() const { return source_; }
  // "jinja" or "built-in" and the family (for logs and `bonsai info`).
  std::string describe() const;

  // Renders `messages`. Errors (kInvalidArgument, message names the message
  // index and field): continue_final_message with a last message that is
  // not an assistant message without tool calls, or a template that does
  // not render that message's content (then it cannot be continued); no messages, a role other than
  // system/user/assistant/ tool, `tools` that is neither null nor an array; for kQwen35 also what its template refuses
  // (raise_exception): no user query (a user message that is not only a <tool_response>), a system message after the
  // first, and tool-call arguments that are not a JSON object. Through Jinja: kInvalidArgument with the template's
  // raise_exception message or runtime error ("jinja: line N: ..."), kResourceExhausted when the template exceeds
  // jinja::Limits. The Jinja template sees `messages` (role, content, reasoning_content when given, tool_calls as
  // [{id, type: "function", function: {name, arguments}}], tool_call_id),
  // `tools` (when not null), add_generation_prompt, enable_thinking,
  // bos_token and eos_token. Tool-call arguments are passed as the JSON
  // text when the template renders a string argument verbatim (probed at
  // load, as llama.cpp's minja does), else parsed to a JSON object.
  core::Expected<RenderedChat> render(std::span<const ChatMessage> messages, const ChatOptions& options = {}) const;

 private:
  core::Expected<RenderedChat> render_jinja(std::span<const ChatMessage> messages, const ChatOptions& options) const;

  Family family_ = Family::kChatML;
  std::string source_;
  // The parsed template when rendering through Jinja (shared, immutable).
  std::shared_ptr<const jinja::Template> jinja_;
  std::string bos_token_, eos_token_;
  // Probed at load: tool-call arguments given as the JSON text (true) or
  // parsed to an object (false); null content passed as null (true) or "".
  bool string_arguments_ = true;
  bool null_content_ = true;
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
// {"type":"text","text":...} parts (joined with "\n", as llama.cpp's server
// and vLLM join them); `reasoning_content` a string;
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
// ", " between items, ": " after keys, no newlines, keys in stored order,
// floats as Python's repr (shortest round-trip digits; exponent form below
// 1e-4 and from 1e16: 1e-05, 1e+16; integral values end in ".0").
std::string to_python_json(const nlohmann::ordered_json& value);

// Python's str() of a JSON value as a Jinja `| string` filter writes it in
// Hugging Face's Jinja2 renderer: a string verbatim, true/false/null as
// True/False/None, numbers as Python prints them, objects and arrays with
// to_python_json. (How the Qwen3.5 template writes a tool-call parameter
// value; it uses tojson for objects and arrays.)
std::string to_python_str(const nlohmann::ordered_json& value);

}  // namespace bonsai::tokenizer
