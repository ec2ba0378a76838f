// Constrained decoding, part 2a: regular languages as deterministic finite
// automata over Unicode code points, for the JSON Schema string and number
// keywords that must hold at once (pattern ∩ format ∩ minLength/maxLength,
// minimum ∩ exclusiveMaximum ∩ multipleOf). Each keyword becomes a DFA, the
// DFAs are intersected (product construction), minimised, pruned of dead
// states and written out as right-recursive GBNF rules (one rule per state),
// which structured::Grammar matches with a constant stack depth.
//
// Regex dialect: ECMAScript (ECMA-262 §22.2, which JSON Schema's `pattern`
// names), without flags: literals, escapes (\n \t \r \f \v \0 \xHH \uHHHH,
// \d \w \s and negations, escaped punctuation), classes ([a-z], [^...]), `.`
// (any code point but \n \r U+2028 U+2029), groups ((...), (?:...),
// (?<name>...)), alternation, * + ? {m} {m,} {m,n} (lazy forms match the same
// language). `^` / `$` anchor a top-level alternative at its start / end; an
// alternative without them is surrounded by any text (a search, as ECMA-262's
// RegExp.prototype.test). Lookaheads (?=...) / (?!...) are supported directly
// after a leading `^` (they intersect with / subtract from the rest, as
// zod's and Pydantic's patterns use them); elsewhere, backreferences, \b, \p
// and lookbehind are errors naming the construct.
//
// Everything here is written from the specifications; no code is copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"  // core::Expected

namespace bonsai::structured {

// Sorted, disjoint, inclusive code point ranges.
using CodeRanges = std::vector<std::pair<uint32_t, uint32_t>>;

// A DFA over code points. State 0 is the start state; a missing transition
// rejects. Edges of one state are sorted by `lo` and disjoint.
struct Dfa {
  struct Edge {
    uint32_t lo, hi;  // inclusive code point range
    uint32_t to;      // target state
  };
  std::vector<std::vector<Edge>> edges;  // [state] -> outgoing edges
  std::vector<bool> accepting;           // [state]
  size_t size() const { return accepting.size(); }
};

// Above this many states an operation fails (kInvalidArgument naming the
// limit) instead of building a grammar of unbounded size.
inline constexpr size_t kMaxDfaStates = 20000;

// The DFA of strings an ECMAScript regex `re` matches (search semantics, see
// above), intersected with L(*within) when given (applied to each
// alternative before its lookaheads, so a length lookahead over a bounded
// format stays small). Errors (kInvalidArgument) name the construct and the
// byte offset of its start: "escape '\\1' (backreferences ...) (at offset
// 4)", or the state limit; the caller adds where.
core::Expected<Dfa> regex_to_dfa(std::string_view re, const Dfa* within = nullptr);
// Strings whose length in code points is in [min, max] (max empty: no bound).
Dfa length_dfa(uint32_t min, std::optional<uint32_t> max);
// Intersection / union of two languages; kInvalidArgument past kMaxDfaStates.
// The result is minimal and has no dead states.
core::Expected<Dfa> dfa_intersect(const Dfa& a, const Dfa& b);
core::Expected<Dfa> dfa_union(const Dfa& a, const Dfa& b);
// Strings over all code points (surrogates excluded) that `a` rejects.
Dfa dfa_complement(const Dfa& a);
// Concatenation "x" · L(a) for a literal prefix (e.g. a '-' sign).
Dfa dfa_prefixed(std::string_view prefix, const Dfa& a);
// Minimal equivalent DFA with unreachable and dead states removed (a state
// from which no accepting state can be reached): Hopcroft's algorithm,
// O(m n log n) for n states and m elementary code point intervals (a chain
// of 5000 counter states takes milliseconds). An empty language is one
// non-accepting state with no edges.
Dfa dfa_minimize(const Dfa& a);
// True when the language is empty.
bool dfa_empty(const Dfa& a);

// ---- decimal numbers (JSON Schema minimum / maximum / exclusive* / multipleOf)

// A non-negative decimal: integer digits without leading zeros ("0" for
// none) and fraction digits without trailing zeros ("" for none).
struct Decimal {
  std::string int_digits = "0";
  std::string frac_digits;
  bool is_zero() const { return int_digits == "0" && frac_digits.empty(); }
};
// Parses a JSON number text (RFC 8259 §6, e.g. nlohmann's dump of a bound:
// "-0.5", "1e-07", "12") into (negative, magnitude). nullopt when the text is
// not a JSON number or its exponent is beyond ±400.
std::optional<std::pair<bool, Decimal>> parse_decimal(std::string_view json_number);

enum class Cmp : uint8_t { kAny, kLt, kLe, kGt, kGe };
// Unsigned JSON number texts without exponent, "I" or "I.F" (I: "0" or 1 to
// max_int_digits digits without a leading zero; F: 1 to max_frac_digits
// digits, none when max_frac_digits is 0; at most max_total_digits digits in
// all, a lone "0" integer part not counted), whose value compares to `m` as
// `op` (kAny: every such text). Exact: a digit-by-digit comparison.
Dfa magnitude_dfa(Cmp op, const Decimal& m, uint32_t max_int_digits, uint32_t max_frac_digits,
                  uint32_t max_total_digits);
// Unsigned decimal texts "I" or "I.F" (digits only, no length limit; meant to
// be intersected with magnitude_dfa) whose value is an integral multiple of
// p / 10^d: the remainder of the digits read so far modulo p is the state.
// Minimised; p * (d + 1) must be at most kMaxMultipleStates (the caller checks).
Dfa multiple_of_dfa(uint32_t p, uint32_t d);
inline constexpr uint64_t kMaxMultipleStates = 10000;

// How dfa_to_gbnf spells characters.
enum class DfaText : uint8_t {
  kRaw,         // each code point as itself (numbers)
  kJsonString,  // the JSON string encoding of each code point: '"' '\\' and
                // control characters escaped (\t \n \r short forms, others
                // \u00XX), everything else unescaped
};

// Writes `a` (minimal, no dead states; not empty) as GBNF rules appended to
// `rules` (name, body), one per state named `prefix` + "-q" + state, and
// returns the start rule's name. The rules derive exactly L(a) (in the
// spelling chosen), without surrounding quotes.
std::string dfa_to_gbnf(const Dfa& a, const std::string& prefix, DfaText text,
                        std::vector<std::pair<std::string, std::string>>& rules);

}  // namespace bonsai::structured
