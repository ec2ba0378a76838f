// The vocabulary trie of one loaded model, for constrained decoding
// (structured/token_mask.h): built from the tokenizer the first time a request
// with a grammar needs it, then shared read-only by every replica of the
// model (build_pool_from_gguf hands one SharedTokenTrie to all of them).
#pragma once

#include <memory>
#include <mutex>
#include <optional>

#include "core/error.h"             // core::Expected, core::Error
#include "structured/token_mask.h"  // TokenTrie

namespace bonsai::tokenizer {
class Tokenizer;  // tokenizer/tokenizer.h
}

namespace bonsai::structured {

// The TokenTrie of `tok`'s vocabulary: token bytes = Tokenizer::token_to_bytes
// (user-defined tokens such as Qwen3's <tool_call> print their text and may be
// chosen; control and unused tokens print nothing and never are), EOS ids = the
// tokenizer's end-of-generation set (is_eog), allowed where the grammar may end.
// About 50-120 ms and ~10 MiB for Qwen3's 151,936 tokens. Errors: those of
// TokenTrie::build (a token longer than 65535 bytes).
core::Expected<TokenTrie> build_token_trie(const tokenizer::Tokenizer& tok);

// A TokenTrie built once, on first get(). Thread-safe: get() may be called
// from any thread; the first caller builds (under mu_), later ones wait for it
// and then read the same immutable trie. A failed build is remembered (every
// get() returns the same error). Keeps the tokenizer alive.
class SharedTokenTrie {
 public:
  explicit SharedTokenTrie(std::shared_ptr<const tokenizer::Tokenizer> tok) : tok_(std::move(tok)) {}
  // The trie (valid as long as this object lives), or the build error.
  core::Expected<const TokenTrie*> get();

 private:
  std::mutex mu_;  // guards trie_ and error_
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  std::optional<TokenTrie> trie_;
  std::optional<core::Error> error_;
};

}  // namespace bonsai::structured
