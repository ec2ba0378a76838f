// Constrained decoding, part 1: GBNF grammars and the pushdown matcher.
//
// Format source: llama.cpp's GBNF (grammars/README.md in llama.cpp):
//   name ::= alternatives        rules; `root` is the start rule
//   a b | c                       sequences and alternatives
//   ( ... )                       groups
//   x* x+ x? x{m} x{m,} x{m,n} x{,n}   repetition
//   "lit\n\x41\u00e9"             string literals (escapes \n \r \t \\ \" \[ \] \xHH \uHHHH
//   \UHHHHHHHH) [a-z0-9_] [^"\\]              character classes (ranges, negation), `.` = any code
//   point # comment                     to end of line
// A rule's alternatives continue on the next line only after `|` or inside
// parentheses (as llama.cpp). The grammar works over Unicode code points; the
// matcher consumes UTF-8 bytes and may stop in the middle of a character.
//
// Everything here is written from the format description; no code is copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"  // core::Expected, core::Error

namespace bonsai::structured {

// A compiled grammar: rules flattened into one element array. Immutable after
// `parse`; share it (shared_ptr<const Grammar>) between every sequence that
// uses the same grammar text — all members are const and thread-safe.
class Grammar {
 public:
  // One grammar symbol. kChar: `arg` indexes charsets(); kRef: `arg` is a rule
  // id; kEnd terminates an alternative.
  enum class Kind : uint8_t { kChar, kRef, kEnd };
  struct Elem {
    Kind kind;
    uint32_t arg;
  };
  // A set of code points: sorted, disjoint, inclusive [lo, hi] ranges (negated
  // classes are complemented at compile time). `ascii` caches code points < 128.
  struct CharSet {
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    uint64_t ascii[2] = {0, 0};
    bool contains(uint32_t cp) const;
    // True when some code point in [lo, hi] is in the set.
    bool intersects(uint32_t lo, uint32_t hi) const;
  };

  // Parses and compiles GBNF text. Errors (code kInvalidArgument) name the
  // line:col and what was expected, an undefined rule, a missing `root`, or
  // left recursion ("grammar: left recursion: a -> b -> a"); never aborts.
  static core::Expected<std::shared_ptr<const Grammar>> parse(std::string_view text);

  const std::vector<Elem>& elems() const { return elems_; }
  const std::vector<CharSet>& charsets() const { return charsets_; }
  // alt_starts(rule): positions in elems() where each alternative begins.
  const std::vector<uint32_t>& alt_starts(uint32_t rule) const { return rules_[rule]; }
  // Position of the synthetic `root` reference the matcher starts from.
  uint32_t start_pos() const { return start_pos_; }
  size_t rule_count() const { return rules_.size(); }
  const std::string& rule_name(uint32_t rule) const { return names_[rule]; }

 private:
  friend class GrammarCompiler;
  std::vector<Elem> elems_;
  std::vector<CharSet> charsets_;
  std::vector<std::vector<uint32_t>> rules_;
  std::vector<std::string> names_;
  uint32_t start_pos_ = 0;
};

// Limits that turn a blow-up into an error instead of running out of memory.
struct GrammarLimits {
  uint32_t max_stacks = 2048;                 // parse stacks alive at once (ambiguity)
  uint32_t max_depth = 1024;                  // frames in one stack (nesting)
  uint32_t max_states = 4096;                 // interned states in one MatcherCache before it is reset
  uint32_t max_masks = 128;                   // cached token masks in one MatcherCache (0: none)
  size_t max_cache_bytes = size_t{24} << 20;  // transition tables of one MatcherCache before reset
};

// Matcher state: the set of parse stacks plus a partially read UTF-8
// character. A plain value; copying it copies the stacks.
struct MatchState {
  // Stacks flattened: [len, pos_0 .. pos_len-1]* ; each pos is an index into
  // Grammar::elems() of a kChar element still to be matched, top = last.
  // Sorted and de-duplicated, so equal sets compare equal.
  std::vector<uint32_t> stacks;
  uint32_t utf8_acc = 0;  // bits of the partial character read so far
  uint8_t utf8_need = 0;  // continuation bytes still expected (0 = none)
  uint8_t utf8_len = 0;   // total length of the partial character
  bool operator==(const MatchState&) const = default;
};

// Result of feeding one byte.
enum class StepResult : uint8_t { kOk, kDead, kOverflow };

// Pure functions over a grammar: the pushdown automaton itself (no caching).
// Thread-safe (reads only the immutable grammar).
class Matcher {
 public:
  Matcher(std::shared_ptr<const Grammar> grammar, GrammarLimits limits = {});

  // The state before any input: `root` expanded. Errors: kUnsupported when
  // that expansion exceeds the limits (more than max_stacks alternatives can
  // start at once, or deeper than max_depth).
  core::Expected<MatchState> initial() const;
  // Feeds one byte: kDead if no stack can take it (or the UTF-8 is invalid:
  // bad lead/continuation byte, overlong form, surrogate, > U+10FFFF, or a
  // partial character no stack could complete); kOverflow if the stack set or
  // a stack's depth exceeds the limits. `out` is written only on kOk.
  StepResult step(const MatchState& in, uint8_t byte, MatchState& out) const;
  // True when the input so far is a complete sentence of the grammar.
  static bool can_end(const MatchState& s);
  // Consumes one whole code point (ignores in's partial character; out's is
  // cleared). Same results as step().
  StepResult advance_cp(const MatchState& in, uint32_t cp, MatchState& out) const;
  // True when some stack's next character set meets [lo, hi].
  bool viable(const MatchState& in, uint32_t lo, uint32_t hi) const;
  // Bit i set when stack i (in order) can take `cp`; stacks past 64 set bit 63.
  uint64_t signature(const MatchState& in, uint32_t cp) const;

  const Grammar& grammar() const { return *grammar_; }
  const std::shared_ptr<const Grammar>& grammar_ptr() const { return grammar_; }
  const GrammarLimits& limits() const { return limits_; }

 private:
  StepResult expand(std::vector<uint32_t>& stack, std::vector<std::vector<uint32_t>>& out, uint32_t depth_guard) const;
  std::shared_ptr<const Grammar> grammar_;
  GrammarLimits limits_;
};

}  // namespace bonsai::structured
