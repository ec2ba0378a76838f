// One request preparation. See completion.h.
#include "engine/completion.h"

#include <algorithm>
#include <span>

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

std::unexpected<PrepareError> outside_vocabulary(int32_t id, const tokenizer::Tokenizer& tok) {
  return refuse(core::Errc::kInvalidArgument,
                "Invalid 'prompt': token id " + std::to_string(id) + " is outside the vocabulary (size " +
                    std::to_string(tok.n_vocab()) + ").",
                "prompt", "invalid_value");
}

bool over_cap(size_t bytes, const PrepareOptions& options) {
  return options.max_prompt_bytes > 0 && bytes > options.max_prompt_bytes;
}

// Step 1 of prepare_completion: `in`'s prompt as token ids (the byte cap
// checked before tokenizing).
std::expected<std::vector<int32_t>, PrepareError> encode_input(const tokenizer::Tokenizer& tok,
                                                               const CompletionInput& in,
                                                               const PrepareOptions& options) {
  using core::Errc;
  std::vector<int32_t> prompt;
  if (in.chat) {
    auto rendered = tok.chat_template().render(in.messages, in.chat_options);
    if (!rendered) return refuse(Errc::kInvalidArgument, rendered.error().message, "messages", "invalid_value");
    size_t rendered_bytes = 0;
    for (const auto& seg : rendered->segments) rendered_bytes += seg.text.size();
    if (over_cap(rendered_bytes, options)) return too_long(rendered_bytes, "messages", options);
    return tok.encode_chat(*rendered);
  }
  if (!in.prompt_pieces.empty()) {
    size_t text_bytes = 0;
    for (const PromptPiece& piece : in.prompt_pieces) {
      if (piece.id >= tok.n_vocab()) return outside_vocabulary(piece.id, tok);
      if (piece.id < 0) text_bytes += piece.text.size();
    }
    if (over_cap(text_bytes, options)) return too_long(text_bytes, "prompt", options);
    for (size_t i = 0; i < in.prompt_pieces.size(); ++i) {
      const PromptPiece& piece = in.prompt_pieces[i];
      if (piece.id >= 0) {
        prompt.push_back(piece.id);
        continue;
      }
      const auto ids = i == 0 ? tok.encode_prompt(piece.text, /*parse_special=*/true)
                              : tok.encode(piece.text, /*parse_special=*/true);
      prompt.insert(prompt.end(), ids.begin(), ids.end());
    }
    return prompt;
  }
  if (!in.prompt_ids.empty()) {
    for (int32_t id : in.prompt_ids)
      if (id < 0 || id >= tok.n_vocab()) return outside_vocabulary(id, tok);
    return in.prompt_ids;
  }
  if (over_cap(in.prompt.size(), options)) return too_long(in.prompt.size(), "prompt", options);
  // As llama.cpp's server and CLI: special-token text in a raw prompt is recognised.
  return tok.encode_prompt(in.prompt, /*parse_special=*/true);
}

// PrepareOptions::truncate: `out.prompt` (the encoding of `in`, longer than
// `fit` tokens) cut to at most `fit` tokens where the mode allows it; left
// as it is where it does not (the context check then refuses it).
std::expected<void, PrepareError> truncate_prompt(const tokenizer::Tokenizer& tok, const CompletionInput& in,
                                                  const PrepareOptions& options, int64_t fit, PreparedCompletion& out) {
  auto over = [&out, fit] { return static_cast<int64_t>(out.prompt.size()) > fit; };
  if (options.truncate == PrepareOptions::Truncate::kOldestMessages && in.chat) {
    CompletionInput cut = in;
    // The template refused what is left (a tool result without its call): drop on.
    bool refused = false;
    PrepareError refusal;
    while (refused || over()) {
      if (cut.messages.size() < 2) break;
      // The oldest message that is neither a system message nor the last one.
      auto victim = std::find_if(cut.messages.begin(), cut.messages.end() - 1,
                                 [](const tokenizer::ChatMessage& m) { return m.role != "system"; });
      if (victim == cut.messages.end() - 1) break;
      cut.messages.erase(victim);
      ++out.dropped_messages;
      auto encoded = encode_input(tok, cut, options);
      refused = !encoded.has_value();
      if (refused) {
        refusal = std::move(encoded.error());
        continue;
      }
      out.prompt = std::move(*encoded);
    }
    if (refused) return std::unexpected(std::move(refusal));
    return {};
  }
  if (options.truncate != PrepareOptions::Truncate::kPromptStart) return {};
  if (!in.chat) {  // a raw prompt: its last tokens, after a leading BOS
    const bool bos = tok.bos_id() != tokenizer::kNoToken && out.prompt.front() == tok.bos_id();
    const int64_t drop = static_cast<int64_t>(out.prompt.size()) - fit;
    const auto from = out.prompt.begin() + (bos ? 1 : 0);
    out.prompt.erase(from, from + drop);
    out.dropped_tokens = drop;
    return {};
  }
  if (in.messages.empty()) return {};
  // A chat: the start of the last message's text goes, a token of it at a
  // time as the rendered prompt is over (a few rounds: the cut text may
  // encode to other tokens than the ones counted).
  CompletionInput cut = in;
  const std::vector<int32_t> text_ids = tok.encode(in.messages.back().content, /*parse_special=*/false);
  int64_t drop = 0;
  for (int round = 0; round < 8 && over(); ++round) {
    drop += static_cast<int64_t>(out.prompt.size()) - fit;
    if (drop > static_cast<int64_t>(text_ids.size())) drop = static_cast<int64_t>(text_ids.size());
    cut.messages.back().content = tok.decode(std::span<const int32_t>(text_ids).subspan(static_cast<size_t>(drop)));
    auto encoded = encode_input(tok, cut, options);
    if (!encoded) return std::unexpected(encoded.error());
    out.prompt = std::move(*encoded);
    out.dropped_tokens = drop;
    if (drop == static_cast<int64_t>(text_ids.size())) break;
  }
  return {};
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

  // 1. Prompt tokens (then, PrepareOptions::truncate, cut to fit).
  auto encoded = encode_input(tok, in, options);
  if (!encoded) return std::unexpected(encoded.error());
  out.prompt = std::move(*encoded);
  // Truncating: the room the prompt may take, the answer's kept free (see PrepareOptions::truncate).
  const int64_t window = options.truncate_ctx > 0 ? std::min(options.truncate_ctx, n_ctx) : n_ctx;
  const int64_t asked = over.max_tokens ? *over.max_tokens : defaults.max_tokens;
  const int64_t fit = window - std::clamp<int64_t>(asked > 0 ? asked : window / 4, 1, std::max<int64_t>(window / 2, 1));
  if (options.truncate != PrepareOptions::Truncate::kNone && static_cast<int64_t>(out.prompt.size()) > fit && fit > 0) {
    if (auto ok = truncate_prompt(tok, in, options, fit, out); !ok) return std::unexpected(ok.error());
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
  // Truncating (Ollama): generation stops at the context instead of the request being refused.
  if (options.truncate != PrepareOptions::Truncate::kNone && n_prompt < n_ctx && max_tokens > n_ctx - n_prompt)
    max_tokens = n_ctx - n_prompt;
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
  for (const auto& [text, bias] : in.logit_bias_text)
    for (int32_t id : tok.encode(text, /*parse_special=*/false)) p.logit_bias.emplace_back(id, bias);
  p.max_tokens = static_cast<int32_t>(max_tokens);
  if (auto v = p.validate(); !v) return refuse(Errc::kInvalidArgument, v.error().message);
  out.params = std::move(p);
  return out;
}

}  // namespace bonsai::engine
