// Batch: the input of one Model::forward call. A prompt is one sequence with
// many tokens; a decode step for N concurrent streams is N sequences with one
// token each (DESIGN.md, "Forward pass"). Modelled on llama.cpp's llama_batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace bonsai::model {

// One token of a batch.
struct BatchToken {
  int32_t token = 0;    // vocabulary id, [0, n_vocab)
  int32_t pos = 0;      // position in its sequence (RoPE angle and KV-cache slot)
  int32_t seq = 0;      // sequence id: index into forward()'s `caches`
  bool logits = false;  // whether forward() writes this token's logits
  // Whether forward() writes this token's final hidden state after the
  // output norm (its `hidden` output; Model::forward's second form): the
  // embedding rows of a scheduler step. Independent of `logits`.
  bool hidden = false;
};

// Tokens in processing order. Rules forward() checks (an error, never a
// crash): within one sequence, positions are consecutive and increasing in
// batch order, and the first is <= that sequence's cache size (see KvCache).
struct Batch {
  std::vector<BatchToken> tokens;

  void clear() { tokens.clear(); }
  size_t size() const { return tokens.size(); }
  bool empty() const { return tokens.empty(); }
  void add(int32_t token, int32_t pos, int32_t seq, bool logits, bool hidden = false) {
    tokens.push_back(BatchToken{token, pos, seq, logits, hidden});
  }
  // Number of tokens with logits == true (rows of forward()'s logits output).
  size_t n_wanted() const {
    size_t n = 0;
    for (const auto& t : tokens) n += t.logits ? 1 : 0;
    return n;
  }
  // Number of tokens with hidden == true (rows of forward()'s hidden output).
  size_t n_hidden() const {
    size_t n = 0;
    for (const auto& t : tokens) n += t.hidden ? 1 : 0;
    return n;
  }

  // A batch holding one sequence `seq`: tokens[i] at position pos0 + i.
  // Logits are wanted for every token if `all_logits`, else for the last only.
  static Batch for_sequence(std::span<const int32_t> ids, int32_t pos0, int32_t seq = 0, bool all_logits = false) {
    Batch b;
    b.tokens.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      b.add(ids[i], pos0 + static_cast<int32_t>(i), seq, all_logits || i + 1 == ids.size());
    }
    return b;
  }
};

}  // namespace bonsai::model
