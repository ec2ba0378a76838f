// Vocabulary trie and per-sequence grammar masks. See token_mask.h.
#include "structured/token_mask.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <unordered_map>

namespace bonsai::structured {

namespace {
constexpr int32_t kUnknown = -1;
constexpr int32_t kDeadId = -2;
constexpr int32_t kOverflowId = -3;
constexpr int32_t kNonUniform = -4;  // class_next: plain characters lead to different places

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

namespace {
// Longest plain token kept out of the residual trie, in code points; longer
// plain tokens (rare: runs of spaces or dashes) are walked like the rest.
constexpr int32_t kMaxPlainLen = 32;

// The plain class: code points a JSON string holds unescaped (json_schema's
// `strchar`, [^"\\\x7F\x00-\x1F]) less the surrogates, which valid UTF-8
// never encodes. Sorted, disjoint, inclusive.
constexpr std::pair<uint32_t, uint32_t> kPlainClass[] = {
    {0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x7E}, {0x80, 0xD7FF}, {0xE000, 0x10FFFF}};

bool in_plain_class(uint32_t cp) {
  for (auto [lo, hi] : kPlainClass) {
    if (cp < lo) return false;
    if (cp <= hi) return true;
  }
  return false;
}

// The plain length of token bytes `b`: its number of code points when it is
// valid UTF-8 (the matcher's rules: no overlong form, surrogate or value above
// U+10FFFF) of plain-class code points only, where the last character may be
// cut short, counting as one, provided every code point it could still become
// is plain (so not ED A0.. or a lone ED, which could only or also become
// surrogates). 0 when not plain or longer than kMaxPlainLen. From a state
// whose plain-class successors are uniform (MatcherCache::class_next) such a
// token is accepted exactly when a complete plain token of the same length is:
// each byte of a cut character is checked against the code points it may still
// become, all plain.
int32_t plain_length(std::string_view b) {
  static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
  int32_t n = 0;
  for (size_t i = 0; i < b.size();) {
    const auto c = static_cast<uint8_t>(b[i]);
    const size_t len = c < 0x80                 ? 1
                       : c >= 0xC2 && c <= 0xDF ? 2
                       : c >= 0xE0 && c <= 0xEF ? 3
                       : c >= 0xF0 && c <= 0xF4 ? 4
                                                : 0;
    if (len == 0) return 0;
    uint32_t cp = len == 1 ? c : c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    const size_t have = std::min(len, b.size() - i);
    for (size_t k = 1; k < have; ++k) {
      const auto d = static_cast<uint8_t>(b[i + k]);
      if ((d & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (have < len) {
      // A cut character (the token's last): the range it can still become.
      const auto need = static_cast<uint32_t>(len - have);
      uint32_t lo = cp << (6 * need);
      uint32_t hi = lo | ((1u << (6 * need)) - 1);
      lo = std::max(lo, kMinForLen[len]);
      hi = std::min(hi, 0x10FFFFu);
      if (lo > hi || (lo <= 0xDFFF && hi >= 0xD800)) return 0;
    } else {
      if (cp < kMinForLen[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
      if (!in_plain_class(cp)) return 0;
    }
    if (++n > kMaxPlainLen) return 0;
    i += have;
  }
  return n;
}
}  // namespace

void TokenTrie::Nodes::build(const std::vector<int32_t>& order, const std::vector<std::string>& bytes) {
  std::vector<uint32_t> open;  // nodes on the current path, waiting for end_
  std::string_view prev;
  for (int32_t id : order) {
    std::string_view b = bytes[static_cast<size_t>(id)];
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < b.size() && prev[lcp] == b[lcp]) ++lcp;
    for (size_t d = lcp + 1; d <= b.size(); ++d) {
      const auto idx = static_cast<uint32_t>(byte_.size());
      while (!open.empty() && depth_[open.back()] >= d) {
        end_[open.back()] = idx;
        open.pop_back();
      }
      byte_.push_back(static_cast<uint8_t>(b[d - 1]));
      depth_.push_back(static_cast<uint16_t>(d));
      end_.push_back(0);
      tok_.push_back(static_cast<uint32_t>(tok_ids_.size()));
      open.push_back(idx);
      max_depth_ = std::max<uint16_t>(max_depth_, static_cast<uint16_t>(d));
    }
    tok_ids_.push_back(id);
    prev = b;
  }
  for (uint32_t i : open) end_[i] = static_cast<uint32_t>(byte_.size());
  tok_.push_back(static_cast<uint32_t>(tok_ids_.size()));
}

core::Expected<TokenTrie> TokenTrie::build(std::span<const std::string> token_bytes, std::span<const int32_t> eos_ids,
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
      return core::fail(core::Errc::kInvalidArgument, "token_trie: special id " + std::to_string(id) + " out of range");
    }
    t.excluded_[static_cast<size_t>(id)] = 1;
  }
  for (int32_t id : eos_ids) {
    if (id < 0 || id >= n) {
      return core::fail(core::Errc::kInvalidArgument, "token_trie: eos id " + std::to_string(id) + " out of range");
    }
    t.eos_.push_back(id);
  }
  std::vector<int32_t> order;
  t.plain_len_.assign(static_cast<size_t>(n), 0);
  for (int32_t id = 0; id < n; ++id) {
    const auto& b = t.bytes_[static_cast<size_t>(id)];
    if (b.empty()) t.excluded_[static_cast<size_t>(id)] = 1;
    if (t.excluded_[static_cast<size_t>(id)] || t.is_eos(id)) continue;
    if (b.size() > 0xFFFF) {
      return core::fail(core::Errc::kInvalidArgument,
                        "token_trie: token " + std::to_string(id) + " longer than 65535 bytes");
    }
    order.push_back(id);
    const int32_t pl = plain_length(b);
    t.plain_len_[static_cast<size_t>(id)] = static_cast<uint8_t>(pl);
    t.max_plain_len_ = std::max(t.max_plain_len_, pl);
  }
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return t.bytes_[static_cast<size_t>(a)] < t.bytes_[static_cast<size_t>(b)]; });
  t.full_.build(order, t.bytes_);
  std::vector<int32_t> rest;
  for (int32_t id : order) {
    if (t.plain_len_[static_cast<size_t>(id)] == 0) rest.push_back(id);
  }
  t.rest_.build(rest, t.bytes_);
  const size_t words = (static_cast<size_t>(n) + 31) / 32;
  t.plain_le_.assign(static_cast<size_t>(t.max_plain_len_) + 1, std::vector<uint32_t>(words, 0));
  for (int32_t id = 0; id < n; ++id) {
    const int32_t pl = t.plain_len_[static_cast<size_t>(id)];
    for (int32_t k = pl; pl > 0 && k <= t.max_plain_len_; ++k) {
      t.plain_le_[static_cast<size_t>(k)][static_cast<uint32_t>(id) >> 5] |= 1u << (static_cast<uint32_t>(id) & 31);
    }
  }
  return t;
}

bool TokenTrie::is_eos(int32_t id) const { return std::find(eos_.begin(), eos_.end(), id) != eos_.end(); }

// ---- MatcherCache --------------------------------------------------------------

namespace {
// Encoded cursor: v >= 0 is a whole-character state id; v <= kPartialBase is
// partial-character state (kPartialBase - v). Both index lazily filled rows.
constexpr int32_t kPartialBase = -16;
inline bool is_partial(int32_t v) { return v <= kPartialBase; }
inline int32_t partial_index(int32_t v) { return kPartialBase - v; }
inline int32_t encode_partial(int32_t p) { return kPartialBase - p; }

struct Partial {
  int32_t whole;  // whole-character state the character started from
  uint32_t acc;
  uint8_t need;
  uint8_t len;
};
}  // namespace

// Rows of `kWidth` transition slots (kUnknown until computed), allocated in
// fixed blocks of kRowsPerBlock rows so growing never moves or copies the
// rows already there (a flat vector's doubling copied megabytes and touched
// fresh pages in the middle of a mask walk: a p99 spike).
template <size_t kWidth>
class RowTable {
 public:
  static constexpr size_t kRowsPerBlock = 64;
  void add_row() {
    if (rows_.size() % kRowsPerBlock == 0) {
      blocks_.push_back(std::make_unique<int32_t[]>(kRowsPerBlock * kWidth));
      std::fill_n(blocks_.back().get(), kRowsPerBlock * kWidth, kUnknown);
    }
    rows_.push_back(blocks_.back().get() + (rows_.size() % kRowsPerBlock) * kWidth);
  }
  int32_t* row(int32_t i) { return rows_[static_cast<size_t>(i)]; }
  size_t bytes() const { return blocks_.size() * kRowsPerBlock * kWidth * sizeof(int32_t); }
  void clear() {
    rows_.clear();
    blocks_.clear();
  }

 private:
  std::vector<std::unique_ptr<int32_t[]>> blocks_;
  std::vector<int32_t*> rows_;  // [rows] pointers into blocks_
};

class MatcherCache {
 public:
  MatcherCache(std::shared_ptr<const Grammar> g, GrammarLimits limits)
      : matcher(std::move(g), limits), limits_(limits) {}

  // Interns a state with no partial character.
  int32_t intern(const MatchState& s) {
    auto [it, inserted] = ids_.try_emplace(s, static_cast<int32_t>(states.size()));
    if (inserted) {
      states.push_back(s);
      trans.add_row();
    }
    return it->second;
  }
  int32_t intern_partial(int32_t whole, uint32_t acc, uint8_t need, uint8_t len) {
    const uint64_t key = (static_cast<uint64_t>(whole) << 32) | (uint64_t{need} << 30) | (uint64_t{len} << 27) | acc;
    auto [it, inserted] = partial_ids_.try_emplace(key, static_cast<int32_t>(partials.size()));
    if (inserted) {
      partials.push_back({whole, acc, need, len});
      ptrans.add_row();
    }
    return encode_partial(it->second);
  }
  // The cursor for a MatchState (interning as needed).
  int32_t cursor_of(const MatchState& st) {
    MatchState whole = st;
    whole.utf8_acc = 0;
    whole.utf8_need = 0;
    whole.utf8_len = 0;
    int32_t w = intern(whole);
    return st.utf8_need == 0 ? w : intern_partial(w, st.utf8_acc, st.utf8_need, st.utf8_len);
  }
  MatchState state_of(int32_t cur) const {
    if (!is_partial(cur)) return states[static_cast<size_t>(cur)];
    const Partial& p = partials[static_cast<size_t>(partial_index(cur))];
    MatchState m = states[static_cast<size_t>(p.whole)];
    m.utf8_acc = p.acc;
    m.utf8_need = p.need;
    m.utf8_len = p.len;
    return m;
  }

  // One byte from cursor `cur`: the next cursor, kDeadId or kOverflowId.
  int32_t next(int32_t cur, uint8_t b) {
    int32_t* slot;
    if (!is_partial(cur)) {
      slot = &trans.row(cur)[b];
    } else {
      if ((b & 0xC0) != 0x80) return kDeadId;
      slot = &ptrans.row(partial_index(cur))[b & 0x3F];
    }
    if (*slot != kUnknown) return *slot;
    const int32_t v = compute(cur, b);
    // Re-index: interning may have grown the tables.
    if (!is_partial(cur)) {
      trans.row(cur)[b] = v;
    } else {
      ptrans.row(partial_index(cur))[b & 0x3F] = v;
    }
    return v;
  }

  // Uncached transition. Partial characters never copy stacks; a completed
  // non-ASCII character is resolved through (state, which stacks take it), so
  // the thousands of CJK code points in a vocabulary cost one advance each
  // distinct signature instead of one per code point.
  int32_t compute(int32_t cur, uint8_t b) {
    static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (!is_partial(cur)) {
      if (b < 0x80) return whole_advance(cur, b);
      uint8_t len = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
      if (len == 0) return kDeadId;
      uint32_t acc = b & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
      return partial_or_dead(cur, acc, static_cast<uint8_t>(len - 1), len);
    }
    const Partial p = partials[static_cast<size_t>(partial_index(cur))];
    const uint32_t acc = (p.acc << 6) | (b & 0x3F);
    const auto need = static_cast<uint8_t>(p.need - 1);
    if (need > 0) return partial_or_dead(p.whole, acc, need, p.len);
    if (acc < kMinForLen[p.len] || acc > 0x10FFFF || (acc >= 0xD800 && acc <= 0xDFFF)) return kDeadId;
    return whole_advance(p.whole, acc);
  }

  int32_t partial_or_dead(int32_t whole, uint32_t acc, uint8_t need, uint8_t len) {
    static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t lo = acc << (6 * need);
    uint32_t hi = lo | ((1u << (6 * need)) - 1);
    lo = std::max(lo, kMinForLen[len]);
    hi = std::min(hi, 0x10FFFFu);
    if (lo > hi || !matcher.viable(states[static_cast<size_t>(whole)], lo, hi)) return kDeadId;
    return intern_partial(whole, acc, need, len);
  }

  int32_t whole_advance(int32_t whole, uint32_t cp) {
    const MatchState& st = states[static_cast<size_t>(whole)];
    const uint64_t sig = matcher.signature(st, cp);
    if (sig == 0) return kDeadId;
    // The signature is exact only with at most 63 stacks (bit 63 is shared).
    size_t count = 0;
    for (size_t i = 0; i < st.stacks.size() && count < 64; i += st.stacks[i] + 1) ++count;
    const bool cacheable = count < 64;
    if (cacheable) {
      if (auto it = by_sig_.find({whole, sig}); it != by_sig_.end()) return it->second;
    }
    MatchState out;
    StepResult r = matcher.advance_cp(st, cp, out);
    int32_t v = r == StepResult::kOk ? intern(out) : r == StepResult::kDead ? kDeadId : kOverflowId;
    if (cacheable) by_sig_.emplace(std::pair<int32_t, uint64_t>{whole, sig}, v);
    return v;
  }

  // From whole-character state `s`: the one result (a whole state id or
  // kDeadId) that every plain-class code point leads to, or kNonUniform when
  // they differ (or a stack limit is hit, or the stack set is too large for
  // exact signatures). Exact: advance_cp's result depends only on which stacks
  // take the code point, and that set is constant between consecutive range
  // bounds of the stack tops' character sets, so one representative per such
  // interval covers the class. Cached per state.
  int32_t class_next(int32_t s) {
    if (class_next_.size() < states.size()) class_next_.resize(states.size(), kUnknown);
    if (class_next_[static_cast<size_t>(s)] != kUnknown) return class_next_[static_cast<size_t>(s)];
    const auto& elems = matcher.grammar().elems();
    const auto& sets = matcher.grammar().charsets();
    std::vector<uint32_t> cuts;
    for (auto [lo, hi] : kPlainClass) cuts.push_back(lo);
    size_t count = 0;
    {
      const MatchState& st = states[static_cast<size_t>(s)];
      for (size_t i = 0; i < st.stacks.size(); i += st.stacks[i] + 1, ++count) {
        const uint32_t len = st.stacks[i];
        if (len == 0) continue;
        for (auto [lo, hi] : sets[elems[st.stacks[i + len]].arg].ranges) {
          cuts.push_back(lo);
          cuts.push_back(hi + 1);
        }
      }
    }
    int32_t result = kUnknown;
    if (count >= 64) {
      result = kNonUniform;
    } else {
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      for (uint32_t cp : cuts) {
        if (!in_plain_class(cp)) continue;
        const int32_t v = whole_advance(s, cp);  // kDeadId when no stack takes cp
        if (v == kOverflowId || (result != kUnknown && v != result)) {
          result = kNonUniform;
          break;
        }
        result = v;
      }
    }
    if (class_next_.size() < states.size()) class_next_.resize(states.size(), kUnknown);
    class_next_[static_cast<size_t>(s)] = result;
    return result;
  }

  // For whole-character state `s`, how plain tokens fare (see TokenTrie):
  // every plain token of at most `k` code points is accepted; longer ones are
  // all rejected (`tail` kDeadId), all accepted (`tail` >= 0: the chain reached
  // a state that loops on the class) or need a walk (`tail` kNonUniform).
  // `max_len` caps the chain (the trie's longest plain token).
  struct PlainReach {
    int32_t k;
    int32_t tail;
  };
  PlainReach plain_reach(int32_t s, int32_t max_len) {
    int32_t cur = s;
    for (int32_t i = 0; i < max_len; ++i) {
      const int32_t next = class_next(cur);
      if (next < 0) return {i, next};
      if (next == cur) return {max_len, next};
      cur = next;
    }
    return {max_len, cur};
  }

  size_t bytes_used() const { return trans.bytes() + ptrans.bytes() + states.size() * 64 + partials.size() * 32; }

  // Drops everything once the soft caps are passed (between walks only, so
  // cursors held by a running walk stay valid).
  void reset_if_full() {
    if (states.size() < limits_.max_states && bytes_used() < limits_.max_cache_bytes) return;
    states.clear();
    ids_.clear();
    trans.clear();
    partials.clear();
    partial_ids_.clear();
    ptrans.clear();
    by_sig_.clear();
    class_next_.clear();
    masks.clear();
    ++generation;
  }

  Matcher matcher;
  uint64_t generation = 1;
  std::vector<MatchState> states;  // whole-character states (utf8_need == 0)
  RowTable<256> trans;             // [states.size()][256 bytes]
  std::vector<Partial> partials;
  RowTable<64> ptrans;                                       // [partials.size()][continuation byte & 0x3F]
  std::unordered_map<int32_t, std::vector<uint32_t>> masks;  // cursor -> bitmask
  GrammarLimits limits_;

 private:
  std::unordered_map<MatchState, int32_t, StateHash> ids_;
  std::unordered_map<uint64_t, int32_t> partial_ids_;
  struct PairHash {
    size_t operator()(const std::pair<int32_t, uint64_t>& p) const {
      return std::hash<uint64_t>()(p.second * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(p.first));
    }
  };
  std::unordered_map<std::pair<int32_t, uint64_t>, int32_t, PairHash> by_sig_;  // (state, stacks taking cp) -> next
  std::vector<int32_t> class_next_;  // [states.size()] class_next results, kUnknown until computed
};

// ---- GrammarState --------------------------------------------------------------

GrammarState::GrammarState(GrammarState&&) noexcept = default;
GrammarState& GrammarState::operator=(GrammarState&&) noexcept = default;
GrammarState::~GrammarState() = default;

core::Expected<GrammarState> GrammarState::create(std::shared_ptr<const Grammar> grammar, GrammarLimits limits) {
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

// The encoded cursor of state_ in the cache (re-interned after a reset).
int32_t GrammarState::state_id() {
  if (id_ == -1 || generation_ != cache_->generation) {
    id_ = cache_->cursor_of(state_);
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
  int32_t c = state_id();
  for (size_t i = 0; i < bytes.size(); ++i) {
    int32_t n = cache_->next(c, static_cast<uint8_t>(bytes[i]));
    if (n == kOverflowId) {
      return core::fail(core::Errc::kUnsupported, "grammar: parse-stack limit exceeded (" +
                                                      std::to_string(cache_->limits_.max_stacks) + " stacks or depth " +
                                                      std::to_string(cache_->limits_.max_depth) + ")");
    }
    if (n == kDeadId) {
      static const char* hex = "0123456789abcdef";
      const auto b = static_cast<uint8_t>(bytes[i]);
      return core::fail(core::Errc::kInvalidArgument, "grammar: byte " + std::to_string(i) + " (0x" + hex[b >> 4] +
                                                          hex[b & 15] +
                                                          ") of the input is not allowed by the grammar here");
    }
    c = n;
  }
  state_ = cache_->state_of(c);
  id_ = c;
  return {};
}

core::Expected<void> GrammarState::accept_token(const TokenTrie& trie, int32_t id) {
  if (id < 0 || id >= trie.n_vocab()) {
    return core::fail(core::Errc::kInvalidArgument, "grammar: token id " + std::to_string(id) + " out of range");
  }
  if (trie.is_eos(id)) {
    if (!can_end()) {
      return core::fail(core::Errc::kInvalidArgument,
                        "grammar: end of generation (token " + std::to_string(id) + ") before the grammar is complete");
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
    return core::fail(r.error().code, "grammar: token " + std::to_string(id) + " rejected: " + r.error().message);
  }
  return {};
}

bool GrammarState::accepts_token(const TokenTrie& trie, int32_t id) {
  if (id < 0 || id >= trie.n_vocab() || finished_) return false;
  if (trie.is_eos(id)) return can_end();
  if (trie.is_excluded(id)) return false;
  cache_->reset_if_full();
  int32_t c = state_id();
  for (char ch : trie.token_bytes(id)) {
    c = cache_->next(c, static_cast<uint8_t>(ch));
    if (c < 0 && !is_partial(c)) return false;
  }
  return true;
}

namespace {
// Walks trie `t` from cursor `root`, setting the bit of every token whose
// bytes the grammar accepts from there. `at` is scratch (resized). Returns
// true when some subtree was cut because it overflowed the stack limits.
bool walk_trie(const TokenTrie::Nodes& t, MatcherCache& c, int32_t root, std::vector<uint32_t>& bitmask,
               std::vector<int32_t>& at) {
  at.resize(static_cast<size_t>(t.max_depth_) + 1);
  at[0] = root;
  const auto n = static_cast<uint32_t>(t.byte_.size());
  const uint8_t* bytes = t.byte_.data();
  const uint16_t* depth = t.depth_.data();
  const uint32_t* end = t.end_.data();
  const uint32_t* tok = t.tok_.data();
  const int32_t* ids = t.tok_ids_.data();
  bool overflow = false;
  for (uint32_t i = 0; i < n;) {
    const int32_t parent = at[depth[i] - 1];
    const uint8_t b = bytes[i];
    int32_t s;
    if (!is_partial(parent)) {
      s = c.trans.row(parent)[b];
    } else if ((b & 0xC0) == 0x80) {
      s = c.ptrans.row(partial_index(parent))[b & 0x3F];
    } else {
      s = kDeadId;
    }
    if (s == kUnknown) s = c.next(parent, b);
    if (s < 0 && !is_partial(s)) {
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
  return overflow;
}
}  // namespace

void GrammarState::allowed(const TokenTrie& trie, std::vector<uint32_t>& bitmask) {
  const size_t words = (static_cast<size_t>(trie.n_vocab()) + 31) / 32;
  if (finished_) {
    bitmask.assign(words, 0);
    return;
  }
  cache_->reset_if_full();
  MatcherCache& c = *cache_;
  const int32_t root = state_id();
  if (auto it = c.masks.find(root); it != c.masks.end() && it->second.size() == words) {
    bitmask = it->second;
    return;
  }
  // Plain tokens by length where the class is uniform from here (strings);
  // otherwise the whole trie.
  MatcherCache::PlainReach reach{0, kNonUniform};
  if (!is_partial(root) && trie.max_plain_len_ > 0) reach = c.plain_reach(root, trie.max_plain_len_);
  std::vector<int32_t> at;
  bool overflow;
  if (reach.tail != kNonUniform) {
    bitmask = trie.plain_le_[static_cast<size_t>(reach.k)];
    overflow = walk_trie(trie.rest_, c, root, bitmask, at);
  } else {
    bitmask.assign(words, 0);
    overflow = walk_trie(trie.full_, c, root, bitmask, at);
  }
  if (overflow) {
    overflow_note_ =
        "grammar: some tokens were disallowed because they exceed the parse-stack "
        "limits";
  }
  if (Matcher::can_end(state_)) {
    for (int32_t id : trie.eos_ids()) {
      bitmask[static_cast<uint32_t>(id) >> 5] |= 1u << (static_cast<uint32_t>(id) & 31);
    }
  }
  if (c.limits_.max_masks == 0) return;
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

}  // namespace bonsai::structured
