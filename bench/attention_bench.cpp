// Prompt-length sweep and decode at depth through Model::forward (the public
// API, so the same source builds against older trees for A/B runs).
//   attention_bench MODEL THREADS [q8]   -> tg16 at depth 0, pp512, pp4096, tg16 at depth 4096
// Prompt: chunks of Model::kMaxUbatch tokens, logits of the last only.
// Decode: 16 single-token steps after a prefill of `depth` tokens.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "model/model.h"

using namespace bonsai;

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  auto m = model::Model::load(argv[1]);
  if (!m) return 1;
  const auto& c = (*m)->config();
  core::ThreadPool pool(std::atoi(argv[2]));
#ifdef BONSAI_HAVE_Q8_KV
  const model::KvType kt = argc > 3 && std::strcmp(argv[3], "q8") == 0 ? model::KvType::kQ8_0 : model::KvType::kF16;
#else
  const model::KvType kt = model::KvType::kF16;
#endif
  auto cache = model::KvCache::create(c, 4096 + 64, kt);
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
  return 0;
}
