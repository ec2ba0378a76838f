// GBNF parsing, matching (incl. split UTF-8) and token masks vs brute force.
#include "structured/grammar.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf.h"  // fixture loading for the Qwen3 vocabulary test
#include "structured/json_schema.h"
#include "structured/token_mask.h"
#include "tokenizer/tokenizer.h"  // Tokenizer::token_to_bytes

namespace bonsai::structured {
namespace {

std::shared_ptr<const Grammar> compile(const std::string& text) {
  auto g = Grammar::parse(text);
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.error().message);
  return g ? *g : nullptr;
}

// Whole-string match: every byte accepted and the end state accepting.
bool matches(const std::shared_ptr<const Grammar>& g, std::string_view s) {
  auto st = GrammarState::create(g);
  if (!st) return false;
  if (!st->accept_bytes(s)) return false;
  return st->can_end();
}

std::string parse_error(const std::string& text) {
  auto g = Grammar::parse(text);
  return g ? std::string("<no error>") : g.error().message;
}

TEST(GrammarParse, ErrorsNameLineColAndExpectation) {
  EXPECT_EQ(parse_error("root ::= \"abc"), "grammar: line 1 col 14: unterminated string literal, expected '\"'");
  EXPECT_EQ(parse_error("root := \"a\""), "grammar: line 1 col 6: expected '::=' after rule name 'root'");
  EXPECT_EQ(parse_error("root ::= foo\n"), "grammar: line 1 col 10: undefined rule 'foo'");
  EXPECT_EQ(parse_error("a ::= \"x\"\n"), "grammar: no 'root' rule");
  EXPECT_EQ(parse_error("root ::= [a-z\n"), "grammar: line 1 col 10: unterminated character class, expected ']'");
  EXPECT_EQ(parse_error("root ::= ( \"a\" \n"), "grammar: line 1 col 10: unclosed '(': expected ')'");
  EXPECT_EQ(parse_error("root ::= \"a\"{3,1}"), "grammar: line 1 col 18: repetition {m,n} with n < m");
  EXPECT_EQ(parse_error("root ::= * \"a\""), "grammar: line 1 col 10: '*' without a preceding symbol");
  EXPECT_EQ(parse_error("root ::= \"a\"\nroot ::= \"b\""), "grammar: line 2 col 1: rule 'root' is defined twice");
  EXPECT_EQ(parse_error("root ::= \"\\q\""), "grammar: line 1 col 11: unknown escape '\\q'");
  EXPECT_EQ(parse_error("root ::= [z-a]"), "grammar: line 1 col 14: character range is reversed");
  EXPECT_EQ(parse_error("root ::= a\na ::= a \"x\" | \"y\""),
            "grammar: left recursion (a rule can reach itself without consuming input): a -> a");
  EXPECT_EQ(parse_error("root ::= b \"x\"\nb ::= c | \"q\"\nc ::= \"\"? root"),
            "grammar: left recursion (a rule can reach itself without consuming input): root -> b "
            "-> c -> root");
}

TEST(GrammarMatch, LiteralsClassesRepetition) {
  auto g = compile(R"(
# a comment
root ::= greeting " " name ("!" | "?")?  # trailing comment
greeting ::= "hi" | "hello"
name ::= [A-Z] [a-z]{1,3}
)");
  EXPECT_TRUE(matches(g, "hi Bob"));
  EXPECT_TRUE(matches(g, "hello Anna!"));
  EXPECT_TRUE(matches(g, "hi Ab?"));
  EXPECT_FALSE(matches(g, "hi B"));      // {1,3}: at least one
  EXPECT_FALSE(matches(g, "hi Bobby"));  // at most 3
  EXPECT_FALSE(matches(g, "hey Bob"));
  EXPECT_FALSE(matches(g, "hi bob"));
  auto rep = compile("root ::= \"ab\"{2} \"c\"+ [^x]* \"x\"{,2}");
  EXPECT_TRUE(matches(rep, "ababc"));
  EXPECT_TRUE(matches(rep, "ababccqqxx"));
  EXPECT_FALSE(matches(rep, "abc"));
  EXPECT_FALSE(matches(rep, "ababcxxx"));
  auto multi = compile("root ::= \"a\" |\n  \"b\" | (\n \"c\"\n \"d\" )");
  EXPECT_TRUE(matches(multi, "b"));
  EXPECT_TRUE(matches(multi, "cd"));
  auto esc = compile(R"(root ::= "\x41\u00e9\n\t\"\\" [\]\-] .)");
  EXPECT_TRUE(matches(esc, "A\xC3\xA9\n\t\"\\]\xF0\x9F\x98\x80"));
  EXPECT_TRUE(matches(esc, "A\xC3\xA9\n\t\"\\-z"));
}

TEST(GrammarMatch, PrefixesAreViableAndCanEndOnlyWhenComplete) {
  auto g = compile("root ::= \"{\" [0-9]+ \"}\"");
  auto st = GrammarState::create(g);
  ASSERT_TRUE(st);
  EXPECT_FALSE(st->can_end());
  ASSERT_TRUE(st->accept_bytes("{12"));
  EXPECT_FALSE(st->can_end());
  auto bad = st->accept_bytes("x");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("byte 0 (0x78)"), std::string::npos) << bad.error().message;
  ASSERT_TRUE(st->accept_bytes("3}"));  // state unchanged by the failure
  EXPECT_TRUE(st->can_end());
  EXPECT_FALSE(st->accept_bytes("}"));
}

TEST(GrammarMatch, NestedJsonFromGenericGrammar) {
  auto g = compile(json_object_gbnf());
  EXPECT_TRUE(matches(g, R"({"a": [1, 2.5, -3e+2, {"b": null}], "c": {"d": [true, false, "x\"y\u00e9"]}})"));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_TRUE(matches(g, "{\n  \"k\": \"\xE4\xBD\xA0\xE5\xA5\xBD\"\n}"));
  EXPECT_FALSE(matches(g, R"({"a": [1, 2,]})"));
  EXPECT_FALSE(matches(g, R"({"a": 01})"));
  EXPECT_FALSE(matches(g, R"([1])"));             // must be an object
  EXPECT_FALSE(matches(g, R"({"a": "x)"));        // incomplete
  EXPECT_FALSE(matches(g, "{\"a\": \"\x01\"}"));  // raw control char in a string
}

TEST(GrammarMatch, Utf8SplitAcrossChunksAndInvalidUtf8) {
  auto g = compile("root ::= [\\u00e0-\\u00ff] \"\xF0\x9F\x98\x80\" [^a]");
  const std::string text = "\xC3\xA9\xF0\x9F\x98\x80\xE4\xBD\xA0";
  for (size_t cut1 = 0; cut1 <= text.size(); ++cut1) {
    for (size_t cut2 = cut1; cut2 <= text.size(); ++cut2) {
      auto st = GrammarState::create(g);
      ASSERT_TRUE(st);
      ASSERT_TRUE(st->accept_bytes(text.substr(0, cut1)));
      ASSERT_TRUE(st->accept_bytes(text.substr(cut1, cut2 - cut1)));
      EXPECT_EQ(st->can_end(), cut2 == text.size()) << "cut2=" << cut2;
      ASSERT_TRUE(st->accept_bytes(text.substr(cut2)));
      EXPECT_TRUE(st->can_end());
    }
  }
  auto st = GrammarState::create(g);
  EXPECT_FALSE(
      st->accept_bytes("\xC3"
                       "A"));                  // missing continuation
  EXPECT_FALSE(st->accept_bytes("\xC1\x81"));  // overlong lead
  EXPECT_FALSE(st->accept_bytes("\xC2\xA0"));  // U+00A0 is not in [à-ÿ]
  EXPECT_FALSE(st->accept_bytes("\xC4"));      // lead byte already impossible (U+0100..)
  auto any = compile("root ::= .*");
  auto a = GrammarState::create(any);
  EXPECT_FALSE(a->accept_bytes("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(a->accept_bytes("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(a->accept_bytes("\xE0\x80\x80"));      // overlong
  EXPECT_TRUE(a->accept_bytes("\xF4\x8F\xBF\xBF"));
}

TEST(GrammarMatch, StackLimitsAreErrorsNotOom) {
  // Deep nesting past max_depth.
  auto g = compile("root ::= \"(\" root \")\" | \"x\"");
  GrammarLimits lim;
  lim.max_depth = 64;
  auto st = GrammarState::create(g, lim);
  ASSERT_TRUE(st);
  auto r = st->accept_bytes(std::string(200, '('));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, core::Errc::kUnsupported);
  // Ambiguity blow-up past max_stacks.
  auto amb = compile("root ::= x*\nx ::= \"a\" | \"a\" \"a\" | \"a\" \"a\" \"a\" y\ny ::= \"a\" | \"a\" \"a\"");
  lim = {};
  lim.max_stacks = 8;
  auto s2 = GrammarState::create(amb, lim);
  ASSERT_TRUE(s2);
  auto r2 = s2->accept_bytes(std::string(40, 'a'));
  ASSERT_FALSE(r2);
  EXPECT_EQ(r2.error().code, core::Errc::kUnsupported);
}

// ---- token masks -------------------------------------------------------------

struct SmallVocab {
  std::vector<std::string> bytes;
  std::vector<int32_t> eos{0};
  std::vector<int32_t> special{1};
  TokenTrie trie;
};

SmallVocab make_vocab() {
  SmallVocab v;
  v.bytes = {"",         "<|special|>", "{",    "}",          "\"",       "\":",  "\",",
             "a",        "ab",          "abc",  "b",          " ",        "  ",   "\n",
             "1",        "12",          "0",    "-",          ".",        "e",    "true",
             "false",    "null",        "[",    "]",          ",",        ":",    "{\"",
             "\"}",      "\xC3",        "\xA9", "\xC3\xA9",   "\xE4\xBD", "\xA0", "\xE4\xBD\xA0",
             "\xF0\x9F", "\x98\x80",    "\\",   "\\n",        "\\u00",    "e9",   "x\"",
             "ab",       "9",           "\xFF", "\xC3\xA9\"", "\"a",      "1}"};
  auto t = TokenTrie::build(v.bytes, v.eos, v.special);
  EXPECT_TRUE(t);
  v.trie = std::move(*t);
  return v;
}

std::vector<uint32_t> brute_force(GrammarState& st, const SmallVocab& v) {
  std::vector<uint32_t> mask((v.bytes.size() + 31) / 32, 0);
  for (int32_t id = 0; id < static_cast<int32_t>(v.bytes.size()); ++id) {
    bool ok;
    if (id == 0) {
      ok = st.can_end();
    } else if (id == 1 || v.bytes[static_cast<size_t>(id)].empty()) {
      ok = false;
    } else {
      GrammarState c = st.clone();
      ok = c.accept_bytes(v.bytes[static_cast<size_t>(id)]).has_value();
    }
    if (ok) mask[static_cast<uint32_t>(id) >> 5] |= 1u << (id & 31);
  }
  return mask;
}

TEST(TokenMask, TrieMaskEqualsBruteForceAlongRandomWalks) {
  SmallVocab v = make_vocab();
  auto schema = json_schema_to_gbnf(
      R"({"type":"object","properties":{"a":{"type":"string","maxLength":6},"b":{"type":"array","items":{"type":"integer"},"maxItems":3},"c":{"type":"boolean"}},"required":["a"]})");
  ASSERT_TRUE(schema) << schema.error().message;
  for (const std::string& text :
       {json_object_gbnf(), *schema, std::string("root ::= [\\u00e0-\\u00ff]* \"\xE4\xBD\xA0\"? \"x\"?")}) {
    auto g = compile(text);
    std::mt19937 rng(7);
    int states_checked = 0;
    for (int walk = 0; walk < 30; ++walk) {
      auto st = GrammarState::create(g);
      ASSERT_TRUE(st);
      for (int step = 0; step < 40; ++step) {
        std::vector<uint32_t> mask;
        st->allowed(v.trie, mask);
        ASSERT_EQ(mask, brute_force(*st, v)) << "walk " << walk << " step " << step;
        std::vector<uint32_t> again;
        st->allowed(v.trie, again);  // cached path
        ASSERT_EQ(mask, again);
        ++states_checked;
        std::vector<int32_t> ok;
        for (int32_t id = 0; id < static_cast<int32_t>(v.bytes.size()); ++id) {
          const bool bit = (mask[static_cast<uint32_t>(id) >> 5] >> (id & 31)) & 1;
          EXPECT_EQ(bit, st->accepts_token(v.trie, id)) << id;
          if (bit) ok.push_back(id);
        }
        if (ok.empty()) break;
        int32_t pick = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
        ASSERT_TRUE(st->accept_token(v.trie, pick));
        if (pick == 0) {
          EXPECT_TRUE(st->finished());
          break;
        }
      }
    }
    EXPECT_GT(states_checked, 100);
  }
}

TEST(TokenMask, EosOnlyWhenCanEndAndSpecialNever) {
  SmallVocab v = make_vocab();
  auto g = compile("root ::= \"ab\" \"c\"?");
  auto st = GrammarState::create(g);
  std::vector<uint32_t> mask;
  st->allowed(v.trie, mask);
  EXPECT_FALSE(mask[0] & 1u);  // EOS before "ab"
  EXPECT_FALSE(mask[0] & 2u);  // special
  EXPECT_FALSE(st->accept_token(v.trie, 0));
  EXPECT_FALSE(st->accept_token(v.trie, 1));
  ASSERT_TRUE(st->accept_token(v.trie, 8));  // "ab"
  EXPECT_TRUE(st->can_end());
  std::vector<float> logits(v.bytes.size(), 1.0f);
  st->apply_mask(v.trie, logits);
  EXPECT_EQ(logits[0], 1.0f);  // EOS allowed now
  EXPECT_TRUE(std::isinf(logits[1]));
  EXPECT_TRUE(std::isinf(logits[8]));                                                   // "ab" again: no
  for (size_t i = 2; i < v.bytes.size(); ++i) EXPECT_TRUE(std::isinf(logits[i])) << i;  // no "c" token
  ASSERT_TRUE(st->accept_token(v.trie, 0));
  EXPECT_TRUE(st->finished());
  EXPECT_FALSE(st->accept_token(v.trie, 7));
}

// Plain lengths: complete plain UTF-8, or cut short in its last character
// when everything that character can become is plain.
TEST(TokenMask, PlainLengthCountsCodePointsAndCutCharacters) {
  std::vector<std::string> bytes{"ab",
                                 "\xC3\xA9x",
                                 "\xE4\xBD",
                                 "a\xE4",
                                 "\xF0\x9F",
                                 "\xED\x9F",
                                 "\xED",
                                 "\xED\xA0",
                                 "\xF4\x90",
                                 "\xE0\x80",
                                 "a\"",
                                 "\\n",
                                 "\x7F",
                                 "\n",
                                 "\xA0",
                                 "\xFF",
                                 "a\xE4"
                                 "b"};
  std::vector<int32_t> eos;
  auto t = TokenTrie::build(bytes, eos);
  ASSERT_TRUE(t);
  const std::vector<int32_t> want{2, 2, 1, 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < bytes.size(); ++i) EXPECT_EQ(t->plain_len(static_cast<int32_t>(i)), want[i]) << i;
  EXPECT_EQ(t->residual_token_count(), 11u);
  EXPECT_EQ(t->max_plain_len(), 2);
}

TEST(TokenMask, TrieBuildValidatesIds) {
  std::vector<std::string> bytes{"a", "b"};
  std::vector<int32_t> eos{5};
  auto t = TokenTrie::build(bytes, eos);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().message, "token_trie: eos id 5 out of range");
  std::vector<int32_t> ok{1};
  auto t2 = TokenTrie::build(bytes, ok);
  ASSERT_TRUE(t2);
  EXPECT_EQ(t2->node_count(), 1u);  // only "a"; "b" is EOS and never walked
}

}  // namespace
}  // namespace bonsai::structured

namespace bonsai::structured {
namespace {

TEST(GrammarParse, GarbageNeverCrashes) {
  std::mt19937 rng(123);
  const std::string alphabet = "root::=|()[]^-*+?{},.\"\\#\n abcxu019\xC3\xA9";
  int ok = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string s = i % 2 ? "root ::= " : "";
    const int n = static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) s += alphabet[rng() % alphabet.size()];
    auto g = Grammar::parse(s);
    if (g) {
      ++ok;
      auto st = GrammarState::create(*g);
      if (st) (void)st->accept_bytes("abc");
    } else {
      EXPECT_EQ(g.error().message.rfind("grammar: ", 0), 0u) << g.error().message;
    }
  }
  EXPECT_GT(ok, 10);
}

// Distinct sequences share the Grammar and the TokenTrie and run on their
// own threads (TSan covers this in scripts/sanitize.sh).
TEST(TokenMask, ConcurrentSequencesShareGrammarAndTrie) {
  SmallVocab v = make_vocab();
  auto g = compile(json_object_gbnf());
  std::vector<std::vector<uint32_t>> first(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto st = GrammarState::create(g);
      std::vector<uint32_t> mask;
      for (const char* tok : {"{\"", "ab", "\":", " ", "1", "}"}) {
        st->allowed(v.trie, mask);
        if (first[static_cast<size_t>(t)].empty()) first[static_cast<size_t>(t)] = mask;
        (void)st->accept_bytes(tok);
      }
      EXPECT_TRUE(st->can_end());
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 1; t < 4; ++t) EXPECT_EQ(first[static_cast<size_t>(t)], first[0]);
}

}  // namespace
}  // namespace bonsai::structured

namespace bonsai::structured {
namespace {

// The trie mask on the real 151,936-token Qwen3 vocabulary equals brute force
// (every token's bytes fed to a clone) at several states, including one in the
// middle of a multi-byte character.
TEST(TokenMask, QwenVocabMaskEqualsBruteForce) {
  auto file = gguf::File::open(std::string(BONSAI_SHARED_DIR) + "/fixtures/qwen3-tiny-q1_0.gguf");
  if (!file) GTEST_SKIP() << "fixture missing: " << file.error().message;
  auto tok = tokenizer::Tokenizer::from_gguf(**file);
  ASSERT_TRUE(tok);
  const auto& t = **tok;
  std::vector<std::string> bytes(static_cast<size_t>(t.n_vocab()));
  std::vector<int32_t> eos, special;
  for (int32_t id = 0; id < t.n_vocab(); ++id) {
    bytes[static_cast<size_t>(id)] = t.token_to_bytes(id);
    if (t.is_eog(id)) {
      eos.push_back(id);
    } else if (t.token_type(id) == tokenizer::TokenType::kUserDefined) {
      special.push_back(id);
    }
  }
  auto trie = TokenTrie::build(bytes, eos, special);
  ASSERT_TRUE(trie);
  ASSERT_EQ(trie->n_vocab(), 151936);
  auto gbnf = json_schema_to_gbnf(
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"n":{"type":"integer","minimum":-5,"maximum":300}},"required":["name","n"]})");
  ASSERT_TRUE(gbnf);
  auto g = compile(*gbnf);
  auto st = GrammarState::create(g);
  ASSERT_TRUE(st);
  // Prefixes: start, inside the key, in the string (mid-character after the
  // first byte of 你), after the string, in the number, complete.
  const std::vector<std::string> chunks = {"", "{\"na", "me\": \"a", "\xE4", "\xBD\xA0\"", ", \"n\": 2", "9}"};
  int checked = 0;
  for (const auto& c : chunks) {
    ASSERT_TRUE(st->accept_bytes(c)) << c;
    std::vector<uint32_t> mask;
    st->allowed(*trie, mask);
    size_t allowed = 0;
    for (int32_t id = 0; id < trie->n_vocab(); ++id) {
      bool expect;
      if (trie->is_eos(id)) {
        expect = st->can_end();
      } else if (trie->is_excluded(id)) {
        expect = false;
      } else {
        GrammarState cl = st->clone();
        expect = cl.accept_bytes(bytes[static_cast<size_t>(id)]).has_value();
      }
      const bool got = (mask[static_cast<uint32_t>(id) >> 5] >> (id & 31)) & 1;
      ASSERT_EQ(got, expect) << "token " << id << " after chunk '" << c << "'";
      allowed += got;
    }
    EXPECT_GT(allowed, 0u);
    ++checked;
  }
  EXPECT_EQ(checked, 7);
  EXPECT_TRUE(st->can_end());
}

// The plain-token fast path (plain tokens by length + the residual trie) on
// the real Qwen3 vocabulary: free strings (json_object: the class loops),
// maxLength strings (a chain of K states ending dead), a string right after an
// escape, a pattern class (not uniform: the full walk) and keys; each mask
// equals brute force.
TEST(TokenMask, QwenVocabPlainFastPathEqualsBruteForce) {
  auto file = gguf::File::open(std::string(BONSAI_SHARED_DIR) + "/fixtures/qwen3-tiny-q1_0.gguf");
  if (!file) GTEST_SKIP() << "fixture missing: " << file.error().message;
  auto tok = tokenizer::Tokenizer::from_gguf(**file);
  ASSERT_TRUE(tok);
  const auto& t = **tok;
  std::vector<std::string> bytes(static_cast<size_t>(t.n_vocab()));
  std::vector<int32_t> eos, special;
  for (int32_t id = 0; id < t.n_vocab(); ++id) {
    bytes[static_cast<size_t>(id)] = t.token_to_bytes(id);
    if (t.is_eog(id)) {
      eos.push_back(id);
    } else if (t.token_type(id) == tokenizer::TokenType::kUserDefined) {
      special.push_back(id);
    }
  }
  auto trie = TokenTrie::build(bytes, eos, special);
  ASSERT_TRUE(trie);
  // Most of the vocabulary is plain; the residual trie is the rest.
  size_t plain = 0;
  for (int32_t id = 0; id < trie->n_vocab(); ++id) plain += trie->plain_len(id) > 0;
  EXPECT_GT(plain, 100000u);
  size_t walkable = 0;  // every token a grammar may allow is plain or in the residual trie
  for (int32_t id = 0; id < trie->n_vocab(); ++id) walkable += !trie->is_eos(id) && !trie->is_excluded(id);
  EXPECT_EQ(plain + trie->residual_token_count(), walkable);
  EXPECT_EQ(trie->plain_len(static_cast<int32_t>(t.encode("hello")[0])), 5);
  auto schema = json_schema_to_gbnf(
      R"({"type":"object","properties":{"s":{"type":"string","maxLength":5},"z":{"type":"string","pattern":"^[0-9]{3}$"},"f":{"type":"string"}},"required":["s","z","f"]})");
  ASSERT_TRUE(schema);
  struct Case {
    std::string gbnf;
    std::vector<std::string> chunks;
  };
  const std::vector<Case> cases = {
      {json_object_gbnf(), {"", "{\"", "ab", "c d", "\\n", "\\u00e9", "x\xE4", "\xBD\xA0\"", ": \"", "q"}},
      {*schema,
       {"", "{\"s\": \"", "a", "bc", "d", "e", "\", \"z\": \"", "1", "23\", \"f\": \"", "long text here", "\\t"}},
  };
  for (const auto& cs : cases) {
    auto g = compile(cs.gbnf);
    auto st = GrammarState::create(g);
    ASSERT_TRUE(st);
    for (const auto& c : cs.chunks) {
      ASSERT_TRUE(st->accept_bytes(c)) << c;
      std::vector<uint32_t> mask;
      st->allowed(*trie, mask);
      for (int32_t id = 0; id < trie->n_vocab(); ++id) {
        bool expect;
        if (trie->is_eos(id)) {
          expect = st->can_end();
        } else if (trie->is_excluded(id)) {
          expect = false;
        } else {
          GrammarState cl = st->clone();
          expect = cl.accept_bytes(bytes[static_cast<size_t>(id)]).has_value();
        }
        const bool got = (mask[static_cast<uint32_t>(id) >> 5] >> (id & 31)) & 1;
        ASSERT_EQ(got, expect) << "token " << id << " '" << bytes[static_cast<size_t>(id)] << "' after chunk '" << c
                               << "'";
      }
    }
  }
}

}  // namespace
}  // namespace bonsai::structured
