// Where one decode step of N concurrent sequences spends its time (issue 9's
// serve criterion, split into its parts). For N = 1, 2, 4, 8, 16 and in
// interleaved rounds (so a shared machine's load changes hit every part
// alike), on one model file:
//   products  the forward's matrix products alone, each as its own
//             kernels::gemv / gemm over the model's own (mapped) weights with
//             N columns: q, k, v, o, gate, up, down per layer + the output
//             (T(N) of the criterion; the kernel bench times the same shapes
//             on synthetic matrices);
//   forward   Model::forward of a batch of N decode tokens, one per sequence
//             (each its own KV cache at depth ~kDepth): products + attention,
//             norms, RoPE, activations, logits;
//   step      the scheduler's steady decode step: N jobs (kDepth-token
//             prompts, temperature 0, ignore_eos) submitted to an
//             engine::Scheduler over an EnginePool of N replicas; the time
//             between consecutive steps that ran exactly N decode tokens
//             (SchedulerOptions::on_step): forward + sampling, text release,
//             events, admission.
// Prints medians (ms per step) and tok/s = N / step, plus the two overheads
// (forward - products: the model outside its products; step - forward: the
// scheduler's own work).
//
//   bonsai_bench_step -m MODEL -t THREADS [--rounds 3] [--steps 12] [--json FILE]
//   (the old positional form, bonsai_bench_step MODEL THREADS [ROUNDS] [STEPS], still works)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "bench_report.h"  // CLI11 flags, --json
#include "core/thread_pool.h"
#include "engine/engine_pool.h"
#include "engine/scheduler.h"
#include "kernels/kernels.h"
#include "model/kv_cache.h"
#include "model/model.h"

using namespace bonsai;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kDepth = 32;  // prompt tokens per sequence before decoding

using bench::median;  // bench_report.h

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// One forward's matrix products with n columns, each product on its own.
double products_ms(const model::Model& m, int n, core::ThreadPool& tp) {
  const auto& c = m.config();
  const auto& w = m.weights();
  const int64_t width = std::max<int64_t>({c.n_embd, c.n_ff, w.layers.front().wq.rows});
  static std::vector<float> x, y;
  x.assign(static_cast<size_t>(n * width), 0.5f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 97) / 97.0f - 0.5f;
  y.resize(static_cast<size_t>(n) * static_cast<size_t>(std::max<int64_t>(c.n_vocab, width)));
  auto run = [&](const kernels::MatrixView& mv) {
    if (n == 1) {
      kernels::gemv(mv, x.data(), y.data(), &tp);
    } else {
      kernels::gemm(mv, x.data(), n, y.data(), &tp);
    }
  };
  const auto t0 = Clock::now();
  for (const auto& l : w.layers) {
    for (const kernels::MatrixView* mv : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) run(*mv);
  }
  run(w.output);
  return ms_since(t0);
}

// Median time of `steps` forwards of n decode tokens (one per sequence).
double forward_ms(const model::Model& m, std::vector<std::unique_ptr<model::KvCache>>& caches, int n, int steps,
                  model::Workspace& ws, core::ThreadPool& tp) {
  const auto& c = m.config();
  std::vector<model::KvCache*> cs;
  for (int s = 0; s < n; ++s) cs.push_back(caches[static_cast<size_t>(s)].get());
  std::vector<float> logits(static_cast<size_t>(n) * static_cast<size_t>(c.n_vocab));
  std::vector<double> t;
  for (int k = 0; k < steps; ++k) {
    model::Batch b;
    for (int s = 0; s < n; ++s)
      b.add(static_cast<int32_t>((s * 131 + k * 17 + 5) % c.n_vocab),
            static_cast<int32_t>(cs[static_cast<size_t>(s)]->size()), s, true);
    const auto t0 = Clock::now();
    if (!m.forward(b, cs, ws, logits, tp)) std::abort();
    t.push_back(ms_since(t0));
  }
  return median(t);
}

// The prompt caches of the forward phase (outside the scheduler's pool), one
// per sequence, each filled with kDepth tokens.
std::vector<std::unique_ptr<model::KvCache>> filled_caches(const model::Model& m, int count, model::Workspace& ws,
                                                           core::ThreadPool& tp) {
  const auto& cfg = m.config();
  std::vector<std::unique_ptr<model::KvCache>> caches;
  for (int s = 0; s < count; ++s) {
    auto kc = model::KvCache::create(cfg, 4096);
    if (!kc) std::abort();
    caches.push_back(std::make_unique<model::KvCache>(std::move(*kc)));
    std::vector<int32_t> ids(kDepth);
    for (int i = 0; i < kDepth; ++i) ids[static_cast<size_t>(i)] = (s * 1009 + i * 31 + 3) % cfg.n_vocab;
    std::vector<float> lg(static_cast<size_t>(cfg.n_vocab));
    model::KvCache* one[] = {caches.back().get()};
    if (!m.forward(model::Batch::for_sequence(ids, 0), one, ws, lg, tp)) std::abort();
  }
  return caches;
}

// The scheduler's steady decode step, its step times recorded by on_step.
class StepTimer {
 public:
  StepTimer(engine::BuiltPool& built, const engine::SamplingParams& sp, int steps, int max_n, core::ThreadPool& tp)
      : sp_(sp), steps_(steps), n_vocab_(built.model->config().n_vocab), sched_(make(built, max_n, tp)) {}

  // Median time (ms) between consecutive steps that ran exactly n decode
  // tokens, over n jobs submitted together (see the file comment).
  double step_ms(int n, int round) {
    {
      std::lock_guard lock(mu_);
      marks_.clear();
    }
    std::vector<std::shared_ptr<engine::JobHandle>> hs;
    for (int s = 0; s < n; ++s) {
      engine::CompletionJob j;
      for (int i = 0; i < kDepth; ++i) j.prompt.push_back((round * 7 + s * 1013 + i * 37 + 11) % n_vocab_);
      j.params = sp_;
      j.params.max_tokens = steps_ + 4;
      j.params.ignore_eos = true;
      auto h = sched_->submit(std::move(j));
      if (!h) std::abort();
      hs.push_back(*h);
    }
    for (auto& h : hs) {
      std::vector<engine::JobEvent> evs;
      while (!h->ended()) h->wait(evs, Clock::now() + std::chrono::milliseconds(50));
    }
    std::lock_guard lock(mu_);
    std::vector<double> t;
    for (size_t i = 1; i < marks_.size(); ++i)
      if (marks_[i].second == n && marks_[i - 1].second == n)
        t.push_back(std::chrono::duration<double, std::milli>(marks_[i].first - marks_[i - 1].first).count());
    return median(t);
  }

 private:
  std::unique_ptr<engine::Scheduler> make(engine::BuiltPool& built, int max_n, core::ThreadPool& tp) {
    engine::SchedulerOptions so;
    so.pool = &tp;
    so.kv_pool = built.kv_pool;
    so.max_queue = static_cast<size_t>(max_n);
    so.on_step = [this](int64_t tokens, int64_t seqs) {
      std::lock_guard lock(mu_);
      marks_.emplace_back(Clock::now(), tokens == seqs ? tokens : -1);
    };
    auto pool = std::make_shared<engine::EnginePool>(std::move(built.pool));
    return std::make_unique<engine::Scheduler>(pool, built.model, built.n_ctx, so);
  }

  const engine::SamplingParams sp_;
  const int steps_;
  const int32_t n_vocab_;
  std::mutex mu_;
  std::vector<std::pair<Clock::time_point, int64_t>> marks_;  // (time, tokens) of steps with tokens == sequences
  std::unique_ptr<engine::Scheduler> sched_;                  // last: its thread stops before the members above go
};

struct Args {
  std::string model;
  int threads = 0;
  int rounds = 3;
  int steps = 12;
  std::string json;
};

// Parses the flags (or the old positional MODEL THREADS [ROUNDS] [STEPS]);
// the exit code after --help or a bad value.
std::variant<Args, int> parse_args(int argc, char** argv) {
  Args a;
  CLI::App app("A decode step of N = 1..16 sequences: the products alone, Model::forward, the scheduler's step");
  app.add_option("MODEL,-m,--model", a.model, "GGUF model file")->required()->check(CLI::ExistingFile);
  app.add_option("THREADS,-t,--threads", a.threads, "Worker threads")->required()->check(bench::kPositive);
  app.add_option("ROUNDS,-r,--rounds", a.rounds, "Interleaved rounds (medians over them)")
      ->capture_default_str()
      ->check(bench::kPositive);
  app.add_option("STEPS,-s,--steps", a.steps, "Decode steps per forward / step phase")
      ->capture_default_str()
      ->check(bench::kPositive);
  bench::add_json_option(app, a.json);
  if (auto rc = bench::parse(app, argc, argv)) return *rc;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const auto parsed = parse_args(argc, argv);
  if (const int* rc = std::get_if<int>(&parsed)) return *rc;
  const Args& args = std::get<Args>(parsed);
  const std::vector<int> levels = {1, 2, 4, 8, 16};
  const int max_n = levels.back();
  core::ThreadPool tp(args.threads);

  engine::SamplingParams sp;
  sp.temperature = 0;
  auto built = engine::build_pool_from_gguf(args.model, sp, 1, 512, max_n);
  if (!built) {
    std::fprintf(stderr, "%s\n", built.error().message.c_str());
    return 1;
  }
  const std::shared_ptr<const model::Model> model = built->model;
  const model::Model& m = *model;
  model::Workspace ws;
  auto caches = filled_caches(m, max_n, ws, tp);
  StepTimer timer(*built, sp, args.steps, max_n, tp);

  nlohmann::json out = {{"threads", args.threads}, {"rounds", args.rounds}, {"steps", args.steps}};
  std::map<int, std::vector<double>> prod, fwd, stp;
  for (int r = 0; r < args.rounds; ++r) {
    for (int n : levels) {
      std::vector<double> p;
      for (int k = 0; k < 3; ++k) p.push_back(products_ms(m, n, tp));
      prod[n].push_back(median(p));
      fwd[n].push_back(forward_ms(m, caches, n, args.steps, ws, tp));
      stp[n].push_back(timer.step_ms(n, r));
      std::printf("round %d N=%2d  products %8.1f  forward %8.1f  step %8.1f ms\n", r, n, prod[n].back(), fwd[n].back(),
                  stp[n].back());
      std::fflush(stdout);
      out["per_round"].push_back({{"round", r},
                                  {"n", n},
                                  {"products_ms", prod[n].back()},
                                  {"forward_ms", fwd[n].back()},
                                  {"step_ms", stp[n].back()}});
    }
  }
  std::printf("\nmedians over %d rounds (ms per step; tok/s = N / step)\n", args.rounds);
  std::printf("%3s %10s %10s %10s %12s %12s %12s %10s %10s\n", "N", "products", "forward", "step", "prod tok/s",
              "fwd tok/s", "step tok/s", "fwd-prod", "step-fwd");
  for (int n : levels) {
    const double p = median(prod[n]), f = median(fwd[n]), s = median(stp[n]);
    std::printf("%3d %10.1f %10.1f %10.1f %12.2f %12.2f %12.2f %9.1f%% %9.1f%%\n", n, p, f, s, 1000.0 * n / p,
                1000.0 * n / f, 1000.0 * n / s, 100.0 * (f - p) / f, 100.0 * (s - f) / s);
    out["medians"].push_back({{"n", n},
                              {"products_ms", p},
                              {"forward_ms", f},
                              {"step_ms", s},
                              {"products_tok_s", 1000.0 * n / p},
                              {"forward_tok_s", 1000.0 * n / f},
                              {"step_tok_s", 1000.0 * n / s},
                              {"forward_minus_products_pct", 100.0 * (f - p) / f},
                              {"step_minus_forward_pct", 100.0 * (s - f) / s}});
  }
  return bench::write_json(args.json, "step", argc, argv, std::move(out)) ? 0 : 1;
}
