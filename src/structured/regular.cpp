// Regular languages as DFAs over code points. See regular.h. Written from
// ECMA-262 §22.2 (regular expression syntax) and the textbook constructions
// (Thompson NFA, subset construction, product automaton, Moore's partition
// refinement); no code is copied.
#include "structured/regular.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

namespace bonsai::structured {

namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr size_t kMaxNfaStates = 200000;
constexpr int kMaxGroupDepth = 100;            // nested groups / lookaheads in a pattern
constexpr uint64_t kMaxSubsetWork = 50000000;  // NFA states visited by the subset construction

struct RegexError {
  std::string message;
};

CodeRanges normalize(CodeRanges r) {
  std::sort(r.begin(), r.end());
  CodeRanges out;
  for (auto x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

// Every code point a string may hold: all but the UTF-16 surrogates.
const CodeRanges& sigma() {
  static const CodeRanges s = {{0, 0xD7FF}, {0xE000, kMaxCp}};
  return s;
}

CodeRanges intersect(const CodeRanges& a, const CodeRanges& b) {
  CodeRanges out;
  for (auto x : a) {
    for (auto y : b) {
      uint32_t lo = std::max(x.first, y.first), hi = std::min(x.second, y.second);
      if (lo <= hi) out.emplace_back(lo, hi);
    }
  }
  return normalize(out);
}

// Σ minus r.
CodeRanges complement(const CodeRanges& r) {
  CodeRanges out;
  uint32_t next = 0;
  for (auto [lo, hi] : normalize(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = std::max(next, hi + 1);
  }
  if (next <= kMaxCp) out.emplace_back(next, kMaxCp);
  return intersect(out, sigma());
}

// ---- regex syntax tree ----------------------------------------------------------

struct Node {
  enum class Kind : uint8_t { kSet, kCat, kAlt, kRep };
  Kind kind = Kind::kCat;  // an empty kCat is the empty string
  CodeRanges set;          // kSet
  std::vector<Node> kids;  // kCat, kAlt; kRep: one
  uint32_t min = 0, max = 0;
  bool unbounded = false;  // kRep: no upper bound
};

// A lookahead at the start of a branch: (?=body) or (?!body).
struct Branch;
struct Look {
  bool negative = false;
  std::vector<Branch> body;
};
// One top-level (or lookahead) alternative: ^? lookaheads* sequence $?.
struct Branch {
  bool start = false, end = false;
  std::vector<Look> looks;
  Node seq;
};

class RegexParser {
 public:
  explicit RegexParser(std::string_view re) : re_(re) {}

  std::vector<Branch> parse() {
    auto out = branches(false);
    if (pos_ < re_.size()) err("unexpected ')'");
    return out;
  }

 private:
  [[noreturn]] void err(const std::string& what) const {
    throw RegexError{what + " (at offset " + std::to_string(pos_) + ")"};
  }
  bool at(char c) const { return pos_ < re_.size() && re_[pos_] == c; }
  bool at_end_of_branch() const { return pos_ >= re_.size() || re_[pos_] == '|' || re_[pos_] == ')'; }

  // Alternatives up to the end (top level) or the closing ')' (lookahead).
  std::vector<Branch> branches(bool in_look) {
    std::vector<Branch> out;
    while (true) {
      Branch b;
      if (at('^')) {
        ++pos_;
        b.start = true;
      }
      if (in_look) b.start = true;  // a lookahead reads from its own position
      while (b.start && (re_.substr(pos_, 3) == "(?=" || re_.substr(pos_, 3) == "(?!")) {
        if (++depth_ > kMaxGroupDepth) err("groups nested deeper than " + std::to_string(kMaxGroupDepth));
        Look l;
        l.negative = re_[pos_ + 2] == '!';
        pos_ += 3;
        l.body = branches(true);
        if (!at(')')) err("missing ')'");
        ++pos_;
        --depth_;
        b.looks.push_back(std::move(l));
      }
      b.seq = sequence();
      if (at('$')) {
        ++pos_;
        b.end = true;
        if (!at_end_of_branch()) err("anchor '$' inside the pattern");
      }
      out.push_back(std::move(b));
      if (!at('|')) break;
      ++pos_;
    }
    return out;
  }

  Node alternation() {
    Node alt;
    alt.kind = Node::Kind::kAlt;
    alt.kids.push_back(sequence());
    while (at('|')) {
      ++pos_;
      alt.kids.push_back(sequence());
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  Node sequence() {
    Node seq;
    seq.kind = Node::Kind::kCat;
    while (pos_ < re_.size() && re_[pos_] != '|' && re_[pos_] != ')') {
      if (re_[pos_] == '$') {
        if (pos_ + 1 == re_.size() || re_[pos_ + 1] == '|' || re_[pos_ + 1] == ')') break;  // the branch's end anchor
        err("anchor '$' inside the pattern");
      }
      Node a = atom();
      seq.kids.push_back(quantified(std::move(a)));
    }
    return seq;
  }

  uint32_t next_cp() {
    auto b = static_cast<unsigned char>(re_[pos_]);
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + static_cast<size_t>(len) > re_.size()) err("invalid UTF-8");
    uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (int i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<unsigned char>(re_[pos_ + i]) & 0x3F);
    pos_ += static_cast<size_t>(len);
    return cp;
  }

  uint32_t hex(size_t n) {
    uint32_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      if (pos_ >= re_.size() || !std::isxdigit(static_cast<unsigned char>(re_[pos_]))) err("bad hex escape");
      char c = re_[pos_++];
      v = v * 16 + static_cast<uint32_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
  }

  // \d \w \s and negations (ECMA-262 §22.2.2.9: \s is WhiteSpace and LineTerminator).
  static bool class_escape(char c, CodeRanges& out) {
    CodeRanges base;
    switch (c | 0x20) {
      case 'd':
        base = {{'0', '9'}};
        break;
      case 'w':
        base = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
        break;
      case 's':
        base = {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
        break;
      default:
        return false;
    }
    out = (c >= 'A' && c <= 'Z') ? complement(base) : normalize(base);
    return true;
  }

  // The code point of a character escape after '\' (pos_ at the letter).
  uint32_t char_escape(bool in_class) {
    char c = re_[pos_++];
    switch (c) {
      case 'n':
        return '\n';
      case 't':
        return '\t';
      case 'r':
        return '\r';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      case '0':
        if (pos_ < re_.size() && std::isdigit(static_cast<unsigned char>(re_[pos_]))) break;
        return 0;
      case 'b':
        if (in_class) return '\b';
        pos_ -= 2;
        err("word boundary '\\b'");
      default:
        break;
    }
    if (std::isalnum(static_cast<unsigned char>(c))) {
      pos_ -= 2;
      err(std::string("escape '\\") + c + "' (backreferences, \\b, \\B, \\p, \\k, \\c are not supported)");
    }
    --pos_;
    return next_cp();
  }

  static Node set_node(CodeRanges r) {
    Node n;
    n.kind = Node::Kind::kSet;
    n.set = intersect(normalize(std::move(r)), sigma());
    return n;
  }

  Node atom() {
    char c = re_[pos_];
    if (c == '(') {
      if (++depth_ > kMaxGroupDepth) err("groups nested deeper than " + std::to_string(kMaxGroupDepth));
      ++pos_;
      if (re_.substr(pos_, 2) == "?:") {
        pos_ += 2;
      } else if (re_.substr(pos_, 2) == "?<" && re_.substr(pos_, 3) != "?<=" && re_.substr(pos_, 3) != "?<!") {
        size_t close = re_.find('>', pos_);
        if (close == std::string_view::npos) err("unterminated group name");
        pos_ = close + 1;
      } else if (at('?')) {
        --pos_;
        err("lookaround / group flags '" + std::string(re_.substr(pos_, 3)) +
            "' (lookaheads are supported only right after a leading '^')");
      }
      Node inner = alternation();
      if (!at(')')) err("missing ')'");
      ++pos_;
      --depth_;
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++pos_;
      return set_node(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '^') err("anchor '^' inside the pattern");
    if (c == '*' || c == '+' || c == '?') err("quantifier without a preceding atom");
    if (c == '\\') {
      ++pos_;
      if (pos_ >= re_.size()) err("trailing '\\'");
      CodeRanges r;
      if (class_escape(re_[pos_], r)) {
        ++pos_;
        return set_node(r);
      }
      uint32_t cp = char_escape(false);
      return set_node({{cp, cp}});
    }
    uint32_t cp = next_cp();
    return set_node({{cp, cp}});
  }

  Node char_class() {
    ++pos_;  // '['
    bool negated = at('^');
    if (negated) ++pos_;
    CodeRanges r;
    while (pos_ < re_.size() && re_[pos_] != ']') {
      uint32_t lo;
      if (re_[pos_] == '\\') {
        ++pos_;
        if (pos_ >= re_.size()) err("trailing '\\' in class");
        CodeRanges sub;
        if (class_escape(re_[pos_], sub)) {
          ++pos_;
          r.insert(r.end(), sub.begin(), sub.end());
          continue;
        }
        lo = char_escape(true);
      } else {
        lo = next_cp();
      }
      uint32_t hi = lo;
      if (pos_ + 1 < re_.size() && re_[pos_] == '-' && re_[pos_ + 1] != ']') {
        ++pos_;
        if (re_[pos_] == '\\') {
          ++pos_;
          if (pos_ >= re_.size()) err("trailing '\\' in class");
          hi = char_escape(true);
        } else {
          hi = next_cp();
        }
        if (hi < lo) err("reversed range in class");
      }
      r.emplace_back(lo, hi);
    }
    if (pos_ >= re_.size()) err("missing ']'");
    ++pos_;
    return set_node(negated ? complement(r) : r);
  }

  // Reads {m}, {m,} or {m,n} at pos_; false (pos_ unchanged) when the text is
  // not a quantifier (then '{' is a literal, as ECMA-262 Annex B allows).
  bool braces(uint32_t& m, uint32_t& n, bool& unbounded) {
    size_t p = pos_ + 1;
    auto num = [&](uint32_t& v) {
      size_t s = p;
      v = 0;
      while (p < re_.size() && std::isdigit(static_cast<unsigned char>(re_[p]))) {
        v = v * 10 + static_cast<uint32_t>(re_[p++] - '0');
        if (v > 10000) {
          pos_ = s;
          err("repetition count above 10000");
        }
      }
      return p > s;
    };
    if (!num(m)) return false;
    n = m;
    unbounded = false;
    if (p < re_.size() && re_[p] == ',') {
      ++p;
      if (!num(n)) unbounded = true;
    }
    if (p >= re_.size() || re_[p] != '}') return false;
    pos_ = p + 1;
    if (!unbounded && n < m) err("numbers out of order in {m,n}");
    return true;
  }

  Node quantified(Node a) {
    if (pos_ >= re_.size()) return a;
    uint32_t m = 0, n = 0;
    bool unbounded = false;
    char q = re_[pos_];
    if (q == '*') {
      ++pos_;
      unbounded = true;
    } else if (q == '+') {
      ++pos_;
      m = 1;
      unbounded = true;
    } else if (q == '?') {
      ++pos_;
      n = 1;
    } else if (q != '{' || !braces(m, n, unbounded)) {
      return a;
    }
    if (at('?')) ++pos_;  // lazy: the same language
    if (pos_ < re_.size() && (re_[pos_] == '*' || re_[pos_] == '+' || re_[pos_] == '{')) err("nested quantifier");
    Node r;
    r.kind = Node::Kind::kRep;
    r.min = m;
    r.max = n;
    r.unbounded = unbounded;
    r.kids.push_back(std::move(a));
    return r;
  }

  std::string_view re_;
  size_t pos_ = 0;
  int depth_ = 0;  // groups open at pos_
};

// ---- Thompson NFA and the subset construction -----------------------------------

struct Nfa {
  struct Edge {
    uint32_t lo, hi, to;
  };
  std::vector<std::vector<Edge>> edges;
  std::vector<std::vector<uint32_t>> eps;
  uint32_t add() {
    if (edges.size() >= kMaxNfaStates)
      throw RegexError{"pattern too large (more than " + std::to_string(kMaxNfaStates) + " automaton states)"};
    edges.emplace_back();
    eps.emplace_back();
    return static_cast<uint32_t>(edges.size() - 1);
  }
  void build(const Node& n, uint32_t from, uint32_t to) {
    switch (n.kind) {
      case Node::Kind::kSet:
        for (auto [lo, hi] : n.set) edges[from].push_back({lo, hi, to});
        return;
      case Node::Kind::kCat: {
        uint32_t cur = from;
        for (size_t i = 0; i < n.kids.size(); ++i) {
          uint32_t nxt = i + 1 == n.kids.size() ? to : add();
          build(n.kids[i], cur, nxt);
          cur = nxt;
        }
        if (n.kids.empty()) eps[from].push_back(to);
        return;
      }
      case Node::Kind::kAlt:
        for (const auto& k : n.kids) {
          uint32_t a = add(), b = add();
          eps[from].push_back(a);
          build(k, a, b);
          eps[b].push_back(to);
        }
        return;
      case Node::Kind::kRep: {
        uint32_t cur = from;
        for (uint32_t i = 0; i < n.min; ++i) {
          uint32_t nxt = add();
          build(n.kids[0], cur, nxt);
          cur = nxt;
        }
        if (n.unbounded) {
          uint32_t a = add(), b = add();
          eps[cur].push_back(a);
          build(n.kids[0], a, b);
          eps[b].push_back(a);
          eps[a].push_back(to);
        } else {
          for (uint32_t i = n.min; i < n.max; ++i) {
            eps[cur].push_back(to);
            uint32_t nxt = add();
            build(n.kids[0], cur, nxt);
            cur = nxt;
          }
          eps[cur].push_back(to);
        }
        return;
      }
    }
  }
};

void closure(const Nfa& nfa, std::vector<uint32_t>& set) {
  std::vector<uint32_t> work = set;
  std::set<uint32_t> seen(set.begin(), set.end());
  while (!work.empty()) {
    uint32_t s = work.back();
    work.pop_back();
    for (uint32_t t : nfa.eps[s]) {
      if (seen.insert(t).second) work.push_back(t);
    }
  }
  set.assign(seen.begin(), seen.end());
}

Dfa nfa_to_dfa(const Nfa& nfa, uint32_t start, uint32_t accept) {
  Dfa d;
  std::map<std::vector<uint32_t>, uint32_t> ids;
  std::vector<std::vector<uint32_t>> sets;
  std::vector<uint32_t> s0 = {start};
  closure(nfa, s0);
  ids[s0] = 0;
  sets.push_back(s0);
  uint64_t work = 0;
  for (size_t i = 0; i < sets.size(); ++i) {
    if (sets.size() > kMaxDfaStates)
      throw RegexError{"pattern needs more than " + std::to_string(kMaxDfaStates) + " automaton states"};
    const std::vector<uint32_t> cur = sets[i];
    std::vector<uint32_t> cuts;
    for (uint32_t s : cur) {
      for (const auto& e : nfa.edges[s]) {
        cuts.push_back(e.lo);
        cuts.push_back(e.hi + 1);
      }
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    work += cur.size() * (cuts.size() + 1);
    if (work > kMaxSubsetWork) throw RegexError{"pattern too large to compile (subset construction limit)"};
    std::vector<Dfa::Edge> out;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      uint32_t lo = cuts[c], hi = cuts[c + 1] - 1;
      std::vector<uint32_t> tgt;
      for (uint32_t s : cur) {
        for (const auto& e : nfa.edges[s]) {
          if (e.lo <= lo && hi <= e.hi) tgt.push_back(e.to);
        }
      }
      if (tgt.empty()) continue;
      std::sort(tgt.begin(), tgt.end());
      tgt.erase(std::unique(tgt.begin(), tgt.end()), tgt.end());
      closure(nfa, tgt);
      auto [it, fresh] = ids.emplace(tgt, static_cast<uint32_t>(sets.size()));
      if (fresh) sets.push_back(tgt);
      if (!out.empty() && out.back().to == it->second && out.back().hi + 1 == lo) {
        out.back().hi = hi;
      } else {
        out.push_back({lo, hi, it->second});
      }
    }
    d.edges.push_back(std::move(out));
  }
  for (const auto& s : sets) d.accepting.push_back(std::binary_search(s.begin(), s.end(), accept));
  return d;
}

Dfa node_dfa(const Node& seq, bool start, bool end) {
  Nfa nfa;
  uint32_t s = nfa.add(), a = nfa.add();
  Node whole;
  whole.kind = Node::Kind::kCat;
  Node any;
  any.kind = Node::Kind::kRep;
  any.unbounded = true;
  Node sig;
  sig.kind = Node::Kind::kSet;
  sig.set = sigma();
  any.kids.push_back(sig);
  if (!start) whole.kids.push_back(any);
  whole.kids.push_back(seq);
  if (!end) whole.kids.push_back(any);
  nfa.build(whole, s, a);
  return dfa_minimize(nfa_to_dfa(nfa, s, a));
}

Dfa expect(core::Expected<Dfa> r) {
  if (!r) throw RegexError{r.error().message};
  return std::move(*r);
}

Dfa branches_dfa(const std::vector<Branch>& bs, const Dfa* within) {
  std::optional<Dfa> out;
  for (const auto& b : bs) {
    Dfa d = node_dfa(b.seq, b.start, b.end);
    if (within) d = expect(dfa_intersect(d, *within));
    for (const auto& l : b.looks) {
      Dfa ld = branches_dfa(l.body, nullptr);
      d = expect(dfa_intersect(d, l.negative ? dfa_complement(ld) : ld));
    }
    out = out ? expect(dfa_union(*out, d)) : d;
  }
  return *out;
}

// Target of `cp` in a sorted edge list, or -1.
int64_t target(const std::vector<Dfa::Edge>& es, uint32_t cp) {
  auto it = std::upper_bound(es.begin(), es.end(), cp, [](uint32_t c, const Dfa::Edge& e) { return c < e.lo; });
  if (it == es.begin()) return -1;
  --it;
  return cp <= it->hi ? static_cast<int64_t>(it->to) : -1;
}

core::Expected<Dfa> product(const Dfa& a, const Dfa& b, bool both) {
  Dfa d;
  std::map<std::pair<int64_t, int64_t>, uint32_t> ids;
  std::vector<std::pair<int64_t, int64_t>> pairs = {{0, 0}};
  ids[{0, 0}] = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (pairs.size() > kMaxDfaStates) {
      return core::fail(core::Errc::kInvalidArgument, "the combined constraints need more than " +
                                                          std::to_string(kMaxDfaStates) + " automaton states");
    }
    auto [pa, pb] = pairs[i];
    static const std::vector<Dfa::Edge> kNone;
    const auto& ea = pa >= 0 ? a.edges[pa] : kNone;
    const auto& eb = pb >= 0 ? b.edges[pb] : kNone;
    std::vector<uint32_t> cuts;
    for (const auto* es : {&ea, &eb}) {
      for (const auto& e : *es) {
        cuts.push_back(e.lo);
        cuts.push_back(e.hi + 1);
      }
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<Dfa::Edge> out;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      uint32_t lo = cuts[c], hi = cuts[c + 1] - 1;
      int64_t ta = target(ea, lo), tb = target(eb, lo);
      if (both ? (ta < 0 || tb < 0) : (ta < 0 && tb < 0)) continue;
      auto [it, fresh] = ids.emplace(std::make_pair(ta, tb), static_cast<uint32_t>(pairs.size()));
      if (fresh) pairs.emplace_back(ta, tb);
      if (!out.empty() && out.back().to == it->second && out.back().hi + 1 == lo) {
        out.back().hi = hi;
      } else {
        out.push_back({lo, hi, it->second});
      }
    }
    d.edges.push_back(std::move(out));
  }
  for (auto [pa, pb] : pairs) {
    bool aa = pa >= 0 && a.accepting[pa], ab = pb >= 0 && b.accepting[pb];
    d.accepting.push_back(both ? (aa && ab) : (aa || ab));
  }
  return dfa_minimize(d);
}

std::string cp_escape(uint32_t cp) {
  char buf[16];
  if (cp < 0x10000) {
    std::snprintf(buf, sizeof buf, "\\u%04X", cp);
  } else {
    std::snprintf(buf, sizeof buf, "\\U%08X", cp);
  }
  return buf;
}

std::string class_text(const CodeRanges& r) {
  if (r.size() == 1 && r[0].first == r[0].second && r[0].first >= 0x20 && r[0].first < 0x7F && r[0].first != '"' &&
      r[0].first != '\\') {
    return "\"" + std::string(1, static_cast<char>(r[0].first)) + "\"";
  }
  std::string out = "[";
  for (auto [lo, hi] : r) {
    out += cp_escape(lo);
    if (hi != lo) {
      out += '-';
      out += cp_escape(hi);
    }
  }
  return out + "]";
}

// GBNF alternatives spelling the characters `r` inside a JSON string.
std::vector<std::string> json_spellings(const CodeRanges& r) {
  std::vector<std::string> alts;
  CodeRanges plain = intersect(r, complement({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}}));
  if (!plain.empty()) alts.push_back(class_text(plain));
  auto has = [&](uint32_t c) {
    return std::any_of(r.begin(), r.end(), [&](auto x) { return c >= x.first && c <= x.second; });
  };
  if (has('"')) alts.push_back("\"\\\\\\\"\"");
  if (has('\\')) alts.push_back("\"\\\\\\\\\"");
  if (has('\t')) alts.push_back("\"\\\\t\"");
  if (has('\n')) alts.push_back("\"\\\\n\"");
  if (has('\r')) alts.push_back("\"\\\\r\"");
  // Other control characters and DEL: \u00XX with upper-case hex digits,
  // grouped by the third hex digit.
  static const char* kHex = "0123456789ABCDEF";
  for (uint32_t high : {0x00u, 0x10u, 0x70u}) {
    std::string digits;
    for (uint32_t c = high; c < high + 16; ++c) {
      if (c == '\t' || c == '\n' || c == '\r' || (high == 0x70 && c != 0x7F)) continue;
      if (has(c)) digits += kHex[c & 15];
    }
    if (digits.empty()) continue;
    std::string cls = digits.size() == 1 ? "\"" + digits + "\"" : "[" + digits + "]";
    alts.push_back("\"\\\\u00" + std::string(1, kHex[high >> 4]) + "\" " + cls);
  }
  return alts;
}

}  // namespace

core::Expected<Dfa> regex_to_dfa(std::string_view re, const Dfa* within) {
  try {
    return branches_dfa(RegexParser(re).parse(), within);
  } catch (const RegexError& e) {
    return core::fail(core::Errc::kInvalidArgument, e.message);
  }
}

Dfa length_dfa(uint32_t min, std::optional<uint32_t> max) {
  Dfa d;
  const uint32_t n = max ? *max : min;
  for (uint32_t i = 0; i <= n; ++i) {
    std::vector<Dfa::Edge> es;
    uint32_t to = i < n ? i + 1 : (max ? UINT32_MAX : i);
    if (to != UINT32_MAX) {
      for (auto [lo, hi] : sigma()) es.push_back({lo, hi, to});
    }
    d.edges.push_back(std::move(es));
    d.accepting.push_back(i >= min);
  }
  return d;
}

core::Expected<Dfa> dfa_intersect(const Dfa& a, const Dfa& b) { return product(a, b, true); }
core::Expected<Dfa> dfa_union(const Dfa& a, const Dfa& b) { return product(a, b, false); }

Dfa dfa_complement(const Dfa& a) {
  Dfa d = a;
  const uint32_t sink = static_cast<uint32_t>(d.size());
  d.edges.emplace_back();
  d.accepting.push_back(false);
  for (auto& es : d.edges) {
    CodeRanges have;
    for (const auto& e : es) have.emplace_back(e.lo, e.hi);
    for (auto [lo, hi] : complement(have)) es.push_back({lo, hi, sink});
    std::sort(es.begin(), es.end(), [](const Dfa::Edge& x, const Dfa::Edge& y) { return x.lo < y.lo; });
  }
  for (size_t i = 0; i < d.accepting.size(); ++i) d.accepting[i] = !d.accepting[i];
  return dfa_minimize(d);
}

Dfa dfa_prefixed(std::string_view prefix, const Dfa& a) {
  Dfa d;
  const auto n = static_cast<uint32_t>(prefix.size());
  for (uint32_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(prefix[i]);
    d.edges.push_back({{c, c, i + 1}});
    d.accepting.push_back(false);
  }
  for (size_t s = 0; s < a.size(); ++s) {
    auto es = a.edges[s];
    for (auto& e : es) e.to += n;
    d.edges.push_back(std::move(es));
    d.accepting.push_back(a.accepting[s]);
  }
  return d;
}

Dfa dfa_minimize(const Dfa& a) {
  const size_t n = a.size();
  // Live states: reachable from the start and able to reach an accepting state.
  std::vector<bool> reach(n, false), live(n, false);
  std::vector<uint32_t> work = {0};
  reach[0] = true;
  std::vector<std::vector<uint32_t>> rev(n);
  while (!work.empty()) {
    uint32_t s = work.back();
    work.pop_back();
    for (const auto& e : a.edges[s]) {
      rev[e.to].push_back(s);
      if (!reach[e.to]) {
        reach[e.to] = true;
        work.push_back(e.to);
      }
    }
  }
  for (size_t s = 0; s < n; ++s) {
    if (reach[s] && a.accepting[s]) {
      live[s] = true;
      work.push_back(static_cast<uint32_t>(s));
    }
  }
  while (!work.empty()) {
    uint32_t s = work.back();
    work.pop_back();
    for (uint32_t p : rev[s]) {
      if (!live[p]) {
        live[p] = true;
        work.push_back(p);
      }
    }
  }
  if (!live[0]) {
    Dfa empty;
    empty.edges.emplace_back();
    empty.accepting.push_back(false);
    return empty;
  }
  // Hopcroft's partition refinement (O(m n log n)) over the live states and
  // one dead state `dead` that takes every missing transition. The alphabet:
  // the elementary intervals between all edge boundaries.
  std::vector<uint32_t> idx(n, UINT32_MAX), states;
  for (size_t s = 0; s < n; ++s) {
    if (live[s]) {
      idx[s] = static_cast<uint32_t>(states.size());
      states.push_back(static_cast<uint32_t>(s));
    }
  }
  const auto ns = static_cast<uint32_t>(states.size());
  const uint32_t dead = ns, total = ns + 1;
  std::vector<uint32_t> cuts;
  for (uint32_t s : states) {
    for (const auto& e : a.edges[s]) {
      if (!live[e.to]) continue;
      cuts.push_back(e.lo);
      cuts.push_back(e.hi + 1);
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  const uint32_t m = cuts.empty() ? 0 : static_cast<uint32_t>(cuts.size() - 1);  // symbols
  std::vector<uint32_t> delta(static_cast<size_t>(total) * m, dead);             // [state * m + symbol]
  for (uint32_t i = 0; i < ns; ++i) {
    for (const auto& e : a.edges[states[i]]) {
      if (!live[e.to]) continue;
      auto k = static_cast<uint32_t>(std::lower_bound(cuts.begin(), cuts.end(), e.lo) - cuts.begin());
      for (; k < m && cuts[k] <= e.hi; ++k) delta[static_cast<size_t>(i) * m + k] = idx[e.to];
    }
  }
  // Predecessors by symbol: inv_start[k * (total + 1) + t] .. of inv.
  std::vector<uint32_t> inv_start(static_cast<size_t>(m) * (total + 1) + 1, 0), inv(static_cast<size_t>(total) * m);
  for (uint32_t s = 0; s < total; ++s)
    for (uint32_t k = 0; k < m; ++k) ++inv_start[static_cast<size_t>(k) * (total + 1) + delta[size_t{s} * m + k] + 1];
  for (size_t i = 1; i < inv_start.size(); ++i) inv_start[i] += inv_start[i - 1];
  {
    std::vector<uint32_t> fill(inv_start.begin(), inv_start.end() - 1);
    for (uint32_t s = 0; s < total; ++s)
      for (uint32_t k = 0; k < m; ++k) inv[fill[static_cast<size_t>(k) * (total + 1) + delta[size_t{s} * m + k]]++] = s;
  }
  // The partition: elems[bstart[b] .. bend[b]) are block b's states.
  std::vector<uint32_t> elems(total), pos(total), block(total), bstart, bend, marked;
  {
    uint32_t at = 0;
    for (bool acc : {true, false}) {
      const uint32_t b = static_cast<uint32_t>(bstart.size());
      bstart.push_back(at);
      for (uint32_t s = 0; s < total; ++s) {
        const bool sa = s < ns && a.accepting[states[s]];
        if (sa != acc) continue;
        elems[at] = s;
        pos[s] = at++;
        block[s] = b;
      }
      bend.push_back(at);
      if (bend.back() == bstart.back()) {
        bstart.pop_back();
        bend.pop_back();
      }
    }
    // Renumber block ids if the accepting block was empty.
    for (uint32_t s = 0; s < total; ++s) block[s] = pos[s] < bend[0] ? 0 : 1;
    marked.assign(bstart.size(), 0);
  }
  std::vector<uint8_t> in_work;                        // [block * m + symbol]
  std::vector<std::pair<uint32_t, uint32_t>> pending;  // (block, symbol) splitters
  in_work.assign(bstart.size() * m, 0);
  for (uint32_t b = 0; b < bstart.size(); ++b) {
    for (uint32_t k = 0; k < m; ++k) {
      pending.emplace_back(b, k);
      in_work[size_t{b} * m + k] = 1;
    }
  }
  std::vector<uint32_t> touched;
  while (!pending.empty()) {
    auto [b, k] = pending.back();
    pending.pop_back();
    in_work[size_t{b} * m + k] = 0;
    touched.clear();
    // Mark every predecessor (by k) of a state in b.
    for (uint32_t i = bstart[b]; i < bend[b]; ++i) {
      const uint32_t t = elems[i];
      const size_t base = static_cast<size_t>(k) * (total + 1) + t;
      for (uint32_t j = inv_start[base]; j < inv_start[base + 1]; ++j) {
        const uint32_t s = inv[j];
        const uint32_t y = block[s];
        const uint32_t slot = bstart[y] + marked[y];
        if (pos[s] < slot) continue;  // already marked
        if (marked[y] == 0) touched.push_back(y);
        const uint32_t other = elems[slot];
        std::swap(elems[pos[s]], elems[slot]);
        pos[other] = pos[s];
        pos[s] = slot;
        ++marked[y];
      }
    }
    for (uint32_t y : touched) {
      const uint32_t cnt = marked[y];
      marked[y] = 0;
      if (cnt == bend[y] - bstart[y]) continue;  // the whole block: no split
      // The marked front part becomes a new block z.
      const auto z = static_cast<uint32_t>(bstart.size());
      bstart.push_back(bstart[y]);
      bend.push_back(bstart[y] + cnt);
      marked.push_back(0);
      bstart[y] += cnt;
      for (uint32_t i = bstart[z]; i < bend[z]; ++i) block[elems[i]] = z;
      in_work.resize(bstart.size() * m, 0);
      const bool z_smaller = bend[z] - bstart[z] <= bend[y] - bstart[y];
      for (uint32_t c = 0; c < m; ++c) {
        if (in_work[size_t{y} * m + c] || z_smaller) {
          pending.emplace_back(z, c);
          in_work[size_t{z} * m + c] = 1;
        } else {
          pending.emplace_back(y, c);
          in_work[size_t{y} * m + c] = 1;
        }
      }
    }
  }
  // Blocks in BFS order from the start; the dead state's block is dropped.
  const uint32_t dead_block = block[dead];
  std::vector<int64_t> id(bstart.size(), -1);
  std::vector<uint32_t> rep;  // a representative (compact index) per new id
  id[block[idx[0]]] = 0;
  rep.push_back(idx[0]);
  Dfa d;
  for (size_t i = 0; i < rep.size(); ++i) {
    const uint32_t s = rep[i];
    std::vector<Dfa::Edge> es;
    for (uint32_t k = 0; k < m; ++k) {
      const uint32_t t = delta[size_t{s} * m + k];
      const uint32_t bt = block[t];
      if (bt == dead_block) continue;
      if (id[bt] < 0) {
        id[bt] = static_cast<int64_t>(rep.size());
        rep.push_back(t);
      }
      const auto to = static_cast<uint32_t>(id[bt]);
      const uint32_t lo = cuts[k], hi = cuts[k + 1] - 1;
      if (!es.empty() && es.back().to == to && es.back().hi + 1 == lo) {
        es.back().hi = hi;
      } else {
        es.push_back({lo, hi, to});
      }
    }
    d.edges.push_back(std::move(es));
    d.accepting.push_back(a.accepting[states[s]]);
  }
  return d;
}

bool dfa_empty(const Dfa& a) {
  Dfa m = dfa_minimize(a);
  return m.edges[0].empty() && !m.accepting[0];
}

std::optional<std::pair<bool, Decimal>> parse_decimal(std::string_view t) {
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && t[i] == '-') {
    neg = true;
    ++i;
  }
  std::string digits;
  int64_t point = -1;  // digits before the decimal point
  for (; i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.'); ++i) {
    if (t[i] == '.') {
      if (point >= 0) return std::nullopt;
      point = static_cast<int64_t>(digits.size());
    } else {
      digits += t[i];
    }
  }
  if (digits.empty()) return std::nullopt;
  if (point < 0) point = static_cast<int64_t>(digits.size());
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    bool eneg = false;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) eneg = t[i++] == '-';
    int64_t e = 0;
    size_t start = i;
    for (; i < t.size() && std::isdigit(static_cast<unsigned char>(t[i])); ++i) {
      e = e * 10 + (t[i] - '0');
      if (e > 400) return std::nullopt;
    }
    if (i == start) return std::nullopt;
    point += eneg ? -e : e;
  }
  if (i != t.size()) return std::nullopt;
  while (point < 0) {
    digits.insert(digits.begin(), '0');
    ++point;
  }
  while (static_cast<int64_t>(digits.size()) < point) digits += '0';
  Decimal d;
  d.int_digits = digits.substr(0, static_cast<size_t>(point));
  d.frac_digits = digits.substr(static_cast<size_t>(point));
  d.int_digits.erase(0, std::min(d.int_digits.find_first_not_of('0'), d.int_digits.size()));
  if (d.int_digits.empty()) d.int_digits = "0";
  while (!d.frac_digits.empty() && d.frac_digits.back() == '0') d.frac_digits.pop_back();
  return std::make_pair(neg, d);
}

Dfa magnitude_dfa(Cmp op, const Decimal& m, uint32_t max_int_digits, uint32_t max_frac_digits,
                  uint32_t max_total_digits) {
  // c: -1 / 0 / +1 = the digits read so far compare less / equal / greater
  // than m's digits at the same places (m's fraction padded with zeros).
  const std::string& mi = m.int_digits;
  const std::string& mf = m.frac_digits;
  const auto ok = [&](int c) {
    switch (op) {
      case Cmp::kAny:
        return true;
      case Cmp::kLt:
        return c < 0;
      case Cmp::kLe:
        return c <= 0;
      case Cmp::kGt:
        return c > 0;
      case Cmp::kGe:
        return c >= 0;
    }
    return false;
  };
  const auto cmp = [](char a, char b) { return a < b ? -1 : a > b ? 1 : 0; };
  // State: phase (0 start, 1 integer part, 2 fraction), n (digits of the
  // current part), c, zero (the integer part is "0"), total (digits counted
  // against max_total_digits: a lone "0" integer part does not count).
  using Key = std::tuple<int, uint32_t, int, bool, uint32_t>;
  std::map<Key, uint32_t> ids;
  std::vector<Key> keys;
  auto id = [&](Key k) {
    auto [it, fresh] = ids.emplace(k, static_cast<uint32_t>(keys.size()));
    if (fresh) keys.push_back(k);
    return it->second;
  };
  id({0, 0, 0, false, 0});
  Dfa d;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [phase, n, c, zero, total] = keys[i];
    std::vector<Dfa::Edge> es;
    bool accept = false;
    if (phase == 0) {
      es.push_back({'0', '0', id({1, 1, cmp('0', mi[0]), true, 0})});
      for (char g = '1'; g <= '9'; ++g) es.push_back({uint32_t(g), uint32_t(g), id({1, 1, cmp(g, mi[0]), false, 1})});
    } else if (phase == 1) {
      const size_t len = mi.size();
      const int int_c = n > len ? 1 : n < len ? -1 : c;
      accept = ok(int_c != 0 ? int_c : (mf.empty() ? 0 : -1));
      if (max_frac_digits > 0 && total < max_total_digits) es.push_back({'.', '.', id({2, 0, int_c, false, total})});
      if (!zero && n < max_int_digits && total < max_total_digits) {
        for (char g = '0'; g <= '9'; ++g) {
          int nc = c != 0 || n >= len ? c : cmp(g, mi[n]);
          es.push_back({uint32_t(g), uint32_t(g), id({1, n + 1, nc, false, total + 1})});
        }
      }
      std::sort(es.begin(), es.end(), [](const Dfa::Edge& x, const Dfa::Edge& y) { return x.lo < y.lo; });
    } else {
      accept = n >= 1 && ok(c != 0 ? c : (n < mf.size() ? -1 : 0));
      if (n < max_frac_digits && total < max_total_digits) {
        for (char g = '0'; g <= '9'; ++g) {
          int nc = c != 0 ? c : cmp(g, n < mf.size() ? mf[n] : '0');
          es.push_back({uint32_t(g), uint32_t(g), id({2, n + 1, nc, false, total + 1})});
        }
      }
    }
    d.edges.push_back(std::move(es));
    d.accepting.push_back(accept);
  }
  return dfa_minimize(d);
}

Dfa multiple_of_dfa(uint32_t p, uint32_t d) {
  // States: r (integer part, remainder r) = r; fraction after j digits with
  // remainder r = p + r * (d + 1) + j; j == d: only zeros may follow.
  Dfa a;
  const uint32_t n = p + p * (d + 1);
  a.edges.resize(n);
  a.accepting.resize(n);
  auto times_pow10 = [&](uint64_t r, uint32_t k) {
    for (uint32_t i = 0; i < k; ++i) r = r * 10 % p;
    return r;
  };
  for (uint32_t r = 0; r < p; ++r) {
    for (uint32_t g = 0; g < 10; ++g) a.edges[r].push_back({'0' + g, '0' + g, (r * 10 + g) % p});
    a.edges[r].push_back({'.', '.', p + r * (d + 1)});
    std::sort(a.edges[r].begin(), a.edges[r].end(), [](const Dfa::Edge& x, const Dfa::Edge& y) { return x.lo < y.lo; });
    a.accepting[r] = times_pow10(r, d) == 0;
    for (uint32_t j = 0; j <= d; ++j) {
      const uint32_t s = p + r * (d + 1) + j;
      if (j < d) {
        for (uint32_t g = 0; g < 10; ++g) {
          a.edges[s].push_back({'0' + g, '0' + g, p + ((r * 10 + g) % p) * (d + 1) + j + 1});
        }
      } else {
        a.edges[s].push_back({'0', '0', s});
      }
      a.accepting[s] = times_pow10(r, d - j) == 0;
    }
  }
  return dfa_minimize(a);
}

std::string dfa_to_gbnf(const Dfa& a, const std::string& prefix, DfaText text,
                        std::vector<std::pair<std::string, std::string>>& rules) {
  auto name = [&](uint32_t s) { return prefix + "-q" + std::to_string(s); };
  for (uint32_t s = 0; s < a.size(); ++s) {
    std::map<uint32_t, CodeRanges> by_target;
    for (const auto& e : a.edges[s]) by_target[e.to].emplace_back(e.lo, e.hi);
    std::vector<std::string> alts;
    for (const auto& [to, r] : by_target) {
      std::vector<std::string> sp = text == DfaText::kRaw ? std::vector<std::string>{class_text(r)} : json_spellings(r);
      std::string chars;
      if (sp.size() == 1) {
        chars = sp[0];
      } else {
        chars = "(";
        for (size_t i = 0; i < sp.size(); ++i) chars += (i ? " | " : " ") + sp[i];
        chars += " )";
      }
      // A state with no way on and nothing else is the end: no reference.
      const bool final_only = a.edges[to].empty();
      alts.push_back(final_only ? chars : chars + " " + name(to));
    }
    if (a.accepting[s]) alts.push_back("\"\"");
    std::string body;
    for (size_t i = 0; i < alts.size(); ++i) body += (i ? " | " : "") + alts[i];
    if (s == 0 || !a.edges[s].empty()) rules.emplace_back(name(s), body);
  }
  return name(0);
}

}  // namespace bonsai::structured
