// SentencePiece-style tokenizer (tokenizer.ggml.model = llama) on the real
// stories260K vocabulary (512 tokens) and the Llama-2 vocabulary (32000).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tok_test_util.h"

namespace bonsai::tokenizer {
namespace {

using testing::kLlama2Gguf;
using testing::kStoriesGguf;
using testing::load_tokenizer;
using testing::read_file;

TEST(StoriesTokenizer, SpecialIdsFromGguf) {
  BONSAI_REQUIRE_FILE(test::shared_path(kStoriesGguf));
  auto tok = load_tokenizer(kStoriesGguf);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_type(), VocabType::kSpm);
  EXPECT_EQ(tok->n_vocab(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->unk_id(), 0);
  EXPECT_EQ(tok->pad_id(), kNoToken);  // 4294967295 in the file means none
  EXPECT_TRUE(tok->add_bos_token());   // llama default
  EXPECT_TRUE(tok->is_eog(2));
  EXPECT_FALSE(tok->is_eog(1));
  EXPECT_EQ(tok->token_to_bytes(1), "");     // <s> is control: not printed
  EXPECT_EQ(tok->token_to_bytes(13), "\n");  // <0x0A> byte token
  EXPECT_EQ(tok->token_to_bytes(403), " Once");
}

// "▁Once" (403, score -144), "▁upon" (407), "▁a" (261), "▁time" (378) are all
// in the vocabulary and every character pair on the way merges toward them
// (▁+O → ▁O, O+n ..., ▁On + ce → ▁Once), so SentencePiece BPE ends at the
// four whole words after prefixing a space: the same four ids the model
// itself generates first from BOS (expected_greedy_from_bos.json).
TEST(StoriesTokenizer, OnceUponATime) {
  BONSAI_REQUIRE_FILE(test::shared_path(kStoriesGguf));
  auto tok = load_tokenizer(kStoriesGguf);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("Once upon a time"), (std::vector<TokenId>{403, 407, 261, 378}));
  EXPECT_EQ(tok->encode_prompt("Once upon a time"), (std::vector<TokenId>{1, 403, 407, 261, 378}));
  // Only the one space the tokenizer itself prefixes is removed on decode;
  // a leading space of the input survives the round trip.
  EXPECT_EQ(tok->decode(tok->encode(" Once upon")), " Once upon");
  EXPECT_EQ(tok->decode(tok->encode("Once upon a time")), "Once upon a time");
  // Newline has no normal token: byte fallback <0x0A> = 13.
  const auto nl = tok->encode("a\nb");
  EXPECT_NE(std::find(nl.begin(), nl.end(), 13), nl.end());
  EXPECT_EQ(tok->decode(nl), "a\nb");
  // Characters outside the vocabulary fall back to their UTF-8 bytes.
  const auto cjk = tok->encode("猫");  // E7 8C AB
  EXPECT_EQ(cjk, (std::vector<TokenId>{tok->find_token("▁"), 3 + 0xE7, 3 + 0x8C, 3 + 0xAB}));
  EXPECT_EQ(tok->decode(cjk), "猫");
  EXPECT_TRUE(tok->encode("").empty());
  EXPECT_EQ(tok->encode_prompt(""), std::vector<TokenId>{1});
}

TEST(StoriesTokenizer, SpecialTokensOnlyWhenParsed) {
  BONSAI_REQUIRE_FILE(test::shared_path(kStoriesGguf));
  auto tok = load_tokenizer(kStoriesGguf);
  ASSERT_NE(tok, nullptr);
  const auto parsed = tok->encode("<s>Hi", true);
  ASSERT_FALSE(parsed.empty());
  EXPECT_EQ(parsed[0], 1);
  // After a special token the text run gets the space prefix again.
  EXPECT_EQ(std::vector<TokenId>(parsed.begin() + 1, parsed.end()), tok->encode("Hi"));
  const auto plain = tok->encode("<s>Hi", false);
  EXPECT_EQ(std::find(plain.begin(), plain.end(), 1), plain.end());
}

// Decoding BOS + the 256 greedy tokens reproduces the published text exactly
// (the JSON keeps the leading space of "▁Once", as llama.cpp prints it).
TEST(StoriesTokenizer, DecodesGreedyOracle) {
  const auto path = test::shared_path("models/stories260K/expected_greedy_from_bos.json");
  BONSAI_REQUIRE_FILE(path);
  BONSAI_REQUIRE_FILE(test::shared_path(kStoriesGguf));
  auto tok = load_tokenizer(kStoriesGguf);
  ASSERT_NE(tok, nullptr);
  const auto j = nlohmann::json::parse(read_file(path));
  std::vector<TokenId> ids = j.at("prompt_token_ids").get<std::vector<TokenId>>();
  const auto gen = j.at("generated_token_ids").get<std::vector<TokenId>>();
  ASSERT_EQ(gen.size(), 256u);
  ids.insert(ids.end(), gen.begin(), gen.end());
  const std::string text = j.at("text").get<std::string>();
  EXPECT_EQ(tok->decode(ids), text);
  // Streaming the generated tokens gives the same text.
  IncrementalDecoder dec(*tok);
  std::string streamed;
  for (TokenId id : gen) streamed += dec.push(id);
  streamed += dec.flush();
  EXPECT_EQ(streamed, text);
  // And the text (without the leading space the model's first token carries)
  // re-encodes to the same tokens the model generated.
  EXPECT_EQ(tok->encode(text.substr(1)), gen);
}

// Llama-2's 32000-token SentencePiece vocabulary: well-known ids.
TEST(Llama2Tokenizer, HelloWorld) {
  BONSAI_REQUIRE_FILE(test::shared_path(kLlama2Gguf));
  auto tok = load_tokenizer(kLlama2Gguf);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->n_vocab(), 32000);
  EXPECT_EQ(tok->token_text(15043), "▁Hello");
  EXPECT_EQ(tok->token_text(3186), "▁world");
  EXPECT_EQ(tok->encode_prompt("Hello world"), (std::vector<TokenId>{1, 15043, 3186}));
  const std::string s = "  Spaces,\ttabs\nand ünïcödé — 🦙 llamas!";
  EXPECT_EQ(tok->decode(tok->encode(s)), s);
  const std::string emoji = "🦙";
  const auto ids = tok->encode(emoji);
  EXPECT_EQ(tok->decode(ids), emoji);
}

// Cases of llama.cpp's test-tokenizer-0 vectors for the Llama SentencePiece
// vocabulary (ggml-vocab-llama-spm), tokenized without BOS. Each id's text is
// checked too, so the expectation can be read off the vocabulary: "▁▁" for a
// lone space (prefix + space), a lone "▁" before byte-fallback characters.
TEST(Llama2Tokenizer, LlamaCppSpmVectors) {
  BONSAI_REQUIRE_FILE(test::shared_path(kLlama2Gguf));
  auto tok = load_tokenizer(kLlama2Gguf);
  ASSERT_NE(tok, nullptr);
  struct Case {
    std::string text;
    std::vector<TokenId> ids;
  };
  const std::vector<Case> cases = {
      {"", {}},
      {" ", {259}},
      {"  ", {1678}},
      {"   ", {268}},
      {"\t", {29871, 12}},
      {"\n", {29871, 13}},
      {"Hello world", {15043, 3186}},
      {" Hello world", {29871, 15043, 3186}},
      {"Hello World", {15043, 2787}},
      {" this is 🦙.cpp", {29871, 445, 338, 29871, 243, 162, 169, 156, 29889, 8223}},
      {"w048 7tuijk dsdfhu", {281, 29900, 29946, 29947, 29871, 29955, 9161, 13535, 18031, 2176, 6905}},
      {"нещо на Български", {1538, 4851, 665, 1386, 29713, 1305}},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(tok->encode(c.text), c.ids) << "'" << c.text << "'";
    EXPECT_EQ(tok->decode(c.ids), c.text);
  }
  EXPECT_EQ(tok->token_text(259), "▁▁");
  EXPECT_EQ(tok->token_text(29871), "▁");
  EXPECT_EQ(tok->token_text(243), "<0xF0>");
}

}  // namespace
}  // namespace bonsai::tokenizer
