// OpenAI's Responses API (internal to src/server), as bonsai serves it
// (platform.openai.com/docs/api-reference/responses; field and event names
// exactly as there):
//   POST   /v1/responses       create, non-streamed (a Response object) or
//                              streamed ("stream": true: typed Server-Sent
//                              Events, `event:` + `data:` lines, each with a
//                              sequence_number, ending in response.completed /
//                              response.incomplete / response.failed; no [DONE])
//   GET    /v1/responses/{id}  a stored Response
//   DELETE /v1/responses/{id}  {"id", "object": "response.deleted", "deleted": true}
//
// One preparation path with chat completions: a Responses request is
// translated into the chat-completions request body it means (messages,
// tools, tool_choice, response_format, sampling fields), read by
// parse_completion_request_json and prepared and submitted by the server's
// chat path (the ChatSubmitter the Server gives); the generated text is split
// by the same engine::ChatOutputParser (reasoning, content, tool calls) and
// written back as Response output items: "reasoning" (the <think> text),
// "message" (output_text) and "function_call".
//
// Request fields read: model, input (a string, or items: messages with role
// user / assistant / system / developer and content a string or input_text /
// output_text parts; function_call; function_call_output; reasoning),
// instructions (a system message first; not carried to a continuation, as
// OpenAI), tools (function tools in Responses' flat shape), tool_choice,
// text.format (text / json_object / json_schema), reasoning.effort ("none"
// turns thinking off), max_output_tokens, temperature, top_p,
// parallel_tool_calls, metadata, user, store, stream, previous_response_id,
// truncation; llama.cpp's sampling extensions as on chat completions (seed,
// top_k, min_p, repeat_penalty, presence_penalty, frequency_penalty, stop,
// logit_bias, ignore_eos, chat_template_kwargs, grammar). Other fields are ignored.
// Bad input is a 400 whose `param` names the Responses field ("input[2].call_id",
// "text.format.schema", "max_output_tokens").
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/chat_output.h"    // ChatOutputParser, ChatOutputDelta
#include "engine/sampling.h"       // SamplingParams
#include "engine/scheduler.h"      // JobHandle, Clock
#include "server/job_pump.h"       // JobProgress, SubmittedChat
#include "server/openai.h"         // CompletionRequest, ApiError
#include "server/routes_common.h"  // ServerContext
#include "server/transport.h"      // HttpTransport
#include "tokenizer/tokenizer.h"   // Tokenizer

namespace bonsai::server {

// Prepares and submits a parsed chat request admitted at the given time:
// the submitted job, or the API error to answer (400 / 404 / 503).
using ChatSubmitter =
    std::function<std::expected<SubmittedChat, ApiError>(CompletionRequest, engine::Clock::time_point)>;

// A POST /v1/responses body, validated and translated.
struct ResponsesRequest {
  // The chat-completions body it means, without "messages" (the route adds
  // them: instructions, the previous response's conversation, `input`).
  nlohmann::ordered_json chat = nlohmann::ordered_json::object();
  // `input` as chat messages (OpenAI message objects), in order.
  nlohmann::ordered_json input_messages = nlohmann::ordered_json::array();
  std::optional<std::string> instructions;
  std::string previous_response_id;  // empty: none
  bool store = true;
  bool stream = false;
  // What the Response object repeats of the request (OpenAI returns them):
  // instructions, max_output_tokens, metadata, parallel_tool_calls,
  // reasoning, temperature, text, tool_choice, tools, top_p, truncation,
  // user, each with OpenAI's value when absent.
  nlohmann::json echo = nlohmann::json::object();
};

// Validates `body` (JSON text) and translates it. A field of the wrong type
// or value is a 400 naming it in `param`; a body nested deeper than
// kMaxJsonDepth or not a JSON object is a 400 "invalid_json". Checks here
// are the Responses shapes; values the chat parser checks (ranges, tool
// names, schemas) are checked there and renamed by responses_param.
std::optional<ApiError> parse_responses_request(std::string_view body, ResponsesRequest& out);

// The Responses name of a chat-completions request field in an error from
// the chat path ("max_completion_tokens" -> "max_output_tokens",
// "response_format.json_schema.schema" -> "text.format.schema",
// "tools[0].function.name" -> "tools[0].name", "messages..." -> "input").
std::string responses_param(std::string_view chat_param);
// `e` with its param (and the quoted field names in its message) renamed by responses_param.
ApiError responses_error(ApiError e);

// The output items of one response, built as the text comes: reasoning
// text opens a "reasoning" item, answer text a "message" item (its one
// "output_text" part), each tool call a "function_call" item; an item is
// closed when another kind starts. With a sink, every step is also written
// as its stream event (type, fields without "type" / "sequence_number").
// Whitespace-only answer text is held until other text follows it, so the
// blank line between calls opens no message. Not thread-safe.
class ResponseOutput {
 public:
  using Sink = std::function<void(const char* type, nlohmann::json fields)>;
  explicit ResponseOutput(Sink sink = nullptr) : sink_(std::move(sink)) {}

  // Adds one parsed piece of the generation (ChatOutputParser::feed / finish).
  void add(const engine::ChatOutputDelta& d);
  // Closes the open item; `incomplete`: it was cut by the token limit
  // (status "incomplete"). A response with no item gets an empty message.
  void finish(bool incomplete);

  // The items so far (closed ones complete; an open one as last sent).
  const nlohmann::json& items() const { return items_; }
  // The answer text (every output_text part, joined).
  const std::string& text() const { return text_; }
  // The assistant turn as an OpenAI chat message (content, reasoning_content,
  // tool_calls with the call ids): what a continuation replays.
  nlohmann::ordered_json assistant_message() const;

 private:
  enum class Open { kNone, kReasoning, kMessage };
  void emit(const char* type, nlohmann::json fields);
  void open(Open kind);
  void close(bool incomplete);
  void add_reasoning(const std::string& text);
  void add_text(const std::string& text);
  void add_call(const engine::ParsedToolCall& call);

  Sink sink_;
  nlohmann::json items_ = nlohmann::json::array();
  Open open_ = Open::kNone;
  std::string open_text_;   // text of the open item so far
  std::string pending_ws_;  // whitespace-only answer text not yet placed
  std::string text_;
  std::string reasoning_;
  nlohmann::ordered_json calls_ = nlohmann::ordered_json::array();  // chat tool_calls of the turn
};

// Past responses, for previous_response_id and GET / DELETE: the Response
// object and the conversation it ends (OpenAI chat messages: earlier turns,
// its input, its output as an assistant message; instructions left out).
// Bounded by count and bytes (each entry counted as its JSON text); the
// least recently used go first; an entry above the byte bound is not kept.
// Thread-safe (one mutex over the list and map; entries are immutable and
// shared, so readers copy nothing under the lock).
class ResponseStore {
 public:
  struct Entry {
    nlohmann::json response;
    nlohmann::ordered_json conversation;
    size_t bytes = 0;
  };
  ResponseStore(size_t max_entries, size_t max_bytes) : max_entries_(max_entries), max_bytes_(max_bytes) {}

  void put(const std::string& id, nlohmann::json response, nlohmann::ordered_json conversation);
  // The entry (most recently used now), or null.
  std::shared_ptr<const Entry> get(const std::string& id);
  // True when it was there.
  bool erase(const std::string& id);
  size_t size() const;
  size_t bytes() const;

 private:
  using List = std::list<std::pair<std::string, std::shared_ptr<const Entry>>>;
  const size_t max_entries_;
  const size_t max_bytes_;
  mutable std::mutex mu_;  // guards everything below
  List lru_;               // most recently used first
  std::unordered_map<std::string, List::iterator> index_;
  size_t bytes_ = 0;
};

// The server's store bound: 1024 responses or 64 MiB of their JSON, whichever is reached first.
inline constexpr size_t kResponseStoreMaxEntries = 1024;
inline constexpr size_t kResponseStoreMaxBytes = size_t{64} << 20;

// Registers the routes above on `http`; `submit` is the server's chat path.
// `ctx` must outlive `http`'s handlers.
void add_responses_routes(HttpTransport& http, ServerContext& ctx, ChatSubmitter submit);

}  // namespace bonsai::server
