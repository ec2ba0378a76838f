// Scheduler (continuous batching) over real replicas of stories260K: batch
// invariance (every request returns what it returns alone, whatever shares
// its steps, the prefill chunk size and the prompt cache), seeds, n > 1
// prefilling once, the prompt cache, chunked prefill not stalling short
// requests, and cancellation / deadlines within one step.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>  // mkdtemp
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "apps/bonsai/synth.h"  // synth::write_model (the draft-model tests' models)
#include "common/test_util.h"
#include "engine/engine_pool.h"
#include "engine/inference_engine.h"
#include "engine/proposer.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "structured/grammar.h"
#include "tokenizer/tokenizer.h"

namespace bonsai::engine {
namespace {

using namespace std::chrono_literals;

const std::string kStories = test::shared_path("models/stories260K/stories260K.gguf");

// What one job produced, gathered from its events.
struct Outcome {
  bool failed = false;
  core::Error error;
  std::map<int, GenerationResult> results;  // by choice
  std::map<int, std::string> streamed;      // concatenated kText per choice
};

// Reads `h`'s events until the job ended (generous deadline: never a tight wait).
Outcome collect(JobHandle& h, std::chrono::seconds limit = 120s) {
  Outcome o;
  const auto until = Clock::now() + limit;
  std::vector<JobEvent> evs;
  while (Clock::now() < until) {
    evs.clear();
    const bool ended = h.ended();  // set after the job's last event was pushed
    h.wait(evs, ended ? Clock::now() : Clock::now() + 100ms);
    for (auto& e : evs) {
      if (e.kind == JobEvent::Kind::kText) o.streamed[e.choice] += e.text;
      if (e.kind == JobEvent::Kind::kDone) o.results[e.choice] = std::move(e.result);
      if (e.kind == JobEvent::Kind::kFailed) {
        o.failed = true;
        o.error = e.error;
      }
    }
    if (ended && evs.empty()) break;
  }
  return o;
}

// Waits (up to 60 s) until pred() holds.
template <class Pred>
bool eventually(Pred pred) {
  const auto until = Clock::now() + 60s;
  while (Clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

// Raises `most` to `v` if v is larger (from the loop thread's on_step).
void raise_max(std::atomic<int64_t>& most, int64_t v) {
  int64_t m = most.load();
  while (v > m && !most.compare_exchange_weak(m, v)) {
  }
}

// Holds the scheduler's loop inside SchedulerOptions::on_step while closed,
// so a test can queue several jobs before the loop admits any of them.
// wait() runs on the loop thread; open() / close() on the test thread. Must
// outlive the scheduler whose on_step calls it.
class StepGate {
 public:
  explicit StepGate(bool open) : open_(open) {}
  void wait() {
    std::unique_lock lock(mu_);
    if (open_) return;
    ++held_;
    cv_.wait(lock, [&] { return open_; });
  }
  void open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void close() {
    std::lock_guard lock(mu_);
    open_ = false;
  }
  // Times wait() found the gate closed (the loop is or was held there).
  int held() {
    std::lock_guard lock(mu_);
    return held_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_;
  int held_ = 0;
};

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override { BONSAI_REQUIRE_FILE(kStories); }

  // A pool of `replicas` slots with `ctx` positions each and a scheduler over it.
  void build(int replicas, int64_t ctx, SchedulerOptions so = {}) {
    build_path(kStories, replicas, ctx, std::move(so));
  }
  void build_path(const std::string& path, int replicas, int64_t ctx, SchedulerOptions so = {}) {
    sched_.reset();
    auto b = build_pool_from_gguf(path, SamplingParams{}, kDefaultSeed, ctx, replicas);
    ASSERT_TRUE(b.has_value()) << b.error().message;
    model_ = b->model;
    tok_ = b->tokenizer;
    pool_ = std::make_shared<EnginePool>(std::move(b->pool));
    kv_ = b->kv_pool;
    so.kv_pool = kv_;  // as the server: one KV budget for the model
    sched_ = std::make_unique<Scheduler>(pool_, model_, b->n_ctx, std::move(so));
  }

  // As build(), with a KV pool of `budget` positions in blocks of `block`
  // (smaller than the default, so budgets run out in a short test).
  void build_budget(int replicas, int64_t ctx, int64_t budget, int64_t block, SchedulerOptions so = {}) {
    sched_.reset();
    auto b = build_pool_from_gguf(kStories, SamplingParams{}, kDefaultSeed, ctx, 1);
    ASSERT_TRUE(b.has_value()) << b.error().message;
    model_ = b->model;
    tok_ = b->tokenizer;
    auto kv = model::KvPool::create(model_->config(), budget, model::KvType::kF16, model::KvType::kF16, block);
    ASSERT_TRUE(kv.has_value()) << kv.error().message;
    kv_ = *kv;
    EngineOptions eo;
    eo.max_seq_len = ctx;
    eo.kv_pool = kv_;
    std::vector<InferenceEngine> engines;
    for (int i = 0; i < replicas; ++i) engines.push_back(std::move(*InferenceEngine::create(model_, tok_, eo)));
    pool_ = std::make_shared<EnginePool>(std::move(engines));
    so.kv_pool = kv_;
    sched_ = std::make_unique<Scheduler>(pool_, model_, ctx, std::move(so));
  }

  // Different prompts of different lengths (the story openings, repeated).
  std::vector<std::vector<int32_t>> prompts(int n) const {
    const char* seeds[] = {"Once upon a time", "The little dog",         "Lily and Ben went to the park",
                           "One day, a bird",  "Tom had a red ball. He", "The sun was hot and"};
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < n; ++i) {
      std::string text = seeds[i % 6];
      for (int r = 0; r < i / 6; ++r) text += std::string(" ") + seeds[(i + r) % 6];
      out.push_back(tok_->encode_prompt(text));
    }
    return out;
  }

  // What `prompt` gives alone on a fresh engine (the library path).
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
    return *r;
  }

  std::shared_ptr<JobHandle> submit(const std::vector<int32_t>& prompt, const SamplingParams& p, uint64_t seed = 1,
                                    int n = 1, Clock::time_point deadline = Clock::time_point::max()) {
    CompletionJob j;
    j.prompt = prompt;
    j.params = p;
    j.params.seed = seed;
    j.n = n;
    j.deadline = deadline;
    auto h = sched_->submit(std::move(j));
    EXPECT_TRUE(h.has_value()) << h.error().message;
    return h ? *h : nullptr;
  }

  std::shared_ptr<const model::Model> model_;
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  std::shared_ptr<EnginePool> pool_;
  std::shared_ptr<model::KvPool> kv_;
  std::unique_ptr<Scheduler> sched_;
};

// Steps (SchedulerStats::steps numbering) at which each choice streamed text.
struct Timeline {
  uint64_t first = 0, last = 0;
};
Outcome collect_steps(JobHandle& h, Timeline& t) {
  Outcome o;
  const auto until = Clock::now() + 120s;
  std::vector<JobEvent> evs;
  while (Clock::now() < until) {
    evs.clear();
    const bool ended = h.ended();
    h.wait(evs, ended ? Clock::now() : Clock::now() + 100ms);
    for (auto& e : evs) {
      if (e.kind == JobEvent::Kind::kText) {
        o.streamed[e.choice] += e.text;
        if (t.first == 0) t.first = e.step;
        t.last = e.step;
      }
      if (e.kind == JobEvent::Kind::kDone) o.results[e.choice] = std::move(e.result);
      if (e.kind == JobEvent::Kind::kFailed) {
        o.failed = true;
        o.error = e.error;
      }
    }
    if (ended && evs.empty()) break;
  }
  return o;
}

// 16 concurrent requests (different prompts and lengths, temperature 0)
// each return exactly the tokens they return alone: 5 rounds, with the
// prompt cache on and off and prefill chunks of 512, 7 and 1 tokens.
TEST_F(SchedulerTest, SixteenConcurrentRequestsEachReturnWhatTheyReturnAlone) {
  constexpr int64_t kCtx = 256;
  build(16, kCtx);
  const auto ps = prompts(16);
  std::vector<GenerationResult> solo;
  for (int i = 0; i < 16; ++i) solo.push_back(alone(ps[i], greedy(8 + 5 * i), 1, kCtx));
  struct Config {
    bool cache;
    int64_t batch;
    int rounds;
    double budget_ms = 0;  // step_budget_ms
  };
  for (const Config c : {Config{true, 512, 5}, Config{false, 512, 1}, Config{true, 7, 1}, Config{false, 1, 1},
                         Config{true, 512, 1, 0.001}, Config{false, 512, 1, 1e5}}) {
    SchedulerOptions so;
    so.prompt_cache = c.cache;
    so.batch_size = c.batch;
    so.step_budget_ms = c.budget_ms;
    build(16, kCtx, so);
    for (int round = 0; round < c.rounds; ++round) {
      std::vector<std::shared_ptr<JobHandle>> hs;
      for (int i = 0; i < 16; ++i) hs.push_back(submit(ps[i], greedy(8 + 5 * i)));
      for (int i = 0; i < 16; ++i) {
        Outcome o = collect(*hs[i]);
        ASSERT_FALSE(o.failed) << o.error.message;
        ASSERT_EQ(o.results.size(), 1u);
        const GenerationResult& r = o.results[0];
        EXPECT_EQ(r.tokens, solo[i].tokens) << "request " << i << " cache " << c.cache << " batch " << c.batch
                                            << " budget " << c.budget_ms << " round " << round;
        EXPECT_EQ(r.text, solo[i].text);
        EXPECT_EQ(o.streamed[0], r.text);
        EXPECT_EQ(r.finish_reason, solo[i].finish_reason);
      }
    }
    const SchedulerStats st = sched_->stats();
    EXPECT_GT(st.steps, 0u);
    EXPECT_EQ(st.running, 0);
    EXPECT_EQ(st.waiting, 0);
    EXPECT_TRUE(eventually([&] { return sched_->stats().running == 0; }));
    // Batching happened: fewer steps than a one-at-a-time run would need.
    if (c.batch == 512) {
      EXPECT_LT(st.steps, st.step_tokens);
    }
  }
}

// StepCost's arithmetic: D from decode-only steps, c from the rest, and the
// allowance (target - D) / c within [1, cap].
TEST(StepCost, LearnsDecodeAndPromptCostsAndSizesChunks) {
  StepCost c;
  EXPECT_EQ(c.prompt_allowance(0, 0, 512), kInitialPromptChunk);  // nothing measured yet
  EXPECT_EQ(c.prompt_allowance(3, 0, 10), 10);                    // capped
  c.record(0, 100, 0.5);                                          // a prompt alone: 5 ms per token
  EXPECT_DOUBLE_EQ(c.token_seconds(), 0.005);
  EXPECT_EQ(c.prompt_allowance(0, 0, 512), 100);                  // alone: kSoloStepSeconds / 5 ms
  EXPECT_EQ(c.prompt_allowance(2, 0, 512), kInitialPromptChunk);  // rows, but D unknown
  c.record(2, 50, 1.0);                                           // ignored: D unknown
  EXPECT_DOUBLE_EQ(c.token_seconds(), 0.005);
  c.record(2, 0, 0.02);  // a decode step: 20 ms
  EXPECT_DOUBLE_EQ(c.decode_step_seconds(), 0.02);
  EXPECT_EQ(c.prompt_allowance(2, 0, 512), 4);      // (2 x 20 ms - 20 ms) / 5 ms
  EXPECT_EQ(c.prompt_allowance(2, 0.1, 512), 16);   // (100 ms - 20 ms) / 5 ms
  EXPECT_EQ(c.prompt_allowance(2, 0.001, 512), 1);  // below one token: still 1
  EXPECT_EQ(c.prompt_allowance(2, 10, 300), 300);   // capped
  c.record(2, 0, 0.04);                             // moving average, weight 1/4
  EXPECT_DOUBLE_EQ(c.decode_step_seconds(), 0.025);
  c.record(1, 10, 0.125);  // marginal (125 - 25) / 10 = 10 ms -> 5 + (10 - 5) / 4
  EXPECT_DOUBLE_EQ(c.token_seconds(), 0.00625);
  EXPECT_NEAR(c.prompt_allowance(0, 0, 512), 76, 1);  // alone: (500 - 25) / 6.25 ms (D: any step's fixed part)
  c.record(0, 100, 0.725);                            // (725 - 25) / 100 = 7 ms -> 6.25 + (7 - 6.25) / 4
  EXPECT_DOUBLE_EQ(c.token_seconds(), 0.0064375);
  c.record(1, 10, 0.026);  // faster than D (noise): at least 1/20 of t / P
  EXPECT_DOUBLE_EQ(c.token_seconds(), 0.0064375 + (0.026 / 200 - 0.0064375) / 4);
  EXPECT_DOUBLE_EQ(c.target_seconds(1, 0), 0.05);
  EXPECT_DOUBLE_EQ(c.target_seconds(0, 0), kSoloStepSeconds);
  EXPECT_DOUBLE_EQ(c.target_seconds(0, 2.0), 2.0);
  // D stays fresh: a decode-only step is asked for when none ran for
  // kDecodeSampleEvery steps, or the rows moved by more than a quarter.
  StepCost d;
  EXPECT_FALSE(d.want_decode_sample(0));
  EXPECT_TRUE(d.want_decode_sample(4));  // D unknown
  d.record(4, 0, 0.02);
  EXPECT_FALSE(d.want_decode_sample(4));
  EXPECT_FALSE(d.want_decode_sample(5));  // 1/4 more: still close
  EXPECT_TRUE(d.want_decode_sample(6));
  EXPECT_TRUE(d.want_decode_sample(2));
  for (int64_t i = 0; i + 1 < StepCost::kDecodeSampleEvery; ++i) d.record(4, 10, 0.05);
  EXPECT_FALSE(d.want_decode_sample(4));
  d.record(4, 10, 0.05);
  EXPECT_TRUE(d.want_decode_sample(4));
  d.record(4, 0, 0.02);
  EXPECT_FALSE(d.want_decode_sample(4));
}

// Proposal rows (speculative decoding, issue 29) are timed apart: once D is
// known, a prompt-free step with K proposals is not a decode sample (D
// would grow with them) but a sample of r = (t - D) / K; before, it is D's;
// a prompt step subtracts K r (or, before r is known, counts the rows as
// prompt tokens); and a step with proposals counts as the decode sample
// want_decode_sample asks for (no prompt waits on a proposal-free step).
TEST(StepCost, TimesProposalRowsApartFromTheDecodeStep) {
  StepCost c;
  c.record(2, 0, 0.02, 3);  // D unknown: this step is D
  EXPECT_DOUBLE_EQ(c.decode_step_seconds(), 0.02);
  EXPECT_EQ(c.row_seconds(), 0.0);
  EXPECT_EQ(c.proposal_row_seconds(), 0.0);  // neither r nor c measured
  c.record(2, 0, 0.026, 3);                  // (26 - 20) / 3 = 2 ms per row; D unchanged
  EXPECT_DOUBLE_EQ(c.decode_step_seconds(), 0.02);
  EXPECT_DOUBLE_EQ(c.row_seconds(), 0.002);
  EXPECT_DOUBLE_EQ(c.proposal_row_seconds(), 0.002);
  c.record(2, 0, 0.034, 2);  // (34 - 20) / 2 = 7 ms -> 2 + (7 - 2) / 4
  EXPECT_DOUBLE_EQ(c.row_seconds(), 0.00325);
  c.record(2, 0, 0.019, 4);  // faster than D (noise): at least 1/20 of t / K
  EXPECT_DOUBLE_EQ(c.row_seconds(), 0.00325 + (0.019 / 80 - 0.00325) / 4);
  c.record(2, 0, 0.024);  // a step without proposals: D
  EXPECT_DOUBLE_EQ(c.decode_step_seconds(), 0.021);
  const double r = c.row_seconds();
  c.record(2, 10, 0.121 + 2 * r, 2);  // prompt step: (t - D - 2 r) / 10 = 10 ms
  EXPECT_DOUBLE_EQ(c.token_seconds(), 0.01);
  EXPECT_DOUBLE_EQ(c.row_seconds(), r);
  EXPECT_DOUBLE_EQ(c.decode_step_seconds(), 0.021);
  StepCost u;
  u.record(1, 0, 0.02);
  u.record(1, 8, 0.12, 2);  // r unknown: (120 - 20) / (8 + 2) = 10 ms per token
  EXPECT_DOUBLE_EQ(u.token_seconds(), 0.01);
  EXPECT_DOUBLE_EQ(u.proposal_row_seconds(), 0.01);  // c stands in for r
  // A step with proposals answers want_decode_sample (and keeps D).
  StepCost d;
  d.record(4, 0, 0.02);
  for (int64_t i = 0; i < StepCost::kDecodeSampleEvery; ++i) d.record(4, 10, 0.05);
  EXPECT_TRUE(d.want_decode_sample(4));
  d.record(4, 0, 0.03, 4);
  EXPECT_FALSE(d.want_decode_sample(4));
  EXPECT_DOUBLE_EQ(d.decode_step_seconds(), 0.02);
  EXPECT_DOUBLE_EQ(d.row_seconds(), 0.0025);
}

// The step-time budget sizes prompt chunks: with a budget below one prompt
// token, a long prompt arriving beside a decoding stream advances one token
// per step (each step: the stream's token + 1), and both answers are what
// they are alone (batch invariance under any chunking).
TEST_F(SchedulerTest, StepBudgetSizesPromptChunksBesideRunningStreams) {
  constexpr int64_t kCtx = 1024;
  std::atomic<bool> watching{false};
  std::atomic<int64_t> widest{0}, watched{0}, steps{0};
  // The loop is held at its 6th step (A's prompt and decode-only steps
  // measured) until B is queued: B then meets A with ~790 tokens to go,
  // however slowly this thread runs.
  StepGate gate(/*open=*/false);
  SchedulerOptions so;
  so.step_budget_ms = 0.001;
  so.prompt_cache = false;         // no keep_tail rows
  so.spec.type = SpecType::kNone;  // A's proposed tokens would widen its rows (this is about prompt chunks)
  so.on_step = [&](int64_t tokens, int64_t seqs) {
    if (steps.fetch_add(1) + 1 == 6) gate.wait();
    if (!watching.load() || seqs != 2) return;  // steps that carry both A and B
    watched.fetch_add(1);
    raise_max(widest, tokens);
  };
  build(2, kCtx, so);
  const auto ps = prompts(2);
  std::vector<int32_t> longp = ps[1];
  while (longp.size() < 150) longp.insert(longp.end(), ps[1].begin() + 1, ps[1].end());
  SamplingParams pa = greedy(800);  // outlasts B's ~170 steps
  pa.ignore_eos = true;
  const GenerationResult solo_a = alone(ps[0], pa, 1, kCtx);
  const GenerationResult solo_b = alone(longp, greedy(5), 1, kCtx);
  auto a = submit(ps[0], pa);
  ASSERT_TRUE(eventually([&] { return steps.load() >= 6; }));  // held in its 6th step
  EXPECT_GT(sched_->stats().decode_step_seconds, 0);
  watching.store(true);
  auto b = submit(longp, greedy(5));
  gate.open();
  Outcome ob = collect(*b);
  watching.store(false);
  Outcome oa = collect(*a);
  ASSERT_FALSE(oa.failed || ob.failed);
  EXPECT_EQ(oa.results[0].tokens, solo_a.tokens);
  EXPECT_EQ(ob.results[0].tokens, solo_b.tokens);
  // While both run, every step is A's token + at most one of B's (a step
  // now and then measures the decode step alone): B's 150+ prompt tokens
  // take at least as many steps.
  EXPECT_GE(watched.load(), static_cast<int64_t>(longp.size()));
  EXPECT_EQ(widest.load(), 2);
  EXPECT_GT(sched_->stats().prompt_token_seconds, 0);
  sched_.reset();  // before the gate's state goes out of scope
}

// Concurrent requests with one long shared prefix (a system prompt) reuse
// it whoever computed it: after one warm-up request, 4 requests admitted in
// the same pass each start from the cached prefix (the first from the idle
// slot, the others from the running first one's KV blocks), and each
// answers as it does alone.
TEST_F(SchedulerTest, ConcurrentRequestsShareAPrefixWhoeverComputedIt) {
  constexpr int64_t kCtx = 1024;
  StepGate gate(/*open=*/true);
  SchedulerOptions so;
  so.on_step = [&](int64_t, int64_t) { gate.wait(); };
  build(6, kCtx, so);
  const auto ps = prompts(6);
  std::vector<int32_t> shared = ps[0];
  while (shared.size() < 300) shared.insert(shared.end(), ps[2].begin() + 1, ps[2].end());
  std::vector<std::vector<int32_t>> ask;
  for (int i = 0; i < 5; ++i) {
    ask.push_back(shared);
    ask.back().insert(ask.back().end(), ps[i + 1].begin() + 1, ps[i + 1].end());
  }
  const Outcome warm = collect(*submit(ask[0], greedy(4)));
  ASSERT_FALSE(warm.failed);
  // Hold the loop inside a step (a short unrelated request), queue the 4, release.
  gate.close();
  auto other = submit(tok_->encode_prompt("Tom"), greedy(3));
  ASSERT_TRUE(eventually([&] { return gate.held() > 0; }));
  std::vector<std::shared_ptr<JobHandle>> hs;
  for (int i = 1; i < 5; ++i) hs.push_back(submit(ask[static_cast<size_t>(i)], greedy(6)));
  gate.open();
  for (int i = 1; i < 5; ++i) {
    Outcome o = collect(*hs[static_cast<size_t>(i - 1)]);
    ASSERT_FALSE(o.failed) << o.error.message;
    EXPECT_GE(o.results[0].cached_tokens, static_cast<int32_t>(shared.size())) << i;
    EXPECT_EQ(o.results[0].tokens, alone(ask[static_cast<size_t>(i)], greedy(6), 1, kCtx).tokens) << i;
  }
  EXPECT_FALSE(collect(*other).failed);
  sched_.reset();  // before the gate's state goes out of scope
}

// An idle conversation that shares only its system prompt with a new
// request (too little of what it holds for acquire_best to hand its slot
// over) still lends that prefix's blocks: the new request computes only
// its own part, and answers as alone; the idle conversation keeps its cache.
TEST_F(SchedulerTest, IdleConversationLendsItsSystemPromptBlocks) {
  constexpr int64_t kCtx = 1024;
  build(3, kCtx);
  const auto ps = prompts(6);
  std::vector<int32_t> system = ps[0];
  while (system.size() < 200) system.insert(system.end(), ps[3].begin() + 1, ps[3].end());
  std::vector<int32_t> first = system, second = system;
  first.insert(first.end(), ps[1].begin() + 1, ps[1].end());
  second.insert(second.end(), ps[2].begin() + 1, ps[2].end());
  SamplingParams longer = greedy(400);  // the first conversation then holds > 2x the shared part
  longer.ignore_eos = true;
  Outcome o1 = collect(*submit(first, longer));
  ASSERT_FALSE(o1.failed);
  Outcome o2 = collect(*submit(second, greedy(6)));
  ASSERT_FALSE(o2.failed);
  EXPECT_GE(o2.results[0].cached_tokens, static_cast<int32_t>(system.size()));
  EXPECT_EQ(o2.results[0].tokens, alone(second, greedy(6), 1, kCtx).tokens);
  // The first conversation's next turn still finds its whole history cached.
  std::vector<int32_t> turn2 = first;
  turn2.insert(turn2.end(), o1.results[0].tokens.begin(), o1.results[0].tokens.end());
  turn2.insert(turn2.end(), ps[4].begin() + 1, ps[4].end());
  Outcome o3 = collect(*submit(turn2, greedy(4)));
  ASSERT_FALSE(o3.failed);
  EXPECT_GE(o3.results[0].cached_tokens, static_cast<int32_t>(first.size() + o1.results[0].tokens.size()) - 1);
  EXPECT_EQ(o3.results[0].tokens, alone(turn2, greedy(4), 1, kCtx).tokens);
}

// -np (SchedulerOptions::max_sequences) bounds the live sequences whatever
// the pool holds: with 6 replicas and a bound of 3, no step has more than 3
// sequences, every job still completes, each as it does alone.
TEST_F(SchedulerTest, MaxSequencesBoundsLiveSequences) {
  constexpr int64_t kCtx = 256;
  std::atomic<int64_t> most{0};
  // The loop is held in its first step until all 6 are queued (no race
  // between the submissions and the first job's end).
  StepGate gate(/*open=*/false);
  SchedulerOptions so;
  so.max_sequences = 3;
  so.on_step = [&](int64_t, int64_t seqs) {
    raise_max(most, seqs);
    gate.wait();
  };
  build(6, kCtx, so);
  EXPECT_EQ(sched_->options().max_sequences, 3);
  const auto ps = prompts(6);
  std::vector<GenerationResult> solo;
  for (int i = 0; i < 6; ++i) solo.push_back(alone(ps[i], greedy(10 + 3 * i), 1, kCtx));
  std::vector<std::shared_ptr<JobHandle>> hs;
  for (int i = 0; i < 6; ++i) hs.push_back(submit(ps[i], greedy(10 + 3 * i)));
  gate.open();
  for (int i = 0; i < 6; ++i) {
    Outcome o = collect(*hs[i]);
    ASSERT_FALSE(o.failed) << o.error.message;
    EXPECT_EQ(o.results[0].tokens, solo[i].tokens) << i;
  }
  EXPECT_EQ(most.load(), 3);
  sched_.reset();  // before the gate's state goes out of scope
  // Unset, the bound is the pool's size.
  build(4, kCtx);
  EXPECT_EQ(sched_->options().max_sequences, 4);
}

// -np beyond the replica count (serve's -np 16 over --pool-size 1): 16
// sequences share the model's KV budget (16 blocks of 256 positions); 16
// short requests (one block each) all run in the same steps.
TEST_F(SchedulerTest, SixteenSequencesOnOneReplica) {
  constexpr int64_t kCtx = 2048;
  sched_.reset();
  // One replica, a KV budget of 16 blocks of 256 positions: -np 16 needs
  // no replica per sequence (each is the scheduler's own Sequence).
  auto b = build_pool_from_gguf(kStories, SamplingParams{}, kDefaultSeed, kCtx, 1, {}, model::KvType::kF16,
                                model::KvType::kF16, 16 * 256);
  ASSERT_TRUE(b.has_value()) << b.error().message;
  EXPECT_EQ(b->size, 1);
  EXPECT_EQ(b->kv_pool->capacity_blocks() * b->kv_pool->block_size(), 16 * 256);
  model_ = b->model;
  tok_ = b->tokenizer;
  pool_ = std::make_shared<EnginePool>(std::move(b->pool));
  kv_ = b->kv_pool;
  std::atomic<int64_t> most{0};
  // The loop is held after its first step until all 16 are queued, so the
  // other 15 join in the next one (the first needs 13 steps).
  StepGate gate(/*open=*/false);
  SchedulerOptions so;
  so.kv_pool = kv_;
  so.max_sequences = 16;
  so.on_step = [&](int64_t, int64_t seqs) {
    raise_max(most, seqs);
    gate.wait();
  };
  sched_ = std::make_unique<Scheduler>(pool_, model_, b->n_ctx, so);
  const auto ps = prompts(16);
  std::vector<std::shared_ptr<JobHandle>> hs;
  for (int i = 0; i < 16; ++i) hs.push_back(submit(ps[i % 6], greedy(12)));
  gate.open();
  for (int i = 0; i < 16; ++i) {
    Outcome o = collect(*hs[i]);
    ASSERT_FALSE(o.failed) << o.error.message;
    EXPECT_EQ(o.results[0].tokens, alone(ps[i % 6], greedy(12), 1, kCtx).tokens) << i;
  }
  EXPECT_EQ(most.load(), 16);
  EXPECT_EQ(pool_->available(), 1);  // the replica was never leased
  sched_.reset();                    // before the gate's state goes out of scope
}

// set_notify: a reader that never waits (the server's streams) sees every
// event: the notifier runs once per event, and once at once when events
// were already queued when it was set.
TEST_F(SchedulerTest, NotifierRunsForEveryEvent) {
  build(2, 128);
  const auto ps = prompts(2);
  const GenerationResult solo = alone(ps[0], greedy(12), 1, 128);
  auto h = submit(ps[0], greedy(12));
  ASSERT_TRUE(h);
  std::mutex mu;
  std::condition_variable cv;
  int notified = 0;
  std::string text;
  bool done = false;
  h->set_notify([&] {
    std::vector<JobEvent> evs;
    h->wait(evs, Clock::now());  // never blocks
    std::lock_guard lock(mu);
    ++notified;
    for (auto& e : evs) {
      if (e.kind == JobEvent::Kind::kText) text += e.text;
      if (e.kind == JobEvent::Kind::kDone) done = true;
    }
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return done; }));
    EXPECT_EQ(text, solo.text);
    EXPECT_GE(notified, 1);  // no event was missed: the last call saw kDone
  }
  // Set after the job ended with its events unread: runs at once.
  auto h2 = submit(ps[1], greedy(3));
  ASSERT_TRUE(eventually([&] { return h2->ended(); }));
  int late = 0;
  h2->set_notify([&] { ++late; });
  EXPECT_EQ(late, 1);
  h->set_notify(nullptr);
}

// The last reference to a scheduler made by Scheduler::create may go away on
// its own loop thread: here a job's notify callback (which runs there) holds
// the only one and drops it when the job is done, as the server's request
// pump does when an unloaded model's last request finishes. A thread cannot
// join itself (std::thread::join threw EDEADLK from ~Scheduler and the
// process terminated); the deletion must move off the loop thread and stop
// the loop, after the job has ended with kDone.
TEST_F(SchedulerTest, LastReferenceReleasedOnTheLoopThreadStopsTheLoopCleanly) {
  build(1, 128);
  sched_.reset();
  const long holders = pool_.use_count();  // the scheduler adds one while it exists
  std::shared_ptr<Scheduler> owned = Scheduler::create(pool_, model_, 128);
  ASSERT_EQ(pool_.use_count(), holders + 1);
  CompletionJob j;
  j.prompt = prompts(1)[0];
  // Long enough that the job cannot end before set_notify below is installed
  // (a job already done would run the callback on this thread).
  j.params = greedy(96);
  j.params.ignore_eos = true;
  auto h = owned->submit(std::move(j));
  ASSERT_TRUE(h.has_value()) << h.error().message;
  std::shared_ptr<JobHandle> handle = *h;
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;  // set only after the callback saw kDone
  std::thread::id released_on;
  // The callback owns the scheduler; `owned` gives its reference up below.
  auto holder = std::make_shared<std::shared_ptr<Scheduler>>(std::move(owned));
  handle->set_notify([holder, &handle, &mu, &cv, &released, &released_on] {
    std::vector<JobEvent> evs;
    handle->wait(evs, Clock::now());  // never blocks
    bool finished = false;
    for (const auto& e : evs) finished = finished || e.kind == JobEvent::Kind::kDone;
    if (!finished || !*holder) return;
    holder->reset();  // the last reference, on the loop thread
    std::lock_guard lock(mu);
    released = true;
    released_on = std::this_thread::get_id();
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return released; }));
    EXPECT_NE(released_on, std::this_thread::get_id());
  }
  // The deferred deletion ran to its end: the scheduler's own reference to
  // the engine pool is gone, and with it every lease (the replica is free).
  ASSERT_TRUE(eventually([&] { return pool_.use_count() == holders; }));
  EXPECT_EQ(pool_->available(), 1);
  handle->set_notify(nullptr);
}

// A seeded request at temperature > 0 reproduces exactly whatever shares its
// steps; different seeds give different text.
TEST_F(SchedulerTest, SeededSamplingReproducesUnderLoad) {
  constexpr int64_t kCtx = 256;
  build(6, kCtx);
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 40;
  p.ignore_eos = true;
  const auto ps = prompts(6);
  const GenerationResult ref = alone(ps[0], p, 1234, kCtx);
  std::vector<std::shared_ptr<JobHandle>> hs;
  hs.push_back(submit(ps[0], p, 1234));
  for (int i = 1; i < 6; ++i) hs.push_back(submit(ps[i], p, 99 + i));
  hs.push_back(submit(ps[0], p, 4321));
  std::vector<Outcome> out;
  for (auto& h : hs) out.push_back(collect(*h));
  EXPECT_EQ(out[0].results[0].tokens, ref.tokens);
  EXPECT_NE(out.back().results[0].tokens, ref.tokens) << "seeds 1234 and 4321 gave the same 40 tokens";
}

// n = 4: the prompt is computed once; choice i equals a lone run with seed + i.
TEST_F(SchedulerTest, FourChoicesPrefillOnce) {
  constexpr int64_t kCtx = 256;
  SchedulerOptions so;
  so.prompt_cache = false;  // the siblings get the prompt's KV by copy, not from the cache
  build(4, kCtx, so);
  SamplingParams p;
  p.temperature = 0.9f;
  p.max_tokens = 24;
  const auto prompt = prompts(8)[7];
  auto h = submit(prompt, p, 500, 4);
  Outcome o = collect(*h);
  ASSERT_FALSE(o.failed) << o.error.message;
  ASSERT_EQ(o.results.size(), 4u);
  const SchedulerStats st = sched_->stats();
  EXPECT_EQ(st.prompt_tokens, prompt.size()) << "the prompt was computed more than once";
  // The siblings share the prompt's KV: not prefix-cache hits (the cache is
  // off: no lookups, no hits; hits never exceed lookups).
  EXPECT_EQ(st.cached_tokens, 0u);
  EXPECT_EQ(st.cache_hits, 0u);
  EXPECT_EQ(st.cache_queried_tokens, 0u);
  for (int i = 0; i < 4; ++i) {
    const GenerationResult solo = alone(prompt, p, 500 + i, kCtx);
    EXPECT_EQ(o.results[i].tokens, solo.tokens) << "choice " << i;
    EXPECT_EQ(o.results[i].text, o.streamed[i]);
  }
  EXPECT_NE(o.results[0].tokens, o.results[1].tokens);
}

// A second turn that extends the first (prompt + answer + more) reuses the
// cached prefix: only the new tokens are computed, and the answer is the same
// as without the cache.
TEST_F(SchedulerTest, PromptCacheReusesTheLongestPrefix) {
  constexpr int64_t kCtx = 256;
  build(3, kCtx);
  const auto first_prompt = tok_->encode_prompt("Once upon a time");
  auto h1 = submit(first_prompt, greedy(20));
  Outcome o1 = collect(*h1);
  ASSERT_FALSE(o1.failed);
  const GenerationResult& a1 = o1.results[0];
  // Keep the other slots busy-then-idle with unrelated prompts, so choosing the right slot matters.
  auto other = submit(tok_->encode_prompt("The little dog"), greedy(5));
  collect(*other);
  std::vector<int32_t> second = first_prompt;
  second.insert(second.end(), a1.tokens.begin(), a1.tokens.end());
  const auto more = tok_->encode("He said hello.");
  second.insert(second.end(), more.begin(), more.end());
  const uint64_t computed_before = sched_->stats().prompt_tokens;
  auto h2 = submit(second, greedy(10));
  Outcome o2 = collect(*h2);
  ASSERT_FALSE(o2.failed);
  const GenerationResult& a2 = o2.results[0];
  // The prefix index holds prompt + the answer but its last sampled token
  // (which never ran: generation stopped after sampling it).
  EXPECT_GE(a2.cached_tokens, static_cast<int32_t>(first_prompt.size() + a1.tokens.size()) - 1);
  EXPECT_EQ(sched_->stats().prompt_tokens - computed_before, second.size() - a2.cached_tokens);
  EXPECT_EQ(a2.tokens, alone(second, greedy(10), 1, kCtx).tokens);
  EXPECT_GE(sched_->stats().cache_hits, 1u);
}

// A step hook for tests that count steps instead of time:
// SchedulerOptions::on_step numbers the steps (1-based, as
// SchedulerStats::steps and JobEvent::step) and, on the scheduler's loop
// thread after that step's forward and before its sampling, runs `fn(step,
// tokens, sequences)` (set and cleared from the test thread) and then the
// gate: while held, the loop waits there, so the test acts at a known step
// with nothing advancing. Shared with the scheduler's callback, so it
// outlives the loop; Release (RAII) opens the gate even when a test fails.
struct StepHook {
  std::mutex mu;
  std::function<void(uint64_t, int64_t, int64_t)> fn;  // guarded by mu
  std::atomic<uint64_t> steps{0};
  // The gate (guarded by gmu).
  std::mutex gmu;
  std::condition_variable gcv;
  bool holding = false;  // steps stop in the hook
  int go = 0;            // steps allowed past the gate while holding
  uint64_t held_at = 0;  // the step waiting in the hook (0: none)

  static std::shared_ptr<StepHook> install(SchedulerOptions& so) {
    auto h = std::make_shared<StepHook>();
    so.on_step = [h](int64_t tokens, int64_t seqs) {
      const uint64_t k = h->steps.fetch_add(1) + 1;
      {
        std::lock_guard lock(h->mu);
        if (h->fn) h->fn(k, tokens, seqs);
      }
      std::unique_lock lock(h->gmu);
      if (!h->holding) return;
      if (h->go > 0) {
        --h->go;
        return;
      }
      h->held_at = k;
      h->gcv.notify_all();
      h->gcv.wait(lock, [&] { return !h->holding || h->go > 0; });
      if (h->holding) --h->go;
      h->held_at = 0;
    };
    return h;
  }
  void set(std::function<void(uint64_t, int64_t, int64_t)> f) {
    std::lock_guard lock(mu);
    fn = std::move(f);
  }
  // Makes the loop stop at its next step (call before submitting the work
  // that makes steps run); wait_held() returns that step once it waits
  // there (0 if none came within 120 s).
  void arm() {
    std::lock_guard lock(gmu);
    holding = true;
    go = 0;
  }
  uint64_t wait_held() {
    std::unique_lock lock(gmu);
    gcv.wait_for(lock, 120s, [&] { return held_at != 0; });
    return held_at;
  }
  // Held: lets the held step finish and holds the next one; returns it (0: none within 120 s).
  uint64_t step() {
    std::unique_lock lock(gmu);
    const uint64_t was = held_at;
    ++go;
    gcv.notify_all();
    gcv.wait_for(lock, 120s, [&] { return held_at != 0 && held_at != was; });
    return held_at != was ? held_at : 0;
  }
  void release() {
    std::lock_guard lock(gmu);
    holding = false;
    go = 0;
    gcv.notify_all();
  }
  struct Release {
    std::shared_ptr<StepHook> h;
    ~Release() { h->release(); }
  };
};

// Issue 9: a short request arriving while a long prompt (2,000 tokens:
// stories260K's context is 2,048) is being processed gets its first token
// within its own prompt time + 3 steps.
// Counted in steps, so load cannot make it flaky: the short request is
// submitted from the hook of a known step k (on the loop thread, so no step
// runs between reading k and submitting), and its first event names the
// step that sampled it.
TEST_F(SchedulerTest, ShortRequestIsNotStalledByALongPrompt) {
  constexpr int64_t kCtx = 2048;
  constexpr int64_t kBatch = 16;  // a 2,000-token prompt takes 125 steps
  SchedulerOptions so;
  so.batch_size = kBatch;
  auto hook = StepHook::install(so);
  build(2, kCtx, so);
  std::vector<int32_t> longp = tok_->encode_prompt("Once upon a time");
  while (longp.size() < 2000) {
    const auto more = tok_->encode(" Once upon a time, there was a little girl named Lily.");
    longp.insert(longp.end(), more.begin(), more.end());
  }
  longp.resize(2000);
  const auto shortp = tok_->encode_prompt("The little dog");
  SamplingParams p3 = greedy(3);
  p3.ignore_eos = true;
  const uint64_t own_prompt_steps = (shortp.size() + kBatch - 1) / kBatch;  // alone, in steps

  std::shared_ptr<JobHandle> hs;  // written by the hook before `submitted_at`
  std::atomic<uint64_t> submitted_at{0};
  hook->set([&](uint64_t k, int64_t, int64_t) {
    if (submitted_at.load() != 0 || k < 20) return;  // the long prompt is 20 steps (320 tokens) in
    CompletionJob j;
    j.prompt = shortp;
    j.params = p3;
    auto h = sched_->submit(std::move(j));
    if (!h) return;
    hs = *h;
    submitted_at = k;
  });
  auto hl = submit(longp, greedy(4));  // after the hook is set: its step 20 is the long prompt's 20th
  ASSERT_TRUE(eventually([&] { return submitted_at.load() != 0; }));
  hook->set(nullptr);
  ASSERT_NE(hs, nullptr);

  // Every event of `h` until it ended: the step of its first token, its text, its result.
  struct Read {
    uint64_t first_step = 0;
    std::string text;
    std::optional<GenerationResult> result;
  };
  auto read_all = [](JobHandle& h) {
    Read r;
    const auto until = Clock::now() + 300s;
    for (;;) {
      const bool ended = h.ended();
      std::vector<JobEvent> evs;
      h.wait(evs, ended ? Clock::now() : Clock::now() + 100ms);
      for (auto& e : evs) {
        if (e.kind == JobEvent::Kind::kText) {
          if (r.first_step == 0) r.first_step = e.step;
          r.text += e.text;
        }
        if (e.kind == JobEvent::Kind::kDone) r.result = std::move(e.result);
      }
      if ((ended && evs.empty()) || Clock::now() > until) return r;
    }
  };
  const Read rs = read_all(*hs);
  const uint64_t first_token_step = rs.first_step;
  ASSERT_GT(first_token_step, submitted_at.load());
  EXPECT_LE(first_token_step - submitted_at.load(), own_prompt_steps + 3)
      << "submitted at step " << submitted_at.load() << ", first token at step " << first_token_step;
  ASSERT_TRUE(rs.result.has_value());
  EXPECT_EQ(rs.result->tokens, alone(shortp, p3, 1, kCtx).tokens);  // the batch did not change its answer

  // The long prompt was still being processed then, and is unharmed.
  const Read rl = read_all(*hl);
  const uint64_t long_first_step = rl.first_step;
  ASSERT_TRUE(rl.result.has_value());
  EXPECT_GE(long_first_step, longp.size() / kBatch) << "the long prompt cannot finish in fewer steps";
  EXPECT_GT(long_first_step, first_token_step);
  EXPECT_EQ(rl.result->tokens, alone(longp, greedy(4), 1, kCtx).tokens);
}

// Issue 9: a client that leaves while queued, during prompt processing or
// while decoding stops within one step, and its slot and KV come back.
// Deterministic under load: the loop is held at a known step k (StepHook)
// while the test cancels, and what followed is read in steps (nothing else
// runs then, so the loop idles once the slot is free and the count stops).
TEST_F(SchedulerTest, CancelWhileQueuedPrefillingOrDecodingFreesTheSlot) {
  constexpr int64_t kCtx = 2048;
  SchedulerOptions so;
  so.batch_size = 1;  // a prompt takes one step per token: "prefilling" lasts
  auto hook = StepHook::install(so);
  StepHook::Release open_at_exit{hook};
  build(1, kCtx, so);
  SamplingParams forever = greedy(1900);
  forever.ignore_eos = true;
  std::vector<int32_t> longp = tok_->encode_prompt("Once upon a time");
  while (longp.size() < 1000) longp.push_back(longp[1 + longp.size() % 3]);
  const int64_t kv_blocks = kv_->capacity_blocks();
  auto kv_free = [&] { return kv_->usage().pinned == 0 && kv_->available_blocks() == kv_blocks; };

  // Queued: `a` runs (its prompt's first tokens), `q` waits for the one slot.
  hook->arm();
  auto a = submit(longp, forever);
  ASSERT_NE(hook->wait_held(), 0u);
  auto q = submit(longp, forever);
  uint64_t k = hook->step();  // the loop moved `q` into its queue (no slot) before this step
  ASSERT_NE(k, 0u);
  ASSERT_EQ(sched_->stats().waiting, 1);
  ASSERT_EQ(sched_->stats().running, 1);
  q->cancel();
  k = hook->step();  // one step later
  ASSERT_NE(k, 0u);
  EXPECT_TRUE(q->ended()) << "still queued one step after the cancel";
  EXPECT_EQ(sched_->stats().waiting, 0);
  Outcome oq = collect(*q);
  EXPECT_TRUE(oq.failed);
  EXPECT_EQ(oq.error.code, core::Errc::kCancelled);
  EXPECT_EQ(sched_->stats().running, 1);  // a still runs
  EXPECT_FALSE(a->ended());

  // Prefilling: `a`, a few of its 1,000 prompt tokens in, is cancelled at
  // step k: at most one more step runs, then its slot is back and no KV
  // block is pinned (its blocks stay only as evictable prompt cache).
  EXPECT_LT(k, 100u);
  a->cancel();
  const uint64_t a_cancel = k;
  hook->release();
  Outcome oa = collect(*a);
  ASSERT_FALSE(oa.failed);
  EXPECT_EQ(oa.results[0].finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(oa.results[0].completion_tokens, 0);
  ASSERT_TRUE(eventually([&] { return sched_->stats().running == 0 && kv_free(); }));
  EXPECT_LE(hook->steps.load() - a_cancel, 1u) << "more than one step ran after the cancel";

  // Decoding: `d` has sampled tokens; cancelled at a held step k.
  hook->arm();
  auto d = submit(tok_->encode_prompt("Once"), forever);
  k = hook->wait_held();
  ASSERT_NE(k, 0u);
  int d_texts = 0;
  for (int i = 0; i < 20 && d_texts < 3; ++i) {
    std::vector<JobEvent> evs;
    d->wait(evs, Clock::now());
    d_texts += static_cast<int>(evs.size());
    if (d_texts < 3) k = hook->step();
    ASSERT_NE(k, 0u);
  }
  ASSERT_GE(d_texts, 3);
  d->cancel();
  hook->release();
  Outcome od = collect(*d);
  ASSERT_FALSE(od.failed);
  EXPECT_EQ(od.results[0].finish_reason, FinishReason::kCancelled);
  EXPECT_LT(od.results[0].completion_tokens, 1900);
  ASSERT_TRUE(eventually([&] { return sched_->stats().running == 0 && kv_free(); }));
  EXPECT_LE(hook->steps.load() - k, 1u) << "more than one step ran after the cancel";
}

// n > 1, cancelled while choice 0 runs and choice 1 still waits for a slot
// (one replica): every choice ends, each with one kDone (the server's stream
// waits for n of them; it used to get only the started ones and hang).
TEST_F(SchedulerTest, CancelWithChoicesNotStartedEndsEveryChoice) {
  // Choice 0 must still run when the test reads its first events: without
  // speculation, whose accepted proposals (this greedy text loops) can end
  // its 400 tokens in a few dozen steps.
  SchedulerOptions so;
  so.spec.type = SpecType::kNone;
  build(1, 512, so);
  SamplingParams p = greedy(400);
  p.ignore_eos = true;
  auto h = submit(tok_->encode_prompt("Once upon a time"), p, 1, /*n=*/3);
  std::vector<JobEvent> evs;
  ASSERT_TRUE(eventually([&] {
    h->wait(evs, Clock::now() + 10ms);
    return !evs.empty();
  }));
  for (const auto& e : evs) ASSERT_EQ(e.choice, 0) << "only one replica: choice 0 runs alone";
  EXPECT_EQ(sched_->stats().waiting, 1) << "choices 1 and 2 wait for the slot";
  h->cancel();
  Outcome o = collect(*h, 60s);
  ASSERT_TRUE(h->ended()) << "the job never ended";
  ASSERT_FALSE(o.failed) << o.error.message;
  ASSERT_EQ(o.results.size(), 3u);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(o.results[c].finish_reason, FinishReason::kCancelled) << "choice " << c;
  EXPECT_LT(o.results[0].completion_tokens, 400);
  EXPECT_EQ(o.results[1].completion_tokens, 0);
  EXPECT_EQ(o.results[2].completion_tokens, 0);
  EXPECT_TRUE(eventually([&] { return sched_->stats().waiting == 0 && sched_->stats().running == 0; }));
}

// Deadlines: a request still queued at its deadline fails with kTimeout; one
// running at its deadline ends with what it produced (kLength, timed_out).
TEST_F(SchedulerTest, DeadlineWhileRunningReturnsWhatWasProduced) {
  constexpr int64_t kCtx = 2048;
  SchedulerOptions so;
  // Throttled steps (>= 2 ms each), so 1900 tokens cannot finish in time.
  so.on_step = [](int64_t, int64_t) { std::this_thread::sleep_for(2ms); };
  build(1, kCtx, so);
  SamplingParams forever = greedy(1900);
  forever.ignore_eos = true;
  auto a = submit(tok_->encode_prompt("Once upon a time"), forever, 1, 1, Clock::now() + 1500ms);
  ASSERT_TRUE(eventually([&] { return sched_->stats().running == 1; }));
  auto q = submit(tok_->encode_prompt("Once"), greedy(4), 1, 1, Clock::now() + 300ms);
  Outcome oq = collect(*q);
  EXPECT_TRUE(oq.failed);
  EXPECT_EQ(oq.error.code, core::Errc::kTimeout);
  Outcome oa = collect(*a);
  ASSERT_FALSE(oa.failed) << oa.error.message;
  EXPECT_EQ(oa.results[0].finish_reason, FinishReason::kLength);
  EXPECT_TRUE(oa.results[0].timed_out);
  EXPECT_GT(oa.results[0].completion_tokens, 0);
  EXPECT_LT(oa.results[0].completion_tokens, 1900);
  EXPECT_EQ(oa.streamed[0], oa.results[0].text);
}

// A bounded queue refuses beyond max_queue; the destructor ends whatever is left.
TEST_F(SchedulerTest, BoundedQueueAndShutdown) {
  constexpr int64_t kCtx = 2048;
  SchedulerOptions so;
  so.max_queue = 1;
  build(1, kCtx, so);
  SamplingParams forever = greedy(1900);
  forever.ignore_eos = true;
  auto a = submit(tok_->encode_prompt("Once"), forever);
  ASSERT_TRUE(eventually([&] { return sched_->stats().running == 1; }));
  CompletionJob j;
  j.prompt = tok_->encode_prompt("The");
  j.params = greedy(2);
  auto q1 = sched_->submit(j);
  ASSERT_TRUE(q1.has_value());
  EXPECT_TRUE(eventually([&] { return sched_->saturated(); }));  // 1 running, 1 waiting
  auto q2 = sched_->submit(j);
  ASSERT_FALSE(q2.has_value());
  EXPECT_EQ(q2.error().code, core::Errc::kResourceExhausted);
  sched_.reset();
  EXPECT_TRUE(a->ended());
  EXPECT_TRUE((*q1)->ended());
  EXPECT_EQ(pool_->available(), 1);
}

}  // namespace
}  // namespace bonsai::engine

namespace bonsai::engine {
namespace {

// The second chat turn reuses prompt + the first answer but its last token
// (cached_tokens >= prompt + completion_tokens - 1: the last sampled token,
// an EOS or max_tokens' last, never ran), and answers as without the cache.
TEST_F(SchedulerTest, SecondTurnReusesPromptAndWholeAnswer) {
  constexpr int64_t kCtx = 256;
  build(2, kCtx);
  const auto p1 = tok_->encode_prompt("Lily and Ben went to the park");
  auto h1 = submit(p1, greedy(200));  // long enough to end with EOS
  Outcome o1 = collect(*h1);
  ASSERT_FALSE(o1.failed) << o1.error.message;
  const GenerationResult& a1 = o1.results[0];
  const bool eos = a1.finish_reason == FinishReason::kStop;  // ended by EOS (else max_tokens)
  ASSERT_EQ(a1.completion_tokens, static_cast<int32_t>(a1.tokens.size()) + (eos ? 1 : 0));
  ASSERT_TRUE(eventually([&] { return sched_->stats().running == 0; }));
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), a1.tokens.begin(), a1.tokens.end());
  if (eos) p2.push_back(tok_->eos_id());
  const auto more = tok_->encode_prompt("The little dog");
  p2.insert(p2.end(), more.begin(), more.end());
  const uint64_t computed_before = sched_->stats().prompt_tokens;
  auto h2 = submit(p2, greedy(12));
  Outcome o2 = collect(*h2);
  ASSERT_FALSE(o2.failed) << o2.error.message;
  const GenerationResult& a2 = o2.results[0];
  EXPECT_GE(a2.cached_tokens, static_cast<int32_t>(p1.size()) + a1.completion_tokens - 1);
  EXPECT_EQ(sched_->stats().prompt_tokens - computed_before, p2.size() - static_cast<size_t>(a2.cached_tokens));
  EXPECT_EQ(a2.tokens, alone(p2, greedy(12), 1, kCtx).tokens);
}

// A KV budget of two blocks and four free slots: new sequences wait in the
// queue until KV is free (never more than two run at once), nobody is
// preempted, and every answer is what it is alone.
TEST_F(SchedulerTest, FullKvBudgetMakesNewWorkWaitAndRunningWorkFinish) {
  constexpr int64_t kCtx = 128;
  build_budget(4, kCtx, /*budget=*/2 * 128, /*block=*/128);
  SamplingParams p = greedy(100);
  p.ignore_eos = true;
  const auto ps = prompts(4);
  std::vector<std::shared_ptr<JobHandle>> hs;
  for (int i = 0; i < 4; ++i) hs.push_back(submit(ps[i], p));
  std::vector<Timeline> tl(4);
  for (int i = 0; i < 4; ++i) {
    Outcome o = collect_steps(*hs[i], tl[i]);
    ASSERT_FALSE(o.failed) << o.error.message;
    EXPECT_EQ(o.results[0].tokens, alone(ps[i], p, 1, kCtx).tokens) << "request " << i;
    EXPECT_EQ(o.results[0].finish_reason, FinishReason::kLength);
  }
  // At no step did more than two sequences stream.
  for (int i = 0; i < 4; ++i) {
    int overlap = 0;
    for (int j = 0; j < 4; ++j) overlap += tl[j].first <= tl[i].first && tl[i].first <= tl[j].last;
    EXPECT_LE(overlap, 2) << "request " << i << " started while two others ran";
  }
  const SchedulerStats st = sched_->stats();
  EXPECT_EQ(st.preemptions, 0u);
  EXPECT_EQ(st.kv_capacity, 256);
  EXPECT_LE(kv_->usage().used, 2);
}

// A budget two sequences outgrow: the younger one is preempted (KV freed)
// and resumed later by recompute; seeded sampling at temperature 1 continues
// bit-identically (same tokens as alone), and the older one never waits.
TEST_F(SchedulerTest, PreemptedSequenceResumesBitIdentical) {
  constexpr int64_t kCtx = 160;
  build_budget(2, kCtx, /*budget=*/5 * 32, /*block=*/32);
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 120;
  p.ignore_eos = true;
  const auto ps = prompts(2);
  auto older = submit(ps[0], p, 77);
  ASSERT_TRUE(eventually([&] { return sched_->stats().running == 1; }));
  auto younger = submit(ps[1], p, 78);
  Timeline t_old, t_young;
  Outcome o_old = collect_steps(*older, t_old);
  Outcome o_young = collect_steps(*younger, t_young);
  ASSERT_FALSE(o_old.failed) << o_old.error.message;
  ASSERT_FALSE(o_young.failed) << o_young.error.message;
  const SchedulerStats st = sched_->stats();
  EXPECT_GE(st.preemptions, 1u) << "the budget should have forced a preemption";
  EXPECT_EQ(o_old.results[0].tokens, alone(ps[0], p, 77, kCtx).tokens);
  EXPECT_EQ(o_young.results[0].tokens, alone(ps[1], p, 78, kCtx).tokens);
  EXPECT_EQ(o_young.streamed[0], o_young.results[0].text);
  EXPECT_EQ(o_old.results[0].completion_tokens, 120);
  EXPECT_EQ(o_young.results[0].completion_tokens, 120);
  // The younger one streamed its last text after the older one's (it waited).
  EXPECT_GT(t_young.last, t_old.last);
  EXPECT_TRUE(eventually([&] { return kv_->usage().pinned == 0; }));
}

// n = 4 in a shared KV pool: the prompt runs once and the choices share its
// blocks (only the partial last block is copied, on write).
TEST_F(SchedulerTest, FourChoicesShareThePromptBlocks) {
  constexpr int64_t kCtx = 256;
  build_budget(4, kCtx, /*budget=*/4 * 256, /*block=*/32);
  SamplingParams p;
  p.temperature = 0.9f;
  p.max_tokens = 8;
  auto prompt = prompts(30)[29];
  while (prompt.size() < 70) prompt.push_back(prompt[1 + prompt.size() % 5]);
  auto h = submit(prompt, p, 500, 4);
  Outcome o = collect(*h);
  ASSERT_FALSE(o.failed) << o.error.message;
  ASSERT_EQ(o.results.size(), 4u);
  EXPECT_EQ(sched_->stats().prompt_tokens, prompt.size());
  // One lookup of the prompt (choice 0's), nothing cached yet: the siblings'
  // shared prompt is not counted as hits (vllm:prefix_cache_hits <= queries).
  EXPECT_EQ(sched_->stats().cache_queried_tokens, prompt.size());
  EXPECT_EQ(sched_->stats().cached_tokens, 0u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(o.results[i].tokens, alone(prompt, p, 500 + i, kCtx).tokens) << "choice " << i;
  // Blocks: the full prompt blocks (70 / 32 = 2) once, plus each choice's own
  // last block, kept in the prefix index (prompt + the answer but its last
  // token, which never ran) once per distinct content.
  ASSERT_TRUE(eventually([&] { return sched_->stats().running == 0; }));
  std::set<std::vector<int32_t>> tails;
  for (int i = 0; i < 4; ++i) tails.emplace(o.results[i].tokens.begin(), o.results[i].tokens.end() - 1);
  const model::KvPool::Usage u = kv_->usage();
  EXPECT_EQ(u.pinned, 0);
  EXPECT_EQ(u.indexed, 2 + static_cast<int64_t>(tails.size()));
  EXPECT_EQ(u.used, u.indexed);
}

}  // namespace
}  // namespace bonsai::engine

namespace bonsai::engine {
namespace {

// Prompt lookup: the longest n-gram (3 down to 1) ending the sequence that
// occurs earlier, at its latest occurrence; what followed it, at most max.
TEST(NgramProposal, LongestThenLatestMatch) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 9, 2, 3, 4, 7, 1, 2, 3};
  EXPECT_EQ(ngram_proposal(a, 1, 3, 3), (std::vector<int32_t>{4, 9, 2}));  // [1 2 3] at 0
  // [2 3] ends it twice earlier (at 1 and 5, the latest wins): what followed 5.
  const std::vector<int32_t> b = {7, 2, 3, 4, 9, 2, 3, 5, 8, 2, 3};
  EXPECT_EQ(ngram_proposal(b, 1, 3, 8), (std::vector<int32_t>{5, 8, 2, 3}));
  EXPECT_EQ(ngram_proposal(b, 1, 3, 2), (std::vector<int32_t>{5, 8}));
  EXPECT_EQ(ngram_proposal(std::vector<int32_t>{4, 1, 4}, 1, 3, 8), (std::vector<int32_t>{1, 4}));  // n = 1
  EXPECT_TRUE(ngram_proposal(std::vector<int32_t>{4, 1, 4}, 2, 3, 8).empty());                      // n >= 2: no match
  EXPECT_TRUE(ngram_proposal(std::vector<int32_t>{1, 2, 3, 9}, 1, 3, 8).empty());
  EXPECT_TRUE(ngram_proposal(a, 1, 3, 0).empty());
  EXPECT_TRUE(ngram_proposal(std::vector<int32_t>{5}, 1, 3, 8).empty());
}

// The marginal rule (Leviathan et al. 2023): the (k+1)-th proposed token
// runs while a^(k+1) (1 + k c) > c E(k), E(k) = 1 + a + ... + a^k.
TEST(DraftLength, NextTokenMustBeatTheStepsYieldPerCost) {
  // a = 0.6, c = 0.1: k = 3 (a^4 = 0.1296 against 0.1 * 2.176 / 1.3 = 0.167),
  // where comparing a^j with c alone would take 4 (0.1296 > 0.1).
  EXPECT_EQ(draft_length(0.6, 0.1, 8), 3);
  // a = 0.5, c = 1/3 (stories260K's row): one token (0.5 > 1/3; then
  // 0.25 * 4/3 = 0.333 < 0.5 = c E(1)).
  EXPECT_EQ(draft_length(0.5, 1.0 / 3, 8), 1);
  EXPECT_EQ(draft_length(0.3, 1.0 / 3, 8), 0);  // a <= c: not even one
  EXPECT_EQ(draft_length(0.9, 0.0, 5), 5);      // free rows: all the room
  EXPECT_EQ(draft_length(0.9, 0.05, 2), 2);     // capped by the room
  EXPECT_EQ(draft_length(0.9, 0.05, 0), 0);
  EXPECT_EQ(draft_length(1.0, std::numeric_limits<double>::infinity(), 8), 0);  // held back
  EXPECT_EQ(draft_length(0.0, 0.01, 8), 0);
  // The length maximises E(k) / (1 + k c) over 0..room.
  for (const double a : {0.2, 0.5, 0.7, 0.9, 0.97}) {
    for (const double c : {0.01, 0.05, 0.2, 0.5}) {
      int64_t best = 0;
      double best_yield = 1.0, e = 1.0, r = 1.0;
      for (int64_t k = 1; k <= 16; ++k) {
        r *= a;
        e += r;
        if (e / (1.0 + static_cast<double>(k) * c) > best_yield + 1e-12) {
          best_yield = e / (1.0 + static_cast<double>(k) * c);
          best = k;
        }
      }
      EXPECT_EQ(draft_length(a, c, 16), best) << "a " << a << " c " << c;
    }
  }
}

// SpecGuard with injected step timings (no clock): warm-up of each mode,
// then the one with the higher tokens per second, probing the other.
namespace {
// Runs `steps` steps of one decode row: a plain step yields 1 token in
// plain_s, a speculating one spec_tokens in spec_s. Returns how many were allowed.
int run_guard(SpecGuard& g, int steps, double plain_s, int64_t spec_tokens, double spec_s, int64_t rows = 1) {
  int allowed = 0;
  for (int i = 0; i < steps; ++i) {
    const bool on = g.allow(rows);
    allowed += on ? 1 : 0;
    if (on)
      g.record(rows, true, spec_tokens * rows, spec_s);
    else
      g.record(rows, false, rows, plain_s);
  }
  return allowed;
}
}  // namespace

TEST(SpecGuard, WarmsUpBothModesThenKeepsTheFasterOne) {
  SpecGuard g;
  // Turns, plain first; the first plain step is slow (a cold start) and
  // weighs as one sample of the mean, not the whole estimate.
  for (int64_t i = 0; i < SpecGuard::kWarmup; ++i) {
    EXPECT_FALSE(g.allow(1)) << "plain, step " << 2 * i;
    g.record(1, false, 1, i == 0 ? 400e-6 : 100e-6);
    if (i + 1 < SpecGuard::kWarmup) {
      EXPECT_EQ(g.plain_rate(1), 0);
    }
    EXPECT_TRUE(g.allow(1)) << "speculation, step " << 2 * i + 1;
    g.record(1, true, 2, 180e-6);  // 2 tokens in 180 us: 11111 tok/s, faster
  }
  EXPECT_NEAR(g.plain_rate(1), 4 / 700e-6, 1e-6);
  EXPECT_NEAR(g.spec_rate(1), 2 / 180e-6, 1e-6);
  // A step the warm-up gave speculation but that proposed nothing counts as plain.
  g.record(1, false, 1, 100e-6);
  // Faster: allowed, except a plain step after 16, 32, 64, 128, 128, ...
  // steps without one (steps 17, 50, 115, 244 and 373 of these 400).
  const int allowed = run_guard(g, 400, 100e-6, 2, 180e-6);
  EXPECT_EQ(400 - allowed, 5);
}

TEST(SpecGuard, SlowerSpeculationStopsAndIsProbedUntilItPaysAgain) {
  SpecGuard g;
  // stories260K-like: about half the proposals are taken, but the steps
  // that verify them are slower than the cost model says: 1.5 tokens per
  // 190 us (7895 tok/s; injected as 3 per 380 us) against 1 per 120 us
  // (8333 tok/s) does not pay.
  run_guard(g, 2 * SpecGuard::kWarmup, 120e-6, 3, 380e-6);
  // Only probes, after 16, 32, 64, 128, 128 steps without one.
  int allowed = run_guard(g, 400, 120e-6, 3, 380e-6);
  EXPECT_EQ(allowed, 5);
  EXPECT_LT(g.spec_rate(1), g.plain_rate(1));
  // Proposals became good (4 tokens per 200 us, the text repeats): a probe
  // sees it and it switches, probing plain decoding now and then.
  allowed = run_guard(g, 600, 120e-6, 4, 200e-6);
  EXPECT_GT(allowed, 400);
  EXPECT_GT(g.spec_rate(1), g.plain_rate(1));
  // And back off when they are bad again (1 token per 160 us).
  allowed = run_guard(g, 600, 120e-6, 1, 160e-6);
  EXPECT_LT(allowed, 80);
  EXPECT_LT(g.spec_rate(1), g.plain_rate(1));
}

TEST(SpecGuard, OneStallDoesNotDecide) {
  SpecGuard g;
  run_guard(g, 40, 100e-6, 3, 180e-6);  // 16667 tok/s against 10000
  if (!g.allow(1)) {
    g.record(1, false, 1, 100e-6);  // (that was a probe of plain decoding)
    ASSERT_TRUE(g.allow(1));
  }
  // A speculating step stopped for a second (SIGSTOP, a descheduled thread)
  // counts as 3x the average (3 per 202.5 us on average after it): still faster.
  g.record(1, true, 3, 1.0);
  EXPECT_NEAR(g.spec_rate(1), 3 / 202.5e-6, 1e-3);
  EXPECT_GT(g.spec_rate(1), g.plain_rate(1) * (1 + SpecGuard::kMargin));
}

TEST(SpecGuard, EachBatchWidthHasItsOwnMeasure) {
  EXPECT_EQ(SpecGuard::width_of(1), 0u);
  EXPECT_EQ(SpecGuard::width_of(3), 1u);
  EXPECT_EQ(SpecGuard::width_of(4), 2u);
  EXPECT_EQ(SpecGuard::width_of(7), 2u);
  EXPECT_EQ(SpecGuard::width_of(8), 3u);
  EXPECT_EQ(SpecGuard::width_of(1 << 20), SpecGuard::kWidths - 1);
  SpecGuard g;
  run_guard(g, 40, 100e-6, 2, 180e-6, 1);  // one row: speculation pays
  EXPECT_GT(g.spec_rate(1), g.plain_rate(1) * (1 + SpecGuard::kMargin));
  // Eight rows (a batch where the extra rows cost more): its own warm-up
  // (plain first), then its own decision, the one-row one unchanged.
  EXPECT_EQ(g.spec_rate(8), 0);
  EXPECT_FALSE(g.allow(8));
  run_guard(g, 40, 400e-6, 2, 1000e-6, 8);         // 16 per 1000 us against 8 per 400 us
  EXPECT_NEAR(g.plain_rate(9), 8 / 400e-6, 1e-6);  // 9 rows: the same width as 8
  EXPECT_NEAR(g.spec_rate(15), 16 / 1000e-6, 1e-6);
  EXPECT_FALSE(g.allow(8));
  EXPECT_TRUE(g.allow(1));
  EXPECT_NEAR(g.spec_rate(1), 2 / 180e-6, 1e-6);
  // Ignored: no time, no token, no row.
  SpecGuard h;
  h.record(8, false, 8, 0);
  h.record(8, false, 0, 1e-3);
  h.record(0, false, 8, 1e-3);
  EXPECT_FALSE(h.allow(8)) << "no plain sample counted: still plain's turn";
  h.record(8, false, 8, 1e-3);
  EXPECT_TRUE(h.allow(8)) << "one plain sample: speculation's turn";
}

TEST(SpecOptions, ValidatesAndParses) {
  EXPECT_TRUE(SpecOptions{}.validate().has_value());
  EXPECT_FALSE((SpecOptions{.draft_max = -1}).validate().has_value());
  EXPECT_FALSE((SpecOptions{.draft_max = kMaxDraft + 1}).validate().has_value());
  EXPECT_FALSE((SpecOptions{.draft_min = -2}).validate().has_value());
  EXPECT_FALSE((SpecOptions{.draft_p_min = 1.5f}).validate().has_value());
  EXPECT_EQ(*parse_spec_type("none"), SpecType::kNone);
  EXPECT_EQ(*parse_spec_type("ngram"), SpecType::kNgram);
  EXPECT_EQ(*parse_spec_type("draft"), SpecType::kDraft);
  EXPECT_STREQ(spec_type_name(SpecType::kDraft), "draft");
  auto bad = parse_spec_type("eagle");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("none, ngram or draft"), std::string::npos);
}

// Speculation (prompt lookup) on: every greedy request returns exactly the
// tokens (and logprobs, and grammar-constrained text) it returns without
// speculation, alone and with 4 other sequences sharing its steps, on
// stories260K and the Qwen3 fixture; proposals really ran and some were
// accepted, and verification widened the steps.
class SpecGreedyTest : public SchedulerTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(SpecGreedyTest, SameTokensAsWithoutSpeculationAloneAndBatched) {
  const std::string path = test::shared_path(GetParam());
  BONSAI_REQUIRE_FILE(path);
  constexpr int64_t kCtx = 512;
  std::atomic<int64_t> widest{0};
  SchedulerOptions so;
  so.on_step = [&](int64_t tokens, int64_t seqs) {
    if (tokens > seqs) raise_max(widest, tokens - seqs);  // (prompt chunks count too: checked below alone)
  };
  so.spec.type = SpecType::kNgram;  // off by default
  so.spec.row_cost = 0.05;          // propose the same way however fast this machine is now (not the measured cost)
  build_path(path, 5, kCtx, so);
  const SpecOptions off{.type = SpecType::kNone};
  const SpecOptions on{.type = SpecType::kNgram};
  // A passage that the answer partly repeats, and four plain story openings.
  const std::string passage =
      "Once upon a time, there was a little girl named Lily. She liked to play with her ball in the park. "
      "One day, Lily saw a big dog in the park. Once upon a time, there was a little girl named Lily. She";
  std::vector<std::vector<int32_t>> ps = {tok_->encode_prompt(passage)};
  for (auto& p : prompts(4)) ps.push_back(p);
  std::vector<SamplingParams> params;
  for (int i = 0; i < 5; ++i) params.push_back(greedy(60 + 7 * i));
  params[0].ignore_eos = true;
  params[1].logprobs = 3;  // logprobs from the target's rows
  params[2].grammar = *structured::Grammar::parse("root ::= [a-zA-Z ,.]+");
  params[3].repeat_penalty = 1.3f;  // penalties see the history each verified row would have seen
  params[3].repeat_last_n = 16;
  std::vector<GenerationResult> ref;
  for (int i = 0; i < 5; ++i) ref.push_back(alone(ps[i], params[i], 1, kCtx, off));
  auto same = [&](const GenerationResult& r, int i, const char* how) {
    EXPECT_EQ(r.tokens, ref[i].tokens) << how << " request " << i;
    EXPECT_EQ(r.text, ref[i].text) << how << " request " << i;
    EXPECT_EQ(r.finish_reason, ref[i].finish_reason) << how << " request " << i;
    ASSERT_EQ(r.logprobs.size(), ref[i].logprobs.size()) << how << " request " << i;
    for (size_t k = 0; k < r.logprobs.size(); ++k) {
      EXPECT_EQ(r.logprobs[k].token, ref[i].logprobs[k].token);
      EXPECT_EQ(r.logprobs[k].logprob, ref[i].logprobs[k].logprob) << how << " token " << k;
      EXPECT_EQ(r.logprobs[k].top, ref[i].logprobs[k].top) << how << " token " << k;
    }
  };
  // The engine path (run) speculates too, and agrees.
  for (int i = 0; i < 5; ++i) same(alone(ps[i], params[i], 1, kCtx, on), i, "engine");
  // Alone through the scheduler.
  for (int i = 0; i < 5; ++i) {
    Outcome o = collect(*submit(ps[i], params[i]));
    ASSERT_FALSE(o.failed) << o.error.message;
    same(o.results[0], i, "alone");
    EXPECT_EQ(o.streamed[0], o.results[0].text);
  }
  const SchedulerStats alone_st = sched_->stats();
  EXPECT_GT(alone_st.spec_ngram_proposed, 0u);
  EXPECT_GT(alone_st.spec_ngram_accepted, 0u);
  EXPECT_LE(alone_st.spec_ngram_accepted, alone_st.spec_ngram_proposed);
  // Five at once, twice (the second round from the prompt cache).
  for (int round = 0; round < 2; ++round) {
    std::vector<std::shared_ptr<JobHandle>> hs;
    for (int i = 0; i < 5; ++i) hs.push_back(submit(ps[i], params[i]));
    for (int i = 0; i < 5; ++i) {
      Outcome o = collect(*hs[i]);
      ASSERT_FALSE(o.failed) << o.error.message;
      same(o.results[0], i, "batched");
      EXPECT_EQ(o.streamed[0], o.results[0].text);
    }
  }
  EXPECT_GT(sched_->stats().spec_ngram_accepted, alone_st.spec_ngram_accepted);
  EXPECT_GT(widest.load(), 0);
  // With speculation off nothing is proposed.
  SchedulerOptions none;
  none.spec.type = SpecType::kNone;
  build_path(path, 1, kCtx, none);
  Outcome o = collect(*submit(ps[0], params[0]));
  same(o.results[0], 0, "spec off");
  EXPECT_EQ(sched_->stats().spec_ngram_proposed, 0u);
}

// With the measured cost (SpecOptions::row_cost unset) the drivers'
// SpecGuards decide from wall-clock step times whether greedy sequences
// propose, differently from run to run: whatever they decide, every greedy
// request returns exactly the tokens it returns without speculation, alone
// (engine and scheduler) and with 5 others sharing its steps.
TEST_F(SchedulerTest, GreedyTextIsTheSameWhateverTheGuardDecides) {
  constexpr int64_t kCtx = 512;
  SchedulerOptions so;
  so.spec.type = SpecType::kNgram;
  build(6, kCtx, so);
  const std::string passage =
      "Once upon a time, there was a little girl named Lily. She liked to play with her ball in the park. "
      "One day, Lily saw a big dog in the park. Once upon a time, there was a little girl named Lily. She";
  std::vector<std::vector<int32_t>> ps = {tok_->encode_prompt(passage), tok_->encode_prompt(passage + " liked")};
  for (auto& p : prompts(4)) ps.push_back(p);
  std::vector<GenerationResult> ref;
  for (size_t i = 0; i < ps.size(); ++i) {
    SamplingParams p = greedy(120);
    p.ignore_eos = true;
    ref.push_back(alone(ps[i], p, 1, kCtx, SpecOptions{.type = SpecType::kNone}));
    EXPECT_EQ(alone(ps[i], p, 1, kCtx, SpecOptions{.type = SpecType::kNgram}).tokens, ref[i].tokens)
        << "engine, request " << i;
    Outcome o = collect(*submit(ps[i], p));
    ASSERT_FALSE(o.failed) << o.error.message;
    EXPECT_EQ(o.results[0].tokens, ref[i].tokens) << "alone, request " << i;
  }
  for (int round = 0; round < 3; ++round) {
    std::vector<std::shared_ptr<JobHandle>> hs;
    for (size_t i = 0; i < ps.size(); ++i) {
      SamplingParams p = greedy(120);
      p.ignore_eos = true;
      hs.push_back(submit(ps[i], p));
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      Outcome o = collect(*hs[i]);
      ASSERT_FALSE(o.failed) << o.error.message;
      EXPECT_EQ(o.results[0].tokens, ref[i].tokens) << "batched, round " << round << ", request " << i;
      EXPECT_EQ(o.results[0].text, ref[i].text);
    }
  }
}

// Proposed tokens share batch_size with the decode tokens and prompt chunks:
// no step exceeds it, prompts keep their allowance, answers are unchanged.
TEST_F(SchedulerTest, ProposalsStayWithinTheBatchSize) {
  constexpr int64_t kCtx = 512;
  constexpr int64_t kBatch = 8;
  std::atomic<int64_t> widest{0};
  SchedulerOptions so;
  so.batch_size = kBatch;
  so.on_step = [&](int64_t tokens, int64_t) { raise_max(widest, tokens); };
  so.spec.type = SpecType::kNgram;
  so.spec.row_cost = 0.05;  // as above: independent of this machine's speed
  build(2, kCtx, so);
  const SpecOptions off{.type = SpecType::kNone};
  const auto loop = tok_->encode_prompt("She didn't know what to do. She didn't know what to do. She didn't know");
  std::vector<int32_t> longp = loop;
  while (longp.size() < 200) longp.insert(longp.end(), loop.begin() + 1, loop.end());
  SamplingParams pa = greedy(120);
  pa.ignore_eos = true;
  const GenerationResult ra = alone(loop, pa, 1, kCtx, off), rb = alone(longp, greedy(20), 1, kCtx, off);
  auto a = submit(loop, pa);
  auto b = submit(longp, greedy(20));
  Outcome oa = collect(*a), ob = collect(*b);
  ASSERT_FALSE(oa.failed || ob.failed);
  EXPECT_EQ(oa.results[0].tokens, ra.tokens);
  EXPECT_EQ(ob.results[0].tokens, rb.tokens);
  EXPECT_LE(widest.load(), kBatch);
  EXPECT_GT(sched_->stats().spec_ngram_accepted, 0u);
}

// A draft model (SpecType::kDraft, `-md FILE`): synth's tiny Qwen3 with
// seed 1 is the target; the same weights (seed 1) are a draft that agrees
// always, seed 2's a draft that agrees little (random weights, the same
// tokenizer). Models written per test process into a unique directory.
class DraftSpecTest : public SchedulerTest {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/bonsai_draft_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    for (const uint64_t seed : {1, 2}) {
      auto pre = synth::preset("tiny");
      ASSERT_TRUE(pre.has_value());
      ASSERT_TRUE(synth::write_model(path(seed), synth::Options{.preset = *pre, .seed = seed}).has_value());
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(uint64_t seed) const { return dir_ + "/tiny" + std::to_string(seed) + ".gguf"; }

  // Speculation by the draft model at `path`, every step proposing (row cost 0).
  SpecOptions draft_spec(const std::string& draft_path, int32_t draft_max = 4) const {
    auto d = model::Model::load(draft_path);
    EXPECT_TRUE(d.has_value());
    SpecOptions s{.type = SpecType::kDraft, .draft_max = draft_max, .draft_p_min = 0.0f, .row_cost = 0};
    s.proposer = draft_model_proposer(*d, model::KvType::kF16, model::KvType::kF16);
    return s;
  }

  std::string dir_;
};

// Greedy output with a draft model is the output without speculation, bit
// for bit, through the engine and the scheduler, alone and 3 at once
// (rejections roll the draft's cache back); a draft with the target's
// weights has every proposal accepted, a random one few; the counts are the
// draft's (spec_draft_*), none in the ngram ones.
TEST_F(DraftSpecTest, GreedySameTokensAsWithoutSpeculationAloneAndBatched) {
  constexpr int64_t kCtx = 256;
  for (const uint64_t draft_seed : {1, 2}) {
    SCOPED_TRACE("draft seed " + std::to_string(draft_seed));
    SchedulerOptions so;
    so.spec = draft_spec(path(draft_seed));
    build_path(path(1), 3, kCtx, so);
    const SpecOptions off{.type = SpecType::kNone};
    std::vector<std::vector<int32_t>> ps = {tok_->encode_prompt("hello world"), tok_->encode_prompt("the cat sat"),
                                            tok_->encode_prompt("a b c d e f")};
    std::vector<SamplingParams> params;
    for (int i = 0; i < 3; ++i) {
      params.push_back(greedy(40 + 9 * i));
      params.back().ignore_eos = true;
    }
    params[1].logprobs = 2;
    std::vector<GenerationResult> ref;
    for (int i = 0; i < 3; ++i) ref.push_back(alone(ps[i], params[i], 1, kCtx, off));
    auto same = [&](const GenerationResult& r, int i, const char* how) {
      EXPECT_EQ(r.tokens, ref[i].tokens) << how << " request " << i;
      EXPECT_EQ(r.text, ref[i].text) << how << " request " << i;
      ASSERT_EQ(r.logprobs.size(), ref[i].logprobs.size()) << how << " request " << i;
      for (size_t k = 0; k < r.logprobs.size(); ++k)
        EXPECT_EQ(r.logprobs[k].logprob, ref[i].logprobs[k].logprob) << how << " token " << k;
    };
    for (int i = 0; i < 3; ++i) {
      const GenerationResult r = alone(ps[i], params[i], 1, kCtx, so.spec);
      same(r, i, "engine");
      EXPECT_GT(r.draft_tokens, 0);
      if (draft_seed == 1) {
        EXPECT_EQ(r.draft_accepted, r.draft_tokens);  // the target's own weights
      }
    }
    for (int round = 0; round < 2; ++round) {
      std::vector<std::shared_ptr<JobHandle>> hs;
      for (int i = 0; i < 3; ++i) hs.push_back(submit(ps[i], params[i]));
      for (int i = 0; i < 3; ++i) {
        Outcome o = collect(*hs[i]);
        ASSERT_FALSE(o.failed) << o.error.message;
        same(o.results[0], i, "batched");
        EXPECT_EQ(o.streamed[0], o.results[0].text);
      }
    }
    const SchedulerStats st = sched_->stats();
    EXPECT_GT(st.spec_draft_proposed, 0u);
    EXPECT_EQ(st.spec_ngram_proposed, 0u);
    if (draft_seed == 1) {
      EXPECT_EQ(st.spec_draft_accepted, st.spec_draft_proposed);
    } else {
      EXPECT_LT(st.spec_draft_accepted, st.spec_draft_proposed / 2);  // a random draft agrees little
    }
  }
}

// A seeded sampled request with a draft model reproduces exactly under load
// (its proposal lengths depend on its own acceptance only: kSampledRowCost);
// the rejection rule's distribution is Verify.RejectionRuleKeepsTheTargetDistribution's
// (a draft model's arg-max proposal is a point mass, as prompt lookup's).
TEST_F(DraftSpecTest, SampledRequestReproducesUnderLoad) {
  constexpr int64_t kCtx = 256;
  SchedulerOptions so;
  so.spec = draft_spec(path(1));
  so.spec.row_cost = -1;  // sampled: kSampledRowCost
  build_path(path(1), 3, kCtx, so);
  SamplingParams p;
  p.temperature = 0.7f;
  p.max_tokens = 50;
  p.ignore_eos = true;
  const auto pr = tok_->encode_prompt("hello world");
  const GenerationResult ref = alone(pr, p, 1234, kCtx, so.spec);
  EXPECT_GT(ref.draft_accepted, 0);
  std::vector<std::shared_ptr<JobHandle>> hs;
  hs.push_back(submit(pr, p, 1234));
  hs.push_back(submit(tok_->encode_prompt("the cat"), p, 7));
  hs.push_back(submit(tok_->encode_prompt("one two three"), p, 8));
  std::vector<Outcome> out;
  for (auto& h : hs) out.push_back(collect(*h));
  EXPECT_EQ(out[0].results[0].tokens, ref.tokens);
  EXPECT_GT(sched_->stats().spec_draft_accepted, 0u);
}

// The tokenizer check: the same tokenizer passes; another vocabulary
// (stories260K's 512 tokens against synth's) is refused naming both files.
TEST_F(DraftSpecTest, DraftWithAnotherVocabularyIsRefusedNamingBothFiles) {
  auto load_tok = [](const std::string& p) {
    auto m = model::Model::load(p);
    EXPECT_TRUE(m.has_value());
    auto t = tokenizer::Tokenizer::from_gguf((*m)->file());
    EXPECT_TRUE(t.has_value());
    return *t;
  };
  const auto t1 = load_tok(path(1)), t2 = load_tok(path(2)), ts = load_tok(kStories);
  EXPECT_TRUE(check_draft_tokenizer(*t1, path(1), *t2, path(2)).has_value());
  auto bad = check_draft_tokenizer(*t1, path(1), *ts, kStories);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, core::Errc::kInvalidArgument);
  EXPECT_NE(bad.error().message.find(path(1)), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find(kStories), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("tokenizer"), std::string::npos) << bad.error().message;
}

INSTANTIATE_TEST_SUITE_P(Models, SpecGreedyTest,
                         ::testing::Values("models/stories260K/stories260K.gguf", "fixtures/qwen3-tiny-q1_0.gguf"));

// A seeded request at temperature > 0 with speculation on reproduces
// exactly under load (its proposal lengths depend on its own acceptance
// only), and the engine path draws the same; the rejection rule's
// distribution itself is Verify.RejectionRuleKeepsTheTargetDistribution's.
TEST_F(SchedulerTest, SpeculativeSampledRequestReproducesUnderLoad) {
  constexpr int64_t kCtx = 512;
  SchedulerOptions so;
  so.spec.type = SpecType::kNgram;
  build(6, kCtx, so);
  SamplingParams p;
  p.temperature = 0.5f;
  p.max_tokens = 80;
  p.ignore_eos = true;
  const auto ps = prompts(6);
  const GenerationResult ref = alone(ps[0], p, 1234, kCtx, so.spec);
  Outcome solo = collect(*submit(ps[0], p, 1234));
  EXPECT_EQ(solo.results[0].tokens, ref.tokens);
  std::vector<std::shared_ptr<JobHandle>> hs;
  hs.push_back(submit(ps[0], p, 1234));
  for (int i = 1; i < 6; ++i) hs.push_back(submit(ps[i], p, 99 + i));
  std::vector<Outcome> out;
  for (auto& h : hs) out.push_back(collect(*h));
  EXPECT_EQ(out[0].results[0].tokens, ref.tokens);
  EXPECT_GT(sched_->stats().spec_ngram_proposed, 0u);
}

}  // namespace
}  // namespace bonsai::engine
