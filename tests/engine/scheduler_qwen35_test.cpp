// The scheduler on a hybrid (qwen35) model: the prompt cache through
// recurrent-state snapshots (a shared system prompt, a second turn), a
// preempted sequence resumed bit-identically, the recurrent-state budget of
// admission, and the memory footprint that counts the states. Every answer
// is compared with the same request run alone on a fresh engine (tokens and
// log probabilities, exactly). Fixture: ../shared/fixtures/qwen35/
// qwen35-tiny-q1_0.gguf (skips without it).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "engine/engine_pool.h"
#include "engine/inference_engine.h"
#include "engine/load_fit.h"
#include "engine/scheduler.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace bonsai::engine {
namespace {

using namespace std::chrono_literals;

const std::string kQwen35 = test::shared_path("fixtures/qwen35/qwen35-tiny-q1_0.gguf");
constexpr int64_t kBlock = 32;  // KV block (and snapshot) granularity of these tests

// Token ids inside the fixture's vocabulary (below its special tokens).
std::vector<int32_t> ids_of(int n, int32_t salt) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 131 + salt * 17 + 7) % 8000));
  return ids;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Outcome {
  bool failed = false;
  core::Error error;
  GenerationResult result;
};

Outcome collect(JobHandle& h) {
  Outcome o;
  const auto until = Clock::now() + 120s;
  std::vector<JobEvent> evs;
  while (Clock::now() < until) {
    evs.clear();
    const bool ended = h.ended();
    h.wait(evs, ended ? Clock::now() : Clock::now() + 100ms);
    for (auto& e : evs) {
      if (e.kind == JobEvent::Kind::kDone) o.result = std::move(e.result);
      if (e.kind == JobEvent::Kind::kFailed) {
        o.failed = true;
        o.error = e.error;
      }
    }
    if (ended && evs.empty()) break;
  }
  return o;
}

template <class Pred>
bool eventually(Pred pred) {
  const auto until = Clock::now() + 60s;
  while (Clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

void raise_max(std::atomic<int64_t>& most, int64_t v) {
  int64_t m = most.load();
  while (v > m && !most.compare_exchange_weak(m, v)) {
  }
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = 0;  // the chosen tokens' log probabilities, compared exactly
  return p;
}

// Same tokens and bit-identical log probabilities.
void expect_same(const GenerationResult& got, const GenerationResult& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_FALSE(want.tokens.empty());
  ASSERT_EQ(want.logprobs.size(), want.tokens.size());
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    EXPECT_EQ(std::memcmp(&got.logprobs[i].logprob, &want.logprobs[i].logprob, sizeof(float)), 0) << "token " << i;
  }
}

class SchedulerQwen35Test : public ::testing::Test {
 protected:
  void SetUp() override { BONSAI_REQUIRE_FILE(kQwen35); }

  // `replicas` engines over one KV pool of `blocks` blocks of kBlock
  // positions with room for `snapshots` state snapshots, and a scheduler.
  void build(int replicas, int64_t ctx, int64_t blocks, uint64_t snapshots, SchedulerOptions so = {}) {
    sched_.reset();
    auto b = build_pool_from_gguf(kQwen35, SamplingParams{}, kDefaultSeed, ctx, 1);
    ASSERT_TRUE(b.has_value()) << b.error().message;
    model_ = b->model;
    tok_ = b->tokenizer;
    state_ = model::KvCache::recurrent_bytes(model_->config());
    ASSERT_GT(state_, 0u);
    auto kv =
        model::KvPool::create(model_->config(), blocks * kBlock, model::KvType::kF16, model::KvType::kF16, kBlock);
    ASSERT_TRUE(kv.has_value()) << kv.error().message;
    kv_ = *kv;
    kv_->set_snapshot_budget(snapshots * state_);
    EngineOptions eo;
    eo.max_seq_len = ctx;
    eo.kv_pool = kv_;
    std::vector<InferenceEngine> engines;
    for (int i = 0; i < replicas; ++i) engines.push_back(std::move(*InferenceEngine::create(model_, tok_, eo)));
    pool_ = std::make_shared<EnginePool>(std::move(engines));
    so.kv_pool = kv_;
    sched_ = std::make_unique<Scheduler>(pool_, model_, ctx, std::move(so));
  }

  // What `prompt` gives alone on a fresh engine with its own cache.
  GenerationResult alone(const std::vector<int32_t>& prompt, const SamplingParams& p, uint64_t seed, int64_t ctx,
                         SpecOptions spec = {}) {
    EngineOptions eo;
    eo.max_seq_len = ctx;
    eo.spec = spec;
    auto e = InferenceEngine::create(model_, tok_, eo);
    EXPECT_TRUE(e.has_value());
    GenerateRequest gr;
    gr.prompt = prompt;
    gr.params = p;
    gr.seed = seed;
    auto r = e->generate_request(gr);
    EXPECT_TRUE(r.has_value()) << r.error().message;
    return r ? *r : GenerationResult{};
  }

  std::shared_ptr<JobHandle> submit(const std::vector<int32_t>& prompt, const SamplingParams& p, uint64_t seed = 1) {
    CompletionJob j;
    j.prompt = prompt;
    j.params = p;
    j.params.seed = seed;
    auto h = sched_->submit(std::move(j));
    EXPECT_TRUE(h.has_value()) << h.error().message;
    return h ? *h : nullptr;
  }

  // Runs `prompt` through the scheduler and waits until it ended and left.
  GenerationResult run(const std::vector<int32_t>& prompt, const SamplingParams& p, uint64_t seed = 1) {
    auto h = submit(prompt, p, seed);
    if (!h) return {};
    Outcome o = collect(*h);
    EXPECT_FALSE(o.failed) << o.error.message;
    EXPECT_TRUE(eventually([&] { return sched_->stats().running == 0; }));
    return o.result;
  }

  std::shared_ptr<const model::Model> model_;
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  std::shared_ptr<EnginePool> pool_;
  std::shared_ptr<model::KvPool> kv_;
  std::unique_ptr<Scheduler> sched_;
  uint64_t state_ = 0;
};

// Requests sharing a 70-token system prompt (over two blocks) with short
// user turns: the second adopts the first's state at the system prompt's
// last boundary (the first prompt's last boundary, kept), and every answer
// is bit-identical to the request run alone.
TEST_F(SchedulerQwen35Test, SharedSystemPromptReusesItsStateSnapshot) {
  constexpr int64_t kCtx = 256;
  build(2, kCtx, 32, 8);
  const std::vector<int32_t> system = ids_of(70, 1);
  const SamplingParams p = greedy(8);
  const auto p1 = concat(system, ids_of(10, 2)), p2 = concat(system, ids_of(12, 3));
  const GenerationResult a1 = run(p1, p);
  EXPECT_EQ(a1.cached_tokens, 0);
  const GenerationResult a2 = run(p2, p);
  EXPECT_EQ(a2.cached_tokens, 64);
  expect_same(a1, alone(p1, p, 1, kCtx));
  expect_same(a2, alone(p2, p, 1, kCtx));
  const SchedulerStats st = sched_->stats();
  EXPECT_EQ(st.cached_tokens, 64u);
  EXPECT_EQ(st.cache_hits, 1u);
  EXPECT_EQ(st.state_snapshot_hits, 1u);
  EXPECT_LE(st.state_snapshot_bytes, st.state_snapshot_budget);
  EXPECT_EQ(st.state_snapshot_budget, 8 * state_);
}

// Speculation stays off on a recurrent model (its state cannot roll back
// past a rejected proposal): a prompt that repeats itself, on which prompt
// lookup has a proposal, runs without one through the scheduler and the
// engine, and answers as with speculation off.
TEST_F(SchedulerQwen35Test, RecurrentModelNeverSpeculates) {
  constexpr int64_t kCtx = 256;
  const SpecOptions on{.type = SpecType::kNgram};  // asked for (it is off by default)
  SchedulerOptions so;
  so.spec = on;
  build(1, kCtx, 32, 8, so);
  const std::vector<int32_t> part = ids_of(20, 1);
  const std::vector<int32_t> prompt = concat(concat(part, part), part);
  ASSERT_FALSE(ngram_proposal(prompt, kNgramMin, kNgramMax, 8).empty());
  const SamplingParams p = greedy(12);
  const GenerationResult a = run(prompt, p);
  EXPECT_EQ(sched_->stats().spec_ngram_proposed, 0u);
  EXPECT_EQ(a.draft_tokens, 0);
  const GenerationResult e = alone(prompt, p, 1, kCtx, on);
  EXPECT_EQ(e.draft_tokens, 0);
  expect_same(a, e);
}

// A system prompt of 100 tokens with long user turns: the first prompt keeps
// only its own last boundaries (128), so the second recomputes the shared
// part but keeps its state where the shared KV ended (96, the fork point);
// the third then adopts it. Answers bit-identical to alone.
TEST_F(SchedulerQwen35Test, LongSharedPrefixIsReusedFromTheThirdRequest) {
  constexpr int64_t kCtx = 256;
  build(2, kCtx, 32, 8);
  const std::vector<int32_t> system = ids_of(100, 4);
  const SamplingParams p = greedy(6);
  const std::vector<std::vector<int32_t>> prompts = {concat(system, ids_of(40, 5)), concat(system, ids_of(42, 6)),
                                                     concat(system, ids_of(44, 7))};
  std::vector<int32_t> cached;
  for (const auto& prompt : prompts) {
    const GenerationResult r = run(prompt, p);
    cached.push_back(r.cached_tokens);
    expect_same(r, alone(prompt, p, 1, kCtx));
  }
  EXPECT_EQ(cached, (std::vector<int32_t>{0, 0, 96}));
}

// A second turn (prompt 1 + answer + a new user turn) adopts up to the last
// block boundary the first turn's sequence reached, and answers as alone.
TEST_F(SchedulerQwen35Test, SecondTurnReusesUpToTheLastBoundary) {
  constexpr int64_t kCtx = 256;
  build(2, kCtx, 32, 8);
  const SamplingParams p = greedy(30);
  const auto p1 = ids_of(50, 8);
  const GenerationResult a1 = run(p1, p);
  ASSERT_EQ(a1.tokens.size(), 30u);
  const auto p2 = concat(concat(p1, a1.tokens), ids_of(10, 9));
  const GenerationResult a2 = run(p2, greedy(10));
  // The first sequence's cache held 50 + 29 positions (the last sampled token never ran): boundary 64.
  EXPECT_EQ(a2.cached_tokens, 64);
  expect_same(a2, alone(p2, greedy(10), 1, kCtx));
}

// A KV budget two sequences outgrow: the younger one is preempted (its
// blocks and its recurrent state freed) and resumed from its last state
// snapshot plus recompute; seeded sampling at temperature 1 continues
// bit-identically.
TEST_F(SchedulerQwen35Test, PreemptedSequenceResumesBitIdentical) {
  constexpr int64_t kCtx = 160;
  // The loop is held after the older one's first step while the younger is
  // submitted, and prompts run whole (a large step budget), so the steps are
  // the same on every run: the older needs its 4th block (position 96) while
  // the younger holds 4 and is at position 102, inside its 4th block. It is
  // preempted; the older takes its partial last block (not indexed), and its
  // three full blocks stay cached with the state snapshot at 96.
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int held = 0;
  SchedulerOptions so;
  so.step_budget_ms = 10000;
  so.on_step = [&](int64_t, int64_t) {
    std::unique_lock lock(mu);
    if (open) return;
    ++held;
    cv.wait(lock, [&] { return open; });
  };
  build(2, kCtx, 7, 4, so);
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 100;
  p.ignore_eos = true;
  p.logprobs = 0;
  const auto p0 = ids_of(20, 10), p1 = ids_of(27, 11);
  auto older = submit(p0, p, 77);
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return held == 1;
  }));
  auto younger = submit(p1, p, 78);
  {
    std::lock_guard lock(mu);
    open = true;
  }
  cv.notify_all();
  Outcome o_old = collect(*older), o_young = collect(*younger);
  ASSERT_FALSE(o_old.failed) << o_old.error.message;
  ASSERT_FALSE(o_young.failed) << o_young.error.message;
  EXPECT_GE(sched_->stats().preemptions, 1u) << "the budget should have forced a preemption";
  // The resume took its replay's first 96 positions back from the snapshot.
  EXPECT_EQ(sched_->stats().state_snapshot_hits, 1u);
  expect_same(o_old.result, alone(p0, p, 77, kCtx));
  expect_same(o_young.result, alone(p1, p, 78, kCtx));
  EXPECT_EQ(o_young.result.completion_tokens, 100);
  EXPECT_TRUE(eventually([&] { return kv_->usage().pinned == 0 && kv_->state_usage().states == 0; }));
}

// A recurrent-state budget of two states with four sequence slots: never
// more than two sequences (and states) at once, the rest wait, all finish
// with the answers they give alone.
TEST_F(SchedulerQwen35Test, StateBudgetAdmitsOnlyWhatFits) {
  constexpr int64_t kCtx = 128;
  std::atomic<int64_t> most_seqs{0}, most_states{0};
  SchedulerOptions so;
  so.max_sequences = 4;
  std::shared_ptr<model::KvPool>* kvp = &kv_;
  so.on_step = [&, kvp](int64_t, int64_t seqs) {
    raise_max(most_seqs, seqs);
    if (*kvp) raise_max(most_states, (*kvp)->state_usage().states);
  };
  auto cfg_state = [&] {
    auto m = model::Model::load(kQwen35);
    return m ? model::KvCache::recurrent_bytes((*m)->config()) : 0;
  }();
  ASSERT_GT(cfg_state, 0u);
  so.state_budget_bytes = 2 * cfg_state + cfg_state / 2;  // two states fit, not three
  build(4, kCtx, 32, 0, so);
  const SamplingParams p = greedy(12);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<JobHandle>> hs;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(ids_of(10 + 5 * i, 20 + i));
    hs.push_back(submit(prompts.back(), p));
  }
  for (int i = 0; i < 4; ++i) {
    Outcome o = collect(*hs[static_cast<size_t>(i)]);
    ASSERT_FALSE(o.failed) << o.error.message;
    expect_same(o.result, alone(prompts[static_cast<size_t>(i)], p, 1, kCtx));
  }
  EXPECT_EQ(most_seqs.load(), 2);
  EXPECT_LE(most_states.load(), 2);
  EXPECT_TRUE(eventually([&] { return kv_->state_usage().states == 0; }));
}

// The load-time footprint of a qwen35 model counts its recurrent states
// (one per parallel sequence) and the state-snapshot budget.
TEST_F(SchedulerQwen35Test, FootprintCountsRecurrentStateAndSnapshots) {
  auto m = model::Model::load(kQwen35);
  ASSERT_TRUE(m.has_value());
  const model::ModelConfig& c = (*m)->config();
  const uint64_t state = model::KvCache::recurrent_bytes(c);
  EXPECT_EQ(state, 3u * (3 * 512 + 8 * 32 * 32) * 4);  // 3 GDN layers: conv tail + 8 heads of 32 x 32
  auto fp = model_footprint(kQwen35, /*max_seq_len=*/64, /*pool_size=*/2, {}, model::KvType::kF16, model::KvType::kF16,
                            /*kv_budget_tokens=*/0, /*parallel=*/3);
  ASSERT_TRUE(fp.has_value()) << fp.error().message;
  EXPECT_EQ(fp->recurrent_state_bytes, state);
  EXPECT_EQ(fp->sequences, 3);
  EXPECT_EQ(fp->states_bytes, 3 * state);
  EXPECT_EQ(fp->kv_budget_tokens, 128);  // two contexts of 64
  EXPECT_EQ(fp->snapshot_bytes, 2 * 2 * state);
  EXPECT_EQ(fp->kv_bytes, 128u * model::KvCache::bytes_per_position(c, model::KvType::kF16, model::KvType::kF16));
  EXPECT_EQ(fp->total_bytes(), fp->mapped_bytes + fp->kv_bytes + 3 * state + 4 * state);
  auto est = estimate_model_bytes(kQwen35, 64, 2, {}, model::KvType::kF16, model::KvType::kF16, 0, 3);
  ASSERT_TRUE(est.has_value());
  EXPECT_EQ(*est, fp->total_bytes());
  // Without parallel, one state per replica; a model without GDN layers counts none.
  auto fp2 = model_footprint(kQwen35, 64, 2);
  ASSERT_TRUE(fp2.has_value());
  EXPECT_EQ(fp2->states_bytes, 2 * state);
  const std::string qwen3 = test::shared_path("models/stories260K/stories260K.gguf");
  if (auto fp3 = model_footprint(qwen3, 64, 2, {}, model::KvType::kF16, model::KvType::kF16, 0, 3); fp3) {
    EXPECT_EQ(fp3->recurrent_state_bytes, 0u);
    EXPECT_EQ(fp3->total_bytes(), fp3->mapped_bytes + fp3->kv_bytes);
  }
  // A --mem-budget that holds the mapping and the KV but not the states is refused, naming them.
  ModelSpec spec;
  spec.path = kQwen35;
  spec.ctx_size = 64;
  spec.pool_size = 2;
  spec.parallel = 3;
  EXPECT_FALSE(check_load_fit("q35", spec, false, false, fp->total_bytes(), 0).has_value());
  const auto refused = check_load_fit("q35", spec, false, false, fp->mapped_bytes + fp->kv_bytes + state, 0);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code, "insufficient_memory");
  EXPECT_NE(refused->message.find("of recurrent state (" + std::to_string(state) + " bytes per sequence x 3"),
            std::string::npos)
      << refused->message;
  // build_pool_from_gguf sets the same snapshot budget on the model's KV pool.
  auto b = build_pool_from_gguf(kQwen35, SamplingParams{}, kDefaultSeed, 64, 2);
  ASSERT_TRUE(b.has_value()) << b.error().message;
  EXPECT_EQ(b->recurrent_state_bytes, state);
  EXPECT_EQ(b->snapshot_bytes, 4 * state);
  EXPECT_EQ(b->kv_pool->snapshot_budget(), 4 * state);
  EXPECT_EQ(b->kv_pool->state_bytes(), state);
}

}  // namespace
}  // namespace bonsai::engine
