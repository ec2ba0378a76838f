// One request preparation, used by the server's completion routes
// (server/server.cpp: /v1/chat/completions, /v1/completions) and the CLI's
// `run` / `chat` (apps/bonsai/cmd_run.cpp):
//
//   1. the prompt: a chat rendered with the model's chat template and encoded
//      injection-safe (Tokenizer::encode_chat), or a raw prompt encoded with
//      control-token text recognised (as llama.cpp), or token ids as given
//      (each checked against the vocabulary). With a byte cap
//      (PrepareOptions::max_prompt_bytes, the server's), the rendered chat
//      text or the raw prompt text is measured BEFORE it is tokenized and
//      refused when longer, so an oversized prompt costs no tokenizer time;
//   2. the empty-prompt rule: an error, or BOS alone (the CLI's `run -p ''`);
//   3. the context check: prompt + max_tokens against n_ctx (max_tokens
//      unset: what the context leaves), with OpenAI's
//      context_length_exceeded message;
//   4. SamplingParams: the defaults with the request's SamplingOverrides
//      applied (engine/sampling.h: the one merge), logit_bias ids checked
//      against the vocabulary, then SamplingParams::validate.
//
// Pure: no model, no I/O; the tokenizer is only read.
#pragma once

#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/sampling.h"          // SamplingParams
#include "tokenizer/chat_template.h"  // ChatMessage, ChatOptions
#include "tokenizer/tokenizer.h"      // Tokenizer

namespace bonsai::engine {

// One piece of llama-server's mixed prompt (`"prompt": [12, "Once upon", 34]`):
// a token id kept as it is, or text tokenized in place.
struct PromptPiece {
  int32_t id = -1;   // >= 0: this token
  std::string text;  // id < 0: this text
};

// What a request generates from.
struct CompletionInput {
  // true: `messages` rendered with the chat template (`chat_options`:
  // enable_thinking, tools); false: the raw prompt below.
  bool chat = false;
  std::vector<tokenizer::ChatMessage> messages;
  tokenizer::ChatOptions chat_options;
  std::string prompt;               // raw prompt text (control-token text parsed as those tokens)
  std::vector<int32_t> prompt_ids;  // raw prompt as token ids; non-empty: used instead of `prompt`
  // A mixed prompt; non-empty: used instead of `prompt` and `prompt_ids`.
  // Tokenized as llama-server's tokenize_mixed does: ids kept; each text
  // encoded with control-token text recognised, BOS (when the vocabulary
  // adds one) only before a text that is the first piece; the results
  // concatenated in order. The byte cap applies to the texts together.
  std::vector<PromptPiece> prompt_pieces;
  // llama-server's text logit biases (`"logit_bias": [["Hello", -5]]`):
  // every token of the text, encoded as plain text without BOS, gets the
  // bias (in [-100, 100]), added after SamplingOverrides::logit_bias.
  std::vector<std::pair<std::string, float>> logit_bias_text;
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
  // Bytes of prompt text tokenized at most (0: no cap; the server's
  // ServerOptions::max_prompt_bytes): the rendered chat text (the sum of
  // its segments) or the raw prompt text, measured before tokenizing.
  // Token-id prompts are not capped (the context check bounds them). Over
  // the cap: kOutOfRange, code "context_length_exceeded", the message
  // naming both sizes and, in parentheses, `prompt_cap_source`.
  size_t max_prompt_bytes = 0;
  std::string prompt_cap_source;  // where the cap comes from (a flag or option name); may be empty
  // Ollama's way with a prompt that does not fit (its /api/chat and
  // /api/generate cut the prompt instead of refusing it). In a window of
  // min(truncate_ctx, n_ctx) tokens (truncate_ctx <= 0: n_ctx; Ollama's
  // options.num_ctx) the prompt must leave room for the answer: max_tokens
  // when the request (or the defaults) give one, else a quarter of the
  // window, at most half of it and at least one token (Ollama shifts its
  // context instead, dropping half of it, which bonsai does not do). Over that:
  //   kOldestMessages (a chat): the oldest messages other than system ones
  //     are dropped one at a time until the rendered prompt fits; the last
  //     message always stays (Ollama's chatPrompt);
  //   kPromptStart: the start of the prompt is dropped and its end kept: a
  //     chat's last message text (Ollama's /api/generate renders its prompt
  //     as that message; the template around it stays whole), or a raw
  //     prompt's tokens after a leading BOS.
  // A prompt that still does not fit is refused as without truncation. A
  // max_tokens beyond what the context leaves is lowered to it (Ollama runs
  // on to the end of its context rather than refusing).
  enum class Truncate { kNone, kOldestMessages, kPromptStart };
  Truncate truncate = Truncate::kNone;
  int64_t truncate_ctx = 0;
};

// A prepared request: the prompt to submit and what to sample it with.
struct PreparedCompletion {
  std::vector<int32_t> prompt;  // token ids, non-empty, shorter than n_ctx
  SamplingParams params;        // validated; max_tokens >= 0 unless the defaults said -1 and !refuse_overflow
  // PrepareOptions::truncate: messages dropped (kOldestMessages) and
  // prompt tokens cut (kPromptStart: the tokens of the dropped text).
  int64_t dropped_messages = 0;
  int64_t dropped_tokens = 0;
};

// Why a request cannot be prepared: `error` (kInvalidArgument; kOutOfRange
// for the context check) with the message an API client sees, plus the
// request field at fault and OpenAI's error code where one applies.
struct PrepareError {
  core::Error error;
  std::string param;  // "messages", "prompt", "logit_bias", or empty
  std::string code;   // "context_length_exceeded", "invalid_value" (a template refusal too), or empty
  // The prompt text's size in bytes when the byte cap refused it; 0 for
  // every other error.
  size_t prompt_bytes = 0;
};

// Prepares `in` for a model with context `n_ctx` (tokens) and tokenizer
// `tok`: see the steps above. `defaults`: the model's or the command
// line's sampling; its max_tokens applies when `over` has none (< 0: the
// rest of the context). The seed: `over.seed` when set, else `defaults`'.
std::expected<PreparedCompletion, PrepareError> prepare_completion(const tokenizer::Tokenizer& tok, int64_t n_ctx,
                                                                   const SamplingParams& defaults,
                                                                   const CompletionInput& in,
                                                                   const SamplingOverrides& over = {},
                                                                   const PrepareOptions& options = {});

}  // namespace bonsai::engine
