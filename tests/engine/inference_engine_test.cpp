// InferenceEngine end to end on the real trained model stories260K
// (../shared/models/stories260K, see PROVENANCE.md): greedy from BOS against
// the published oracle, streaming == non-streaming, seed/params swap
// semantics, stop strings, limits, cancellation, thread-count determinism.
#include "engine/inference_engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/kernel_env.h"  // BONSAI_KERNEL forces the tier under test
#include "common/test_util.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace bonsai::engine {
namespace {

struct Loaded {
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tok;
};

const std::string kModelRel = "models/stories260K/stories260K.gguf";

// Loads stories260K once per test binary (nullopt-like empty struct on failure).
const Loaded& stories() {
  static const Loaded loaded = [] {
    Loaded l;
    auto m = model::Model::load(test::shared_path(kModelRel));
    if (!m) {
      ADD_FAILURE() << m.error().message;
      return l;
    }
    auto t = tokenizer::Tokenizer::from_gguf((*m)->file());
    if (!t) {
      ADD_FAILURE() << t.error().message;
      return l;
    }
    l.model = *m;
    l.tok = *t;
    return l;
  }();
  return loaded;
}

SamplingParams greedy(int32_t n) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = n;
  return p;
}

SamplingParams creative(int32_t n, uint64_t seed = 7) {
  SamplingParams p;  // llama.cpp defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05
  p.max_tokens = n;
  p.seed = seed;
  return p;
}

InferenceEngine make_engine(const SamplingParams& p, int64_t ctx = 512, core::ThreadPool* pool = nullptr) {
  EngineOptions o;
  o.params = p;
  o.max_seq_len = ctx;
  o.pool = pool;
  auto e = InferenceEngine::create(stories().model, stories().tok, o);
  EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
  return std::move(*e);
}

#define REQUIRE_STORIES()                            \
  BONSAI_REQUIRE_FILE(test::shared_path(kModelRel)); \
  ASSERT_NE(stories().model, nullptr);               \
  ASSERT_NE(stories().tok, nullptr)

const std::vector<int32_t> kBos = {1};

TEST(InferenceEngine, GreedyFromBosMatchesOracle) {
  const std::string oracle_path = test::shared_path("models/stories260K/expected_greedy_from_bos.json");
  BONSAI_REQUIRE_FILE(oracle_path);
  REQUIRE_STORIES();
  std::ifstream f(oracle_path);
  const nlohmann::json oracle = nlohmann::json::parse(f);
  const auto expected = oracle.at("generated_token_ids").get<std::vector<int32_t>>();
  ASSERT_EQ(expected.size(), 256u);

  InferenceEngine e = make_engine(greedy(256));
  auto r = e.generate(kBos);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->tokens, expected);
  EXPECT_EQ(r->text, oracle.at("text").get<std::string>());
  EXPECT_EQ(r->finish_reason, FinishReason::kLength);
  EXPECT_EQ(r->prompt_tokens, 1);
  EXPECT_EQ(r->completion_tokens, 256);
  EXPECT_EQ(e.stats().generated_tokens, 256u);
  EXPECT_EQ(e.stats().prompt_tokens, 1u);
}

TEST(InferenceEngine, StreamedTextEqualsNonStreamed) {
  REQUIRE_STORIES();
  for (const SamplingParams& p : {greedy(120), creative(120)}) {
    InferenceEngine a = make_engine(p), b = make_engine(p);
    auto whole = a.generate(kBos);
    ASSERT_TRUE(whole.has_value());
    std::string streamed;
    std::vector<int32_t> ids;
    int32_t expect_index = 0;
    auto r = b.generate_streaming(kBos, [&](const TokenEvent& ev) {
      if (ev.token >= 0) {
        EXPECT_EQ(ev.index, expect_index++);
        ids.push_back(ev.token);
      }
      streamed += ev.text;
      return true;
    });
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(streamed, whole->text);
    EXPECT_EQ(r->text, whole->text);
    EXPECT_EQ(r->tokens, whole->tokens);
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<long>(r->tokens.size())), r->tokens);
  }
}

TEST(InferenceEngine, SameSeedSameOutputAtTemperature) {
  REQUIRE_STORIES();
  InferenceEngine a = make_engine(creative(100, 42)), b = make_engine(creative(100, 42));
  auto ra = a.generate(kBos), rb = b.generate(kBos);
  ASSERT_TRUE(ra && rb);
  EXPECT_EQ(ra->tokens, rb->tokens);
  EXPECT_EQ(ra->text, rb->text);
  // A different seed gives a different story (100 tokens at temp 0.8).
  InferenceEngine c = make_engine(creative(100, 43));
  auto rc = c.generate(kBos);
  ASSERT_TRUE(rc.has_value());
  EXPECT_NE(rc->tokens, ra->tokens);
  // Sampling is not greedy here.
  InferenceEngine g = make_engine(greedy(100));
  EXPECT_NE(g.generate(kBos)->tokens, ra->tokens);
}

TEST(InferenceEngine, GenerateAdvancesTheRng) {
  REQUIRE_STORIES();
  InferenceEngine e = make_engine(creative(60));
  const Rng::State s0 = e.rng_state();
  auto r1 = e.generate(kBos);
  ASSERT_TRUE(r1.has_value());
  EXPECT_NE(e.rng_state(), s0);
  auto r2 = e.generate(kBos);
  ASSERT_TRUE(r2.has_value());
  EXPECT_NE(r1->tokens, r2->tokens);  // continues the stream, not a replay
}

TEST(InferenceEngine, GenerateWithSeedRestoresTheRng) {
  REQUIRE_STORIES();
  InferenceEngine e = make_engine(creative(60, 1));
  InferenceEngine fresh = make_engine(creative(60, 1));
  const Rng::State s0 = e.rng_state();
  auto seeded = e.generate_with_seed(kBos, 99);
  ASSERT_TRUE(seeded.has_value());
  EXPECT_EQ(e.rng_state(), s0);
  EXPECT_EQ(e.params().seed, 1u);
  // The call left no trace: the next generate equals a fresh engine's.
  EXPECT_EQ(e.generate(kBos)->tokens, fresh.generate(kBos)->tokens);
  // And a seeded call equals an engine created with that seed.
  InferenceEngine s99 = make_engine(creative(60, 99));
  EXPECT_EQ(s99.generate(kBos)->tokens, seeded->tokens);
  EXPECT_EQ(e.generate_with_seed(kBos, 99)->tokens, seeded->tokens);
}

TEST(InferenceEngine, GenerateWithParamsKeepsTheRng) {
  REQUIRE_STORIES();
  SamplingParams base = creative(40, 5);
  SamplingParams other = creative(25, 12345);  // its seed must NOT be applied
  other.temperature = 1.1f;
  other.top_k = 10;
  InferenceEngine a = make_engine(base);
  InferenceEngine b = make_engine(base);
  auto ra = a.generate_with_params(kBos, other);
  ASSERT_TRUE(ra.has_value());
  EXPECT_EQ(ra->completion_tokens, 25);
  // b does the same by hand: switch params without reseeding, generate.
  b.set_params(other);
  auto rb = b.generate(kBos);
  ASSERT_TRUE(rb.has_value());
  EXPECT_EQ(ra->tokens, rb->tokens);
  EXPECT_EQ(a.rng_state(), b.rng_state());  // the RNG advanced in both
  // a's params are back; b switches back by hand; both continue identically.
  EXPECT_EQ(a.params().max_tokens, 40);
  EXPECT_EQ(a.params().seed, 5u);
  b.set_params(base);
  EXPECT_EQ(a.generate(kBos)->tokens, b.generate(kBos)->tokens);
}

TEST(InferenceEngine, DeterministicWhateverTheThreadCount) {
  REQUIRE_STORIES();
  core::ThreadPool one(1), three(3);
  InferenceEngine a = make_engine(creative(80, 3), 512, &one);
  InferenceEngine b = make_engine(creative(80, 3), 512, &three);
  const std::vector<int32_t> prompt = stories().tok->encode_prompt("Once upon a time, a cat");
  auto ra = a.generate(prompt), rb = b.generate(prompt);
  ASSERT_TRUE(ra && rb);
  EXPECT_EQ(ra->tokens, rb->tokens);
}

TEST(InferenceEngine, StopStringEndsAndIsRemoved) {
  REQUIRE_STORIES();
  SamplingParams p = greedy(256);
  p.stop = {"Lily"};
  InferenceEngine e = make_engine(p);
  std::string streamed;
  auto r = e.generate_streaming(kBos, [&](const TokenEvent& ev) {
    streamed += ev.text;
    return true;
  });
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->text, " Once upon a time, there was a little girl named ");
  EXPECT_EQ(streamed, r->text);
  EXPECT_EQ(r->finish_reason, FinishReason::kStop);
  EXPECT_LT(r->completion_tokens, 20);
}

TEST(InferenceEngine, PartialStopThatNeverCompletesIsReleased) {
  REQUIRE_STORIES();
  // 14 greedy tokens: " Once upon a time, there was a little girl named Lily".
  // "Lily" may start "Lily!!" but max_tokens ends the answer first: the held
  // text must come out at the end, whole.
  SamplingParams p = greedy(14);
  p.stop = {"Lily!!"};
  InferenceEngine plain = make_engine(greedy(14)), e = make_engine(p);
  auto want = plain.generate(kBos);
  std::string streamed;
  TokenEvent last_event;
  std::string last_text;
  auto r = e.generate_streaming(kBos, [&](const TokenEvent& ev) {
    streamed += ev.text;
    last_event = ev;
    last_text = ev.text;
    return true;
  });
  ASSERT_TRUE(want && r);
  // The 14th token is " Lily": "Lily" was held until the end, then flushed.
  EXPECT_EQ(last_event.token, -1);
  EXPECT_EQ(last_event.index, 14);
  EXPECT_EQ(last_text, "Lily");
  EXPECT_EQ(r->text, want->text);
  EXPECT_EQ(streamed, want->text);
  EXPECT_EQ(r->finish_reason, FinishReason::kLength);
}

TEST(InferenceEngine, MaxTokensAndContextLimit) {
  REQUIRE_STORIES();
  InferenceEngine e = make_engine(greedy(10));
  auto r = e.generate(kBos);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->tokens.size(), 10u);
  EXPECT_EQ(r->finish_reason, FinishReason::kLength);

  auto none = e.generate_with_params(kBos, greedy(0));
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->tokens.empty());
  EXPECT_EQ(none->finish_reason, FinishReason::kLength);

  // A 16-position cache: BOS at 0, tokens decoded at 1..15, a 16th sampled
  // from position 15's logits; then the context is full.
  InferenceEngine small = make_engine(greedy(-1), 16);
  auto full = small.generate(kBos);
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->tokens.size(), 16u);
  EXPECT_EQ(full->finish_reason, FinishReason::kLength);
  InferenceEngine big = make_engine(greedy(16));
  EXPECT_EQ(big.generate(kBos)->tokens, full->tokens);
}

TEST(InferenceEngine, CallbackCancelsWithinOneStep) {
  REQUIRE_STORIES();
  InferenceEngine e = make_engine(greedy(100));
  int calls = 0;
  auto r = e.generate_streaming(kBos, [&](const TokenEvent& ev) {
    if (ev.token >= 0) ++calls;
    return calls < 5;
  });
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(r->completion_tokens, 5);
  EXPECT_EQ(calls, 5);

  std::atomic<bool> cancel{true};
  GenerateRequest req;
  req.prompt = kBos;
  req.cancel = &cancel;
  auto c = e.generate_request(req);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(c->completion_tokens, 0);
}

TEST(InferenceEngine, EosEndsGenerationUnlessIgnored) {
  REQUIRE_STORIES();
  // stories260K separates stories with BOS and never samples EOS (id 2) on
  // its own; logit_bias forces it after the first token's step.
  ASSERT_TRUE(stories().tok->is_eog(2));
  SamplingParams p = greedy(50);
  p.logit_bias = {{2, 100.0f}};
  InferenceEngine e = make_engine(p);
  std::vector<int32_t> events;
  auto r = e.generate_streaming(kBos, [&](const TokenEvent& ev) {
    events.push_back(ev.token);
    return true;
  });
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->finish_reason, FinishReason::kStop);
  EXPECT_TRUE(r->tokens.empty());      // EOS is not listed...
  EXPECT_EQ(r->completion_tokens, 1);  // ...but counted
  EXPECT_EQ(r->text, "");
  EXPECT_EQ(events, std::vector<int32_t>{2});  // the EOS event is still delivered
  p.ignore_eos = true;
  p.max_tokens = 5;
  auto all = e.generate_with_params(kBos, p);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->finish_reason, FinishReason::kLength);
  EXPECT_EQ(all->tokens, std::vector<int32_t>(5, 2));
}

TEST(InferenceEngine, BatchGenerateEqualsSequentialCalls) {
  REQUIRE_STORIES();
  const std::vector<std::vector<int32_t>> prompts = {kBos, stories().tok->encode_prompt("The dog"),
                                                     stories().tok->encode_prompt("Tom had a red")};
  InferenceEngine a = make_engine(creative(30, 11)), b = make_engine(creative(30, 11));
  auto batch = a.batch_generate(prompts);
  ASSERT_TRUE(batch.has_value());
  ASSERT_EQ(batch->size(), 3u);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ((*batch)[i].tokens, b.generate(prompts[i])->tokens);
}

TEST(InferenceEngine, LowLevelStepsComposeLikeGenerate) {
  REQUIRE_STORIES();
  InferenceEngine e = make_engine(greedy(8));
  auto want = e.generate(kBos);
  ASSERT_TRUE(want.has_value());
  e.reset();
  EXPECT_EQ(e.position(), 0);
  auto logits = e.prefill_from_pos(kBos, 0);
  ASSERT_TRUE(logits.has_value());
  std::vector<int32_t> got;
  for (int i = 0; i < 8; ++i) {
    const int32_t t = e.sample(*logits);
    got.push_back(t);
    if (i + 1 < 8) {
      logits = e.decode_step(t);
      ASSERT_TRUE(logits.has_value());
    }
  }
  EXPECT_EQ(got, want->tokens);
  EXPECT_EQ(e.position(), 8);
  // Re-prefilling from an earlier position overwrites the tail.
  const std::vector<int32_t> tail(want->tokens.begin() + 3, want->tokens.begin() + 6);
  auto again = e.prefill_from_pos(tail, 4);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(e.position(), 7);
  EXPECT_EQ(argmax(*again), want->tokens[6]);
  EXPECT_FALSE(e.prefill_from_pos(tail, 9).has_value());  // beyond the cache
}

TEST(InferenceEngine, Errors) {
  REQUIRE_STORIES();
  InferenceEngine e = make_engine(greedy(4), 8);
  auto empty = e.generate(std::vector<int32_t>{});
  ASSERT_FALSE(empty.has_value());
  EXPECT_EQ(empty.error().code, core::Errc::kInvalidArgument);
  auto bad_id = e.generate(std::vector<int32_t>{1, 100000});
  ASSERT_FALSE(bad_id.has_value());
  EXPECT_EQ(bad_id.error().code, core::Errc::kInvalidArgument);
  auto too_long = e.generate(std::vector<int32_t>(9, 1));
  ASSERT_FALSE(too_long.has_value());
  EXPECT_EQ(too_long.error().code, core::Errc::kOutOfRange);
  SamplingParams bad = greedy(4);
  bad.top_p = 2.0f;
  EXPECT_FALSE(e.generate_with_params(kBos, bad).has_value());
  EXPECT_FALSE(InferenceEngine::create(nullptr, stories().tok).has_value());
  EXPECT_FALSE(InferenceEngine::create(stories().model, nullptr).has_value());
  // The engine still works after errors.
  EXPECT_TRUE(e.generate(kBos).has_value());
}

TEST(InferenceEngine, MetricsAndTrackers) {
  REQUIRE_STORIES();
  InferenceEngine e = make_engine(greedy(12));
  auto agg = std::make_shared<RequestRateAggregator>();
  e.set_metrics(agg);
  RequestRateTracker tracker;
  GenerateRequest req;
  req.prompt = kBos;
  req.tracker = &tracker;
  auto r = e.generate_request(req);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(tracker.tokens(), 12u);
  EXPECT_EQ(r->rate.tokens, 12u);
  EXPECT_EQ(r->rate.itl_ms.size(), 11u);
  ASSERT_TRUE(e.generate(kBos).has_value());
  const RequestRateStats s = agg->snapshot();
  EXPECT_EQ(s.requests, 2u);
  EXPECT_EQ(s.tokens, 24u);
  EXPECT_EQ(e.stats().requests, 2u);
  EXPECT_GT(e.stats().gen_ms, 0.0);
}

TEST(InferenceEngine, MovableIntoAVector) {
  REQUIRE_STORIES();
  std::vector<InferenceEngine> v;
  for (int i = 0; i < 3; ++i) v.push_back(make_engine(creative(20, 8)));
  auto r0 = v[0].generate(kBos), r2 = v[2].generate(kBos);
  ASSERT_TRUE(r0 && r2);
  EXPECT_EQ(r0->tokens, r2->tokens);  // identically seeded replicas
}

}  // namespace
}  // namespace bonsai::engine

// ---- Qwen3 fixtures (byte-level BPE vocabulary, llama.cpp goldens) ----------

namespace bonsai::engine {
namespace {

// Greedy generation through the whole engine (prefill, decode, sampler at
// temperature 0) reproduces llama.cpp's greedy ids up to the first step whose
// golden top-1/top-2 margin is <= 1.0 (beyond it, float differences may
// legitimately flip the choice; see ../shared/fixtures/README.md). The text
// streamed is the text returned, and valid UTF-8 although these random models
// emit many split multi-byte characters.
TEST(InferenceEngineQwen3, GreedyMatchesLlamaCppGoldens) {
  for (const char* name : {"qwen3-tiny-q1_0", "qwen3-tiny-f16"}) {
    const std::string gguf = test::shared_path(std::string("fixtures/") + name + ".gguf");
    const std::string golden = test::shared_path(std::string("fixtures/golden/") + name + ".json");
    BONSAI_REQUIRE_FILE(gguf);
    BONSAI_REQUIRE_FILE(golden);
    auto m = model::Model::load(gguf);
    ASSERT_TRUE(m.has_value()) << m.error().message;
    auto t = tokenizer::Tokenizer::from_gguf((*m)->file());
    ASSERT_TRUE(t.has_value()) << t.error().message;
    EngineOptions o;
    o.params = greedy(24);
    o.params.ignore_eos = true;
    o.max_seq_len = 512;
    auto e = InferenceEngine::create(*m, *t, o);
    ASSERT_TRUE(e.has_value()) << e.error().message;
    std::ifstream f(golden);
    const nlohmann::json g = nlohmann::json::parse(f);
    size_t checked = 0;
    for (const auto& p : g.at("prompts")) {
      const auto prompt = p.at("prompt_ids").get<std::vector<int32_t>>();
      const auto want = p.at("greedy_ids").get<std::vector<int32_t>>();
      const auto margin = p.at("greedy_margin").get<std::vector<double>>();
      std::string streamed;
      auto r = e->generate_streaming(prompt, [&](const TokenEvent& ev) {
        streamed += ev.text;
        return true;
      });
      ASSERT_TRUE(r.has_value()) << r.error().message;
      ASSERT_EQ(r->tokens.size(), 24u);
      for (size_t s = 0; s < want.size() && s < margin.size() && margin[s] > 1.0; ++s, ++checked) {
        ASSERT_EQ(r->tokens[s], want[s]) << name << " prompt " << p.at("name") << " step " << s;
      }
      EXPECT_EQ(streamed, r->text);
      std::string valid;
      EXPECT_EQ(tokenizer::append_valid_utf8(r->text, valid), 0u);
      EXPECT_EQ(valid, r->text) << "text is not valid UTF-8";
    }
    EXPECT_GE(checked, 5u) << name;  // the margins leave some steps to check
  }
}

TEST(InferenceEngineQwen3, ChatPromptEndsAtImEndWhenSampled) {
  // The template + encode_chat path feeds the engine; <|im_end|> is an EOG
  // token, so forcing it as the only candidate ends with finish_reason stop.
  const std::string gguf = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(gguf);
  auto m = model::Model::load(gguf);
  ASSERT_TRUE(m.has_value());
  auto t = tokenizer::Tokenizer::from_gguf((*m)->file());
  ASSERT_TRUE(t.has_value());
  auto e = InferenceEngine::create(*m, *t, {.max_seq_len = 256, .params = greedy(8)});
  ASSERT_TRUE(e.has_value());
  const std::vector<tokenizer::ChatMessage> msgs = {{.role = "user", .content = "Hi"}};
  auto rendered = (*t)->chat_template().render(msgs);
  ASSERT_TRUE(rendered.has_value());
  const std::vector<int32_t> ids = (*t)->encode_chat(*rendered);
  const int32_t im_end = (*t)->find_token("<|im_end|>");
  ASSERT_TRUE((*t)->is_eog(im_end));
  // Low level: prefill the chat prompt, then sample from logits that favour <|im_end|>.
  auto logits = e->prefill_from_pos(ids, 0);
  ASSERT_TRUE(logits.has_value());
  std::vector<float> forced(logits->begin(), logits->end());
  forced[static_cast<size_t>(im_end)] = 1e9f;
  EXPECT_EQ(e->sample(forced), im_end);
  // High level: unbiased, 8 greedy steps of random weights contain no EOG...
  auto r = e->generate(ids);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->completion_tokens, 8);
  EXPECT_EQ(r->finish_reason, FinishReason::kLength);
  // ...and with <|im_end|> favoured the answer ends there with "stop".
  SamplingParams p = greedy(8);
  p.logit_bias = {{im_end, 100.0f}};
  auto stopped = e->generate_with_params(ids, p);
  ASSERT_TRUE(stopped.has_value());
  EXPECT_EQ(stopped->finish_reason, FinishReason::kStop);
  EXPECT_EQ(stopped->completion_tokens, 1);
  for (int32_t tok : r->tokens) EXPECT_FALSE((*t)->is_eog(tok));
}

}  // namespace
}  // namespace bonsai::engine
