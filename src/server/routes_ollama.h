// Ollama's HTTP API (internal to src/server), as bonsai serves it
// (github.com/ollama/ollama, docs/api.md; field names exactly as there), so
// Ollama clients (the `ollama` npm / Python packages, Open WebUI's Ollama
// connection) can use `bonsai serve`:
//   GET  /api/version     {"version"}: kOllamaApiVersion
//   GET  /api/tags        {"models": [{name, model, modified_at, size, digest, details}]}
//   POST /api/show        {"model"} -> {modelfile, parameters, template, details,
//                         model_info, capabilities, modified_at}
//   GET  /api/ps          the loaded models: {"models": [{name, model, size,
//                         digest, details, expires_at, size_vram, context_length}]}
//   POST /api/chat        messages -> an assistant message; NDJSON stream
//                         ("stream" absent or true: application/x-ndjson, one
//                         JSON object a line, the last with "done": true and
//                         the counts) or one object ("stream": false)
//   POST /api/generate    a prompt -> "response" text (the chat template
//                         applied with `system`, unless "raw": true: then the
//                         prompt is the model's input as written; with a
//                         "suffix", fill in the middle as /infill); an empty
//                         prompt only loads / unloads the model (done_reason
//                         "load" / "unload"), as an empty /api/chat does
//   POST /api/embed       {"model", "input": str | [str], "dimensions"?} ->
//                         {"model", "embeddings", "total_duration",
//                         "load_duration", "prompt_eval_count"}
//                         (L2-normalised, as Ollama's; "dimensions" keeps the
//                         first values and normalises again; an input longer
//                         than the context is cut to its first n_ctx tokens,
//                         Ollama's "truncate" (default true); false: a 400)
//   POST /api/embeddings  (older) {"model", "prompt"} -> {"embedding"} (the
//                         same vector as /api/embed's: normalised)
//   POST /api/pull, /api/push, /api/create, /api/copy, DELETE /api/delete:
//                         models are GGUF files named at start (-m ID=FILE)
//                         or loaded by POST /admin/models/load: a pull of a
//                         served model answers {"status": "success"}, the
//                         rest 501 saying so.
// Every error is Ollama's {"error": "message"} with the HTTP status
// (send_ollama_error); unknown /api/ paths 404 the same way.
//
// One preparation path with chat completions (as /v1/responses): a chat or
// generate request is translated into the chat-completions (raw generate:
// completions) body it means, read by parse_completion_request_json and
// submitted through the server's chat path (ChatSubmitter); the text is
// split by engine::ChatOutputParser: reasoning -> "thinking", tool calls
// -> message.tool_calls [{"id", "function": {"index", "name", "arguments":
// an object}}]. Mapping:
//   model         a served id, or the id with ":latest" (how /api/tags
//                 names an id without a tag)
//   messages      role / content / thinking (-> reasoning_content) /
//                 tool_calls / tool_name; "images" are refused (text models)
//   tools         OpenAI's shape already; passed on
//   (extensions)  tool_choice and parallel_tool_calls (OpenAI's) and grammar
//                 (llama.cpp's), which Ollama has not, are read as on chat
//                 completions (a client forces a tool call with them)
//   format        "json" -> response_format json_object; a JSON Schema
//                 object -> json_schema (the grammar engine constrains the
//                 answer to it)
//   think         false -> chat_template_kwargs.enable_thinking false; true
//                 or "high" / "medium" / "low" -> thinking on
//   options       num_predict (> 0: max_tokens; <= 0: no limit but the
//                 context), temperature, top_k, top_p, min_p, seed, stop,
//                 repeat_penalty, presence_penalty, frequency_penalty;
//                 num_ctx bounds the prompt (see truncate below; the
//                 model's context is not changed per request); the others
//                 (num_thread, mirostat, ...: load-time settings or
//                 samplers bonsai has not) are ignored, as Ollama ignores
//                 options a model does not use
//   truncate      (default true) a prompt that does not fit min(num_ctx,
//                 the model's context) with room left to answer
//                 (num_predict when given, else a quarter of it, at most
//                 half) is cut as Ollama cuts it instead of refused: /api/chat drops
//                 the oldest messages but system ones (the last message
//                 always stays), /api/generate drops the start of its
//                 prompt and keeps the end (engine::PrepareOptions::
//                 truncate); num_predict beyond what the context then
//                 leaves stops at the context (done_reason "length").
//                 false, or what still does not fit (one huge last
//                 message): a 400 naming the context length, as before
//   keep_alive    a number of seconds or a Go duration ("5m", "1h30m",
//                 "0"); 0 unloads the model once the request has answered
//                 and no other request holds it (ModelPool::unload); a
//                 positive D unloads it once no request has used it for D
//                 (ModelPool::set_keep_alive; /api/ps's expires_at says
//                 when); negative, or absent (bonsai's default), keeps it
//                 until another model needs its room or an admin unloads
//                 it (expires_at "9999-12-31T23:59:59Z"). Each /api/chat,
//                 /api/generate and /api/embed request sets the model's
//                 duration anew, as Ollama's do; other APIs' requests only
//                 restart its idle time
// Times in answers are nanoseconds: total_duration (admission -> answer),
// load_duration (admission -> the job's submission: the model's on-demand
// load, rendering and tokenizing), prompt_eval_duration / eval_duration
// (the engine's prefill / decode time); prompt_eval_count is the prompt's
// tokens and eval_count the generated ones (chat completions' usage);
// done_reason "stop" or "length".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai.h"            // ApiError
#include "server/routes_common.h"     // ServerContext
#include "server/routes_responses.h"  // ChatSubmitter
#include "server/transport.h"         // HttpTransport, HttpResponse

namespace bonsai::server {

// The Ollama API version GET /api/version reports: the release whose API
// shapes (think, tool calls with arguments objects, /api/embed) these routes follow.
inline constexpr std::string_view kOllamaApiVersion = "0.9.0";

// Answers `res` with Ollama's error body {"error": e.message}, e.status
// (and Retry-After when set).
void send_ollama_error(HttpResponse& res, const ApiError& e);

// `keep_alive` (Ollama: a number of seconds, or a Go duration string such
// as "5m", "1h30m", "300ms", "-1m"; negative: forever) in seconds, or
// nullopt when absent / null. A string that is not a duration or another
// type is a 400 naming keep_alive.
std::optional<ApiError> parse_keep_alive(const nlohmann::ordered_json& body, std::optional<double>& seconds);

// The chat-completions body an /api/chat body means (see the mapping above;
// "stream", "keep_alive" are the caller's). A field of the wrong type or
// value is a 400 whose message names the Ollama field. The returned body's
// "model" is the name as sent (the caller resolves it).
std::optional<ApiError> ollama_chat_body(const nlohmann::ordered_json& body, nlohmann::ordered_json& chat);
// The body an /api/generate body means: chat completions (prompt as the
// user message after `system`) or, with "raw": true, completions (`endpoint`
// says which); with a non-empty "suffix", completions with OpenAI's
// `suffix` (fill in the middle, the prompt the prefix: a 400 later when the
// vocabulary has no FIM tokens, as /infill). images, template and context
// are refused (400) when not empty: bonsai's models read no images, and the
// template is the GGUF's.
std::optional<ApiError> ollama_generate_body(const nlohmann::ordered_json& body, nlohmann::ordered_json& out,
                                             Endpoint& endpoint);

// An Ollama `model` name resolved against the served ids: the id itself, or
// the id of "<id>:latest"; otherwise the name unchanged (the model lookup
// then answers 404).
std::string resolve_ollama_model(const std::string& name, const std::vector<std::string>& served_ids);
// How /api/tags and /api/ps name a served id: "<id>:latest" unless it has a ":tag".
std::string ollama_model_name(const std::string& id);

// Registers the routes above on `http`; `submit` is the server's chat path.
// `ctx` must outlive `http`'s handlers.
void add_ollama_routes(HttpTransport& http, ServerContext& ctx, ChatSubmitter submit);

}  // namespace bonsai::server
