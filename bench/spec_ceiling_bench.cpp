// The ceiling of speculative decoding's machinery (issue 29, acceptance item
// 2): a benchmark-only proposer (an "oracle") that proposes exactly the
// tokens a previous greedy run produced, so every proposal is accepted and
// each step yields k + 1 tokens for k + 1 forward rows. On one model file:
//   1. a greedy reference run of N tokens (temperature 0, ignore_eos) through
//      engine::InferenceEngine without speculation;
//   2. PAIRS rounds; in each, for every k of --draft (default 1,2,4): a plain
//      run (no speculation) and an oracle run proposing k tokens per step
//      (SpecType::kDraft with this file's proposer, draft_min = draft_max = k,
//      row_cost 0 so the adaptive rule never shortens it), alternating.
// Prints each pair's decode tokens/s, the ratio, the proposed / accepted
// counts, whether the text equals the reference; then per k the median
// ratio. Only the paired ratios mean something on a shared machine.
// Each pair also times Model::forward of one sequence alone at the prompt's
// end: 1 row and k + 1 rows (every row's logits, as a verifying step), the
// fastest of 5 each (the least disturbed by other work on a shared machine); (k + 1) T(1) / T(k + 1) is the ratio the
// step's row cost predicts (the oracle's run then pays only its prefill and the sampling of k + 1 rows beyond the
// forwards), printed beside the measured one.
//
//   bonsai_bench_spec_ceiling -m MODEL -t THREADS [-n 64] [--pairs 5] [--draft 1,2,4] [-p PROMPT] [--json FILE]
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "bench_report.h"  // CLI11 flags, --json, median, now_s
#include "core/thread_pool.h"
#include "engine/inference_engine.h"
#include "engine/proposer.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

using namespace bonsai;

namespace {

// Proposes what the reference run produced after `seq`, when `seq` is a
// prefix of it (nothing otherwise).
class OracleProposer final : public engine::Proposer {
 public:
  explicit OracleProposer(std::shared_ptr<const std::vector<int32_t>> full) : full_(std::move(full)) {}
  std::vector<int32_t> propose(std::span<const int32_t> seq, int32_t max_draft, float) override {
    const std::vector<int32_t>& f = *full_;
    if (seq.size() >= f.size() || !std::equal(seq.begin(), seq.end(), f.begin())) return {};
    const size_t n = std::min(f.size() - seq.size(), static_cast<size_t>(max_draft));
    return {f.begin() + static_cast<std::ptrdiff_t>(seq.size()),
            f.begin() + static_cast<std::ptrdiff_t>(seq.size() + n)};
  }

 private:
  std::shared_ptr<const std::vector<int32_t>> full_;
};

// The fastest of 5 timings (seconds) of one forward of `rows` tokens at
// positions [pos, pos + rows) of `cache` (every row's logits), the cache
// holding `pos` positions before and after.
double forward_s(const model::Model& m, model::KvCache& cache, model::Workspace& ws, int64_t pos, int rows,
                 core::ThreadPool& tp) {
  std::vector<int32_t> ids(static_cast<size_t>(rows), 1);
  std::vector<float> logits(static_cast<size_t>(rows) * static_cast<size_t>(m.config().n_vocab));
  const model::Batch b = model::Batch::for_sequence(ids, static_cast<int32_t>(pos), 0, /*all_logits=*/true);
  model::KvCache* caches[] = {&cache};
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const double t0 = bench::now_s();
    if (!m.forward(b, caches, ws, logits, tp)) return 0;
    t.push_back(bench::now_s() - t0);
    cache.truncate(pos);
  }
  return *std::min_element(t.begin(), t.end());
}

struct Args {
  std::string model;
  int threads = 2;
  int n = 64;
  int pairs = 5;
  std::vector<int> drafts = {1, 2, 4};
  std::string prompt = "Once upon a time there was a tree. Once upon a time there was a tree. Once upon a";
  std::string json;
};

std::variant<Args, int> parse_args(int argc, char** argv) {
  Args a;
  CLI::App app{"Speculative decoding's ceiling: an oracle proposer (every proposal accepted) against plain decode"};
  app.add_option("-m,--model", a.model, "GGUF model file")->required()->check(CLI::ExistingFile);
  app.add_option("-t,--threads", a.threads, "Worker threads")->check(bench::kPositive);
  app.add_option("-n,--n-predict", a.n, "Tokens per run")->check(bench::kPositive);
  app.add_option("--pairs", a.pairs, "Alternating plain / oracle pairs per k")->check(bench::kPositive);
  app.add_option("--draft", a.drafts, "Proposals per step to measure")->delimiter(',')->check(bench::kPositive);
  app.add_option("-p,--prompt", a.prompt, "Prompt text");
  bench::add_json_option(app, a.json);
  if (auto rc = bench::parse(app, argc, argv)) return *rc;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const auto parsed = parse_args(argc, argv);
  if (const int* rc = std::get_if<int>(&parsed)) return *rc;
  const Args& args = std::get<Args>(parsed);
  core::ThreadPool tp(args.threads);
  auto model = model::Model::load(args.model);
  if (!model) {
    std::fprintf(stderr, "cannot load %s: %s\n", args.model.c_str(), model.error().message.c_str());
    return 1;
  }
  auto tok = tokenizer::Tokenizer::from_gguf((*model)->file());
  if (!tok) {
    std::fprintf(stderr, "cannot load the tokenizer of %s: %s\n", args.model.c_str(), tok.error().message.c_str());
    return 1;
  }
  const std::vector<int32_t> prompt = (*tok)->encode_prompt(args.prompt);
  engine::EngineOptions eo;
  eo.params.temperature = 0;
  eo.params.max_tokens = args.n;
  eo.params.ignore_eos = true;
  eo.max_seq_len = static_cast<int64_t>(prompt.size()) + args.n + 8;
  eo.pool = &tp;
  eo.spec.type = engine::SpecType::kNone;
  auto plain = engine::InferenceEngine::create(*model, *tok, eo);
  if (!plain) {
    std::fprintf(stderr, "%s\n", plain.error().message.c_str());
    return 1;
  }
  auto ref = plain->generate(prompt);
  if (!ref) {
    std::fprintf(stderr, "%s\n", ref.error().message.c_str());
    return 1;
  }
  auto full = std::make_shared<std::vector<int32_t>>(prompt);
  full->insert(full->end(), ref->tokens.begin(), ref->tokens.end());
  std::printf("model %s, %d threads, prompt %zu tokens, %d generated, %d pairs per k\n", args.model.c_str(),
              args.threads, prompt.size(), ref->completion_tokens, args.pairs);
  // The row-cost probe's cache: the prompt's KV (ids do not matter for the timing).
  auto probe = model::KvCache::create((*model)->config(), eo.max_seq_len);
  if (!probe) {
    std::fprintf(stderr, "%s\n", probe.error().message.c_str());
    return 1;
  }
  model::Workspace ws;
  {
    const model::Batch b = model::Batch::for_sequence(prompt, 0);
    model::KvCache* caches[] = {&*probe};
    std::vector<float> lg(static_cast<size_t>((*model)->config().n_vocab));
    if (!(*model)->forward(b, caches, ws, lg, tp)) return 1;
  }
  const auto depth = static_cast<int64_t>(prompt.size());
  std::printf(
      "    k  pair  plain_tok/s  oracle_tok/s   ratio  proposed  accepted  same_text  T1_ms  Tk+1_ms  predicted\n");
  nlohmann::json out = {{"threads", args.threads}, {"n", args.n}, {"pairs", args.pairs}};
  bool all_same = true;
  for (const int k : args.drafts) {
    engine::EngineOptions so = eo;
    so.spec.type = engine::SpecType::kDraft;
    so.spec.draft_max = k;
    so.spec.draft_min = k;
    so.spec.row_cost = 0;
    so.spec.proposer = [full](int64_t) -> core::Expected<std::unique_ptr<engine::Proposer>> {
      return std::make_unique<OracleProposer>(full);
    };
    auto oracle = engine::InferenceEngine::create(*model, *tok, so);
    if (!oracle) {
      std::fprintf(stderr, "%s\n", oracle.error().message.c_str());
      return 1;
    }
    std::vector<double> ratios, predicted;
    for (int i = 0; i < args.pairs; ++i) {
      auto a = plain->generate(prompt);
      auto b = oracle->generate(prompt);
      if (!a || !b) {
        std::fprintf(stderr, "generation failed: %s\n", (!a ? a.error() : b.error()).message.c_str());
        return 1;
      }
      const double t1 = forward_s(**model, *probe, ws, depth, 1, tp);
      const double tk = forward_s(**model, *probe, ws, depth, k + 1, tp);
      const double pred = tk > 0 ? (k + 1) * t1 / tk : 0;
      predicted.push_back(pred);
      const double ta = a->completion_tokens * 1e3 / a->gen_ms, tb = b->completion_tokens * 1e3 / b->gen_ms;
      const bool same = a->tokens == ref->tokens && b->tokens == ref->tokens && a->text == b->text;
      all_same = all_same && same;
      ratios.push_back(tb / ta);
      std::printf("%5d  %4d  %11.2f  %12.2f  %6.3f  %8d  %8d  %-9s  %5.1f  %7.1f  %9.3f\n", k, i + 1, ta, tb, tb / ta,
                  b->draft_tokens, b->draft_accepted, same ? "True" : "False", t1 * 1e3, tk * 1e3, pred);
      std::fflush(stdout);
      out["pairs_detail"].push_back({{"k", k},
                                     {"plain_tok_s", ta},
                                     {"oracle_tok_s", tb},
                                     {"proposed", b->draft_tokens},
                                     {"accepted", b->draft_accepted},
                                     {"same_text", same},
                                     {"forward_1_ms", t1 * 1e3},
                                     {"forward_k1_ms", tk * 1e3},
                                     {"predicted_ratio", pred}});
    }
    const double med = bench::median(ratios);
    std::printf("k=%d: median ratio (oracle / plain) %.3f, predicted by the forward's row cost %.3f\n", k, med,
                bench::median(predicted));
    out["median_ratio"][std::to_string(k)] = med;
    out["median_predicted"][std::to_string(k)] = bench::median(predicted);
  }
  out["same_text"] = all_same;
  if (!args.json.empty() && !bench::write_json(args.json, "spec_ceiling", argc, argv, out)) return 1;
  return all_same ? 0 : 2;
}
