// bonsai_bench_sampler [-r ROUNDS=5] [--json FILE] (or the old positional [ROUNDS]): ms per sampled row of
// temperature-only sampling (top_k 0, top_p 1, min_p 0) on Qwen3's 151,936-entry vocabulary, the full-sort reference
// (filter_candidates + walk: the algorithm before sample_tempered) against Sampler::sample (sample_tempered),
// alternating A/B per round on the same logits so load drift hits both. The tokens of both are compared on every row
// (they must be equal).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_report.h"     // CLI11 flags, --json
#include "engine/sampling.h"  // Sampler, filter_candidates, walk, Rng

using bonsai::engine::Rng;
using bonsai::engine::Sampler;
using bonsai::engine::SamplingParams;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  int rounds = 5;
  std::string json;
  CLI::App app("Temperature-only sampling on a 151,936-entry vocabulary: full-sort reference vs sample_tempered");
  app.add_option("ROUNDS,-r,--rounds", rounds, "Alternating A/B rounds (best of them)")
      ->capture_default_str()
      ->check(bonsai::bench::kPositive);
  bonsai::bench::add_json_option(app, json);
  if (auto rc = bonsai::bench::parse(app, argc, argv)) return *rc;
  nlohmann::json out = {{"rounds", rounds}};
  constexpr size_t kVocab = 151936;
  constexpr int kRows = 16;  // logit rows per round (distinct vectors)
  // Logits shaped like a model's: a normal-ish bulk (sum of three uniforms,
  // sd ~ 3.5) and a handful of large values.
  Rng r(42);
  std::vector<std::vector<float>> rows(kRows, std::vector<float>(kVocab));
  for (auto& l : rows) {
    for (auto& x : l) x = static_cast<float>((r.next_double() + r.next_double() + r.next_double() - 1.5) * 6.0);
    for (int k = 0; k < 20; ++k) l[r.next_u64() % kVocab] = static_cast<float>(10 + r.next_u64() % 8);
  }
  std::printf("temperature  round  reference_ms_per_row  new_ms_per_row  ratio\n");
  for (const float temp : {0.7f, 1.0f}) {
    SamplingParams p;
    p.temperature = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 1;
    double best_ref = 1e30, best_new = 1e30;
    for (int round = 0; round < rounds; ++round) {
      Rng ref_rng(1000 + static_cast<uint64_t>(round));
      Sampler s(p);
      s.reseed(1000 + static_cast<uint64_t>(round));
      std::vector<int32_t> ref_tok, new_tok;
      const auto t0 = Clock::now();
      for (const auto& l : rows)
        ref_tok.push_back(bonsai::engine::walk(bonsai::engine::filter_candidates(l, p), ref_rng.next_double()));
      const auto t1 = Clock::now();
      for (const auto& l : rows) new_tok.push_back(s.sample(l, {}));
      const auto t2 = Clock::now();
      if (ref_tok != new_tok) {
        std::fprintf(stderr, "MISMATCH at temperature %g round %d\n", temp, round);
        return 1;
      }
      const double ref_ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / kRows;
      const double new_ms = std::chrono::duration<double, std::milli>(t2 - t1).count() / kRows;
      best_ref = std::min(best_ref, ref_ms);
      best_new = std::min(best_new, new_ms);
      std::printf("%11.2f  %5d  %20.3f  %14.3f  %5.1fx\n", temp, round, ref_ms, new_ms, ref_ms / new_ms);
    }
    std::printf("%11.2f  best   %20.3f  %14.3f  %5.1fx\n", temp, best_ref, best_new, best_ref / best_new);
    out["best"].push_back({{"temperature", temp},
                           {"reference_ms_per_row", best_ref},
                           {"new_ms_per_row", best_new},
                           {"ratio", best_ref / best_new}});
  }
  return bonsai::bench::write_json(json, "sampler", argc, argv, std::move(out)) ? 0 : 1;
}
