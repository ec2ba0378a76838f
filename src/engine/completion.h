// One request preparation for the CLI's `run` / `chat`
// (apps/bonsai/cmd_run.cpp). The server's completion route
// (server/server.cpp) still repeats these steps with its prompt byte cap
// and early overload check in between; moving it onto this (the cap as a
// PrepareOptions field) is the open half of issue 9.1:
//
//   1. the prompt: a chat rendered with the model's chat template and encoded
//      injection-safe (Tokenizer::encode_chat), or a raw prompt encoded with
//      control-token text recognised (as llama.cpp), or token ids as given
//      (each checked against the vocabulary);
//   2. the empty-prompt rule: an error, or BOS alone (the CLI's `run -p ''`);
//   3. the context check: prompt + max_tokens against n_ctx (max_tokens
//      unset: what the context leaves), with OpenAI's
//      context_length_exceeded message;
//   4. SamplingParams: the defaults, overridden field by field, logit_bias
//      ids checked against the vocabulary, then SamplingParams::validate.
//
// Pure: no model, no I/O; the tokenizer is only read.
#pragma once

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/sampling.h"          // SamplingParams
#include "tokenizer/chat_template.h"  // ChatMessage, ChatOptions
#include "tokenizer/tokenizer.h"      // Tokenizer

namespace bonsai::engine {

// What a request generates from.
struct CompletionInput {
  // true: `messages` rendered with the chat template (`chat_options`:
  // enable_thinking, tools); false: the raw prompt below.
  bool chat = false;
  std::vector<tokenizer::ChatMessage> messages;
  tokenizer::ChatOptions chat_options;
  std::string prompt;               // raw prompt text (control-token text parsed as those tokens)
  std::vector<int32_t> prompt_ids;  // raw prompt as token ids; non-empty: used instead of `prompt`
};

// A request's sampling fields; unset ones keep the defaults. Names as in
// SamplingParams (OpenAI's / llama.cpp's).
struct SamplingOverrides {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repeat_penalty;
  std::optional<float> presence_penalty;
  std::optional<float> frequency_penalty;
  std::optional<int32_t> max_tokens;
  std::optional<std::vector<std::string>> stop;
  std::optional<bool> ignore_eos;
  std::optional<std::vector<std::pair<int32_t, float>>> logit_bias;  // (token id, bias)
};

struct PrepareOptions {
  // An empty prompt (nothing encoded): false: an error (the server); true:
  // BOS alone, an error only when the vocabulary has no BOS (`run -p ''`).
  bool empty_prompt_is_bos = false;
  // true (the server): prompt + max_tokens beyond n_ctx is an error, as
  // OpenAI's context_length_exceeded. false (the CLI): only a prompt that
  // leaves no room to answer is; a larger max_tokens stops at the full
  // context (finish "length").
  bool refuse_overflow = true;
};

// A prepared request: the prompt to submit and what to sample it with.
struct PreparedCompletion {
  std::vector<int32_t> prompt;  // token ids, non-empty, shorter than n_ctx
  SamplingParams params;        // validated; max_tokens >= 0 unless the defaults said -1 and !refuse_overflow
};

// Why a request cannot be prepared: `error` (kInvalidArgument; kOutOfRange
// for the context check) with the message an API client sees, plus the
// request field at fault and OpenAI's error code where one applies.
struct PrepareError {
  core::Error error;
  std::string param;  // "messages", "prompt", "logit_bias", or empty
  std::string code;   // "context_length_exceeded", "invalid_value", or empty
};

// Prepares `in` for a model with context `n_ctx` (tokens) and tokenizer
// `tok`: see the steps above. `defaults`: the model's or the command
// line's sampling; its max_tokens applies when `over` has none (< 0: the
// rest of the context). The seed is the caller's (left as in `defaults`).
std::expected<PreparedCompletion, PrepareError> prepare_completion(const tokenizer::Tokenizer& tok, int64_t n_ctx,
                                                                   const SamplingParams& defaults,
                                                                   const CompletionInput& in,
                                                                   const SamplingOverrides& over = {},
                                                                   const PrepareOptions& options = {});

}  // namespace bonsai::engine
