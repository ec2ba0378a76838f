// The `qwen35` pre-tokenizer (Qwen3.5 / the 27B Bonsai family): llama.cpp's
// prompt ids for the 12 qwen35 golden prompts, the split pieces where it and
// qwen2 differ (combining marks), the fallback for unknown `pre` values, and
// the chat template of the qwen35 fixture (../shared/fixtures/README.md,
// section "Qwen3.5 (`qwen35`) fixtures").
#include <gtest/gtest.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "gguf/gguf.h"
#include "tok_test_util.h"
#include "tokenizer/pretokenizer.h"

namespace bonsai::tokenizer {
namespace {

using testing::load_tokenizer;
using testing::read_file;

constexpr const char* kQwen35Gguf = "fixtures/qwen35/qwen35-tiny-q1_0.gguf";
constexpr const char* kQwen35Golden = "fixtures/qwen35/golden/qwen35-tiny-q1_0.json";

std::string show(const std::vector<TokenId>& ids) {
  std::ostringstream os;
  for (TokenId id : ids) os << ' ' << id;
  return os.str();
}

std::vector<std::string> pieces(const RegexSplitter& s, std::string_view text) {
  std::vector<std::string> out;
  for (auto p : s.split(text)) out.emplace_back(p);
  return out;
}

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

// A tokenizer of the same vocabulary, merges and token types as `file`, with
// `tokenizer.ggml.pre` replaced by `pre` (empty: key left out).
core::Expected<std::shared_ptr<const Tokenizer>> with_pre(const gguf::File& file, const std::string& pre) {
  gguf::Writer w;
  w.set_string("tokenizer.ggml.model", "gpt2");
  if (!pre.empty()) w.set_string("tokenizer.ggml.pre", pre);
  auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  auto merges = file.get_string_array("tokenizer.ggml.merges");
  auto types = file.get_i32_array("tokenizer.ggml.token_type");
  if (!tokens) return std::unexpected(tokens.error());
  if (!merges) return std::unexpected(merges.error());
  if (!types) return std::unexpected(types.error());
  w.set_string_array("tokenizer.ggml.tokens", std::vector<std::string>(tokens->begin(), tokens->end()));
  w.set_string_array("tokenizer.ggml.merges", std::vector<std::string>(merges->begin(), merges->end()));
  w.set_i32_array("tokenizer.ggml.token_type", *types);
  w.set_u32("tokenizer.ggml.eos_token_id", 8096);
  const auto bytes = w.to_bytes();
  auto copy = gguf::File::parse(core::MappedFile::from_bytes(bytes, "qwen35-vocab-" + pre + ".gguf"));
  if (!copy) return std::unexpected(copy.error());
  return Tokenizer::from_gguf(**copy);
}

// llama.cpp's prompt ids for all 12 prompts (special tokens parsed), the
// byte pieces of its greedy tokens, and the same ids in every golden of the
// family (the four files share the tokenizer). `combining_marks` is the
// prompt where qwen35 and qwen2 differ; it is NFD text, tokenized as is.
TEST(Qwen35Tokenizer, GoldenPromptIds) {
  const auto path = test::shared_path(kQwen35Golden);
  BONSAI_REQUIRE_FILE(path);
  BONSAI_REQUIRE_FILE(test::shared_path(kQwen35Gguf));
  auto tok = load_tokenizer(kQwen35Gguf);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->n_vocab(), 8128);
  EXPECT_EQ(tok->eos_id(), 8096);
  EXPECT_FALSE(tok->add_bos_token());
  const auto golden = nlohmann::json::parse(read_file(path));
  const auto& prompts = golden.at("prompts");
  ASSERT_EQ(prompts.size(), 12u);
  bool saw_marks = false;
  for (const auto& p : prompts) {
    const std::string name = p.at("name").get<std::string>();
    const auto want = p.at("prompt_ids").get<std::vector<TokenId>>();
    const auto got = tok->encode(p.at("text").get<std::string>(), p.at("parse_special").get<bool>());
    EXPECT_EQ(got, want) << name << "\n got:" << show(got) << "\nwant:" << show(want);
    saw_marks |= name == "combining_marks";
    if (!p.contains("greedy_ids")) continue;
    const auto greedy = p.at("greedy_ids").get<std::vector<TokenId>>();
    ASSERT_EQ(p.at("greedy_pieces_hex").size(), greedy.size()) << name;
    // Control tokens (e.g. <|box_start|>) print as "" here, llama.cpp's
    // pieces show their text: compare the others.
    for (size_t i = 0; i < greedy.size(); ++i) {
      if (tok->is_control(greedy[i])) continue;
      EXPECT_EQ(hex(tok->token_to_bytes(greedy[i])), p["greedy_pieces_hex"][i].get<std::string>())
          << name << " token " << greedy[i];
    }
  }
  EXPECT_TRUE(saw_marks);
  for (const char* other : {"qwen35-tiny-f16.json", "qwen35-tiny-pq2_0.json", "qwen35-tiny-q2_0-g64.json"}) {
    const auto other_path = test::shared_path(std::string("fixtures/qwen35/golden/") + other);
    BONSAI_REQUIRE_FILE(other_path);
    const auto g = nlohmann::json::parse(read_file(other_path));
    ASSERT_EQ(g.at("prompts").size(), prompts.size()) << other;
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(g["prompts"][i].at("prompt_ids"), prompts[i].at("prompt_ids")) << other << " prompt " << i;
  }
}

// The fixture README: "ที่" is one token (8055) under qwen35 and two under
// qwen2, with the same vocabulary. Plain ASCII text is the same under both.
TEST(Qwen35Tokenizer, SameVocabularyUnderQwen2SplitsMarks) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwen35Gguf));
  auto file = gguf::File::open(test::shared_path(kQwen35Gguf));
  ASSERT_TRUE(file.has_value()) << file.error().message;
  auto q35 = with_pre(**file, "qwen35");
  auto q2 = with_pre(**file, "qwen2");
  ASSERT_TRUE(q35.has_value()) << q35.error().message;
  ASSERT_TRUE(q2.has_value()) << q2.error().message;
  const std::string thai = "\xE0\xB8\x97\xE0\xB8\xB5\xE0\xB9\x88";  // ท ี ่ (U+0E17 U+0E35 U+0E48)
  EXPECT_EQ((*q35)->encode(thai), (std::vector<TokenId>{8055}));
  const auto split = (*q2)->encode(thai);
  EXPECT_EQ(split.size(), 2u) << show(split);
  EXPECT_EQ((*q2)->decode(split), thai);
  const std::string ascii = "Don't stop: 12 apples, 3 pears!\n";
  EXPECT_EQ((*q35)->encode(ascii), (*q2)->encode(ascii));
}

// Unseen strings with combining marks: qwen35 keeps every mark with the
// letters around it ([\p{L}\p{M}]+) and never puts one in a symbol run; qwen2
// cuts before each mark, and a mark then starts a symbol run or is the
// optional lead-in of the next letter run.
TEST(Qwen35Pretokenizer, CombiningMarksStayInWords) {
  auto q35 = RegexSplitter::qwen35();
  auto q2 = RegexSplitter::qwen2();
  ASSERT_TRUE(q35.has_value()) << q35.error().message;
  ASSERT_TRUE(q2.has_value()) << q2.error().message;
  using V = std::vector<std::string>;

  // Latin letter + U+0301 COMBINING ACUTE ACCENT (NFD "café olé!").
  const std::string acute = "\xCC\x81";
  const std::string latin = "cafe" + acute + " ole" + acute + "!";
  EXPECT_EQ(pieces(*q35, latin), (V{"cafe" + acute, " ole" + acute, "!"}));
  EXPECT_EQ(pieces(*q2, latin), (V{"cafe", acute, " ole", acute + "!"}));

  // A mark after a symbol: the symbol is qwen35's lead-in of the word.
  const std::string sym = "x+" + acute + "y";
  EXPECT_EQ(pieces(*q35, sym), (V{"x", "+" + acute + "y"}));
  EXPECT_EQ(pieces(*q2, sym), (V{"x", "+" + acute, "y"}));

  // Devanagari "हिन्दी भाषा": ह ि न ् द ी, space, भ ा ष ा (ि ् ी ा are marks).
  const std::string ha = "\xE0\xA4\xB9", i_sign = "\xE0\xA4\xBF", na = "\xE0\xA4\xA8", virama = "\xE0\xA5\x8D",
                    da = "\xE0\xA4\xA6", ii_sign = "\xE0\xA5\x80", bha = "\xE0\xA4\xAD", aa_sign = "\xE0\xA4\xBE",
                    ssa = "\xE0\xA4\xB7";
  const std::string hindi = ha + i_sign + na + virama + da + ii_sign;
  const std::string bhasha = bha + aa_sign + ssa + aa_sign;
  EXPECT_EQ(pieces(*q35, hindi + " " + bhasha), (V{hindi, " " + bhasha}));
  EXPECT_EQ(pieces(*q2, hindi + " " + bhasha),
            (V{ha, i_sign + na, virama + da, ii_sign, " " + bha, aa_sign + ssa, aa_sign}));

  // Thai "ผู้ใหญ่": ผ ู ้ ใ ห ญ ่ (ู ้ ่ are marks; two in a row after ผ).
  const std::string pho = "\xE0\xB8\x9C", u_sign = "\xE0\xB8\xB9", mai_tho = "\xE0\xB9\x89", sara_ai = "\xE0\xB9\x83",
                    ho = "\xE0\xB8\xAB", yo = "\xE0\xB8\x8D", mai_ek = "\xE0\xB9\x88";
  const std::string thai = pho + u_sign + mai_tho + sara_ai + ho + yo + mai_ek;
  EXPECT_EQ(pieces(*q35, thai + "."), (V{thai, "."}));
  EXPECT_EQ(pieces(*q2, thai + "."), (V{pho, u_sign + mai_tho, sara_ai + ho + yo, mai_ek + "."}));

  // Mark-free text splits the same way under both.
  const std::string plain = "It's 2024-01-01, naïve café\r\n  ok";
  EXPECT_EQ(pieces(*q35, plain), pieces(*q2, plain));
}

// The same unseen strings through the qwen35 tokenizer: no NFC, so the text
// decodes back byte for byte, and a precomposed é differs from e + U+0301.
TEST(Qwen35Tokenizer, UnseenCombiningMarksRoundTrip) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwen35Gguf));
  auto tok = load_tokenizer(kQwen35Gguf);
  ASSERT_NE(tok, nullptr);
  for (const std::string& text : {
           std::string("cafe\xCC\x81 ole\xCC\x81!"),
           std::string("\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8\xE0\xA5\x8D\xE0\xA4\xA6\xE0\xA5\x80 "
                       "\xE0\xA4\xAD\xE0\xA4\xBE\xE0\xA4\xB7\xE0\xA4\xBE"),
           std::string("\xE0\xB8\x9C\xE0\xB8\xB9\xE0\xB9\x89\xE0\xB9\x83\xE0\xB8\xAB\xE0\xB8\x8D\xE0\xB9\x88."),
       }) {
    const auto ids = tok->encode(text);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tok->decode(ids), text);
  }
  EXPECT_NE(tok->encode("caf\xC3\xA9"), tok->encode("cafe\xCC\x81"));
}

// `pre` values other than "qwen2" / "qwen35", or none, load with GPT-2's
// regex, which keeps digit runs together (" ?\p{N}+"); qwen2 and qwen35 cut
// every digit. Values bonsai does not implement come with a load warning.
TEST(Qwen35Tokenizer, UnknownPreFallsBackToGpt2) {
  auto build = [](const std::string& pre) {
    gguf::Writer w;
    w.set_string("tokenizer.ggml.model", "gpt2");
    if (!pre.empty()) w.set_string("tokenizer.ggml.pre", pre);
    w.set_string_array("tokenizer.ggml.tokens", {"1", "2", "12"});
    w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1});
    w.set_string_array("tokenizer.ggml.merges", {"1 2"});
    const auto bytes = w.to_bytes();
    auto file = gguf::File::parse(core::MappedFile::from_bytes(bytes, "pre-" + pre + ".gguf"));
    EXPECT_TRUE(file.has_value());
    return Tokenizer::from_gguf(**file);
  };
  // Names bonsai implements load quietly; others carry a load warning that
  // names the key and the value (the commands print it).
  for (const char* pre : {"", "default", "gpt-2", "no-such-pre", "qwen3.5", "QWEN35"}) {
    auto tok = build(pre);
    ASSERT_TRUE(tok.has_value()) << pre << ": " << tok.error().message;
    EXPECT_EQ((*tok)->encode("12"), (std::vector<TokenId>{2})) << "pre '" << pre << "'";
    const std::string p = pre;
    if (p.empty() || p == "default" || p == "gpt-2") {
      EXPECT_EQ((*tok)->load_warning(), "") << "pre '" << pre << "'";
    } else {
      EXPECT_NE((*tok)->load_warning().find("tokenizer.ggml.pre = '" + p + "'"), std::string::npos)
          << (*tok)->load_warning();
    }
  }
  for (const char* pre : {"qwen2", "qwen35"}) {
    auto tok = build(pre);
    ASSERT_TRUE(tok.has_value()) << pre << ": " << tok.error().message;
    EXPECT_EQ((*tok)->encode("12"), (std::vector<TokenId>{0, 1})) << "pre '" << pre << "'";
    EXPECT_EQ((*tok)->load_warning(), "") << "pre '" << pre << "'";
  }
}

// The fixture's chat template (Qwen3.5's, from llama.cpp's
// models/templates/Qwen3.5-4B.jinja) with today's renderer: it must render a
// plain conversation. It is recognised as the Qwen3 family, which is not yet
// Qwen3.5's output: that template's generation prompt opens "<think>\n" unless
// enable_thinking is false, and its tool calls use an XML form (issue 30
// item 6, second part); only the shared ChatML turns are asserted here.
TEST(Qwen35Tokenizer, ChatTemplateRenders) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwen35Gguf));
  auto tok = load_tokenizer(kQwen35Gguf);
  ASSERT_NE(tok, nullptr);
  const auto& tmpl = tok->chat_template();
  EXPECT_FALSE(tmpl.source().empty());
  std::vector<ChatMessage> msgs(2);
  msgs[0].role = "system";
  msgs[0].content = "You are a helpful assistant.";
  msgs[1].role = "user";
  msgs[1].content = "Hi";
  auto chat = tmpl.render(msgs);
  ASSERT_TRUE(chat.has_value()) << chat.error().message;
  const std::string text = chat->text();
  std::cout << "qwen35 template family: " << tmpl.family_name() << "\n" << text << "\n";
  EXPECT_NE(text.find("<|im_start|>user\nHi<|im_end|>\n"), std::string::npos) << text;
  EXPECT_FALSE(tok->encode_chat(*chat).empty());
}

}  // namespace
}  // namespace bonsai::tokenizer
