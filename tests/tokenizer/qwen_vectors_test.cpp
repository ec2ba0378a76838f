// Qwen2/Qwen3 byte-level BPE against llama.cpp's Qwen2 vocabulary test vectors
// and the 222-string Qwen3 corpus (../shared/fixtures/tokenizer, formats in
// ../shared/fixtures/README.md).
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tok_test_util.h"
#include "tokenizer/unicode.h"

namespace bonsai::tokenizer {
namespace {

using testing::kQwenGguf;
using testing::load_tokenizer;
using testing::read_file;

std::string show(const std::vector<TokenId>& ids) {
  std::ostringstream os;
  for (TokenId id : ids) os << ' ' << id;
  return os.str();
}

TEST(QwenTokenizer, LoadsVocabularyAndSpecialIds) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwenGguf));
  auto tok = load_tokenizer(kQwenGguf);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->n_vocab(), 151936);
  EXPECT_EQ(tok->vocab_type(), VocabType::kBpe);
  EXPECT_EQ(tok->eos_id(), 151645);
  EXPECT_EQ(tok->bos_id(), 151643);
  EXPECT_EQ(tok->pad_id(), 151643);
  EXPECT_EQ(tok->eot_id(), 151645);
  EXPECT_FALSE(tok->add_bos_token());
  EXPECT_EQ(tok->token_text(151644), "<|im_start|>");
  EXPECT_EQ(tok->find_token("<think>"), 151667);
  EXPECT_EQ(tok->token_type(151667), TokenType::kUserDefined);
  EXPECT_EQ(tok->token_type(151700), TokenType::kUnused);
  EXPECT_TRUE(tok->is_eog(151645));  // <|im_end|>
  EXPECT_TRUE(tok->is_eog(151643));  // <|endoftext|>
  EXPECT_TRUE(tok->is_eog(151662));  // <|fim_pad|>
  EXPECT_FALSE(tok->is_eog(151644));
  EXPECT_FALSE(tok->is_eog(198));
  EXPECT_TRUE(tok->is_control(151644));
  EXPECT_FALSE(tok->is_control(151667));
  EXPECT_EQ(tok->chat_template().family(), ChatTemplate::Family::kQwen3);
  // encode_prompt adds no BOS for Qwen (add_bos_token false).
  EXPECT_EQ(tok->encode_prompt("Hello"), tok->encode("Hello"));
}

// llama.cpp's tests/test-tokenizer-0 vectors for the Qwen2 vocabulary.
TEST(QwenTokenizer, Qwen2VocabTestVectors) {
  const auto inp_path = test::shared_path("fixtures/tokenizer/qwen2-vocab-test.inp");
  const auto out_path = test::shared_path("fixtures/tokenizer/qwen2-vocab-test.out");
  BONSAI_REQUIRE_FILE(inp_path);
  BONSAI_REQUIRE_FILE(out_path);
  BONSAI_REQUIRE_FILE(test::shared_path(kQwenGguf));
  auto tok = load_tokenizer(kQwenGguf);
  ASSERT_NE(tok, nullptr);

  const std::string inp = read_file(inp_path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0;;) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) break;
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<std::vector<TokenId>> expected;
  std::istringstream out(read_file(out_path));
  for (std::string line; std::getline(out, line);) {
    std::istringstream ls(line);
    std::vector<TokenId> ids;
    for (TokenId id; ls >> id;) ids.push_back(id);
    expected.push_back(ids);
  }
  ASSERT_EQ(texts.size(), 46u);
  ASSERT_EQ(expected.size(), texts.size());
  int failures = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto got = tok->encode(texts[i], /*parse_special=*/false);
    if (got != expected[i]) ++failures;
    EXPECT_EQ(got, expected[i]) << "case " << i << " text '" << texts[i] << "'\n got:" << show(got)
                                << "\nwant:" << show(expected[i]);
  }
  EXPECT_EQ(failures, 0);
}

std::vector<TokenId> ids_of(const nlohmann::json& j) { return j.get<std::vector<TokenId>>(); }

// The Qwen3 corpus: `ids` with special tokens parsed, `ids_plain` without;
// `ids_hf_js` (Hugging Face, NFC applied) takes precedence where present.
TEST(QwenTokenizer, Qwen3Corpus) {
  const auto path = test::shared_path("fixtures/tokenizer/qwen3-corpus.json");
  BONSAI_REQUIRE_FILE(path);
  BONSAI_REQUIRE_FILE(test::shared_path(kQwenGguf));
  auto tok = load_tokenizer(kQwenGguf);
  ASSERT_NE(tok, nullptr);
  const auto corpus = nlohmann::json::parse(read_file(path));
  ASSERT_EQ(corpus.size(), 222u);
  int checked_hf = 0, checked_plain = 0, roundtrips = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const auto& c = corpus[i];
    const std::string text = c.at("text").get<std::string>();
    const bool has_hf = c.contains("ids_hf_js");
    const auto want_special = has_hf ? ids_of(c["ids_hf_js"]) : ids_of(c.at("ids"));
    const auto want_plain =
        has_hf ? ids_of(c["ids_hf_js"]) : (c.contains("ids_plain") ? ids_of(c["ids_plain"]) : ids_of(c["ids"]));
    checked_hf += has_hf;
    checked_plain += c.contains("ids_plain");
    const auto got_special = tok->encode(text, /*parse_special=*/true);
    const auto got_plain = tok->encode(text, /*parse_special=*/false);
    EXPECT_EQ(got_special, want_special) << "case " << i << " '" << text << "' (special)\n got:" << show(got_special)
                                         << "\nwant:" << show(want_special);
    EXPECT_EQ(got_plain, want_plain) << "case " << i << " '" << text << "' (plain)\n got:" << show(got_plain)
                                     << "\nwant:" << show(want_plain);
    if (c.at("roundtrip_ok").get<bool>()) {
      // Plain encoding keeps control-token text as characters, so decoding
      // gives the text back (NFC-normalized, as the tokenizer normalizes).
      EXPECT_EQ(tok->decode(got_plain), unicode::nfc(text)) << "round trip, case " << i;
      ++roundtrips;
    }
  }
  EXPECT_EQ(checked_hf, 7);
  EXPECT_GT(checked_plain, 0);
  EXPECT_GT(roundtrips, 200);
}

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

// The model goldens: llama.cpp's prompt ids for the 11 prompts (special
// tokens parsed) and the byte pieces of its 24 greedy tokens per prompt.
TEST(QwenTokenizer, GoldenPromptIdsAndPieces) {
  const auto path = test::shared_path("fixtures/golden/qwen3-tiny-q1_0.json");
  BONSAI_REQUIRE_FILE(path);
  BONSAI_REQUIRE_FILE(test::shared_path(kQwenGguf));
  auto tok = load_tokenizer(kQwenGguf);
  ASSERT_NE(tok, nullptr);
  const auto golden = nlohmann::json::parse(read_file(path));
  const auto& prompts = golden.at("prompts");
  ASSERT_EQ(prompts.size(), 11u);
  for (const auto& p : prompts) {
    const std::string name = p.at("name").get<std::string>();
    const auto ids = tok->encode(p.at("text").get<std::string>(), p.at("parse_special").get<bool>());
    EXPECT_EQ(ids, ids_of(p.at("prompt_ids"))) << name;
    const auto greedy = ids_of(p.at("greedy_ids"));
    const auto& pieces_hex = p.at("greedy_pieces_hex");
    ASSERT_EQ(pieces_hex.size(), greedy.size()) << name;
    std::string all;
    for (size_t i = 0; i < greedy.size(); ++i) {
      EXPECT_EQ(hex(tok->token_to_bytes(greedy[i])), pieces_hex[i].get<std::string>())
          << name << " token " << greedy[i];
      all += tok->token_to_bytes(greedy[i]);
    }
    EXPECT_EQ(hex(all), p.at("greedy_text_hex").get<std::string>()) << name;
    EXPECT_EQ(hex(tok->decode(greedy)), p.at("greedy_text_hex").get<std::string>()) << name;
  }
}

// One Tokenizer shared by many threads (the server's replicas): same ids as
// a single thread (the BPE cache is shared and locked).
TEST(QwenTokenizer, ConcurrentEncodeIsConsistent) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwenGguf));
  auto tok = load_tokenizer(kQwenGguf);
  ASSERT_NE(tok, nullptr);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) {
    texts.push_back("Thread-safe tokenization #" + std::to_string(i) + ": café, 世界 " +
                    std::string(static_cast<size_t>(i % 7), ' ') + "🦙 word" + std::to_string(i * 7919));
  }
  std::vector<std::vector<TokenId>> want;
  for (const auto& t : texts) want.push_back(tok->encode(t));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int rep = 0; rep < 5; ++rep) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i * 31 + static_cast<size_t>(th) * 17 + static_cast<size_t>(rep)) % texts.size();
          if (tok->encode(texts[k]) != want[k]) mismatches.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(QwenTokenizer, PreTokenizerRules) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwenGguf));
  auto tok = load_tokenizer(kQwenGguf);
  ASSERT_NE(tok, nullptr);
  // "->" is one token; digits are split one by one.
  const auto arrow = tok->encode("->");
  ASSERT_EQ(arrow.size(), 1u);
  EXPECT_EQ(tok->token_text(arrow[0]), "->");
  const auto digits = tok->encode("12345");
  ASSERT_EQ(digits.size(), 5u);
  for (size_t i = 0; i < digits.size(); ++i) {
    EXPECT_EQ(tok->token_text(digits[i]), std::string(1, static_cast<char>('1' + i)));
  }
  // User-defined tokens (<think>) are recognised even without parse_special,
  // control tokens only with it (llama.cpp and Hugging Face behaviour).
  EXPECT_EQ(tok->encode("<think>", false), std::vector<TokenId>{151667});
  EXPECT_EQ(tok->encode("<|im_end|>", true), std::vector<TokenId>{151645});
  EXPECT_NE(tok->encode("<|im_end|>", false), std::vector<TokenId>{151645});
  // Unused [PAD] tokens are never produced from text.
  for (TokenId id : tok->encode("[PAD151700]", true)) EXPECT_LT(id, 151669);
  EXPECT_TRUE(tok->encode("").empty());
}

TEST(QwenTokenizer, InvalidUtf8BecomesReplacementCharacter) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwenGguf));
  auto tok = load_tokenizer(kQwenGguf);
  ASSERT_NE(tok, nullptr);
  // llama.cpp maps each invalid byte to U+FFFD before pre-tokenization.
  EXPECT_EQ(tok->encode("a\xFF"
                        "b"),
            tok->encode("a\xEF\xBF\xBD"
                        "b"));
  EXPECT_EQ(tok->decode(tok->encode("x\xC3")), "x\xEF\xBF\xBD");
}

TEST(QwenTokenizer, LongInputIsFastAndConsistent) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwenGguf));
  auto tok = load_tokenizer(kQwenGguf);
  ASSERT_NE(tok, nullptr);
  // A single 20000-byte "word" (no pre-tokenizer split) exercises the heap
  // merge; the result must decode back exactly.
  const std::string word(20000, 'a');
  const auto ids = tok->encode(word);
  EXPECT_LT(ids.size(), word.size() / 4);
  EXPECT_EQ(tok->decode(ids), word);
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "The quick brown fox jumps over the lazy dog " + std::to_string(i) + ". ";
  const auto ids2 = tok->encode(text);
  EXPECT_EQ(tok->decode(ids2), text);
}

}  // namespace
}  // namespace bonsai::tokenizer
