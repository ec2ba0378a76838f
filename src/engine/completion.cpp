// One request preparation. See completion.h.
#include "engine/completion.h"

#include <algorithm>

namespace bonsai::engine {

namespace {

std::unexpected<PrepareError> refuse(core::Errc code, std::string message, std::string param = {},
                                     std::string api_code = {}) {
  return std::unexpected(PrepareError{core::Error{code, std::move(message)}, std::move(param), std::move(api_code)});
}

// The byte cap's refusal of `bytes` of `field` text (see PrepareOptions::max_prompt_bytes).
std::unexpected<PrepareError> too_long(size_t bytes, const char* field, const PrepareOptions& options) {
  const std::string source = options.prompt_cap_source.empty() ? "" : " (" + options.prompt_cap_source + ")";
  auto e = refuse(core::Errc::kOutOfRange,
                  "The " + std::string(field) + " text is " + std::to_string(bytes) +
                      " bytes; this server tokenizes at most " + std::to_string(options.max_prompt_bytes) +
                      " bytes of prompt for this model" + source + ". Please reduce the length of the " + field + ".",
                  field, "context_length_exceeded");
  e.error().prompt_bytes = bytes;
  return e;
}

bool over_cap(size_t bytes, const PrepareOptions& options) {
  return options.max_prompt_bytes > 0 && bytes > options.max_prompt_bytes;
}

}  // namespace

std::expected<PreparedCompletion, PrepareError> prepare_completion(const tokenizer::Tokenizer& tok, int64_t n_ctx,
                                                                   const SamplingParams& defaults,
                                                                   const CompletionInput& in,
                                                                   const SamplingOverrides& over,
                                                                   const PrepareOptions& options) {
  using core::Errc;
  const char* const prompt_field = in.chat ? "messages" : "prompt";
  PreparedCompletion out;

  // 1. Prompt tokens.
  if (in.chat) {
    auto rendered = tok.chat_template().render(in.messages, in.chat_options);
    if (!rendered) return refuse(Errc::kInvalidArgument, rendered.error().message, "messages", "invalid_value");
    size_t rendered_bytes = 0;
    for (const auto& seg : rendered->segments) rendered_bytes += seg.text.size();
    if (over_cap(rendered_bytes, options)) return too_long(rendered_bytes, "messages", options);
    out.prompt = tok.encode_chat(*rendered);
  } else if (!in.prompt_ids.empty()) {
    for (int32_t id : in.prompt_ids)
      if (id < 0 || id >= tok.n_vocab())
        return refuse(Errc::kInvalidArgument,
                      "Invalid 'prompt': token id " + std::to_string(id) + " is outside the vocabulary (size " +
                          std::to_string(tok.n_vocab()) + ").",
                      "prompt", "invalid_value");
    out.prompt = in.prompt_ids;
  } else {
    if (over_cap(in.prompt.size(), options)) return too_long(in.prompt.size(), "prompt", options);
    // As llama.cpp's server and CLI: special-token text in a raw prompt is recognised.
    out.prompt = tok.encode_prompt(in.prompt, /*parse_special=*/true);
  }

  // 2. Empty prompt.
  if (out.prompt.empty()) {
    if (!options.empty_prompt_is_bos) return refuse(Errc::kInvalidArgument, "The prompt is empty.", prompt_field);
    if (tok.bos_id() == tokenizer::kNoToken)
      return refuse(Errc::kInvalidArgument, "the prompt is empty and the model has no BOS token to start from",
                    prompt_field);
    out.prompt.push_back(tok.bos_id());
  }

  // 3. Context: prompt + max_tokens must fit.
  const int64_t n_prompt = static_cast<int64_t>(out.prompt.size());
  int64_t max_tokens = over.max_tokens ? *over.max_tokens : defaults.max_tokens;
  if (max_tokens < 0 && (options.refuse_overflow || over.max_tokens)) max_tokens = n_ctx - n_prompt;
  const bool overflow =
      options.refuse_overflow ? n_prompt + max_tokens > n_ctx || n_prompt >= n_ctx : n_prompt >= n_ctx;
  if (overflow && n_prompt >= n_ctx)  // the prompt alone fills the context, whatever max_tokens says
    return refuse(Errc::kOutOfRange,
                  "This model's maximum context length is " + std::to_string(n_ctx) + " tokens. However, the " +
                      prompt_field + " is " + std::to_string(n_prompt) +
                      " tokens, which leaves no room for the completion. Please reduce the length of the " +
                      prompt_field + ".",
                  prompt_field, "context_length_exceeded");
  if (overflow) {
    const int64_t asked = std::max<int64_t>(max_tokens, 0);
    return refuse(Errc::kOutOfRange,
                  "This model's maximum context length is " + std::to_string(n_ctx) +
                      " tokens. However, you requested " + std::to_string(n_prompt + asked) + " tokens (" +
                      std::to_string(n_prompt) + " in the " + prompt_field + ", " + std::to_string(asked) +
                      " in the completion). Please reduce the length of the " + prompt_field + " or completion.",
                  prompt_field, "context_length_exceeded");
  }

  // 4. Sampling: the defaults, overridden by what the request says (the
  // seed too), max_tokens as resolved against the context above.
  if (over.logit_bias) {
    for (const auto& [id, bias] : *over.logit_bias) {
      if (id >= tok.n_vocab())
        return refuse(Errc::kInvalidArgument,
                      "Invalid key in 'logit_bias': token " + std::to_string(id) + " is outside the vocabulary (size " +
                          std::to_string(tok.n_vocab()) + ").",
                      "logit_bias", "invalid_value");
    }
  }
  SamplingParams p = apply_overrides(defaults, over);
  p.max_tokens = static_cast<int32_t>(max_tokens);
  if (auto v = p.validate(); !v) return refuse(Errc::kInvalidArgument, v.error().message);
  out.params = std::move(p);
  return out;
}

}  // namespace bonsai::engine
