// Vocabulary trie and per-sequence grammar masks. See token_mask.h.
#include "engine/token_mask.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace bonsai::engine {

namespace {
constexpr int32_t kUnknown = -1;
constexpr int32_t kDeadId = -2;
constexpr int32_t kOverflowId = -3;

struct StateHash {
  size_t operator()(const MatchState& s) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    for (uint32_t v : s.stacks) mix(v);
    mix(s.utf8_acc);
    mix((uint64_t{s.utf8_need} << 8) | s.utf8_len);
    return static_cast<size_t>(h);
  }
};
}  // namespace

// ---- TokenTrie ---------------------------------------------------------------

core::Expected<TokenTrie> TokenTrie::build(std::span<const std::string> token_bytes,
                                           std::span<const int32_t> eos_ids,
                                           std::span<const int32_t> special_ids) {
  TokenTrie t;
  const auto n = static_cast<int64_t>(token_bytes.size());
  if (n == 0 || n > std::numeric_limits<int32_t>::max()) {
    return core::fail(core::Errc::kInvalidArgument, "token_trie: empty or oversized vocabulary");
  }
  t.bytes_.assign(token_bytes.begin(), token_bytes.end());
  t.excluded_.assign(static_cast<size_t>(n), 0);
  for (int32_t id : special_ids) {
    if (id < 0 || id >= n) {
      return core::fail(core::Errc::kInvalidArgument,
                        "token_trie: special id " + std::to_string(id) + " out of range");
    }
    t.excluded_[static_cast<size_t>(id)] = 1;
  }
  for (int32_t id : eos_ids) {
    if (id < 0 || id >= n) {
      return core::fail(core::Errc::kInvalidArgument,
                        "token_trie: eos id " + std::to_string(id) + " out of range");
    }
    t.eos_.push_back(id);
  }
  std::vector<int32_t> order;
  for (int32_t id = 0; id < n; ++id) {
    const auto& b = t.bytes_[static_cast<size_t>(id)];
    if (b.empty()) t.excluded_[static_cast<size_t>(id)] = 1;
    if (t.excluded_[static_cast<size_t>(id)] || t.is_eos(id)) continue;
    if (b.size() > 0xFFFF) {
      return core::fail(core::Errc::kInvalidArgument,
                        "token_trie: token " + std::to_string(id) + " longer than 65535 bytes");
    }
    order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return t.bytes_[static_cast<size_t>(a)] < t.bytes_[static_cast<size_t>(b)];
  });
  std::vector<uint32_t> open;  // nodes on the current path, waiting for end_
  std::string_view prev;
  for (int32_t id : order) {
    std::string_view b = t.bytes_[static_cast<size_t>(id)];
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < b.size() && prev[lcp] == b[lcp]) ++lcp;
    for (size_t d = lcp + 1; d <= b.size(); ++d) {
      const auto idx = static_cast<uint32_t>(t.byte_.size());
      while (!open.empty() && t.depth_[open.back()] >= d) {
        t.end_[open.back()] = idx;
        open.pop_back();
      }
      t.byte_.push_back(static_cast<uint8_t>(b[d - 1]));
      t.depth_.push_back(static_cast<uint16_t>(d));
      t.end_.push_back(0);
      t.tok_.push_back(static_cast<uint32_t>(t.tok_ids_.size()));
      open.push_back(idx);
      t.max_depth_ = std::max<uint16_t>(t.max_depth_, static_cast<uint16_t>(d));
    }
    t.tok_ids_.push_back(id);
    prev = b;
  }
  for (uint32_t i : open) t.end_[i] = static_cast<uint32_t>(t.byte_.size());
  t.tok_.push_back(static_cast<uint32_t>(t.tok_ids_.size()));
  return t;
}

bool TokenTrie::is_eos(int32_t id) const {
  return std::find(eos_.begin(), eos_.end(), id) != eos_.end();
}

// ---- MatcherCache --------------------------------------------------------------

class MatcherCache {
 public:
  MatcherCache(std::shared_ptr<const Grammar> g, GrammarLimits limits)
      : matcher(std::move(g), limits), limits_(limits) {}

  int32_t intern(const MatchState& s) {
    auto [it, inserted] = ids_.try_emplace(s, static_cast<int32_t>(states.size()));
    if (inserted) {
      states.push_back(s);
      trans.resize(trans.size() + 256, kUnknown);
    }
    return it->second;
  }

  // Transition on one byte: a state id, kDeadId or kOverflowId.
  int32_t next(int32_t s, uint8_t b) {
    int32_t& slot = trans[static_cast<size_t>(s) * 256 + b];
    if (slot != kUnknown) return slot;
    MatchState out;
    StepResult r = matcher.step(states[static_cast<size_t>(s)], b, out);
    int32_t v = r == StepResult::kOk ? intern(out)
                : r == StepResult::kDead ? kDeadId
                                         : kOverflowId;
    trans[static_cast<size_t>(s) * 256 + b] = v;  // `slot` may dangle after intern()
    return v;
  }

  // Drops everything once the soft cap is passed (between walks only, so ids
  // held by a running walk stay valid).
  void reset_if_full() {
    if (states.size() < limits_.max_states) return;
    states.clear();
    ids_.clear();
    trans.clear();
    masks.clear();
    ++generation;
  }

  Matcher matcher;
  uint64_t generation = 1;
  std::vector<MatchState> states;
  std::vector<int32_t> trans;  // [states.size() * 256]
  std::unordered_map<int32_t, std::vector<uint32_t>> masks;  // state id -> bitmask
  GrammarLimits limits_;

 private:
  std::unordered_map<MatchState, int32_t, StateHash> ids_;
};

// ---- GrammarState --------------------------------------------------------------

GrammarState::GrammarState(GrammarState&&) noexcept = default;
GrammarState& GrammarState::operator=(GrammarState&&) noexcept = default;
GrammarState::~GrammarState() = default;

core::Expected<GrammarState> GrammarState::create(std::shared_ptr<const Grammar> grammar,
                                                  GrammarLimits limits) {
  if (!grammar) return core::fail(core::Errc::kInvalidArgument, "grammar_state: null grammar");
  GrammarState g;
  g.cache_ = std::make_shared<MatcherCache>(std::move(grammar), limits);
  auto init = g.cache_->matcher.initial();
  if (!init) return std::unexpected(init.error());
  g.state_ = std::move(*init);
  return g;
}

GrammarState GrammarState::clone() const {
  GrammarState g;
  g.cache_ = cache_;
  g.state_ = state_;
  g.id_ = id_;
  g.generation_ = generation_;
  g.finished_ = finished_;
  return g;
}

int32_t GrammarState::state_id() {
  if (id_ < 0 || generation_ != cache_->generation) {
    id_ = cache_->intern(state_);
    generation_ = cache_->generation;
  }
  return id_;
}

bool GrammarState::can_end() const { return !finished_ && Matcher::can_end(state_); }

core::Expected<void> GrammarState::accept_bytes(std::string_view bytes) {
  if (finished_) {
    return core::fail(core::Errc::kInvalidArgument, "grammar: input after end of generation");
  }
  cache_->reset_if_full();
  int32_t s = state_id();
  for (size_t i = 0; i < bytes.size(); ++i) {
    int32_t n = cache_->next(s, static_cast<uint8_t>(bytes[i]));
    if (n == kDeadId) {
      return core::fail(core::Errc::kInvalidArgument,
                        "grammar: byte " + std::to_string(i) + " (0x" +
                            std::string(1, "0123456789abcdef"[(uint8_t(bytes[i]) >> 4)]) +
                            std::string(1, "0123456789abcdef"[uint8_t(bytes[i]) & 15]) +
                            ") of the input is not allowed by the grammar here");
    }
    if (n == kOverflowId) {
      return core::fail(core::Errc::kResourceExhausted,
                        "grammar: parse-stack limit exceeded (" +
                            std::to_string(cache_->limits_.max_stacks) + " stacks or depth " +
                            std::to_string(cache_->limits_.max_depth) + ")");
    }
    s = n;
  }
  state_ = cache_->states[static_cast<size_t>(s)];
  id_ = s;
  return {};
}

core::Expected<void> GrammarState::accept_token(const TokenTrie& trie, int32_t id) {
  if (id < 0 || id >= trie.n_vocab()) {
    return core::fail(core::Errc::kInvalidArgument,
                      "grammar: token id " + std::to_string(id) + " out of range");
  }
  if (trie.is_eos(id)) {
    if (!can_end()) {
      return core::fail(core::Errc::kInvalidArgument,
                        "grammar: end of generation (token " + std::to_string(id) +
                            ") before the grammar is complete");
    }
    finished_ = true;
    return {};
  }
  if (trie.is_excluded(id)) {
    return core::fail(core::Errc::kInvalidArgument,
                      "grammar: special token " + std::to_string(id) + " is never allowed");
  }
  auto r = accept_bytes(trie.token_bytes(id));
  if (!r) {
    return core::fail(r.error().code,
                      "grammar: token " + std::to_string(id) + " rejected: " + r.error().message);
  }
  return {};
}

bool GrammarState::accepts_token(const TokenTrie& trie, int32_t id) {
  if (id < 0 || id >= trie.n_vocab() || finished_) return false;
  if (trie.is_eos(id)) return can_end();
  if (trie.is_excluded(id)) return false;
  cache_->reset_if_full();
  int32_t s = state_id();
  for (char c : trie.token_bytes(id)) {
    s = cache_->next(s, static_cast<uint8_t>(c));
    if (s < 0) return false;
  }
  return true;
}

void GrammarState::allowed(const TokenTrie& trie, std::vector<uint32_t>& bitmask) {
  const size_t words = (static_cast<size_t>(trie.n_vocab()) + 31) / 32;
  if (finished_) {
    bitmask.assign(words, 0);
    return;
  }
  cache_->reset_if_full();
  const int32_t root = state_id();
  if (auto it = cache_->masks.find(root); it != cache_->masks.end() && it->second.size() == words) {
    bitmask = it->second;
    return;
  }
  bitmask.assign(words, 0);
  MatcherCache& c = *cache_;
  std::vector<int32_t> at(static_cast<size_t>(trie.max_depth_) + 1);
  at[0] = root;
  const uint32_t n = static_cast<uint32_t>(trie.byte_.size());
  const uint8_t* bytes = trie.byte_.data();
  const uint16_t* depth = trie.depth_.data();
  const uint32_t* end = trie.end_.data();
  const uint32_t* tok = trie.tok_.data();
  const int32_t* ids = trie.tok_ids_.data();
  bool overflow = false;
  for (uint32_t i = 0; i < n;) {
    const int32_t parent = at[depth[i] - 1];
    int32_t s = c.trans[static_cast<size_t>(parent) * 256 + bytes[i]];
    if (s == kUnknown) s = c.next(parent, bytes[i]);
    if (s < 0) {
      overflow |= s == kOverflowId;
      i = end[i];
      continue;
    }
    at[depth[i]] = s;
    for (uint32_t k = tok[i]; k < tok[i + 1]; ++k) {
      const auto id = static_cast<uint32_t>(ids[k]);
      bitmask[id >> 5] |= 1u << (id & 31);
    }
    ++i;
  }
  if (overflow) {
    overflow_note_ = "grammar: some tokens were disallowed because they exceed the parse-stack "
                     "limits";
  }
  if (Matcher::can_end(state_)) {
    for (int32_t id : trie.eos_ids()) {
      bitmask[static_cast<uint32_t>(id) >> 5] |= 1u << (static_cast<uint32_t>(id) & 31);
    }
  }
  if (c.masks.size() >= c.limits_.max_masks) c.masks.clear();
  c.masks.emplace(root, bitmask);
}

void GrammarState::apply_mask(const TokenTrie& trie, std::span<float> logits) {
  std::vector<uint32_t> mask;
  allowed(trie, mask);
  const float ninf = -std::numeric_limits<float>::infinity();
  const size_t n = std::min(logits.size(), static_cast<size_t>(trie.n_vocab()));
  for (size_t i = 0; i < n; ++i) {
    if (!((mask[i >> 5] >> (i & 31)) & 1)) logits[i] = ninf;
  }
  for (size_t i = n; i < logits.size(); ++i) logits[i] = ninf;
}

}  // namespace bonsai::engine
