// llama.cpp's native server routes (internal to src/server), as bonsai
// serves them (field names as llama.cpp's tools/server/README.md documents
// them, so its clients and scripts work unchanged):
//   POST /completion, /completions  a raw-prompt completion: `prompt` (a
//        string or an array of token ids), n_predict (-1: no limit; 0: the
//        prompt is evaluated into the cache, nothing generated),
//        temperature, top_k, top_p, min_p, repeat_penalty,
//        presence_penalty, frequency_penalty, seed (-1: random), stop,
//        ignore_eos, logit_bias (an object, or [[id, bias], ...] with bias
//        false: never), grammar, json_schema, return_tokens, n_probs (0..20),
//        stream. The answer: {"index", "content", "tokens", "stop": true,
//        "model", "tokens_predicted", "tokens_evaluated", "tokens_cached",
//        "prompt", "has_new_line", "truncated", "stop_type" ("eos" | "word"
//        | "limit"), "stopping_word", "stopped_eos" / "stopped_word" /
//        "stopped_limit", "generation_settings", "timings"}, and with
//        n_probs > 0 "completion_probabilities": per generated token {"id",
//        "token", "bytes", "logprob", "top_logprobs": [n_probs of {"id",
//        "token", "bytes", "logprob"}]}. Streamed: one `data: {"index",
//        "content", "stop": false}` line per piece of text (with its tokens'
//        completion_probabilities), then the whole answer above with
//        "content": "" and "stop": true (its completion_probabilities: those
//        of tokens no piece released); no [DONE] (llama.cpp's framing). An error that
//        comes after the stream started is one `data: {"error": {...}}`.
//   POST /infill  fill in the middle: input_prefix, input_suffix,
//        input_extra ([{"filename", "text"}], other files as context),
//        prompt (text the answer starts with), and /completion's sampling
//        fields; answered as /completion. The prompt is built from the
//        vocabulary's FIM tokens (build_fim_prompt); a 400 when it has none.
//   GET  /props   the model's settings: default_generation_settings
//        {"n_ctx", "params"}, total_slots, model_path, model_alias,
//        chat_template, bos_token, eos_token, modalities.
//   GET  /slots   one entry per sequence slot of the model's scheduler:
//        {"id", "n_ctx", "is_processing"}. bonsai's sequences are not bound
//        to numbered slots (a request takes any free one), so slot i is
//        busy when fewer than i + 1 are free: the count is exact, the ids
//        are only positions.
// /props and /slots take `?model=ID` (default: the server's default model).
// Bad input is a 400 in OpenAI's error shape whose `param` names the
// llama.cpp field (n_predict, input_extra[1].text...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai.h"            // FimRequest, ApiError
#include "server/routes_common.h"     // ServerContext
#include "server/routes_responses.h"  // ChatSubmitter
#include "server/transport.h"         // HttpTransport
#include "tokenizer/tokenizer.h"      // Tokenizer

namespace bonsai::server {

// The vocabulary's fill-in-the-middle tokens, by the text Qwen2.5-Coder /
// Qwen3 vocabularies give them (CodeLlama-style <PRE> / <SUF> / <MID> are
// not recognised).
inline constexpr std::string_view kFimPrefix = "<|fim_prefix|>";
inline constexpr std::string_view kFimSuffix = "<|fim_suffix|>";
inline constexpr std::string_view kFimMiddle = "<|fim_middle|>";
inline constexpr std::string_view kFileSep = "<|file_sep|>";

// The fill-in-the-middle prompt, as token ids, in the prefix-suffix-middle
// order Qwen2.5-Coder documents: [BOS when the vocabulary adds one]
// (<|file_sep|> FILENAME "\n" TEXT for each extra file) <|fim_prefix|>
// PREFIX <|fim_suffix|> SUFFIX <|fim_middle|> MIDDLE. The texts are
// tokenized as plain text (special-token text in them is not a token).
// Errors (400, param "suffix" / "input_extra"): the vocabulary lacks one of
// the three FIM tokens, or <|file_sep|> when there are extra files; the
// texts together exceed `max_prompt_bytes` (400 context_length_exceeded).
std::expected<std::vector<int32_t>, ApiError> build_fim_prompt(const tokenizer::Tokenizer& tok, std::string_view prefix,
                                                               const FimRequest& fim, size_t max_prompt_bytes);

// The prompt as text with its special tokens spelled out (control tokens
// as their vocabulary text, others as their bytes): /completion's "prompt".
std::string prompt_text(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids);

// Whether `path` is one of the routes above (they are behind --api-key, as /v1 is).
bool is_llama_route(std::string_view path);

// Registers the routes above on `http`; `submit` is the server's
// completions path (Server's submit_completion). `ctx` outlives the handlers.
void add_llama_routes(HttpTransport& http, ServerContext& ctx, ChatSubmitter submit);

}  // namespace bonsai::server
