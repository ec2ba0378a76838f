// Anthropic's Messages API (internal to src/server), as bonsai serves it
// for Claude-style agents (docs.anthropic.com/en/api/messages,
// /en/api/messages-streaming, /en/api/messages-count-tokens,
// /en/api/errors; field, block and event names exactly as there):
//   POST /v1/messages               a Message ({"id": "msg_...", "type":
//                                   "message", "role": "assistant", "model",
//                                   "content": [blocks], "stop_reason",
//                                   "stop_sequence", "usage"}), or with
//                                   "stream": true Server-Sent Events
//                                   (`event:` + `data:` lines): message_start,
//                                   ping, per block content_block_start /
//                                   content_block_delta... / content_block_stop,
//                                   message_delta, message_stop; an `error`
//                                   event when the job fails mid-stream
//   POST /v1/messages/count_tokens  {"input_tokens": N}: the prompt the same
//                                   body renders to, counted, nothing generated
//
// One preparation path with chat completions (as /v1/responses): a Messages
// request is translated into the chat-completions body it means, read by
// parse_completion_request_json and prepared and submitted by the server's
// chat path (ChatSubmitter, routes_responses.h); the generated text is split
// by engine::ChatOutputParser into content blocks: "thinking" (the <think>
// text; "signature" is "": nothing is signed), "text", and "tool_use" ({"id":
// "toolu_...", "name", "input": object}).
//
// Request fields read: model (else the server's default), max_tokens
// (required, >= 1), system (a string or text blocks, joined by a blank
// line), messages (role user / assistant; content a string or blocks: text;
// tool_use and thinking in assistant turns; tool_result in user turns, which
// become chat "tool" messages, in order, before the turn's text; image and
// document blocks are a 400: the models served read text only), tools
// ({name, description?, input_schema}; type absent or "custom"), tool_choice
// ({type: auto | any | tool (+ name) | none}, disable_parallel_tool_use),
// temperature, top_p, top_k, stop_sequences, thinking ({type: enabled |
// adaptive | disabled}; absent: the model's default, as on chat completions),
// metadata (user_id), stream; llama.cpp's sampling extensions as on chat
// completions (seed, min_p, repeat_penalty, presence_penalty,
// frequency_penalty, logit_bias, ignore_eos, grammar, chat_template_kwargs,
// which `thinking` overrides). Other fields are ignored; the
// anthropic-version and anthropic-beta headers are accepted and ignored.
//
// stop_reason: "max_tokens" (the token limit or --timeout cut it),
// "stop_sequence" (one of stop_sequences; `stop_sequence` names it),
// "tool_use" (the answer has tool_use blocks), else "end_turn". usage:
// {"input_tokens": prompt tokens, "output_tokens": generated tokens}.
//
// Errors on these routes are in Anthropic's shape: {"type": "error",
// "error": {"type", "message"}} (anthropic_error_json); the message names the
// Anthropic field at fault.
#pragma once

#include <cstdint>
#include <expected>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat_output.h"       // ChatOutputDelta, ParsedToolCall
#include "server/openai.h"            // CompletionRequest, ApiError
#include "server/routes_common.h"     // ServerContext
#include "server/routes_responses.h"  // ChatSubmitter, SubmittedChat
#include "server/transport.h"         // HttpTransport

namespace bonsai::server {

// A POST /v1/messages (or count_tokens) body, validated and translated.
struct MessagesRequest {
  // The chat-completions body it means, "messages" included.
  nlohmann::ordered_json chat = nlohmann::ordered_json::object();
  std::vector<std::string> stop_sequences;  // as sent (stop_reason "stop_sequence" names one)
  bool stream = false;
};

// Validates `body` (JSON text) and translates it. `count_only`: the
// count_tokens body (max_tokens, stream and the sampling fields are not
// read; thinking and chat_template_kwargs are, as they change the prompt). A field of the wrong type or value is a 400
// whose message and `param` name the Anthropic field ("messages[1].content[0].tool_use_id"); a body nested deeper than
// kMaxJsonDepth or not a JSON object is a 400. Values the chat parser checks (ranges, tool names, schemas) are checked
// there and renamed by anthropic_error.
std::optional<ApiError> parse_messages_request(std::string_view body, MessagesRequest& out, bool count_only = false);

// `e` (an error of the chat path, named in chat-completions terms) with
// its param and the quoted names in its message renamed to the Messages
// fields: "stop" -> "stop_sequences", "tools[0].function.parameters" ->
// "tools[0].input_schema", "tools[0].function.name" -> "tools[0].name",
// "tool_choice.function.name" -> "tool_choice.name".
ApiError anthropic_error(ApiError e);

// Anthropic's error type for an HTTP status (docs.anthropic.com/en/api/errors):
// 400 invalid_request_error, 401 authentication_error, 403
// permission_error, 404 not_found_error, 413 request_too_large, 429
// rate_limit_error, 503 / 529 overloaded_error, other 5xx api_error, other
// 4xx invalid_request_error.
const char* anthropic_error_type(int status);
// {"type": "error", "error": {"type": anthropic_error_type(e.status), "message": e.message}}.
nlohmann::json anthropic_error_json(const ApiError& e);
// Answers `res` with e.status, anthropic_error_json(e) and Retry-After when set.
void send_anthropic_error(HttpResponse& res, const ApiError& e);
// True for the paths answered in Anthropic's shapes (/v1/messages and below),
// whose transport and authorization errors the server writes with
// anthropic_error_json too.
bool is_anthropic_path(std::string_view path);

// The content blocks of one Message, built as the text comes: reasoning
// opens a "thinking" block, answer text a "text" block, each tool call a
// "tool_use" block; a block is closed when another kind starts. With a
// sink, each step is also written as its stream event (name, data with
// "type"). Whitespace-only answer text is held until other text follows
// it, so the blank line after </think> or between calls opens no block.
// Not thread-safe.
class MessageContent {
 public:
  using Sink = std::function<void(const char* event, nlohmann::json data)>;
  explicit MessageContent(Sink sink = nullptr) : sink_(std::move(sink)) {}

  // Adds one parsed piece of the generation (ChatOutputParser::feed / finish).
  void add(const engine::ChatOutputDelta& d);
  // Closes the open block. A generation of whitespace only becomes one text
  // block of it; an empty one leaves `content` empty.
  void finish();

  // The blocks so far (closed ones complete), Anthropic's Message.content.
  const nlohmann::json& blocks() const { return blocks_; }
  // The answer text (every text block, joined).
  const std::string& text() const { return text_; }
  bool has_tool_use() const { return has_tool_use_; }

 private:
  enum class Open { kNone, kThinking, kText };
  void emit(const char* event, nlohmann::json data);
  void open(Open kind);
  void close();
  void add_thinking(const std::string& text);
  void add_text(const std::string& text);
  void add_tool_use(const engine::ParsedToolCall& call);

  Sink sink_;
  nlohmann::json blocks_ = nlohmann::json::array();
  Open open_ = Open::kNone;
  std::string pending_ws_;  // whitespace-only answer text not yet placed
  std::string text_;
  bool has_tool_use_ = false;
};

// Counts the prompt tokens a parsed chat request renders to with its
// model's template (nothing is submitted): the count, or the API error to
// answer (400 / 404 / 503).
using ChatCounter = std::function<std::expected<int64_t, ApiError>(CompletionRequest)>;

// Registers the routes above on `http`; `submit` is the server's chat path,
// `count` its prompt counter. `ctx` must outlive `http`'s handlers.
void add_anthropic_routes(HttpTransport& http, ServerContext& ctx, ChatSubmitter submit, ChatCounter count);

}  // namespace bonsai::server
