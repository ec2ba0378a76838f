// Prompt-length sweep and decode at depth through Model::forward (the public
// API, so the same source builds against older trees for A/B runs).
//   bonsai_bench_attention -m MODEL -t THREADS [--kv f16|q8_0] [--json FILE]
//     -> tg16 at depth 0, pp512, pp4096, tg16 at depth 4096
//   (the old positional form, bonsai_bench_attention MODEL THREADS [q8], still works)
// Prompt: chunks of Model::kMaxUbatch tokens, logits of the last only.
// Decode: 16 single-token steps after a prefill of `depth` tokens.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_report.h"  // CLI11 flags, --json
#include "core/thread_pool.h"
#include "model/model.h"

using namespace bonsai;

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  std::string path, kv = "f16", json;
  int threads = 0;
  CLI::App app("Prompt-length sweep and decode at depth through Model::forward");
  app.add_option("MODEL,-m,--model", path, "GGUF model file")->required()->check(CLI::ExistingFile);
  app.add_option("THREADS,-t,--threads", threads, "Worker threads")->required()->check(bench::kPositive);
  app.add_option("KV,--kv", kv, "KV cache type (q8: q8_0, the old positional spelling)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "q8_0", "q8"}));
  bench::add_json_option(app, json);
  if (auto rc = bench::parse(app, argc, argv)) return *rc;
  auto m = model::Model::load(path);
  if (!m) {
    std::fprintf(stderr, "%s\n", m.error().message.c_str());
    return 1;
  }
  const auto& c = (*m)->config();
  core::ThreadPool pool(threads);
#ifdef BONSAI_HAVE_Q8_KV
  const model::KvType kt = kv != "f16" ? model::KvType::kQ8_0 : model::KvType::kF16;
#else
  const model::KvType kt = model::KvType::kF16;
#endif
  auto cache = model::KvCache::create(c, 4096 + 64, kt);
  if (!cache) {  // e.g. q8_0 on head dims that are not multiples of 32
    std::fprintf(stderr, "%s\n", cache.error().message.c_str());
    return 1;
  }
  model::Workspace ws;
  std::vector<float> logits(c.n_vocab);
  model::KvCache* caches[] = {&*cache};
  auto prefill = [&](int n) {
    cache->clear();
    double t0 = now();
    for (int p0 = 0; p0 < n; p0 += 512) {
      std::vector<int32_t> ids(std::min(512, n - p0));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((p0 + i) * 7919 % c.n_vocab);
      auto b = model::Batch::for_sequence(ids, p0);
      if (!(*m)->forward(b, caches, ws, logits, pool)) std::abort();
    }
    return now() - t0;
  };
  auto decode = [&](int steps) {
    double t0 = now();
    for (int s = 0; s < steps; ++s) {
      const int32_t id[] = {static_cast<int32_t>(s * 31 % c.n_vocab)};
      auto b = model::Batch::for_sequence(id, static_cast<int32_t>(cache->size()));
      if (!(*m)->forward(b, caches, ws, logits, pool)) std::abort();
    }
    return (now() - t0) / steps;
  };
  prefill(1);
  const double d0 = decode(16);
  std::printf("tg16 @ depth 0     %8.2f tok/s\n", 1 / d0);
  const double t512 = prefill(512);
  std::printf("pp512   %8.2f tok/s (%.2f s)\n", 512 / t512, t512);
  std::fflush(stdout);
  const double t4096 = prefill(4096);
  std::printf("pp4096  %8.2f tok/s (%.2f s)  ratio pp4096/pp512 %.3f\n", 4096 / t4096, t4096,
              (4096 / t4096) / (512 / t512));
  std::fflush(stdout);
  const double d4k = decode(16);
  std::printf("tg16 @ depth 4096  %8.2f tok/s (kv %s)\n", 1 / d4k, kt == model::KvType::kF16 ? "f16" : "q8_0");
  const nlohmann::json out = {{"threads", threads},
                              {"kv", kt == model::KvType::kF16 ? "f16" : "q8_0"},
                              {"tg16_depth0_tok_s", 1 / d0},
                              {"pp512_tok_s", 512 / t512},
                              {"pp512_s", t512},
                              {"pp4096_tok_s", 4096 / t4096},
                              {"pp4096_s", t4096},
                              {"pp4096_over_pp512", (4096 / t4096) / (512 / t512)},
                              {"tg16_depth4096_tok_s", 1 / d4k}};
  return bench::write_json(json, "attention", argc, argv, out) ? 0 : 1;
}
