// engine::prepare_completion (src/engine/completion.h): the one request
// preparation of the server and the CLI, on the Qwen3 fixture's tokenizer
// (ChatML template, no BOS) and stories260K's (a BOS, no chat template).
#include "engine/completion.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "engine/logprobs.h"  // kMaxTopLogprobs
#include "gguf/gguf.h"
#include "structured/grammar.h"
#include "tokenizer/tokenizer.h"

namespace bonsai::engine {
namespace {

constexpr const char* kQwen = "fixtures/qwen3-tiny-q1_0.gguf";
constexpr const char* kStories = "models/stories260K/stories260K.gguf";

std::shared_ptr<const tokenizer::Tokenizer> load(const char* rel) {
  auto file = gguf::File::open(test::shared_path(rel));
  if (!file) return nullptr;
  auto tok = tokenizer::Tokenizer::from_gguf(**file);
  return tok ? *tok : nullptr;
}

CompletionInput chat_of(std::string user) {
  CompletionInput in;
  in.chat = true;
  in.messages.push_back({.role = "user", .content = std::move(user)});
  return in;
}

TEST(PrepareCompletion, ChatIsRenderedAndEncodedAsTheTemplateSays) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwen));
  auto tok = load(kQwen);
  ASSERT_NE(tok, nullptr);
  CompletionInput in = chat_of("Hello");
  in.chat_options.enable_thinking = false;
  auto p = prepare_completion(*tok, 4096, SamplingParams{}, in);
  ASSERT_TRUE(p.has_value()) << p.error().error.message;
  auto rendered = tok->chat_template().render(in.messages, in.chat_options);
  ASSERT_TRUE(rendered.has_value());
  EXPECT_EQ(p->prompt, tok->encode_chat(*rendered));
  // Unset max_tokens: what the context leaves.
  EXPECT_EQ(p->params.max_tokens, 4096 - static_cast<int32_t>(p->prompt.size()));
}

TEST(PrepareCompletion, OverridesReplaceDefaultsFieldByField) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwen));
  auto tok = load(kQwen);
  ASSERT_NE(tok, nullptr);
  SamplingParams defaults;
  defaults.temperature = 0.3f;
  defaults.top_k = 7;
  defaults.stop = {"x"};
  SamplingOverrides over;
  over.top_k = 3;
  over.max_tokens = 5;
  over.logit_bias = std::vector<std::pair<int32_t, float>>{{1, -100.0f}};
  CompletionInput in;
  in.prompt = "Once upon a time";
  auto p = prepare_completion(*tok, 256, defaults, in, over);
  ASSERT_TRUE(p.has_value()) << p.error().error.message;
  EXPECT_EQ(p->prompt, tok->encode_prompt("Once upon a time", true));
  EXPECT_FLOAT_EQ(p->params.temperature, 0.3f);
  EXPECT_EQ(p->params.top_k, 3);
  EXPECT_EQ(p->params.max_tokens, 5);
  EXPECT_EQ(p->params.stop, std::vector<std::string>{"x"});
  ASSERT_EQ(p->params.logit_bias.size(), 1u);
  EXPECT_EQ(p->params.logit_bias[0].first, 1);
  EXPECT_EQ(p->params.grammar, nullptr);
  EXPECT_EQ(p->params.logprobs, -1);
  // The server's fields: a grammar (structured outputs) and log probabilities.
  auto g = structured::Grammar::parse("root ::= \"yes\" | \"no\"");
  ASSERT_TRUE(g.has_value()) << g.error().message;
  over.grammar = *g;
  over.logprobs = 3;
  over.prompt_logprobs = 2;
  p = prepare_completion(*tok, 256, defaults, in, over);
  ASSERT_TRUE(p.has_value()) << p.error().error.message;
  EXPECT_EQ(p->params.grammar, *g);
  EXPECT_EQ(p->params.logprobs, 3);
  EXPECT_EQ(p->params.prompt_logprobs, 2);
  over.logprobs = kMaxTopLogprobs + 1;  // validated with the rest
  p = prepare_completion(*tok, 256, defaults, in, over);
  ASSERT_FALSE(p.has_value());
  EXPECT_NE(p.error().error.message.find("logprobs"), std::string::npos);
}

// The seed travels in one field: the request's (SamplingOverrides::seed)
// replaces the defaults' in the prepared SamplingParams, which the
// scheduler samples choice i with (params.seed + i); unset keeps the defaults'.
TEST(PrepareCompletion, TheRequestSeedBecomesTheParamsSeed) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwen));
  auto tok = load(kQwen);
  ASSERT_NE(tok, nullptr);
  SamplingParams defaults;
  defaults.seed = 11;
  CompletionInput in;
  in.prompt = "Once upon a time";
  auto p = prepare_completion(*tok, 256, defaults, in);
  ASSERT_TRUE(p.has_value()) << p.error().error.message;
  EXPECT_EQ(p->params.seed, 11u);
  SamplingOverrides over;
  over.seed = 0xFFFF'FFFF'FFFF'FFFFull;
  p = prepare_completion(*tok, 256, defaults, in, over);
  ASSERT_TRUE(p.has_value()) << p.error().error.message;
  EXPECT_EQ(p->params.seed, 0xFFFF'FFFF'FFFF'FFFFull);
}

// The server's prompt byte cap: the text is measured before it is tokenized
// (the rendered chat, or the raw prompt), the limit itself is allowed, one
// byte more is refused as context_length_exceeded naming the field; token
// ids are not capped (the context check bounds them).
TEST(PrepareCompletion, PromptByteCapMeasuresTheTextBeforeTokenizing) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwen));
  auto tok = load(kQwen);
  ASSERT_NE(tok, nullptr);
  CompletionInput raw;
  raw.prompt = std::string(100, 'a');
  PrepareOptions capped;
  capped.max_prompt_bytes = 100;
  capped.prompt_cap_source = "--max-prompt-bytes";
  EXPECT_TRUE(prepare_completion(*tok, 4096, SamplingParams{}, raw, {}, capped).has_value());
  raw.prompt.push_back('a');
  auto p = prepare_completion(*tok, 4096, SamplingParams{}, raw, {}, capped);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().error.code, core::Errc::kOutOfRange);
  EXPECT_EQ(p.error().param, "prompt");
  EXPECT_EQ(p.error().code, "context_length_exceeded");
  EXPECT_EQ(p.error().prompt_bytes, 101u);
  EXPECT_EQ(p.error().error.message,
            "The prompt text is 101 bytes; this server tokenizes at most 100 bytes of prompt for this model "
            "(--max-prompt-bytes). Please reduce the length of the prompt.");
  // No cap (the CLI's default): the same prompt is prepared.
  EXPECT_TRUE(prepare_completion(*tok, 4096, SamplingParams{}, raw).has_value());

  // A chat counts its rendered text (template markup included), not the message alone.
  CompletionInput chat = chat_of("hello there");
  auto rendered = tok->chat_template().render(chat.messages, chat.chat_options);
  ASSERT_TRUE(rendered.has_value());
  size_t bytes = 0;
  for (const auto& seg : rendered->segments) bytes += seg.text.size();
  ASSERT_GT(bytes, std::string("hello there").size());
  capped.max_prompt_bytes = bytes;
  EXPECT_TRUE(prepare_completion(*tok, 4096, SamplingParams{}, chat, {}, capped).has_value());
  capped.max_prompt_bytes = bytes - 1;
  p = prepare_completion(*tok, 4096, SamplingParams{}, chat, {}, capped);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().param, "messages");
  EXPECT_EQ(p.error().prompt_bytes, bytes);
  // The cap comes first: a capped prompt that would also overflow the context reports the cap.
  p = prepare_completion(*tok, 2, SamplingParams{}, chat, {}, capped);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().prompt_bytes, bytes);

  CompletionInput ids;
  ids.prompt_ids = std::vector<int32_t>(50, 1);
  capped.max_prompt_bytes = 1;
  EXPECT_TRUE(prepare_completion(*tok, 4096, SamplingParams{}, ids, {}, capped).has_value());
}

TEST(PrepareCompletion, ContextCheckNamesTheFieldAndTheCounts) {
  BONSAI_REQUIRE_FILE(test::shared_path(kQwen));
  auto tok = load(kQwen);
  ASSERT_NE(tok, nullptr);
  CompletionInput in;
  in.prompt = "one two three four";
  const int64_t n = static_cast<int64_t>(tok->encode_prompt(in.prompt, true).size());
  SamplingOverrides over;
  over.max_tokens = 10;
  auto p = prepare_completion(*tok, n + 9, SamplingParams{}, in, over);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().error.code, core::Errc::kOutOfRange);
  EXPECT_EQ(p.error().param, "prompt");
  EXPECT_EQ(p.error().code, "context_length_exceeded");
  EXPECT_EQ(p.error().error.message,
            "This model's maximum context length is " + std::to_string(n + 9) + " tokens. However, you requested " +
                std::to_string(n + 10) + " tokens (" + std::to_string(n) +
                " in the prompt, 10 in the completion). Please reduce the length of the prompt or completion.");
  // Exactly fitting is fine; the CLI's mode lets max_tokens run past the context.
  EXPECT_TRUE(prepare_completion(*tok, n + 10, SamplingParams{}, in, over).has_value());
  PrepareOptions cli{.empty_prompt_is_bos = true, .refuse_overflow = false};
  auto c = prepare_completion(*tok, n + 9, SamplingParams{}, in, over, cli);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->params.max_tokens, 10);
  // But not a prompt that leaves no room to answer, in either mode.
  EXPECT_FALSE(prepare_completion(*tok, n, SamplingParams{}, in, over, cli).has_value());
  auto chat = prepare_completion(*tok, 8, SamplingParams{}, chat_of("a long enough message"), {}, cli);
  ASSERT_FALSE(chat.has_value());
  EXPECT_EQ(chat.error().param, "messages");
}

TEST(PrepareCompletion, EmptyPromptIsAnErrorOrBosAlone) {
  BONSAI_REQUIRE_FILE(test::shared_path(kStories));
  BONSAI_REQUIRE_FILE(test::shared_path(kQwen));
  auto stories = load(kStories);
  auto qwen = load(kQwen);
  ASSERT_NE(stories, nullptr);
  ASSERT_NE(qwen, nullptr);
  CompletionInput in;  // prompt ""
  auto server = prepare_completion(*qwen, 256, SamplingParams{}, in);
  ASSERT_FALSE(server.has_value());
  EXPECT_EQ(server.error().error.message, "The prompt is empty.");
  EXPECT_EQ(server.error().param, "prompt");
  const PrepareOptions cli{.empty_prompt_is_bos = true, .refuse_overflow = false};
  ASSERT_NE(stories->bos_id(), tokenizer::kNoToken);
  auto bos = prepare_completion(*stories, 256, SamplingParams{}, in, {}, cli);
  ASSERT_TRUE(bos.has_value()) << bos.error().error.message;
  EXPECT_EQ(bos->prompt, std::vector<int32_t>{stories->bos_id()});
  if (qwen->bos_id() == tokenizer::kNoToken) {
    auto none = prepare_completion(*qwen, 256, SamplingParams{}, in, {}, cli);
    ASSERT_FALSE(none.has_value());
    EXPECT_NE(none.error().error.message.find("no BOS token"), std::string::npos);
  }
}

TEST(PrepareCompletion, TokenIdsAndLogitBiasAreCheckedAgainstTheVocabulary) {
  BONSAI_REQUIRE_FILE(test::shared_path(kStories));
  auto tok = load(kStories);
  ASSERT_NE(tok, nullptr);
  CompletionInput in;
  in.prompt_ids = {1, 2, tok->n_vocab()};
  auto p = prepare_completion(*tok, 256, SamplingParams{}, in);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().param, "prompt");
  EXPECT_EQ(p.error().code, "invalid_value");
  in.prompt_ids = {1, 2, 3};
  SamplingOverrides over;
  over.logit_bias = std::vector<std::pair<int32_t, float>>{{tok->n_vocab(), 1.0f}};
  p = prepare_completion(*tok, 256, SamplingParams{}, in, over);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().param, "logit_bias");
  SamplingOverrides bad;
  bad.top_p = 0.0f;  // SamplingParams::validate wants (0, 1]
  p = prepare_completion(*tok, 256, SamplingParams{}, in, bad);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().error.code, core::Errc::kInvalidArgument);
  EXPECT_NE(p.error().error.message.find("top_p"), std::string::npos);
  p = prepare_completion(*tok, 256, SamplingParams{}, in);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->prompt, (std::vector<int32_t>{1, 2, 3}));
}

}  // namespace
}  // namespace bonsai::engine
