// The shared vocabulary trie of one model. See vocab_trie.h.
#include "structured/vocab_trie.h"

#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"  // Tokenizer

namespace bonsai::structured {

core::Expected<TokenTrie> build_token_trie(const tokenizer::Tokenizer& tok) {
  const int32_t n = tok.n_vocab();
  std::vector<std::string> bytes(static_cast<size_t>(n));
  std::vector<int32_t> eos;
  for (int32_t id = 0; id < n; ++id) {
    if (tok.is_eog(id)) {
      eos.push_back(id);
      continue;  // an EOS id's bytes are never matched (TokenTrie skips them)
    }
    // Control / unused tokens print as "" and are therefore never allowed.
    bytes[static_cast<size_t>(id)] = tok.token_to_bytes(id);
  }
  return TokenTrie::build(bytes, eos);
}

core::Expected<const TokenTrie*> SharedTokenTrie::get() {
  std::lock_guard lock(mu_);
  if (trie_) return &*trie_;
  if (error_) return std::unexpected(*error_);
  if (!tok_) {
    error_ = core::Error{core::Errc::kInvalidArgument, "grammar: the model has no tokenizer"};
    return std::unexpected(*error_);
  }
  auto t = build_token_trie(*tok_);
  if (!t) {
    error_ = t.error();
    return std::unexpected(*error_);
  }
  trie_.emplace(std::move(*t));
  return &*trie_;
}

}  // namespace bonsai::structured
