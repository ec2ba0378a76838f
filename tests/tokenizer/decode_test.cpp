// Decoding: token_to_bytes, decode, and the UTF-8-safe IncrementalDecoder.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tok_test_util.h"
#include "tokenizer/unicode.h"

namespace bonsai::tokenizer {
namespace {

using testing::kQwenGguf;
using testing::load_tokenizer;

bool is_valid_utf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = unicode::valid_utf8_length(s, pos);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

TEST(Utf8, AppendValidHoldsBackUnfinishedCharacter) {
  std::string out;
  EXPECT_EQ(append_valid_utf8("ab\xF0\x9F", out), 2u);  // first half of an emoji
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(append_valid_utf8("\xF0\x9F\xA6\x99", out), 0u);  // 🦙 complete
  EXPECT_EQ(out, "🦙");
  out.clear();
  // A stray continuation byte and a lead byte followed by ASCII are invalid:
  // one U+FFFD each (maximal subpart), the rest kept.
  EXPECT_EQ(append_valid_utf8("\x80x\xE4\xB8y", out), 0u);
  EXPECT_EQ(out, "\xEF\xBF\xBDx\xEF\xBF\xBDy");
  out.clear();
  // Overlong and surrogate encodings are invalid, never held back.
  EXPECT_EQ(append_valid_utf8("\xC0\xAF", out), 0u);
  EXPECT_EQ(out, "\xEF\xBF\xBD\xEF\xBF\xBD");
  out.clear();
  EXPECT_EQ(append_valid_utf8("\xED\xA0", out), 0u);
  EXPECT_EQ(out, "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(QwenDecode, PiecesAndSpecialTokens) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwenGguf));
  auto tok = load_tokenizer(kQwenGguf);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->token_to_bytes(21927), " Hello");    // "ĠHello"
  EXPECT_EQ(tok->token_to_bytes(198), "\n");          // "Ċ"
  EXPECT_EQ(tok->token_to_bytes(151645), "");         // <|im_end|>: control, not printed
  EXPECT_EQ(tok->token_to_bytes(151667), "<think>");  // user-defined: printed
  EXPECT_EQ(tok->token_to_bytes(151700), "");         // [PAD]: unused
  EXPECT_EQ(tok->token_to_bytes(-1), "");
  EXPECT_EQ(tok->token_to_bytes(1 << 30), "");
  EXPECT_EQ(tok->token_text(1 << 30), "");
  const std::vector<TokenId> ids = {151644, 872, 198, 9707, 0, 151645};
  EXPECT_EQ(tok->decode(ids), "user\nHello!");
}

// Feeding emoji and CJK token by token never yields a partial character,
// holds bytes back while a character is unfinished, and adds up to decode().
TEST(QwenDecode, IncrementalDecoderNeverSplitsCharacters) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwenGguf));
  auto tok = load_tokenizer(kQwenGguf);
  ASSERT_NE(tok, nullptr);
  const std::vector<std::string> texts = {"🦙🦙 llamas",
                                          "😶‍🌫️ (multiple emojis concatenated) ✅",
                                          "我想在apple工作1314151天～",
                                          "កាន់តែពិសេសអាច",
                                          "Ελληνικά и кириллица",
                                          "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 👩‍👩‍👧‍👦"};
  int held_back = 0;
  for (const std::string& text : texts) {
    const auto ids = tok->encode(text);
    IncrementalDecoder dec(*tok);
    std::string streamed;
    for (TokenId id : ids) {
      const std::string piece = dec.push(id);
      EXPECT_TRUE(is_valid_utf8(piece)) << "partial character streamed for '" << text << "'";
      if (piece.empty() && dec.pending_bytes() > 0) ++held_back;
      streamed += piece;
    }
    EXPECT_EQ(dec.pending_bytes(), 0u);
    streamed += dec.flush();
    EXPECT_EQ(streamed, text);
    EXPECT_EQ(tok->decode(ids), text);
  }
  EXPECT_GT(held_back, 0);  // some characters really were split across tokens
}

TEST(QwenDecode, FlushReplacesUnfinishedCharacter) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwenGguf));
  auto tok = load_tokenizer(kQwenGguf);
  ASSERT_NE(tok, nullptr);
  // " 🦙" (20 F0 9F A6 99) is split over several byte-level tokens, the
  // first of which ends inside the emoji; stop early.
  const auto ids = tok->encode(" 🦙");
  ASSERT_GT(ids.size(), 1u);
  IncrementalDecoder dec(*tok);
  EXPECT_EQ(dec.push(ids[0]), " ");
  EXPECT_GT(dec.pending_bytes(), 0u);
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(dec.pending_bytes(), 0u);
  // Control tokens produce nothing and do not disturb a pending character.
  IncrementalDecoder dec2(*tok);
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    s += dec2.push(ids[i]);
    if (i == 0) s += dec2.push(151645);
  }
  EXPECT_EQ(s, " 🦙");
}

}  // namespace
}  // namespace bonsai::tokenizer

namespace bonsai::tokenizer {
namespace {

// Random mixes of ASCII, accents (composed and combining), CJK, emoji with
// ZWJ/skin tones, whitespace and special-token text: encode never crashes,
// plain encoding round-trips to the NFC text, and streaming matches decode.
TEST(QwenDecode, RandomTextRoundTrips) {
  BONSAI_REQUIRE_FILE(test::shared_path(testing::kQwenGguf));
  auto tok = testing::load_tokenizer(testing::kQwenGguf);
  ASSERT_NE(tok, nullptr);
  const std::vector<std::string> atoms = {"a",        "Z",          " ",
                                          "  ",       "\n",         "\t",
                                          "\r\n",     "7",          "42",
                                          "'s",       "'LL",        "->",
                                          "!!",       "é",          "e\xCC\x81",
                                          "\xC3\x85", "A\xCC\x8A",  "猫",
                                          "世界",     "🦙",       "😶\u200d🌫️",
                                          "👍🏽", "\u00A0",     "\u3000",
                                          "\u0085",   "<|im_end|>", "<think>",
                                          "Ω",        "ﬁ",          "\xF0\x9D\x94\x98"};
  uint64_t state = 0x9E3779B97F4A7C15ull;  // splitmix64, fixed seed
  auto next = [&] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const int n = 1 + static_cast<int>(next() % 24);
    for (int i = 0; i < n; ++i) text += atoms[next() % atoms.size()];
    const auto ids = tok->encode(text, false);
    EXPECT_EQ(tok->decode(ids), unicode::nfc(text)) << "text: " << text;
    IncrementalDecoder dec(*tok);
    std::string streamed;
    for (TokenId id : tok->encode(text, true)) {
      const std::string piece = dec.push(id);
      EXPECT_TRUE(is_valid_utf8(piece));
      streamed += piece;
    }
    EXPECT_EQ(dec.pending_bytes(), 0u);
    EXPECT_TRUE(is_valid_utf8(streamed));
  }
  // Arbitrary bytes: no crash, output stays valid UTF-8 when streamed.
  for (int iter = 0; iter < 200; ++iter) {
    std::string bytes;
    const int n = static_cast<int>(next() % 40);
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<char>(next() & 0xFF));
    const auto ids = tok->encode(bytes, true);
    IncrementalDecoder dec(*tok);
    std::string streamed;
    for (TokenId id : ids) streamed += dec.push(id);
    streamed += dec.flush();
    EXPECT_TRUE(is_valid_utf8(streamed));
  }
}

}  // namespace
}  // namespace bonsai::tokenizer
