// Grammar-constrained decoding through InferenceEngine and the Scheduler, on
// real vocabularies: the Qwen3 fixture (random weights, 151,936 byte-level
// tokens) and stories260K (512 sentencepiece tokens with byte fallback).
// Random weights never produce valid JSON by chance, so a parseable answer
// that the grammar's own matcher accepts as a complete sentence shows the
// mask did the work. Also: EOS only where the grammar may end (also with
// ignore_eos), a dead end ends with kLength and no crash, and batch
// invariance (a constrained request returns the same tokens alone and in a
// step shared with other constrained and unconstrained requests).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "engine/engine_pool.h"
#include "engine/inference_engine.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "structured/token_mask.h"
#include "structured/vocab_trie.h"
#include "tokenizer/tokenizer.h"

namespace bonsai::engine {
namespace {

using structured::Grammar;
using structured::GrammarState;
using structured::json_schema_to_gbnf;
using structured::SharedTokenTrie;
using structured::TokenTrie;

using namespace std::chrono_literals;

const std::string kQwen = test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
const std::string kStories = test::shared_path("models/stories260K/stories260K.gguf");

std::shared_ptr<const Grammar> compile(const std::string& gbnf) {
  auto g = Grammar::parse(gbnf);
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.error().message);
  return g ? *g : nullptr;
}

std::shared_ptr<const Grammar> compile_schema(const std::string& schema) {
  auto gbnf = json_schema_to_gbnf(schema);
  EXPECT_TRUE(gbnf.has_value()) << (gbnf ? "" : gbnf.error().message);
  return gbnf ? compile(*gbnf) : nullptr;
}

// True when `text` is a complete sentence of `g` (fed byte by byte to a fresh matcher).
bool complete_sentence(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  auto st = GrammarState::create(g);
  if (!st) return false;
  if (!st->accept_bytes(text)) return false;
  return st->can_end();
}

const char* kPersonSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    "ok": {"type": "boolean"}
  },
  "required": ["name", "age", "ok"],
  "additionalProperties": false
})";

struct Loaded {
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  std::shared_ptr<SharedTokenTrie> trie;  // one per model, as build_pool_from_gguf gives its replicas
};

// Loads each file once per test process (the vocabulary trie is built once too).
Loaded load(const std::string& path) {
  static std::map<std::string, Loaded> cache;
  if (auto it = cache.find(path); it != cache.end()) return it->second;
  auto b = build_pool_from_gguf(path, SamplingParams{}, kDefaultSeed, 1024, 1);
  EXPECT_TRUE(b.has_value()) << (b ? "" : b.error().message);
  if (!b) return {};
  Loaded m{b->model, b->tokenizer, std::make_shared<SharedTokenTrie>(b->tokenizer)};
  cache.emplace(path, m);
  return m;
}

SamplingParams params(float temperature, int max_tokens, std::shared_ptr<const Grammar> g) {
  SamplingParams p;
  p.temperature = temperature;
  p.max_tokens = max_tokens;
  p.grammar = std::move(g);
  return p;
}

GenerationResult run_alone(const Loaded& m, const std::vector<int32_t>& prompt, const SamplingParams& p, uint64_t seed,
                           std::shared_ptr<SharedTokenTrie> trie = nullptr) {
  EngineOptions eo;
  eo.max_seq_len = 1024;
  eo.token_trie = trie ? std::move(trie) : m.trie;
  auto e = InferenceEngine::create(m.model, m.tok, eo);
  EXPECT_TRUE(e.has_value());
  GenerateRequest gr;
  gr.prompt = prompt;
  gr.params = p;
  gr.seed = seed;
  auto r = e->generate_request(gr);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  return r ? *r : GenerationResult{};
}

class GrammarDecode : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    BONSAI_REQUIRE_FILE(GetParam());
    m_ = load(GetParam());
    ASSERT_NE(m_.model, nullptr);
    prompt_ = m_.tok->encode_prompt("Once upon a time");
  }
  Loaded m_;
  std::vector<int32_t> prompt_;
};

TEST_P(GrammarDecode, SchemaAnswersAreCompleteValidJsonAtTemperatureZeroAndOne) {
  auto g = compile_schema(kPersonSchema);
  ASSERT_NE(g, nullptr);
  auto trie = std::make_shared<SharedTokenTrie>(m_.tok);  // a fresh one: built on first use, then shared
  for (float temp : {0.0f, 1.0f}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      const GenerationResult r = run_alone(m_, prompt_, params(temp, 400, g), seed, trie);
      SCOPED_TRACE("temperature " + std::to_string(temp) + " seed " + std::to_string(seed) + ": " + r.text);
      EXPECT_EQ(r.finish_reason, FinishReason::kStop);
      EXPECT_TRUE(complete_sentence(g, r.text));
      const auto j = nlohmann::json::parse(r.text, nullptr, false);
      ASSERT_FALSE(j.is_discarded());
      ASSERT_TRUE(j.is_object());
      ASSERT_TRUE(j.contains("name") && j["name"].is_string());
      EXPECT_LE(j["name"].get<std::string>().size(), 12u * 4u);  // <= 12 code points
      ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer());
      EXPECT_GE(j["age"].get<int64_t>(), 0);
      EXPECT_LE(j["age"].get<int64_t>(), 150);
      EXPECT_TRUE(j.contains("ok") && j["ok"].is_boolean());
      for (const auto& [k, v] : j.items()) EXPECT_TRUE(k == "name" || k == "age" || k == "tags" || k == "ok") << k;
      // The terminating EOS is counted but not kept in the tokens.
      EXPECT_EQ(r.completion_tokens, static_cast<int32_t>(r.tokens.size()) + 1);
      if (temp == 0.0f) break;  // greedy ignores the seed
    }
  }
}

TEST_P(GrammarDecode, LiteralGrammarForcesTheTextThenStopsEvenWithIgnoreEos) {
  auto g = compile(R"(root ::= "{\"answer\": " ("yes" | "no") "}")");
  ASSERT_NE(g, nullptr);
  for (bool ignore_eos : {false, true}) {
    SamplingParams p = params(1.0f, 100, g);
    p.ignore_eos = ignore_eos;
    const GenerationResult r = run_alone(m_, prompt_, p, 7);
    EXPECT_TRUE(r.text == R"({"answer": yes})" || r.text == R"({"answer": no})") << r.text;
    EXPECT_EQ(r.finish_reason, FinishReason::kStop);
  }
}

TEST_P(GrammarDecode, MaxTokensCutsAConstrainedAnswerWithLength) {
  auto g = compile(R"(root ::= "[" [a-z]{200} "]")");
  ASSERT_NE(g, nullptr);
  const GenerationResult r = run_alone(m_, prompt_, params(1.0f, 5, g), 3);
  EXPECT_EQ(r.finish_reason, FinishReason::kLength);
  EXPECT_EQ(r.completion_tokens, 5);
  ASSERT_FALSE(r.text.empty());
  EXPECT_EQ(r.text[0], '[');
  auto st = GrammarState::create(g);
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(st->accept_bytes(r.text).has_value()) << r.text;  // a valid prefix
}

TEST_P(GrammarDecode, DeadEndEndsWithLengthNotACrash) {
  // After "x" the optional repeats leave > 2048 parse stacks (GrammarLimits::max_stacks):
  // every token that continues the answer overflows, so no token is allowed.
  auto g = compile(R"(root ::= "x" ("a"?){3000} "b")");
  ASSERT_NE(g, nullptr);
  const GenerationResult r = run_alone(m_, prompt_, params(1.0f, 50, g), 1);
  EXPECT_EQ(r.finish_reason, FinishReason::kLength);
  EXPECT_TRUE(r.text.empty()) << r.text;
  EXPECT_EQ(r.completion_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GrammarDecode, ::testing::Values(kQwen, kStories),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return i.param == kQwen ? std::string("qwen3_tiny_q1_0") : std::string("stories260K");
                         });

TEST(VocabTrie, QwenUserDefinedTokensAreChoosableControlTokensAreNot) {
  BONSAI_REQUIRE_FILE(kQwen);
  const Loaded m = load(kQwen);
  ASSERT_NE(m.tok, nullptr);
  SharedTokenTrie shared(m.tok);
  auto t = shared.get();
  ASSERT_TRUE(t.has_value()) << t.error().message;
  auto again = shared.get();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*t, *again);  // built once
  const TokenTrie& trie = **t;
  EXPECT_EQ(trie.n_vocab(), 151936);
  const int32_t tool_call = m.tok->find_token("<tool_call>");
  const int32_t im_start = m.tok->find_token("<|im_start|>");
  const int32_t im_end = m.tok->find_token("<|im_end|>");
  ASSERT_GE(tool_call, 0);
  ASSERT_GE(im_start, 0);
  ASSERT_GE(im_end, 0);
  EXPECT_FALSE(trie.is_excluded(tool_call));
  EXPECT_EQ(trie.token_bytes(tool_call), "<tool_call>");
  EXPECT_TRUE(trie.is_excluded(im_start));
  EXPECT_TRUE(trie.is_eos(im_end));
  // A grammar spelling the tag may take it as the one added token.
  auto g = compile(R"(root ::= "<tool_call>" "x")");
  auto st = GrammarState::create(g);
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(st->accepts_token(trie, tool_call));
  EXPECT_FALSE(st->accepts_token(trie, im_end));
  EXPECT_FALSE(st->accepts_token(trie, im_start));
}

// ---- Scheduler: per-row masks inside the batched step -------------------------------

struct Outcome {
  bool failed = false;
  std::string error;
  std::map<int, GenerationResult> results;
  std::map<int, std::string> streamed;
};

Outcome collect(JobHandle& h) {
  Outcome o;
  const auto until = Clock::now() + 300s;
  std::vector<JobEvent> evs;
  while (Clock::now() < until) {
    evs.clear();
    const bool ended = h.ended();
    h.wait(evs, ended ? Clock::now() : Clock::now() + 100ms);
    for (auto& e : evs) {
      if (e.kind == JobEvent::Kind::kText) o.streamed[e.choice] += e.text;
      if (e.kind == JobEvent::Kind::kDone) o.results[e.choice] = std::move(e.result);
      if (e.kind == JobEvent::Kind::kFailed) {
        o.failed = true;
        o.error = e.error.message;
      }
    }
    if (ended && evs.empty()) break;
  }
  return o;
}

TEST(GrammarScheduler, ConstrainedRowsInOneStepMatchTheirAloneAnswers) {
  BONSAI_REQUIRE_FILE(kQwen);
  auto b = build_pool_from_gguf(kQwen, SamplingParams{}, kDefaultSeed, 1024, 4);
  ASSERT_TRUE(b.has_value()) << b.error().message;
  const Loaded m{b->model, b->tokenizer,
                 std::make_shared<SharedTokenTrie>(b->tokenizer)};  // one trie for the alone runs
  auto pool = std::make_shared<EnginePool>(std::move(b->pool));
  Scheduler sched(pool, m.model, b->n_ctx);

  auto person = compile_schema(kPersonSchema);
  auto list = compile_schema(R"({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
                                 "minItems": 1, "maxItems": 4})");
  ASSERT_NE(person, nullptr);
  ASSERT_NE(list, nullptr);
  struct Req {
    std::vector<int32_t> prompt;
    SamplingParams p;
    uint64_t seed;
    int n;
  };
  std::vector<Req> reqs = {
      {m.tok->encode_prompt("Once upon a time"), params(0.0f, 300, person), 1, 1},
      {m.tok->encode_prompt("The little dog"), params(1.0f, 300, person), 5, 2},
      {m.tok->encode_prompt("Lily and Ben"), params(1.0f, 40, nullptr), 9, 1},  // unconstrained
      {m.tok->encode_prompt("One day"), params(1.0f, 300, list), 11, 1},
  };
  // Alone: one engine, one request at a time (the library path).
  std::vector<std::vector<GenerationResult>> alone;
  for (const auto& r : reqs) {
    std::vector<GenerationResult> per_choice;
    for (int c = 0; c < r.n; ++c) per_choice.push_back(run_alone(m, r.prompt, r.p, r.seed + static_cast<uint64_t>(c)));
    alone.push_back(std::move(per_choice));
  }
  // Together: all submitted at once share the scheduler's steps.
  std::vector<std::shared_ptr<JobHandle>> handles;
  for (const auto& r : reqs) {
    CompletionJob j;
    j.prompt = r.prompt;
    j.params = r.p;
    j.params.seed = r.seed;
    j.n = r.n;
    auto h = sched.submit(std::move(j));
    ASSERT_TRUE(h.has_value()) << h.error().message;
    handles.push_back(*h);
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Outcome o = collect(*handles[i]);
    ASSERT_FALSE(o.failed) << o.error;
    ASSERT_EQ(o.results.size(), static_cast<size_t>(reqs[i].n));
    for (int c = 0; c < reqs[i].n; ++c) {
      const GenerationResult& got = o.results.at(c);
      SCOPED_TRACE("request " + std::to_string(i) + " choice " + std::to_string(c) + ": " + got.text);
      EXPECT_EQ(got.tokens, alone[i][static_cast<size_t>(c)].tokens);
      EXPECT_EQ(got.finish_reason, alone[i][static_cast<size_t>(c)].finish_reason);
      EXPECT_EQ(o.streamed.at(c), got.text);
      if (reqs[i].p.grammar) {
        EXPECT_EQ(got.finish_reason, FinishReason::kStop);
        EXPECT_TRUE(complete_sentence(reqs[i].p.grammar, got.text));
      }
    }
  }
}

}  // namespace
}  // namespace bonsai::engine
