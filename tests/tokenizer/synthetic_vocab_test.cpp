// Tokenizers built from small hand-written GGUFs (gguf::Writer): merge-rank
// and score ordering on vocabularies small enough to reason about by hand,
// and load errors for broken tokenizer metadata.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace bonsai::tokenizer {
namespace {

core::Expected<std::shared_ptr<const Tokenizer>> build(const gguf::Writer& w) {
  const auto bytes = w.to_bytes();
  auto file = gguf::File::parse(core::MappedFile::from_bytes(bytes, "synthetic.gguf"));
  if (!file) return std::unexpected(file.error());
  return Tokenizer::from_gguf(**file);
}

gguf::Writer bpe_writer(std::vector<std::string> merges) {
  gguf::Writer w;
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "qwen2");
  w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "c", "ab", "bc", "<|end|>"});
  w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 3});
  w.set_string_array("tokenizer.ggml.merges", std::move(merges));
  w.set_u32("tokenizer.ggml.eos_token_id", 5);
  return w;
}

// "abc": with "a b" ranked first the word becomes ab|c; with "b c" first,
// a|bc. The lower rank (earlier line) always wins.
TEST(SyntheticBpe, MergeRankDecides) {
  auto t1 = build(bpe_writer({"a b", "b c"}));
  ASSERT_TRUE(t1.has_value()) << t1.error().message;
  EXPECT_EQ((*t1)->encode("abc"), (std::vector<TokenId>{3, 2}));
  auto t2 = build(bpe_writer({"b c", "a b"}));
  ASSERT_TRUE(t2.has_value()) << t2.error().message;
  EXPECT_EQ((*t2)->encode("abc"), (std::vector<TokenId>{0, 4}));
  // Equal candidates: leftmost first. "abab" → ab|ab.
  EXPECT_EQ((*t2)->encode("abab"), (std::vector<TokenId>{3, 3}));
  EXPECT_EQ((*t1)->encode("x<|end|>a", true), (std::vector<TokenId>{5, 0}));  // "x" has no token: dropped
  EXPECT_TRUE((*t1)->is_eog(5));
  EXPECT_EQ((*t1)->eos_id(), 5);
  EXPECT_EQ((*t1)->bos_id(), kNoToken);
}

gguf::Writer spm_writer() {
  gguf::Writer w;
  w.set_string("tokenizer.ggml.model", "llama");
  // ids: 0 <unk>, 1 <s>, 2 </s>, 3 <0x41> ('A'), 4 ▁, 5 a, 6 b, 7 ▁a, 8 ab, 9 ▁ab
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "<0x41>", "\xE2\x96\x81", "a", "b",
                                               "\xE2\x96\x81"
                                               "a",
                                               "ab",
                                               "\xE2\x96\x81"
                                               "ab"});
  w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 6, 1, 1, 1, 1, 1, 1});
  // Higher score merges first: "ab" (-1) beats "▁a" (-2).
  w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0, 0, -10, -10, -10, -2, -1, -3});
  return w;
}

TEST(SyntheticSpm, ScoreDecidesAndBytesFallBack) {
  auto t = build(spm_writer());
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ((*t)->bos_id(), 1);
  EXPECT_TRUE((*t)->add_bos_token());
  // "▁ab": "ab" (score -1) merges before "▁a" (-2), then ▁ + ab → "▁ab".
  EXPECT_EQ((*t)->encode("ab"), (std::vector<TokenId>{9}));
  // "▁a▁b": ▁a merges; "▁b" is no token → ▁ (4), b (6).
  EXPECT_EQ((*t)->encode("a b"), (std::vector<TokenId>{7, 4, 6}));
  // 'A' has only a byte token; 'Z' has none → unk via byte fallback.
  EXPECT_EQ((*t)->encode("A"), (std::vector<TokenId>{4, 3}));
  EXPECT_EQ((*t)->encode("Z"), (std::vector<TokenId>{4, 0}));
  EXPECT_EQ((*t)->decode(std::vector<TokenId>{4, 3}), "A");
  EXPECT_EQ((*t)->decode(std::vector<TokenId>{1, 9}), " ab");  // space kept after BOS (llama.cpp)
  EXPECT_EQ((*t)->decode(std::vector<TokenId>{9}), "ab");      // leading space removed
}

TEST(SyntheticLoad, BrokenMetadataIsAnError) {
  {
    gguf::Writer w;
    w.set_string("tokenizer.ggml.model", "gpt2");
    auto t = build(w);
    ASSERT_FALSE(t.has_value());
    EXPECT_NE(t.error().message.find("tokenizer.ggml.tokens"), std::string::npos) << t.error().message;
  }
  {
    auto w = bpe_writer({"a b"});
    w.set_string("tokenizer.ggml.model", "t5");
    auto t = build(w);
    ASSERT_FALSE(t.has_value());
    EXPECT_EQ(t.error().code, core::Errc::kUnsupported);
  }
  {
    auto w = bpe_writer({"ab"});  // no separator
    auto t = build(w);
    ASSERT_FALSE(t.has_value());
    EXPECT_NE(t.error().message.find("tokenizer.ggml.merges[0]"), std::string::npos) << t.error().message;
  }
  {
    auto w = bpe_writer({"a b"});
    w.set_i32_array("tokenizer.ggml.token_type", {1, 1});
    auto t = build(w);
    ASSERT_FALSE(t.has_value());
    EXPECT_NE(t.error().message.find("token_type"), std::string::npos) << t.error().message;
  }
  {
    auto w = bpe_writer({"a b"});
    w.set_u32("tokenizer.ggml.eos_token_id", 99);
    auto t = build(w);
    ASSERT_FALSE(t.has_value());
    EXPECT_NE(t.error().message.find("eos_token_id"), std::string::npos) << t.error().message;
  }
  {
    auto w = spm_writer();
    w.set_f32_array("tokenizer.ggml.scores", {0, 1});
    auto t = build(w);
    ASSERT_FALSE(t.has_value());
    EXPECT_NE(t.error().message.find("scores"), std::string::npos) << t.error().message;
  }
  {
    auto w = spm_writer();
    w.set_u32("tokenizer.ggml.padding_token_id", 4294967295u);  // "none", as converters write -1
    auto t = build(w);
    ASSERT_TRUE(t.has_value()) << t.error().message;
    EXPECT_EQ((*t)->pad_id(), kNoToken);
  }
}

}  // namespace
}  // namespace bonsai::tokenizer
