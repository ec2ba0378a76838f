// Constrained decoding, part 3: the vocabulary trie and per-sequence grammar
// state that turns a grammar position into a mask over token ids.
//
// Integration (sampler): per sequence keep one GrammarState; before sampling
// call apply_mask(trie, logits) (or allowed() for a bitmask), after sampling
// call accept_token(trie, id). EOS ids are allowed only where can_end().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"          // core::Expected
#include "structured/grammar.h"  // Grammar, Matcher, MatchState

namespace bonsai::structured {

// A trie over the vocabulary's byte strings, stored in depth-first preorder
// so a mask walk is one forward scan that skips dead subtrees. Built once per
// model; immutable and thread-safe afterwards (share by const reference; it
// must outlive every GrammarState call that takes it).
//
// Plain tokens (complete UTF-8, every code point a printable JSON-string
// character: most of a BPE vocabulary) are also classified by length, so in
// a state where every plain character leads to one and the same next state
// (inside a JSON string) the mask is "plain tokens of at most K characters"
// (a precomputed bitmask) plus a walk of the small residual trie of the other
// tokens, instead of a walk over all ~333k nodes.
class TokenTrie {
 public:
  // token_bytes[id] = the raw bytes the token prints as (byte-level BPE tokens
  // may be partial UTF-8). Tokens with empty bytes (control tokens) and ids in
  // `special_ids` are never allowed by a grammar; ids in `eos_ids` are allowed
  // exactly where the grammar may end. Ids outside [0, size) are an error.
  static core::Expected<TokenTrie> build(std::span<const std::string> token_bytes, std::span<const int32_t> eos_ids,
                                         std::span<const int32_t> special_ids = {});

  int32_t n_vocab() const { return static_cast<int32_t>(bytes_.size()); }
  size_t node_count() const { return full_.byte_.size(); }
  std::string_view token_bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool is_eos(int32_t id) const;
  // True for ids a grammar never allows (empty bytes or listed special).
  bool is_excluded(int32_t id) const { return excluded_[static_cast<size_t>(id)] != 0; }
  const std::vector<int32_t>& eos_ids() const { return eos_; }

  // Number of tokens in the residual trie (tokens that are not plain; see
  // below) and the longest plain token in code points.
  size_t residual_token_count() const { return rest_.tok_ids_.size(); }
  int32_t max_plain_len() const { return max_plain_len_; }
  // Plain-token length of `id` in code points: > 0 when the token is valid
  // UTF-8 whose every code point is in the plain class (kPlainClass in
  // token_mask.cpp: printable JSON-string characters, i.e. not '"', '\\',
  // DEL, C0 controls, surrogates), the last one possibly cut short (it counts
  // as one) if all it can still become is plain; at most kMaxPlainLen (32).
  // 0 otherwise.
  int32_t plain_len(int32_t id) const { return plain_len_[static_cast<size_t>(id)]; }

  // A trie in preorder node arrays (node 0 is the first child of the implicit
  // root):
  //   byte_[i]   the byte on the edge into node i
  //   depth_[i]  1 for children of the root
  //   end_[i]    one past the last node of i's subtree
  //   tok_[i], tok_[i+1]: range in tok_ids_ of tokens whose bytes end at node i
  struct Nodes {
    std::vector<uint8_t> byte_;
    std::vector<uint16_t> depth_;
    std::vector<uint32_t> end_;
    std::vector<uint32_t> tok_;
    std::vector<int32_t> tok_ids_;
    uint16_t max_depth_ = 0;
    // Builds the arrays from `order` (ids sorted by their bytes).
    void build(const std::vector<int32_t>& order, const std::vector<std::string>& bytes);
  };

 private:
  friend class GrammarState;
  Nodes full_;  // every allowed-able token (not excluded, not EOS)
  Nodes rest_;  // the same minus the plain tokens (plain_len_ > 0)
  // plain_le_[n]: bitmask (ceil(n_vocab / 32) words) of plain tokens with
  // plain_len in [1, n]; n in [0, max_plain_len_].
  std::vector<std::vector<uint32_t>> plain_le_;
  std::vector<uint8_t> plain_len_;  // [n_vocab]
  int32_t max_plain_len_ = 0;
  std::vector<std::string> bytes_;
  std::vector<uint8_t> excluded_;
  std::vector<int32_t> eos_;
};

// Interned matcher states with a lazily filled byte-transition table (a DFA
// built on demand) and cached masks. Not thread-safe: one per sequence (or
// per thread). Reset when it holds GrammarLimits::max_states states (about
// 1 KiB each) so memory stays bounded.
class MatcherCache;

// The grammar position of one sequence. Cheap to move; clone() shares the
// cache (use the clone on the same thread only); a GrammarState made by
// create() has its own cache, so distinct sequences are independent and may
// run on different threads concurrently (the Grammar and TokenTrie are
// read-only).
class GrammarState {
 public:
  // A matcher at the grammar's start. Errors: kUnsupported (Matcher::initial:
  // the start state exceeds `limits`).
  static core::Expected<GrammarState> create(std::shared_ptr<const Grammar> grammar, GrammarLimits limits = {});
  GrammarState(GrammarState&&) noexcept;
  GrammarState& operator=(GrammarState&&) noexcept;
  ~GrammarState();

  // A copy at the same position sharing this state's cache (same thread).
  GrammarState clone() const;

  // Feeds raw bytes. On error (kInvalidArgument: not allowed here;
  // kUnsupported: the parse-stack limits of GrammarLimits) the state is unchanged.
  core::Expected<void> accept_bytes(std::string_view bytes);
  // Feeds one sampled token: its bytes, or for an EOS id marks the state
  // finished (only if can_end()). After finish no token is accepted.
  core::Expected<void> accept_token(const TokenTrie& trie, int32_t id);
  // Whether `id` is allowed now (cheap: walks only that token's bytes). Lets a
  // sampler try its sampled token first and compute the full mask only when
  // it is rejected.
  bool accepts_token(const TokenTrie& trie, int32_t id);

  // True where the grammar may end (EOS allowed); false mid-character.
  bool can_end() const;
  bool finished() const { return finished_; }

  // bitmask[(id >> 5)] bit (id & 31) = 1 for allowed tokens; resized to
  // ceil(n_vocab / 32) words.
  void allowed(const TokenTrie& trie, std::vector<uint32_t>& bitmask);
  // Sets logits of disallowed tokens to -infinity. logits.size() == n_vocab
  // (extra entries beyond the trie's vocabulary are disallowed too).
  void apply_mask(const TokenTrie& trie, std::span<float> logits);

  // Last internal limit hit during a mask walk (empty when none): a token
  // whose stack set would overflow is treated as disallowed.
  const std::string& overflow_note() const { return overflow_note_; }

 private:
  GrammarState() = default;
  int32_t state_id();
  std::shared_ptr<MatcherCache> cache_;
  MatchState state_;
  int32_t id_ = -1;
  uint64_t generation_ = 0;
  bool finished_ = false;
  std::string overflow_note_;
};

}  // namespace bonsai::structured
