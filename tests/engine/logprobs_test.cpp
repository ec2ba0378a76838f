// Log probabilities, logit_bias and embeddings (issue 11 items 4 and 6):
// the math against double references (engine/logprobs.h), logit_bias in the
// sampler, and end to end on stories260K: the engine's logprobs / prompt
// logprobs equal a log-softmax of Model::forward's logits for the same
// teacher-forced sequence, in the single-caller path and in the scheduler's
// batched step (each row its own), streamed values equal the final ones,
// and embeddings are unit-length, equal for equal inputs, different for
// different inputs.
#include "engine/logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "core/thread_pool.h"         // global_pool
#include "engine/engine_pool.h"       // build_pool_from_gguf, EnginePool
#include "engine/inference_engine.h"  // InferenceEngine
#include "engine/sampling.h"          // Sampler, SamplingParams
#include "engine/scheduler.h"         // Scheduler
#include "model/model.h"              // Model, KvCache, Workspace, Batch
#include "tokenizer/tokenizer.h"      // Tokenizer

namespace bonsai::engine {
namespace {

using namespace std::chrono_literals;

// ---- Math against double references ------------------------------------------------

// log-softmax in long double, the plain formula log(exp(l_i) / sum exp(l_j)) with the max shifted out.
std::vector<long double> ref_log_softmax(const std::vector<float>& l) {
  long double mx = -INFINITY;
  for (float v : l) mx = std::max<long double>(mx, v);
  long double sum = 0;
  for (float v : l) sum += std::exp(static_cast<long double>(v) - mx);
  std::vector<long double> out;
  for (float v : l) out.push_back(static_cast<long double>(v) - mx - std::log(sum));
  return out;
}

TEST(LogSoftmax, MatchesLongDoubleReference) {
  std::mt19937 rng(42);
  for (const float scale : {0.01f, 1.0f, 30.0f, 1000.0f}) {
    std::normal_distribution<float> d(5.0f, scale);
    std::vector<float> l(151936);
    for (auto& v : l) v = d(rng);
    const auto ref = ref_log_softmax(l);
    std::vector<float> out(l.size());
    log_softmax(l, out);
    double worst = 0, total = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(out[i] - ref[i])));
      total += std::exp(static_cast<double>(out[i]));
    }
    // float rounding of the result only (|value| up to ~5000 at scale 1000: ulp 5e-4).
    EXPECT_LT(worst, 1e-6 * std::max(1.0f, 5 * scale)) << "scale " << scale;
    EXPECT_NEAR(total, 1.0, 1e-4) << "scale " << scale;
  }
}

TEST(LogSoftmax, TokenLogprobAndTopN) {
  //                      0     1     2     3     4     5
  std::vector<float> l = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f, 2.0f};
  const auto ref = ref_log_softmax(l);
  const TokenLogprob r = token_logprob(l, 4, 4);
  EXPECT_EQ(r.token, 4);
  EXPECT_NEAR(r.logprob, static_cast<double>(ref[4]), 1e-6);
  // Largest first, ties (ids 1 and 2) lower id first.
  ASSERT_EQ(r.top.size(), 4u);
  const int32_t want[] = {1, 2, 5, 0};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(r.top[k].first, want[k]) << k;
    EXPECT_NEAR(r.top[k].second, static_cast<double>(ref[static_cast<size_t>(want[k])]), 1e-6) << k;
  }
  EXPECT_TRUE(token_logprob(l, 0, 0).top.empty());
  EXPECT_EQ(token_logprob(l, 0, 50).top.size(), l.size());  // clamped to the vocabulary
  // Top-n of a random row equals a full sort's prefix.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> d(-50, 50);  // many ties
  std::vector<float> big(5000);
  for (auto& v : big) v = static_cast<float>(d(rng)) * 0.25f;
  std::vector<int32_t> idx(big.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(),
            [&](int32_t a, int32_t b) { return big[a] > big[b] || (big[a] == big[b] && a < b); });
  const TokenLogprob t = token_logprob(big, 3, kMaxTopLogprobs);
  ASSERT_EQ(t.top.size(), static_cast<size_t>(kMaxTopLogprobs));
  for (int k = 0; k < kMaxTopLogprobs; ++k) EXPECT_EQ(t.top[static_cast<size_t>(k)].first, idx[static_cast<size_t>(k)]);
}

TEST(LogSoftmax, NanAndInfinities) {
  std::vector<float> l = {0.0f, -INFINITY, std::nanf(""), 0.0f};
  const TokenLogprob r = token_logprob(l, 0, 4);
  EXPECT_NEAR(r.logprob, -std::log(2.0), 1e-7);
  EXPECT_EQ(r.top.size(), 3u);  // NaN never listed
  EXPECT_TRUE(std::isinf(token_logprob(l, 1, 0).logprob));
}

TEST(MeanPoolL2, UnitLengthMeanDirection) {
  const std::vector<float> h = {1, 2, 2,  //
                                3, 2, 6};
  const auto e = mean_pool_l2(h, 2, 3);  // mean (2, 2, 4), norm sqrt(24)
  ASSERT_EQ(e.size(), 3u);
  const double n = std::sqrt(24.0);
  EXPECT_NEAR(e[0], 2 / n, 1e-7);
  EXPECT_NEAR(e[1], 2 / n, 1e-7);
  EXPECT_NEAR(e[2], 4 / n, 1e-7);
  const auto z = mean_pool_l2(std::vector<float>(6, 0.0f), 2, 3);
  EXPECT_EQ(z, std::vector<float>(3, 0.0f));
}

// ---- logit_bias in the sampler --------------------------------------------------------

TEST(LogitBias, ValidateRangeAndLogprobs) {
  SamplingParams p;
  p.logit_bias = {{3, 100.0f}, {4, -100.0f}};
  EXPECT_TRUE(p.validate().has_value());
  p.logit_bias = {{3, 100.5f}};
  auto r = p.validate();
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("logit_bias for token 3"), std::string::npos) << r.error().message;
  p.logit_bias = {{3, std::nanf("")}};
  EXPECT_FALSE(p.validate().has_value());
  p.logit_bias.clear();
  p.logprobs = 21;
  r = p.validate();
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("logprobs"), std::string::npos);
  p.logprobs = 20;
  p.prompt_logprobs = 21;
  EXPECT_FALSE(p.validate().has_value());
}

TEST(LogitBias, GreedyAndSampledFollowTheBias) {
  std::vector<float> l = {0.5f, 2.0f, 1.0f, 1.9f};
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.sample(l, {}), 1);
  p.logit_bias = {{1, -100.0f}};
  s.set_params(p);
  EXPECT_EQ(s.sample(l, {}), 3);          // the ban moves greedy to the runner-up
  p.logit_bias = {{0, 1.0f}, {0, 0.6f}};  // repeated ids add up: 0.5 + 1.6 = 2.1 > 2.0
  s.set_params(p);
  EXPECT_EQ(s.sample(l, {}), 0);
  // Sampled (temperature 1, no filters): +100 forces a token every time, -100 bans it.
  SamplingParams q;
  q.temperature = 1.0f;
  q.top_k = 0;
  q.top_p = 1.0f;
  q.min_p = 0.0f;
  q.logit_bias = {{2, 100.0f}};
  Sampler t(q);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(t.sample(l, {}), 2);
  q.logit_bias = {{1, -100.0f}};
  t.set_params(q);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[t.sample(l, {})];
  EXPECT_EQ(seen.count(1), 0u);
  EXPECT_GT(seen[3], 0);
  EXPECT_GT(seen[0], 0);
}

// ---- End to end on stories260K ----------------------------------------------------------

const std::string kStories = test::shared_path("models/stories260K/stories260K.gguf");

struct Stories {
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tok;
};

const Stories& stories() {
  static const Stories s = [] {
    Stories r;
    auto m = model::Model::load(kStories);
    if (!m) return r;
    auto t = tokenizer::Tokenizer::from_gguf((*m)->file());
    if (!t) return r;
    r.model = *m;
    r.tok = *t;
    return r;
  }();
  return s;
}

#define REQUIRE_STORIES()        \
  BONSAI_REQUIRE_FILE(kStories); \
  ASSERT_NE(stories().model, nullptr)

// Logits of every position of `seq` run as one teacher-forced prefill (what
// `bonsai logits` does): [seq.size()][n_vocab].
std::vector<float> all_logits(const std::vector<int32_t>& seq) {
  const model::Model& m = *stories().model;
  const auto nv = static_cast<size_t>(m.config().n_vocab);
  auto cache = model::KvCache::create(m.config(), static_cast<int64_t>(seq.size()) + 1);
  EXPECT_TRUE(cache.has_value());
  model::Workspace ws;
  std::vector<float> out(seq.size() * nv);
  model::KvCache* caches[] = {&*cache};
  auto ok = m.forward(model::Batch::for_sequence(seq, 0, 0, true), caches, ws, out, core::global_pool());
  EXPECT_TRUE(ok.has_value());
  return out;
}

// Checks `lp` (the logprob of seq[pos] and its top list) against the
// log-softmax of row pos-1 of `rows`, in long double, to `tol`.
void expect_matches_row(const TokenLogprob& lp, const std::vector<float>& rows, size_t nv, size_t pos, int32_t token,
                        size_t top_n, double tol, const std::string& what) {
  const std::vector<float> row(rows.begin() + static_cast<std::ptrdiff_t>((pos - 1) * nv),
                               rows.begin() + static_cast<std::ptrdiff_t>(pos * nv));
  const auto ref = ref_log_softmax(row);
  EXPECT_EQ(lp.token, token) << what;
  EXPECT_NEAR(lp.logprob, static_cast<double>(ref[static_cast<size_t>(token)]), tol) << what;
  ASSERT_EQ(lp.top.size(), top_n) << what;
  for (size_t k = 0; k < top_n; ++k) {
    EXPECT_NEAR(lp.top[k].second, static_cast<double>(ref[static_cast<size_t>(lp.top[k].first)]), tol) << what;
    if (k > 0) {
      EXPECT_GE(lp.top[k - 1].second, lp.top[k].second) << what;
    }
  }
  // The top entry is the row's arg-max.
  if (top_n > 0) {
    EXPECT_EQ(lp.top[0].first, static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin())) << what;
  }
}

InferenceEngine make_engine(int64_t ctx = 256) {
  EngineOptions o;
  o.max_seq_len = ctx;
  auto e = InferenceEngine::create(stories().model, stories().tok, o);
  EXPECT_TRUE(e.has_value());
  return std::move(*e);
}

TEST(EngineLogprobs, EqualTeacherForcedLogSoftmaxEveryPosition) {
  REQUIRE_STORIES();
  InferenceEngine e = make_engine();
  const std::vector<int32_t> prompt = stories().tok->encode_prompt("Once upon a time, there was a little");
  SamplingParams p;
  p.temperature = 0.8f;  // sampled, with filters: logprobs must ignore them
  p.top_k = 5;
  p.repeat_penalty = 1.3f;
  p.max_tokens = 12;
  p.ignore_eos = true;
  p.logprobs = 5;
  p.prompt_logprobs = 3;
  std::vector<TokenLogprob> streamed;
  GenerateRequest gr;
  gr.prompt = prompt;
  gr.params = p;
  gr.seed = 11;
  gr.on_token = [&](const TokenEvent& ev) {
    if (ev.logprob != nullptr) streamed.push_back(*ev.logprob);
    return true;
  };
  auto r = e.generate_request(gr);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ASSERT_EQ(r->tokens.size(), 12u);
  ASSERT_EQ(r->logprobs.size(), r->tokens.size());
  ASSERT_EQ(r->prompt_logprobs.size(), prompt.size());
  EXPECT_TRUE(std::isnan(r->prompt_logprobs[0].logprob));
  EXPECT_TRUE(r->prompt_logprobs[0].top.empty());

  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), r->tokens.begin(), r->tokens.end());
  const auto rows = all_logits(seq);
  const size_t nv = static_cast<size_t>(stories().model->config().n_vocab);
  for (size_t i = 1; i < prompt.size(); ++i)
    expect_matches_row(r->prompt_logprobs[i], rows, nv, i, prompt[i], 3, 1e-4, "prompt pos " + std::to_string(i));
  for (size_t j = 0; j < r->tokens.size(); ++j)
    expect_matches_row(r->logprobs[j], rows, nv, prompt.size() + j, r->tokens[j], 5, 1e-4,
                       "sampled " + std::to_string(j));
  ASSERT_EQ(streamed.size(), r->logprobs.size());
  for (size_t j = 0; j < streamed.size(); ++j) {
    EXPECT_EQ(streamed[j].token, r->logprobs[j].token);
    EXPECT_EQ(streamed[j].logprob, r->logprobs[j].logprob);
  }
  // Off by default: nothing computed.
  auto plain = e.generate_with_params(prompt, [] {
    SamplingParams q;
    q.max_tokens = 3;
    return q;
  }());
  ASSERT_TRUE(plain.has_value());
  EXPECT_TRUE(plain->logprobs.empty());
  EXPECT_TRUE(plain->prompt_logprobs.empty());
}

TEST(EngineLogprobs, PromptLogprobsAcrossChunksAndDespiteTheCache) {
  REQUIRE_STORIES();
  InferenceEngine e = make_engine(512);
  std::string text;
  for (int i = 0; i < 12; ++i) text += "The little dog ran to the park and played with a ball. ";
  const std::vector<int32_t> prompt = stories().tok->encode_prompt(text);
  ASSERT_GT(prompt.size(), static_cast<size_t>(kPromptRowsChunk) * 2);  // several chunks
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 1;
  p.prompt_logprobs = 0;
  auto warm = e.generate_with_params(prompt, p);  // fills the cache with the prompt
  ASSERT_TRUE(warm.has_value());
  GenerateRequest gr;
  gr.prompt = prompt;
  gr.params = p;
  ASSERT_TRUE(e.start(gr, StartOptions{.reuse_prefix = true}).has_value());
  EXPECT_EQ(e.pending_prompt(), static_cast<int64_t>(prompt.size()));  // nothing reused: every row is needed
  e.abandon();
  const auto rows = all_logits(prompt);
  const size_t nv = static_cast<size_t>(stories().model->config().n_vocab);
  ASSERT_EQ(warm->prompt_logprobs.size(), prompt.size());
  for (size_t i = 1; i < prompt.size(); ++i)
    expect_matches_row(warm->prompt_logprobs[i], rows, nv, i, prompt[i], 0, 1e-4, "pos " + std::to_string(i));
}

TEST(EngineLogitBias, BansTheGreedyTokenAndRefusesIdsOutsideTheVocabulary) {
  REQUIRE_STORIES();
  InferenceEngine e = make_engine();
  const std::vector<int32_t> prompt = stories().tok->encode_prompt("Once upon a time");
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 6;
  auto base = e.generate_with_params(prompt, p);
  ASSERT_TRUE(base.has_value());
  ASSERT_FALSE(base->tokens.empty());
  p.logit_bias = {{base->tokens[0], -100.0f}};
  p.logprobs = 1;
  auto banned = e.generate_with_params(prompt, p);
  ASSERT_TRUE(banned.has_value());
  ASSERT_FALSE(banned->tokens.empty());
  EXPECT_NE(banned->tokens[0], base->tokens[0]);
  for (int32_t t : banned->tokens) EXPECT_NE(t, base->tokens[0]);
  // logprobs describe the raw model: the banned token is still its top choice.
  EXPECT_EQ(banned->logprobs[0].top[0].first, base->tokens[0]);
  p.logit_bias = {{99999, 5.0f}};
  auto bad = e.generate_with_params(prompt, p);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, core::Errc::kInvalidArgument);
  EXPECT_NE(bad.error().message.find("99999"), std::string::npos) << bad.error().message;
}

TEST(EngineEmbed, UnitLengthDeterministicAndInputDependent) {
  REQUIRE_STORIES();
  InferenceEngine e = make_engine();
  const auto a = stories().tok->encode_prompt("The cat sat on the mat.");
  const auto b = stories().tok->encode_prompt("A bird flew over the sea.");
  auto ea = e.embed(a);
  ASSERT_TRUE(ea.has_value()) << ea.error().message;
  ASSERT_EQ(ea->size(), static_cast<size_t>(stories().model->config().n_embd));
  double n2 = 0;
  for (float v : *ea) n2 += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(n2), 1.0, 1e-5);
  auto eb = e.embed(b);
  ASSERT_TRUE(eb.has_value());
  auto ea2 = make_engine().embed(a);  // another replica: same bits
  ASSERT_TRUE(ea2.has_value());
  EXPECT_EQ(*ea, *ea2);
  double dot = 0;
  for (size_t i = 0; i < ea->size(); ++i) dot += static_cast<double>((*ea)[i]) * (*eb)[i];
  EXPECT_LT(dot, 0.9999);  // different inputs, different directions
  EXPECT_NE(*ea, *eb);
  // The cache now holds `b`: a later generation may reuse it.
  EXPECT_EQ(e.cached_prefix(b), static_cast<int64_t>(b.size()));
  EXPECT_FALSE(e.embed({}).has_value());
  const std::vector<int32_t> bad = {1, 100000};
  EXPECT_FALSE(e.embed(bad).has_value());
}

// Model::forward_hidden returns exactly what the output matrix multiplies:
// W_out x hidden == forward()'s logits, bit for bit (the kernels are batch-invariant).
TEST(EngineEmbed, ForwardHiddenTimesOutputMatrixIsTheLogits) {
  REQUIRE_STORIES();
  const model::Model& m = *stories().model;
  const auto seq = stories().tok->encode_prompt("Tom had a red ball. He");
  const auto logits = all_logits(seq);
  auto cache = model::KvCache::create(m.config(), static_cast<int64_t>(seq.size()));
  ASSERT_TRUE(cache.has_value());
  model::Workspace ws;
  model::KvCache* caches[] = {&*cache};
  const auto E = static_cast<size_t>(m.config().n_embd);
  std::vector<float> hidden(seq.size() * E);
  auto small = m.forward_hidden(model::Batch::for_sequence(seq, 0, 0, true), caches, ws,
                                std::span<float>(hidden).first(E), core::global_pool());
  ASSERT_FALSE(small.has_value());  // one row of room for many rows: refused
  ASSERT_TRUE(m.forward_hidden(model::Batch::for_sequence(seq, 0, 0, true), caches, ws, hidden, core::global_pool())
                  .has_value());
  std::vector<float> y(logits.size());
  kernels::gemm(m.weights().output, hidden.data(), static_cast<int64_t>(seq.size()), y.data(), nullptr);
  EXPECT_EQ(y, logits);
}

// The stepwise embedding (what the scheduler drives) equals embed() bit for
// bit, in uneven chunks and after a suspend() in the middle (the replayed
// rows are not pooled twice), and the hidden rows of Model::forward's
// second form equal forward_hidden's.
TEST(EngineEmbed, StepwiseEqualsEmbedWithChunksAndSuspend) {
  REQUIRE_STORIES();
  const auto a = stories().tok->encode_prompt("The cat sat on the mat. Then it ran after a little red ball.");
  auto want = make_engine().embed(a);
  ASSERT_TRUE(want.has_value());
  const model::Model& m = *stories().model;
  const auto E = static_cast<size_t>(m.config().n_embd);
  for (const int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{7}, int64_t{512}}) {
    for (const bool do_suspend : {false, true}) {
      InferenceEngine e = make_engine();
      ASSERT_TRUE(e.start_embedding(a).has_value());
      EXPECT_FALSE(e.start_embedding(a).has_value());  // one at a time
      model::Workspace ws;
      std::vector<float> hidden;
      bool suspended = false;
      int steps = 0;
      while (!e.finished() && steps++ < 1000) {
        ASSERT_TRUE(e.wants_hidden_rows());
        const auto in = e.next_input(chunk);
        model::Batch b;
        for (size_t k = 0; k < in.size(); ++k)
          b.add(in[k], static_cast<int32_t>(e.next_pos() + static_cast<int64_t>(k)), 0, false, true);
        EXPECT_FALSE(e.logits_wanted(static_cast<int64_t>(in.size())));
        hidden.assign(in.size() * E, 0.0f);
        model::KvCache* caches[] = {&e.kv_cache()};
        ASSERT_TRUE(m.forward(b, caches, ws, {}, hidden, core::global_pool()).has_value());
        e.record_hidden_rows(hidden);
        EXPECT_FALSE(e.inputs_done(static_cast<int64_t>(in.size())));
        if (do_suspend && !suspended && e.next_pos() * 2 >= static_cast<int64_t>(a.size()) && !e.finished()) {
          e.suspend();  // preempted: the whole input runs again from position 0
          suspended = true;
          EXPECT_EQ(e.next_pos(), 0);
        }
      }
      ASSERT_TRUE(e.finished());
      const GenerationResult r = e.finish();
      EXPECT_EQ(r.finish_reason, FinishReason::kStop);
      EXPECT_EQ(r.prompt_tokens, static_cast<int32_t>(a.size()));
      EXPECT_EQ(r.embedding, *want) << "chunk " << chunk << " suspend " << do_suspend;
      EXPECT_EQ(e.cached_prefix(a), static_cast<int64_t>(a.size()));  // the cache holds the input, as after embed()
    }
  }
  // Cancelled or stopped: no embedding.
  InferenceEngine e = make_engine();
  std::atomic<bool> cancel{false};
  ASSERT_TRUE(e.start_embedding(a, &cancel).has_value());
  cancel = true;
  EXPECT_TRUE(e.poll_cancel());
  const GenerationResult r = e.finish();
  EXPECT_EQ(r.finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(r.embedding.empty());
  EXPECT_FALSE(e.start_embedding({}).has_value());
  const std::vector<int32_t> bad = {1, 100000};
  EXPECT_FALSE(e.start_embedding(bad).has_value());
}

// Collects a job's events until it ended (or 120 s): kDone results by choice, the failure if any.
struct Collected {
  std::map<int, GenerationResult> done;
  std::optional<core::Error> failed;
  std::vector<uint64_t> text_steps;  // scheduler step of each kText
};
Collected collect(JobHandle& h, size_t n) {
  Collected c;
  const auto until = Clock::now() + 120s;
  while (c.done.size() < n && !c.failed && Clock::now() < until) {
    std::vector<JobEvent> evs;
    h.wait(evs, Clock::now() + 100ms);
    for (auto& ev : evs) {
      if (ev.kind == JobEvent::Kind::kText) c.text_steps.push_back(ev.step);
      if (ev.kind == JobEvent::Kind::kDone) c.done[ev.choice] = std::move(ev.result);
      if (ev.kind == JobEvent::Kind::kFailed) c.failed = ev.error;
    }
  }
  return c;
}

// An embedding job in the scheduler: its inputs are prefilled in chunks in
// the same forward steps as a running completion, and each input's vector
// equals embed() bit for bit; the completion's tokens equal its answer alone.
TEST(SchedulerEmbed, SharesStepsWithACompletionAndEqualsEmbed) {
  REQUIRE_STORIES();
  auto b = build_pool_from_gguf(kStories, SamplingParams{}, kDefaultSeed, 256, 3);
  ASSERT_TRUE(b.has_value()) << b.error().message;
  auto pool = std::make_shared<EnginePool>(std::move(b->pool));
  SchedulerOptions so;
  so.batch_size = 5;  // small: the inputs take several steps beside the decode
  so.kv_pool = b->kv_pool;
  // The loop pauses after its 3rd step until the embeddings are submitted,
  // so they arrive while the completion has ~37 tokens to go, whatever the load.
  std::atomic<int> steps_seen{0}, max_seqs{0};
  std::atomic<bool> submitted{false};
  so.on_step = [&](int64_t, int64_t seqs) {
    max_seqs = std::max<int>(max_seqs, static_cast<int>(seqs));
    if (++steps_seen == 3)
      for (int i = 0; i < 10000 && !submitted; ++i) std::this_thread::sleep_for(1ms);
  };
  Scheduler sched(pool, b->model, b->n_ctx, so);
  const std::vector<std::vector<int32_t>> inputs = {
      stories().tok->encode_prompt("The cat sat on the mat. Then it ran after a little red ball."),
      stories().tok->encode_prompt("A bird flew over the sea."),
      stories().tok->encode_prompt("The cat sat on the mat. Then it ran after a little red ball.")};
  CompletionJob cj;
  cj.prompt = stories().tok->encode_prompt("Once upon a time");
  cj.params.temperature = 0.0f;
  cj.params.max_tokens = 40;
  cj.params.ignore_eos = true;
  InferenceEngine alone = make_engine();
  auto want_text = alone.generate_with_params(cj.prompt, cj.params);
  ASSERT_TRUE(want_text.has_value());
  auto hc = sched.submit(cj);
  ASSERT_TRUE(hc.has_value());
  // Once the completion decodes (the loop waits in on_step), the embeddings.
  while (steps_seen < 3) std::this_thread::sleep_for(1ms);
  EmbeddingJob ej;
  ej.inputs = inputs;
  auto he = sched.submit_embedding(ej);
  submitted = true;
  ASSERT_TRUE(he.has_value()) << he.error().message;
  const Collected ce = collect(**he, inputs.size());
  const Collected cc = collect(**hc, 1);
  ASSERT_FALSE(ce.failed) << ce.failed->message;
  ASSERT_FALSE(cc.failed) << cc.failed->message;
  ASSERT_EQ(ce.done.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto want = make_engine().embed(inputs[i]);
    ASSERT_TRUE(want.has_value());
    const GenerationResult& r = ce.done.at(static_cast<int>(i));
    EXPECT_EQ(r.finish_reason, FinishReason::kStop);
    EXPECT_EQ(r.prompt_tokens, static_cast<int32_t>(inputs[i].size()));
    EXPECT_EQ(r.embedding, *want) << "input " << i;
  }
  EXPECT_EQ(ce.done.at(0).embedding, ce.done.at(2).embedding);
  ASSERT_EQ(cc.done.size(), 1u);
  EXPECT_EQ(cc.done.at(0).tokens, want_text->tokens);
  const SchedulerStats st = sched.stats();
  EXPECT_EQ(st.embeddings, inputs.size());
  EXPECT_EQ(st.sequences, inputs.size() + 1);
  // The embedding tokens went through the step loop: 5-token steps, so the
  // 2 x ~16 + 8 input tokens took many steps, during which the completion decoded.
  size_t embed_tokens = 0;
  for (const auto& in : inputs) embed_tokens += in.size();
  EXPECT_GE(st.prompt_tokens, embed_tokens + cj.prompt.size());
  EXPECT_GE(st.steps, embed_tokens / 5);
  // Shared steps: the embeddings' >= 8 steps of prompt chunks ran inside the
  // completion's decode steps (run one after the other, the loop would have
  // needed >= 8 steps more than the completion's last token).
  ASSERT_FALSE(cc.text_steps.empty());
  EXPECT_LE(st.steps, cc.text_steps.back() + 2);
  EXPECT_GE(max_seqs, 2);  // steps with the completion and embedding sequences together
  EXPECT_EQ(st.running, 0);
  // Every block unpinned (kept in the prefix index as prompt cache) once the
  // sequences finished.
  for (int i = 0; i < 5000 && sched.stats().kv_used != 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(sched.stats().kv_used, 0);
}

// Queue rules: an embedding job waits in the queue while every sequence
// slot (-np 1 here) is busy; at its deadline it fails with kTimeout, a
// cancelled one with kCancelled (it gives up its place); invalid jobs are
// refused at submit.
TEST(SchedulerEmbed, QueuedDeadlineCancelAndValidation) {
  REQUIRE_STORIES();
  auto b = build_pool_from_gguf(kStories, SamplingParams{}, kDefaultSeed, 256, 1);
  ASSERT_TRUE(b.has_value()) << b.error().message;
  auto pool = std::make_shared<EnginePool>(std::move(b->pool));
  // The loop is held inside on_step while `hold` is set (after a step of the
  // occupying generation), so nothing is admitted meanwhile.
  std::mutex mu;
  std::condition_variable cv;
  bool hold = true;
  int held_steps = 0;
  SchedulerOptions so;
  so.max_sequences = 1;
  so.on_step = [&](int64_t, int64_t) {
    std::unique_lock lock(mu);
    ++held_steps;
    cv.notify_all();
    cv.wait(lock, [&] { return !hold; });
  };
  Scheduler sched(pool, b->model, b->n_ctx, so);
  EXPECT_FALSE(sched.submit_embedding(EmbeddingJob{}).has_value());
  EXPECT_FALSE(sched.submit_embedding(EmbeddingJob{.inputs = {{1, 2}, {}}}).has_value());
  EXPECT_FALSE(sched.submit_embedding(EmbeddingJob{.inputs = {std::vector<int32_t>(300, 5)}}).has_value());
  // The one sequence slot is busy with a generation, held in its first step.
  CompletionJob busy;
  busy.prompt = stories().tok->encode_prompt("Once upon a time");
  busy.params.max_tokens = 4;
  auto running = sched.submit(busy);
  ASSERT_TRUE(running.has_value());
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return held_steps > 0; }));
  }
  const std::vector<int32_t> in = stories().tok->encode_prompt("A bird flew over the sea.");
  auto late = sched.submit_embedding(EmbeddingJob{.inputs = {in}, .deadline = Clock::now() + 30ms});
  auto gone = sched.submit_embedding(EmbeddingJob{.inputs = {in, in}});
  ASSERT_TRUE(late.has_value() && gone.has_value());
  EXPECT_EQ(sched.stats().waiting, 2);
  (*gone)->cancel();
  std::this_thread::sleep_for(40ms);  // past `late`'s deadline while the loop is held
  {
    std::lock_guard lock(mu);
    hold = false;
  }
  cv.notify_all();
  const Collected cl = collect(**late, 1);
  const Collected cg = collect(**gone, 2);
  ASSERT_TRUE(cl.failed);
  EXPECT_EQ(cl.failed->code, core::Errc::kTimeout);
  ASSERT_TRUE(cg.failed);
  EXPECT_EQ(cg.failed->code, core::Errc::kCancelled);
  EXPECT_EQ(sched.stats().embeddings, 0u);  // neither started
  for (int i = 0; i < 1000 && sched.stats().waiting > 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(sched.stats().waiting, 0);  // both left the queue
  ASSERT_FALSE(collect(**running, 1).failed);
  // Free again: an embedding runs.
  auto ok = sched.submit_embedding(EmbeddingJob{.inputs = {in}});
  ASSERT_TRUE(ok.has_value());
  const Collected co = collect(**ok, 1);
  ASSERT_FALSE(co.failed);
  EXPECT_EQ(co.done.at(0).embedding, *make_engine().embed(in));
  EXPECT_EQ(sched.stats().embeddings, 1u);
}

// The scheduler's batched step: several jobs share forwards (decodes plus
// prompt chunks with every row wanted); each job's values equal its own
// teacher-forced log-softmax, and the streamed logprobs equal the final ones.
TEST(SchedulerLogprobs, EachRowItsOwnInTheBatchedStep) {
  REQUIRE_STORIES();
  auto b = build_pool_from_gguf(kStories, SamplingParams{}, kDefaultSeed, 256, 4);
  ASSERT_TRUE(b.has_value()) << b.error().message;
  auto pool = std::make_shared<EnginePool>(std::move(b->pool));
  SchedulerOptions so;
  so.batch_size = 24;  // small: prompts take several steps beside running decodes
  Scheduler sched(pool, b->model, b->n_ctx, so);
  const char* texts[] = {"Once upon a time", "The little dog was very happy because", "Lily and Ben",
                         "One day, a bird flew into the garden and saw a big red"};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<JobHandle>> handles;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(stories().tok->encode_prompt(texts[i]));
    CompletionJob j;
    j.prompt = prompts.back();
    j.params.temperature = 0.7f;
    j.params.max_tokens = 10;
    j.params.ignore_eos = true;
    j.params.logprobs = 4;
    j.params.prompt_logprobs = i % 2 == 0 ? 2 : -1;  // echo on half of them
    j.params.seed = 100 + static_cast<uint64_t>(i);
    auto h = sched.submit(std::move(j));
    ASSERT_TRUE(h.has_value());
    handles.push_back(*h);
  }
  const size_t nv = static_cast<size_t>(b->model->config().n_vocab);
  for (int i = 0; i < 4; ++i) {
    std::vector<TokenLogprob> streamed;
    GenerationResult res;
    bool done = false;
    const auto until = Clock::now() + 120s;
    while (!done && Clock::now() < until) {
      std::vector<JobEvent> evs;
      handles[static_cast<size_t>(i)]->wait(evs, Clock::now() + 100ms);
      for (auto& ev : evs) {
        ASSERT_NE(ev.kind, JobEvent::Kind::kFailed) << ev.error.message;
        if (ev.kind == JobEvent::Kind::kText) streamed.insert(streamed.end(), ev.logprobs.begin(), ev.logprobs.end());
        if (ev.kind == JobEvent::Kind::kDone) {
          res = std::move(ev.result);
          done = true;
        }
      }
    }
    ASSERT_TRUE(done) << i;
    ASSERT_EQ(res.tokens.size(), 10u);
    ASSERT_EQ(res.logprobs.size(), 10u);
    std::vector<int32_t> seq = prompts[static_cast<size_t>(i)];
    seq.insert(seq.end(), res.tokens.begin(), res.tokens.end());
    const auto rows = all_logits(seq);
    const size_t np = prompts[static_cast<size_t>(i)].size();
    for (size_t j = 0; j < res.tokens.size(); ++j)
      expect_matches_row(res.logprobs[j], rows, nv, np + j, res.tokens[j], 4, 1e-4,
                         "job " + std::to_string(i) + " token " + std::to_string(j));
    if (i % 2 == 0) {
      ASSERT_EQ(res.prompt_logprobs.size(), np) << i;
      for (size_t k = 1; k < np; ++k)
        expect_matches_row(res.prompt_logprobs[k], rows, nv, k, seq[k], 2, 1e-4,
                           "job " + std::to_string(i) + " prompt " + std::to_string(k));
    } else {
      EXPECT_TRUE(res.prompt_logprobs.empty());
    }
    // Streamed: a prefix of the final list (text held back at the end may not have been released).
    ASSERT_LE(streamed.size(), res.logprobs.size());
    EXPECT_GE(streamed.size() + 2, res.logprobs.size());
    for (size_t j = 0; j < streamed.size(); ++j) EXPECT_EQ(streamed[j].logprob, res.logprobs[j].logprob);
  }
}

// n > 1 with prompt logprobs: the prompt runs once (choice 0), every
// choice's result carries the prompt's values, and each choice's first
// streamed text event brings them (a stream echoes the prompt first).
TEST(SchedulerLogprobs, EveryChoiceGetsThePromptLogprobs) {
  REQUIRE_STORIES();
  auto b = build_pool_from_gguf(kStories, SamplingParams{}, kDefaultSeed, 256, 3);
  ASSERT_TRUE(b.has_value()) << b.error().message;
  auto pool = std::make_shared<EnginePool>(std::move(b->pool));
  Scheduler sched(pool, b->model, b->n_ctx);
  CompletionJob j;
  j.prompt = stories().tok->encode_prompt("Lily and Ben went to the park");
  j.params.temperature = 1.0f;
  j.params.max_tokens = 6;
  j.params.ignore_eos = true;
  j.params.logprobs = 1;
  j.params.prompt_logprobs = 2;
  j.n = 3;
  const auto prompt = j.prompt;
  auto h = sched.submit(std::move(j));
  ASSERT_TRUE(h.has_value());
  std::map<int, GenerationResult> done;
  std::map<int, std::vector<TokenLogprob>> first_event_plp;
  std::map<int, int> with_plp;  // text events carrying prompt logprobs, per choice
  const auto until = Clock::now() + 120s;
  while (done.size() < 3 && Clock::now() < until) {
    std::vector<JobEvent> evs;
    (*h)->wait(evs, Clock::now() + 100ms);
    for (auto& ev : evs) {
      ASSERT_NE(ev.kind, JobEvent::Kind::kFailed) << ev.error.message;
      if (ev.kind == JobEvent::Kind::kText && !ev.prompt_logprobs.empty()) ++with_plp[ev.choice];
      if (ev.kind == JobEvent::Kind::kText && !first_event_plp.contains(ev.choice))
        first_event_plp[ev.choice] = ev.prompt_logprobs;
      if (ev.kind == JobEvent::Kind::kDone) done[ev.choice] = std::move(ev.result);
    }
  }
  ASSERT_EQ(done.size(), 3u);
  const auto rows = all_logits(prompt);
  const size_t nv = static_cast<size_t>(stories().model->config().n_vocab);
  for (int c = 0; c < 3; ++c) {
    const auto& plp = done[c].prompt_logprobs;
    ASSERT_EQ(plp.size(), prompt.size()) << c;
    for (size_t k = 1; k < prompt.size(); ++k)
      expect_matches_row(plp[k], rows, nv, k, prompt[k], 2, 1e-4, "choice " + std::to_string(c));
    EXPECT_EQ(with_plp[c], 1) << c;  // once per choice
    ASSERT_TRUE(first_event_plp.contains(c));
    ASSERT_EQ(first_event_plp[c].size(), prompt.size()) << c;
    for (size_t k = 1; k < prompt.size(); ++k) EXPECT_EQ(first_event_plp[c][k].logprob, plp[k].logprob);
  }
  EXPECT_EQ(sched.stats().prompt_tokens, prompt.size());  // computed once
}

}  // namespace
}  // namespace bonsai::engine
