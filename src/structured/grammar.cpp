// GBNF parser/compiler and the pushdown matcher. See grammar.h.
#include "structured/grammar.h"

#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>
#include <unordered_map>

namespace bonsai::structured {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kMaxRepeat = 10000;  // bound on {m,n} so a typo cannot make 10^9 rules

struct ParseError {
  std::string message;
};

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool Grammar::CharSet::contains(uint32_t cp) const {
  if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
  // Ranges are sorted: binary search for the last range with lo <= cp.
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp, [](uint32_t v, const auto& r) { return v < r.first; });
  if (it == ranges.begin()) return false;
  --it;
  return cp <= it->second;
}

bool Grammar::CharSet::intersects(uint32_t lo, uint32_t hi) const {
  for (const auto& r : ranges) {
    if (r.first > hi) break;
    if (r.second >= lo) return true;
  }
  return false;
}

// Recursive-descent parser producing the compiled grammar directly. Errors
// are thrown as ParseError inside this file only and returned as core::Error.
class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::string_view src) : src_(src) {}

  std::shared_ptr<const Grammar> run() {
    skip_space(true);
    while (pos_ < src_.size()) {
      const size_t name_pos = pos_;
      std::string name = parse_name();
      skip_space(false);
      if (src_.substr(pos_, 3) != "::=") fail_here("expected '::=' after rule name '" + name + "'");
      pos_ += 3;
      skip_space(true);
      uint32_t id = rule_id(name, name_pos);
      if (defined_[id]) fail_at(name_pos, "rule '" + name + "' is defined twice");
      defined_[id] = true;
      alts_[id] = parse_alternates(false);
      skip_space(false);
      if (pos_ < src_.size() && src_[pos_] != '\n') {
        if (src_[pos_] == ')') fail_here("unmatched ')'");
        fail_here("expected end of line after rule '" + name + "'");
      }
      skip_space(true);
    }
    for (size_t i = 0; i < names_.size(); ++i) {
      if (!defined_[i]) fail_at(first_use_[i], "undefined rule '" + names_[i] + "'");
    }
    auto root = ids_.find("root");
    if (root == ids_.end()) throw ParseError{"grammar: no 'root' rule"};
    check_left_recursion();
    return flatten(root->second);
  }

 private:
  using Seq = std::vector<Grammar::Elem>;

  [[noreturn]] void fail_at(size_t at, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw ParseError{"grammar: line " + std::to_string(line) + " col " + std::to_string(col) + ": " + what};
  }
  [[noreturn]] void fail_here(const std::string& what) const { fail_at(pos_, what); }

  // Skips blanks and comments; newlines too when `newline_ok`.
  void skip_space(bool newline_ok) {
    while (pos_ < src_.size()) {
      char c = src_[pos_];
      if (c == ' ' || c == '\t' || c == '\r') {
        ++pos_;
      } else if (c == '\n' && newline_ok) {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < src_.size() && src_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    size_t start = pos_;
    while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
    if (start == pos_) fail_here("expected a rule name");
    return std::string(src_.substr(start, pos_ - start));
  }

  uint32_t rule_id(const std::string& name, size_t at) {
    auto [it, inserted] = ids_.try_emplace(name, static_cast<uint32_t>(names_.size()));
    if (inserted) {
      names_.push_back(name);
      defined_.push_back(false);
      first_use_.push_back(at);
      alts_.emplace_back();
    }
    return it->second;
  }

  uint32_t new_rule(std::vector<Seq> alts) {
    std::string name = "_anon" + std::to_string(anon_++);
    uint32_t id = rule_id(name, pos_);
    defined_[id] = true;
    alts_[id] = std::move(alts);
    return id;
  }

  // Decodes one UTF-8 code point of the grammar text.
  uint32_t next_utf8() {
    auto b = static_cast<unsigned char>(src_[pos_]);
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > src_.size()) fail_here("invalid UTF-8 in grammar text");
    uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (int i = 1; i < len; ++i) {
      auto c = static_cast<unsigned char>(src_[pos_ + i]);
      if ((c & 0xC0) != 0x80) fail_here("invalid UTF-8 in grammar text");
      cp = (cp << 6) | (c & 0x3F);
    }
    pos_ += len;
    return cp;
  }

  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      int h = pos_ < src_.size() ? hex_value(src_[pos_]) : -1;
      if (h < 0) fail_here("expected " + std::to_string(digits) + " hex digits in escape");
      v = v * 16 + static_cast<uint32_t>(h);
      ++pos_;
    }
    if (v > kMaxCodePoint) fail_here("code point escape beyond U+10FFFF");
    return v;
  }

  // One character of a literal or class, with escapes.
  uint32_t parse_char() {
    if (pos_ >= src_.size()) fail_here("unexpected end of grammar inside a literal or class");
    if (src_[pos_] != '\\') return next_utf8();
    ++pos_;
    if (pos_ >= src_.size()) fail_here("unexpected end of grammar after '\\'");
    char c = src_[pos_++];
    switch (c) {
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      case '0':
        return 0;
      case 'x':
        return parse_hex(2);
      case 'u':
        return parse_hex(4);
      case 'U':
        return parse_hex(8);
      case '\\':
      case '"':
      case '[':
      case ']':
      case '-':
      case '^':
      case '/':
      case '.':
      case '\'':
        return static_cast<unsigned char>(c);
      default:
        fail_at(pos_ - 2, std::string("unknown escape '\\") + c + "'");
    }
  }

  uint32_t charset_id(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (auto r : ranges) {
      if (!merged.empty() && r.first <= merged.back().second + 1) {
        merged.back().second = std::max(merged.back().second, r.second);
      } else {
        merged.push_back(r);
      }
    }
    auto [it, inserted] = charset_ids_.try_emplace(merged, static_cast<uint32_t>(charsets_.size()));
    if (inserted) {
      Grammar::CharSet cs;
      cs.ranges = merged;
      for (auto [lo, hi] : merged) {
        for (uint32_t c = lo; c <= hi && c < 128; ++c) cs.ascii[c >> 6] |= uint64_t{1} << (c & 63);
      }
      charsets_.push_back(std::move(cs));
    }
    return it->second;
  }

  static std::vector<std::pair<uint32_t, uint32_t>> complement(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> out;
    uint32_t next = 0;
    for (auto [lo, hi] : ranges) {
      if (lo > next) out.emplace_back(next, lo - 1);
      next = std::max(next, hi + 1);
    }
    if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
    return out;
  }

  Grammar::Elem char_elem(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
    return {Grammar::Kind::kChar, charset_id(std::move(ranges))};
  }

  std::vector<Seq> parse_alternates(bool nested) {
    std::vector<Seq> alts;
    alts.push_back(parse_sequence(nested));
    while (pos_ < src_.size() && src_[pos_] == '|') {
      ++pos_;
      skip_space(true);
      alts.push_back(parse_sequence(nested));
    }
    return alts;
  }

  Grammar::Elem as_single(Seq item) {
    if (item.size() == 1) return item[0];
    return {Grammar::Kind::kRef, new_rule({std::move(item)})};
  }

  // x{min,max}; max == UINT32_MAX means unbounded.
  Seq repeat(Seq item, uint32_t min, uint32_t max) {
    Grammar::Elem x = as_single(std::move(item));
    Seq out(min, x);
    if (max == UINT32_MAX) {
      // star ::= x star | ε  (right recursion: tail position, constant depth)
      uint32_t star = new_rule({});
      alts_[star] = {Seq{x, {Grammar::Kind::kRef, star}}, Seq{}};
      out.push_back({Grammar::Kind::kRef, star});
    } else if (max > min) {
      // opt_1 ::= x | ε ; opt_k ::= x opt_{k-1} | ε
      uint32_t prev = new_rule({Seq{x}, Seq{}});
      for (uint32_t k = 2; k <= max - min; ++k) {
        prev = new_rule({Seq{x, {Grammar::Kind::kRef, prev}}, Seq{}});
      }
      out.push_back({Grammar::Kind::kRef, prev});
    }
    return out;
  }

  uint32_t parse_int() {
    size_t start = pos_;
    uint64_t v = 0;
    while (pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '9') {
      v = v * 10 + static_cast<uint64_t>(src_[pos_] - '0');
      if (v > kMaxRepeat) fail_at(start, "repetition count above " + std::to_string(kMaxRepeat));
      ++pos_;
    }
    if (start == pos_) fail_here("expected a number in {m,n}");
    return static_cast<uint32_t>(v);
  }

  Seq parse_sequence(bool nested) {
    Seq seq;
    for (;;) {
      skip_space(nested);
      if (pos_ >= src_.size()) break;
      char c = src_[pos_];
      if (c == '|' || c == ')' || c == '\n') break;
      Seq item;
      if (c == '"') {
        ++pos_;
        while (pos_ < src_.size() && src_[pos_] != '"') {
          if (src_[pos_] == '\n') fail_here("newline inside a string literal (missing '\"'?)");
          uint32_t cp = parse_char();
          item.push_back(char_elem({{cp, cp}}));
        }
        if (pos_ >= src_.size()) fail_here("unterminated string literal, expected '\"'");
        ++pos_;
      } else if (c == '[') {
        const size_t open = pos_;
        ++pos_;
        bool negated = pos_ < src_.size() && src_[pos_] == '^';
        if (negated) ++pos_;
        std::vector<std::pair<uint32_t, uint32_t>> ranges;
        while (pos_ < src_.size() && src_[pos_] != ']') {
          uint32_t lo = parse_char();
          uint32_t hi = lo;
          if (pos_ + 1 < src_.size() && src_[pos_] == '-' && src_[pos_ + 1] != ']') {
            ++pos_;
            hi = parse_char();
            if (hi < lo) fail_here("character range is reversed");
          }
          ranges.emplace_back(lo, hi);
        }
        if (pos_ >= src_.size()) fail_at(open, "unterminated character class, expected ']'");
        ++pos_;
        if (negated) ranges = complement(std::move(ranges));
        if (ranges.empty()) fail_here("character class matches nothing");
        item.push_back(char_elem(std::move(ranges)));
      } else if (c == '.') {
        ++pos_;
        item.push_back(char_elem({{0, kMaxCodePoint}}));
      } else if (c == '(') {
        const size_t open = pos_;
        ++pos_;
        skip_space(true);
        auto alts = parse_alternates(true);
        if (pos_ >= src_.size() || src_[pos_] != ')') fail_at(open, "unclosed '(': expected ')'");
        ++pos_;
        item.push_back({Grammar::Kind::kRef, new_rule(std::move(alts))});
      } else if (is_name_char(c)) {
        size_t at = pos_;
        std::string name = parse_name();
        size_t save = pos_;
        skip_space(false);
        if (src_.substr(pos_, 3) == "::=") {
          fail_at(at, "expected end of line before the definition of rule '" + name + "'");
        }
        pos_ = save;
        item.push_back({Grammar::Kind::kRef, rule_id(name, at)});
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        fail_here(std::string("'") + c + "' without a preceding symbol");
      } else if (c == '<') {
        fail_here("token references '<...>' are not supported");
      } else {
        fail_here(std::string("unexpected character '") + c +
                  "': expected a rule name, \"literal\", [class], '.' or '('");
      }
      // Quantifiers (spaces before them allowed, as llama.cpp).
      for (;;) {
        size_t save = pos_;
        skip_space(nested);
        if (pos_ >= src_.size()) {
          pos_ = save;
          break;
        }
        char q = src_[pos_];
        if (q == '*') {
          ++pos_;
          item = repeat(std::move(item), 0, UINT32_MAX);
        } else if (q == '+') {
          ++pos_;
          item = repeat(std::move(item), 1, UINT32_MAX);
        } else if (q == '?') {
          ++pos_;
          item = repeat(std::move(item), 0, 1);
        } else if (q == '{') {
          ++pos_;
          skip_space(false);
          uint32_t min = 0, max = 0;
          if (pos_ < src_.size() && src_[pos_] == ',') {
            min = 0;
          } else {
            min = parse_int();
          }
          skip_space(false);
          if (pos_ < src_.size() && src_[pos_] == ',') {
            ++pos_;
            skip_space(false);
            max = (pos_ < src_.size() && src_[pos_] == '}') ? UINT32_MAX : parse_int();
          } else {
            max = min;
          }
          skip_space(false);
          if (pos_ >= src_.size() || src_[pos_] != '}') fail_here("expected '}' in repetition");
          ++pos_;
          if (max < min) fail_here("repetition {m,n} with n < m");
          item = repeat(std::move(item), min, max);
        } else {
          pos_ = save;
          break;
        }
      }
      seq.insert(seq.end(), item.begin(), item.end());
    }
    return seq;
  }

  // A rule calling itself (through nullable prefixes) before consuming a
  // character would make the matcher loop; reject it here with the cycle.
  void check_left_recursion() {
    const size_t n = names_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& alt : alts_[r]) {
          bool all = std::all_of(alt.begin(), alt.end(), [&](const Grammar::Elem& e) {
            return e.kind == Grammar::Kind::kRef && nullable[e.arg];
          });
          if (all) {
            nullable[r] = true;
            changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<uint32_t>> left(n);
    for (size_t r = 0; r < n; ++r) {
      for (const auto& alt : alts_[r]) {
        for (const auto& e : alt) {
          if (e.kind != Grammar::Kind::kRef) break;
          left[r].push_back(e.arg);
          if (!nullable[e.arg]) break;
        }
      }
    }
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on path, 2 done
    std::vector<uint32_t> path;
    auto display = [&](uint32_t r) {
      // Anonymous helper rules stand for groups/repetitions; name them so.
      return names_[r].rfind("_anon", 0) == 0 ? std::string("(group)") : names_[r];
    };
    std::function<void(uint32_t)> dfs = [&](uint32_t r) {
      color[r] = 1;
      path.push_back(r);
      for (uint32_t s : left[r]) {
        if (color[s] == 1) {
          std::string cycle;
          auto it = std::find(path.begin(), path.end(), s);
          for (; it != path.end(); ++it) cycle += display(*it) + " -> ";
          cycle += display(s);
          throw ParseError{
              "grammar: left recursion (a rule can reach itself without "
              "consuming input): " +
              cycle};
        }
        if (color[s] == 0) dfs(s);
      }
      path.pop_back();
      color[r] = 2;
    };
    // Prefer reporting from named rules.
    for (size_t r = 0; r < n; ++r) {
      if (color[r] == 0 && names_[r].rfind("_anon", 0) != 0) dfs(static_cast<uint32_t>(r));
    }
    for (size_t r = 0; r < n; ++r) {
      if (color[r] == 0) dfs(static_cast<uint32_t>(r));
    }
  }

  std::shared_ptr<const Grammar> flatten(uint32_t root) {
    auto g = std::make_shared<Grammar>();
    g->rules_.resize(names_.size());
    for (size_t r = 0; r < names_.size(); ++r) {
      for (const auto& alt : alts_[r]) {
        g->rules_[r].push_back(static_cast<uint32_t>(g->elems_.size()));
        g->elems_.insert(g->elems_.end(), alt.begin(), alt.end());
        g->elems_.push_back({Grammar::Kind::kEnd, 0});
      }
    }
    g->start_pos_ = static_cast<uint32_t>(g->elems_.size());
    g->elems_.push_back({Grammar::Kind::kRef, root});
    g->elems_.push_back({Grammar::Kind::kEnd, 0});
    g->charsets_ = std::move(charsets_);
    g->names_ = std::move(names_);
    return g;
  }

  std::string_view src_;
  size_t pos_ = 0;
  uint32_t anon_ = 0;
  std::vector<std::string> names_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;
  std::vector<std::vector<Seq>> alts_;
  std::vector<Grammar::CharSet> charsets_;
  std::map<std::vector<std::pair<uint32_t, uint32_t>>, uint32_t> charset_ids_;
};

core::Expected<std::shared_ptr<const Grammar>> Grammar::parse(std::string_view text) {
  try {
    GrammarCompiler c(text);
    return c.run();
  } catch (const ParseError& e) {
    return core::fail(core::Errc::kInvalidArgument, e.message);
  } catch (const std::bad_alloc&) {
    return core::fail(core::Errc::kResourceExhausted, "grammar: out of memory while compiling");
  }
}

// ---- matcher ---------------------------------------------------------------

Matcher::Matcher(std::shared_ptr<const Grammar> grammar, GrammarLimits limits)
    : grammar_(std::move(grammar)), limits_(limits) {}

// Expands `stack` until every resulting stack is empty or has a character
// element on top; appends them to `out`. Leaves `stack` as it found it.
StepResult Matcher::expand(std::vector<uint32_t>& stack, std::vector<std::vector<uint32_t>>& out,
                           uint32_t depth_guard) const {
  if (stack.size() > limits_.max_depth || depth_guard > limits_.max_depth) {
    return StepResult::kOverflow;
  }
  if (stack.empty() || grammar_->elems()[stack.back()].kind == Grammar::Kind::kChar) {
    if (out.size() >= limits_.max_stacks) return StepResult::kOverflow;
    out.push_back(stack);
    return StepResult::kOk;
  }
  const auto& elems = grammar_->elems();
  const uint32_t top = stack.back();
  const uint32_t rule = elems[top].arg;
  stack.pop_back();
  const bool has_next = elems[top + 1].kind != Grammar::Kind::kEnd;
  if (has_next) stack.push_back(top + 1);
  StepResult result = StepResult::kOk;
  for (uint32_t alt : grammar_->alt_starts(rule)) {
    const bool non_empty = elems[alt].kind != Grammar::Kind::kEnd;
    if (non_empty) stack.push_back(alt);
    result = expand(stack, out, depth_guard + 1);
    if (non_empty) stack.pop_back();
    if (result != StepResult::kOk) break;
  }
  if (has_next) stack.pop_back();
  stack.push_back(top);
  return result;
}

namespace {
void canonicalize(std::vector<std::vector<uint32_t>>& stacks, std::vector<uint32_t>& flat) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  flat.clear();
  for (const auto& s : stacks) {
    flat.push_back(static_cast<uint32_t>(s.size()));
    flat.insert(flat.end(), s.begin(), s.end());
  }
}
}  // namespace

core::Expected<MatchState> Matcher::initial() const {
  std::vector<uint32_t> stack{grammar_->start_pos()};
  std::vector<std::vector<uint32_t>> out;
  if (expand(stack, out, 0) != StepResult::kOk) {
    return core::fail(core::Errc::kUnsupported, "grammar: the start state exceeds the parse-stack limits (" +
                                                    std::to_string(limits_.max_stacks) + " stacks, depth " +
                                                    std::to_string(limits_.max_depth) + ")");
  }
  MatchState s;
  canonicalize(out, s.stacks);
  return s;
}

bool Matcher::can_end(const MatchState& s) {
  if (s.utf8_need != 0) return false;
  for (size_t i = 0; i < s.stacks.size(); i += s.stacks[i] + 1) {
    if (s.stacks[i] == 0) return true;
  }
  return false;
}

StepResult Matcher::advance_cp(const MatchState& in, uint32_t cp, MatchState& out) const {
  const auto& elems = grammar_->elems();
  const auto& sets = grammar_->charsets();
  std::vector<std::vector<uint32_t>> next;
  std::vector<uint32_t> work;
  for (size_t i = 0; i < in.stacks.size(); i += in.stacks[i] + 1) {
    const uint32_t len = in.stacks[i];
    if (len == 0) continue;
    const uint32_t top = in.stacks[i + len];
    if (!sets[elems[top].arg].contains(cp)) continue;
    work.assign(in.stacks.begin() + static_cast<ptrdiff_t>(i + 1), in.stacks.begin() + static_cast<ptrdiff_t>(i + len));
    if (elems[top + 1].kind != Grammar::Kind::kEnd) work.push_back(top + 1);
    StepResult r = expand(work, next, 0);
    if (r != StepResult::kOk) return r;
  }
  if (next.empty()) return StepResult::kDead;
  canonicalize(next, out.stacks);
  out.utf8_acc = 0;
  out.utf8_need = 0;
  out.utf8_len = 0;
  return StepResult::kOk;
}

uint64_t Matcher::signature(const MatchState& in, uint32_t cp) const {
  const auto& elems = grammar_->elems();
  const auto& sets = grammar_->charsets();
  uint64_t sig = 0;
  unsigned k = 0;
  for (size_t i = 0; i < in.stacks.size(); i += in.stacks[i] + 1, ++k) {
    const uint32_t len = in.stacks[i];
    if (len != 0 && sets[elems[in.stacks[i + len]].arg].contains(cp)) sig |= uint64_t{1} << std::min(k, 63u);
  }
  return sig;
}

bool Matcher::viable(const MatchState& in, uint32_t lo, uint32_t hi) const {
  const auto& elems = grammar_->elems();
  const auto& sets = grammar_->charsets();
  for (size_t i = 0; i < in.stacks.size(); i += in.stacks[i] + 1) {
    const uint32_t len = in.stacks[i];
    if (len == 0) continue;
    if (sets[elems[in.stacks[i + len]].arg].intersects(lo, hi)) return true;
  }
  return false;
}

StepResult Matcher::step(const MatchState& in, uint8_t b, MatchState& out) const {
  static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
  uint32_t acc;
  uint8_t need, len;
  if (in.utf8_need == 0) {
    if (b < 0x80) return advance_cp(in, b, out);
    if (b >= 0xC2 && b <= 0xDF) {
      acc = b & 0x1F, need = 1, len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      acc = b & 0x0F, need = 2, len = 3;
    } else if (b >= 0xF0 && b <= 0xF4) {
      acc = b & 0x07, need = 3, len = 4;
    } else {
      return StepResult::kDead;
    }
  } else {
    if ((b & 0xC0) != 0x80) return StepResult::kDead;
    acc = (in.utf8_acc << 6) | (b & 0x3F);
    need = static_cast<uint8_t>(in.utf8_need - 1);
    len = in.utf8_len;
    if (need == 0) {
      if (acc < kMinForLen[len] || acc > kMaxCodePoint || (acc >= 0xD800 && acc <= 0xDFFF)) {
        return StepResult::kDead;
      }
      return advance_cp(in, acc, out);
    }
  }
  // Partial character: the code points it can still become.
  uint32_t lo = acc << (6 * need);
  uint32_t hi = lo | ((1u << (6 * need)) - 1);
  lo = std::max(lo, kMinForLen[len]);
  hi = std::min(hi, kMaxCodePoint);
  if (lo > hi || !viable(in, lo, hi)) return StepResult::kDead;
  out.stacks = in.stacks;
  out.utf8_acc = acc;
  out.utf8_need = need;
  out.utf8_len = len;
  return StepResult::kOk;
}

}  // namespace bonsai::structured
