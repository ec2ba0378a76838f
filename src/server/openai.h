// The OpenAI HTTP API's request and response shapes, as bonsai serves them:
// parsing and validating /v1/chat/completions and /v1/completions bodies,
// and building responses, streaming chunks, model objects and error objects.
// Field names follow the OpenAI API reference (platform.openai.com/docs/
// api-reference/chat and /completions) exactly; top_k, min_p,
// repeat_penalty and ignore_eos are llama.cpp server extensions.
//
// Pure functions over nlohmann::json: no I/O, no model, so they are unit
// tested on their own.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat_output.h"       // ParsedToolCall
#include "engine/completion.h"        // PromptPiece
#include "engine/logprobs.h"          // kMaxTopLogprobs
#include "engine/sampling.h"          // SamplingOverrides
#include "tokenizer/chat_template.h"  // ChatMessage, ToolCall

namespace bonsai::server {

// An HTTP error in OpenAI's shape:
// {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // or "server_error", "authentication_error"...
  std::string param;                           // empty: null
  std::string code;                            // empty: null
  int retry_after_s = 0;                       // > 0: send a Retry-After header (503)

  nlohmann::json to_json() const;
};

// Shorthands for the errors the server returns.
ApiError bad_request(std::string message, std::string param = {}, std::string code = {});
// JSON Schema's name for v's type ("null", "boolean", "string", "array",
// "object", "number" for floats, "integer"), as the 400s name what they got.
const char* json_type_name(const nlohmann::ordered_json& v);
// 400 invalid_type: "Invalid type for 'FIELD': expected EXPECTED, but got TYPE." (param = field).
ApiError wrong_type(const std::string& field, const char* expected, const nlohmann::ordered_json& got);
ApiError overloaded(std::string message, std::string code = "overloaded", int retry_after_s = 1);

enum class Endpoint { kChat, kCompletion };

// A fill-in-the-middle request (/v1/completions `suffix`, llama.cpp's POST
// /infill): the model writes what goes between the prefix (the request's
// `prompt` text) and `suffix`. The server builds the prompt from the
// vocabulary's FIM tokens (build_fim_prompt, routes_llama.h).
struct FimRequest {
  std::string suffix;  // the text after the insertion point
  std::string middle;  // text the answer starts with, after <|fim_middle|> (llama.cpp infill's `prompt`)
  // Other files as context (llama.cpp infill's input_extra): (filename, text).
  std::vector<std::pair<std::string, std::string>> extra;
};

// A validated /v1/chat/completions or /v1/completions request, parsed once
// from its body. Optional fields are unset when the client did not send them
// (or sent null), so the model's defaults apply.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;                             // may be empty: the server's default model
  std::vector<tokenizer::ChatMessage> messages;  // chat
  nlohmann::ordered_json tools = nullptr;        // chat: OpenAI `tools` (array) or null
  bool tool_choice_none = false;                 // chat: tool_choice "none" (tool calls stay text)
  bool enable_thinking = true;                   // chat_template_kwargs.enable_thinking
  // llama-server's per-request `reasoning_format` (chat): "none" false (the
  // <think> text stays in content), "deepseek" / "deepseek-legacy" / "auto"
  // true (reasoning_content); unset: the server's --reasoning-format.
  std::optional<bool> parse_reasoning;
  // vLLM's `continue_final_message` (chat): continue the last, assistant,
  // message instead of answering it. Unset: continue exactly when the last
  // message is an assistant message without tool calls (a prefill, as
  // llama-server, Ollama and Anthropic's Messages API read one). See
  // continues_final_message.
  std::optional<bool> continue_final_message;
  std::string prompt;               // completions, text form
  std::vector<int32_t> prompt_ids;  // completions, token-id form (non-empty: used)
  // Completions, llama-server's mixed form: an array holding both token ids
  // and strings (`[1, "Once upon"]`), tokenized by engine::prepare_completion
  // (CompletionInput::prompt_pieces); non-empty: used.
  std::vector<engine::PromptPiece> prompt_pieces;
  // Completions with several prompts (`prompt` an array of 2..kMaxPrompts
  // strings or token arrays, as OpenAI's legacy completions take them): each
  // prompt's text or ids (ids non-empty: used); `prompt` / `prompt_ids` are
  // then unused. Each prompt gets n choices: choice index = prompt index * n
  // + i (OpenAI's and vLLM's numbering); usage sums the prompts.
  struct BatchPrompt {
    std::string text;
    std::vector<int32_t> ids;
    std::vector<engine::PromptPiece> pieces;  // a mixed prompt (non-empty: used)
  };
  std::vector<BatchPrompt> prompts;
  // Every sampling field, as the sequence gets it (engine::SamplingOverrides,
  // merged onto the model's defaults by engine::prepare_completion). Ranges
  // the API allows: max_tokens (or max_completion_tokens) >= 1, temperature
  // [0, 2], top_p [0, 1] (0 = 1e-6: the top token only), top_k >= 0 (0: off),
  // min_p [0, 1], repeat_penalty > 0, presence / frequency_penalty [-2, 2],
  // seed any integer (-1: a fresh random one), logit_bias {"token id": bias in [-100, 100]}, stop up
  // to kMaxStop strings (empty ones dropped). Always set, whether sent or
  // not: stop (empty), ignore_eos (false; llama.cpp extension), logit_bias
  // (empty), grammar (structured outputs — response_format json / grammar /
  // json_schema / tool_choice required or named — compiled by
  // server/structured_output.h; nullptr: unconstrained) and logprobs (< 0
  // off; k >= 0: each token's plus k alternatives, k <= 20: chat logprobs
  // true + top_logprobs k, completions logprobs k); prompt_logprobs = logprobs
  // with completions echo, else unset.
  engine::SamplingOverrides sampling;
  // llama-server's text logit biases (/completion's [["text", bias]]): every
  // token of the text gets the bias (engine::CompletionInput::logit_bias_text).
  std::vector<std::pair<std::string, float>> logit_bias_text;
  // llama-server's per-request `cache_prompt` (default true): false, the
  // prompt neither reuses cached prefix blocks nor leaves its blocks in the
  // model's prompt cache (engine::CompletionJob::cache_prompt).
  bool cache_prompt = true;
  // Ollama's /api/chat and /api/generate: a prompt longer than the context
  // is cut to fit (engine::PrepareOptions::truncate: the oldest messages, or
  // the start of the prompt), in truncate_ctx tokens (options.num_ctx; 0:
  // the model's context). kNone (OpenAI, llama-server): a 400.
  engine::PrepareOptions::Truncate truncate = engine::PrepareOptions::Truncate::kNone;
  int64_t truncate_ctx = 0;
  int n = 1;  // [1, kMaxChoices]
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool forced_tool_call = false;  // the grammar makes the answer tool calls
  bool echo = false;              // completions: the prompt precedes the answer
  // Completions with a non-empty `suffix` (a text prompt only): fill in the
  // middle between `prompt` and the suffix. Unset: a plain completion.
  std::optional<FimRequest> fim;
  // The request body when it asked for a grammar (else null): the server
  // compiles it again for a model whose template writes answers in another
  // form (server.cpp, build_output_grammar's GrammarForm).
  nlohmann::ordered_json grammar_source = nullptr;
  // sampling.logprobs, or -1 when off.
  int32_t logprobs() const { return sampling.logprobs.value_or(-1); }
};

// Whether a chat request's prompt ends inside its last message (a prefill):
// `continue_final_message` when the client sent it, else true when the last
// message is an assistant message without tool calls. The one rule for
// every chat-shaped route (OpenAI, Ollama /api/chat, Anthropic /v1/messages).
bool continues_final_message(const CompletionRequest& cr);

inline constexpr int kMaxChoices = 16;
// Most prompts one /v1/completions request may batch, and most choices
// (prompts * n) it may ask for: a larger batch is a 400 naming `prompt`.
inline constexpr int kMaxPrompts = 64;
inline constexpr size_t kMaxStop = 16;
// Deepest nesting of arrays/objects a request body may have. Parsing is
// iterative, but dumping a value (tool-call arguments, tools rendered by the
// chat template's tojson) recurses once per level: a 2 MiB body of nested
// brackets overflowed a connection thread's stack and killed the server.
// Real requests (tool JSON schemas included) stay far below this.
inline constexpr int kMaxJsonDepth = 128;

// True when `text` (JSON, possibly malformed) nests arrays/objects deeper
// than `max_depth`. One pass over the bytes, brackets inside strings ignored.
bool json_nesting_exceeds(std::string_view text, int max_depth);

// A fresh random seed (thread-safe; a 64-bit Mersenne twister seeded once per
// process from std::random_device and the clock): a request that names no
// seed (and no --seed default), or seed -1 (llama.cpp's "random"), samples
// from it, so two such requests differ and a restart does not replay them.
uint64_t fresh_seed();

// Parses and validates a request body: the JSON text is parsed once (in
// document order, which tool schemas and tool-call arguments keep). Unknown
// fields are ignored; a field of the wrong type or out of range is a 400
// naming it in `param`; a body nested deeper than kMaxJsonDepth is a 400
// (code "invalid_json").
std::optional<ApiError> parse_completion_request(std::string_view body, Endpoint endpoint, CompletionRequest& out);
// The same over a body already parsed into a JSON object (document order):
// the path of a route that translates its own dialect into a chat request
// (POST /v1/responses, routes_responses.h). Nesting depth is the caller's to check.
std::optional<ApiError> parse_completion_request_json(const nlohmann::ordered_json& body, Endpoint endpoint,
                                                      CompletionRequest& out);

// Token counts of one request (OpenAI `usage`).
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // Prompt tokens reused from the prompt cache (OpenAI
  // usage.prompt_tokens_details.cached_tokens); < 0: the field is omitted.
  int64_t cached_tokens = -1;
  nlohmann::json to_json() const;
};

// One finished choice.
struct Choice {
  std::string text;           // chat: message.content (null when empty and there are tool calls); completions: text
  std::string finish_reason;  // "stop" | "length" | "tool_calls"
  std::string reasoning;      // chat: message.reasoning_content (left out when empty)
  std::vector<engine::ParsedToolCall> tool_calls;  // chat: message.tool_calls (left out when empty)
  nlohmann::json logprobs = nullptr;               // build_chat_logprobs / build_completion_logprobs, or null
};

// One token position's log probabilities, its strings resolved by the caller
// (Tokenizer::token_to_bytes).
struct LogprobEntry {
  std::string bytes;                                        // the token's raw bytes (may be a partial UTF-8 character)
  float logprob = std::numeric_limits<float>::quiet_NaN();  // NaN: null (echo's first token)
  std::vector<std::pair<std::string, float>> top;           // (raw bytes, logprob), most likely first
};

// Chat `logprobs` (OpenAI): {"content": [{"token", "logprob", "bytes": [..],
// "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}.
// "token" is the bytes as UTF-8 with invalid sequences replaced by U+FFFD;
// "bytes" the exact byte values.
nlohmann::json build_chat_logprobs(const std::vector<LogprobEntry>& entries);
// Completions `logprobs` (OpenAI legacy): {"tokens": [..], "token_logprobs":
// [..], "top_logprobs": [{token: logprob, ..}], "text_offset": [..]}; a NaN
// logprob is null in token_logprobs and top_logprobs. text_offset: byte
// offsets into the returned text's frame (prompt + answer), the first being
// `offset0`, each next one advanced by the previous token's byte length; an
// offset below 0 (`offset0` < 0: tokens that spell bytes the echoed prompt
// leaves out, SentencePiece's dummy-prefix space) is 0.
nlohmann::json build_completion_logprobs(const std::vector<LogprobEntry>& entries, int64_t offset0);
// Concatenates two build_*_logprobs values of the same kind (chat: content
// lists; completions: each list). null + x = x.
void append_logprobs(nlohmann::json& into, const nlohmann::json& more);

// Identity shared by a response and all its chunks.
struct ResponseMeta {
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
  Endpoint endpoint = Endpoint::kChat;
};

// A new response id: prefix + 24 random hex digits (not from the sampling RNG).
std::string new_response_id(Endpoint endpoint);
// A new tool call id: "call_" + 24 random hex digits.
std::string new_tool_call_id();

// The non-streamed body: chat.completion or text_completion.
nlohmann::json build_response(const ResponseMeta& meta, const std::vector<Choice>& choices, const Usage& usage);

// Chat stream deltas of the assistant message's other parts (OpenAI
// "chat.completion.chunk"): {"reasoning_content": text} (llama-server /
// vLLM's name), and one tool call complete in one chunk:
// {"tool_calls": [{"index": k, "id", "type": "function", "function":
// {"name", "arguments"}}]} (k counts the choice's calls from 0).
nlohmann::json build_reasoning_chunk(const ResponseMeta& meta, int index, std::string_view text);
nlohmann::json build_tool_call_chunk(const ResponseMeta& meta, int index, int call_index,
                                     const engine::ParsedToolCall& call, const std::string& call_id);

// Streaming chunks (chat.completion.chunk, or text_completion for /v1/completions).
// First chunk of a chat choice: delta {"role":"assistant","content":""}.
nlohmann::json build_role_chunk(const ResponseMeta& meta, int index);
// A piece of text of choice `index`, with its tokens' `logprobs` (a
// build_*_logprobs value, or null).
nlohmann::json build_content_chunk(const ResponseMeta& meta, int index, std::string_view text,
                                   nlohmann::json logprobs = nullptr);
// The last chunk of choice `index`: empty delta (chat) / empty text, with finish_reason.
// `logprobs`: of tokens no earlier chunk carried (or null).
nlohmann::json build_finish_chunk(const ResponseMeta& meta, int index, std::string_view finish_reason,
                                  nlohmann::json logprobs = nullptr);
// stream_options.include_usage: `choices: []` and the usage.
nlohmann::json build_usage_chunk(const ResponseMeta& meta, const Usage& usage);

// Server-Sent Events framing (html.spec.whatwg.org, "Server-sent events"):
// "data: <payload>\n\n"; the stream ends with "data: [DONE]\n\n" (OpenAI).
std::string sse_event(const nlohmann::json& payload);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// An OpenAI model object {"id","object":"model","created","owned_by"}.
nlohmann::json model_object(const std::string& id, int64_t created);

}  // namespace bonsai::server
