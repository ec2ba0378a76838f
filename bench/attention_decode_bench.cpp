// Decode attention at depth alone: model::attention for one query token at
// position DEPTH - 1 over every layer of a KV cache of the Bonsai-1.7B shape
// (28 layers, 16 query heads, 8 KV heads, head dim 128), filled with random
// rows, next to the cache bytes it reads. The KV read per token at depth
// 4096 rivals the weights (issue 8), so this is the attention share of a
// decode step at depth, without the matrix products or a 4,096-token prefill.
//   bonsai_bench_attention_decode THREADS DEPTH f16|f32|q8_0 [V type, default K's] [ROUNDS] [QUERIES]
// Prints ms per token (all layers), GB/s of K/V rows read, and the kernel.
// QUERIES > 1 (a prefill ubatch, e.g. 512): the last QUERIES positions of
// the cache are the queries, as the last chunk of a DEPTH-token prompt;
// layer 0 only (every layer has the same shape), ms per layer and GFLOP/s
// (2 flops per multiply-add of QK and PV over the keys each query sees).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "model/attention.h"
#include "model/kv_cache.h"

using namespace bonsai;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

model::KvType kv_type(const char* s) {
  auto t = model::parse_kv_type(s);
  if (!t) {
    std::fprintf(stderr, "attention_decode_bench: unknown KV type '%s' (f16, f32, q8_0)\n", s);
    std::exit(2);
  }
  return *t;
}

// Writes n random values (normal, sd 1) as a row of type t.
void store_row(model::KvType t, std::mt19937& rng, uint8_t* dst, int64_t n) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  if (t == model::KvType::kF16) {
    kernels::f32_to_f16_row(x.data(), reinterpret_cast<uint16_t*>(dst), n);
  } else if (t == model::KvType::kQ8_0) {
    kernels::quantize_row_q8_0(x.data(), dst, n);
  } else {
    std::copy(x.begin(), x.end(), reinterpret_cast<float*>(dst));
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto usage = [&] {
    std::fprintf(stderr, "usage: %s THREADS DEPTH f16|f32|q8_0 [V type] [ROUNDS] [QUERIES <= DEPTH]\n", argv[0]);
    return 2;
  };
  if (argc < 4) return usage();
  const int threads = std::atoi(argv[1]);
  const int64_t depth = std::atoll(argv[2]);
  const model::KvType tk = kv_type(argv[3]);
  const model::KvType tv = argc > 4 ? kv_type(argv[4]) : tk;
  const int rounds = argc > 5 ? std::atoi(argv[5]) : 20;
  const int64_t queries = argc > 6 ? std::atoll(argv[6]) : 1;
  if (threads < 1 || depth < 1 || rounds < 1 || queries < 1 || queries > depth) return usage();

  model::ModelConfig c;
  c.n_layer = 28, c.n_head = 16, c.n_head_kv = 8, c.head_dim_k = 128, c.head_dim_v = 128;
  auto made = model::KvCache::create(c, depth, tk, tv);
  if (!made) {
    std::fprintf(stderr, "attention_decode_bench: %s\n", made.error().message.c_str());
    return 1;
  }
  model::KvCache& kv = *made;
  // A pool of random rows, copied into every slot in a scattered order (the
  // values do not change the cost; generating 235 M normals would).
  constexpr int64_t kPool = 1021;
  std::mt19937 rng(7);
  std::vector<uint8_t> kpool(kPool * kv.k_row_bytes()), vpool(kPool * kv.v_row_bytes());
  for (int64_t i = 0; i < kPool; ++i) {
    store_row(tk, rng, &kpool[i * kv.k_row_bytes()], c.head_dim_k);
    store_row(tv, rng, &vpool[i * kv.v_row_bytes()], c.head_dim_v);
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    for (int64_t h = 0; h < c.n_head_kv; ++h) {
      for (int64_t p = 0; p < depth; ++p) {
        const int64_t i = (p * 7 + l * 13 + h * 31) % kPool;
        std::memcpy(kv.k_row(l, h, p), &kpool[i * kv.k_row_bytes()], kv.k_row_bytes());
        std::memcpy(kv.v_row(l, h, p), &vpool[i * kv.v_row_bytes()], kv.v_row_bytes());
      }
    }
  }
  kv.set_size(depth);
  std::vector<float> q(queries * c.n_head * c.head_dim_k), out(queries * c.n_head * c.head_dim_v);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& x : q) x = nd(rng);
  std::vector<model::BatchToken> tok;
  for (int64_t p = depth - queries; p < depth; ++p) tok.push_back({0, static_cast<int32_t>(p), 0, false});
  model::KvCache* caches[] = {&kv};
  core::ThreadPool pool(threads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim_k));
  const int64_t layers = queries > 1 ? 1 : c.n_layer;
  auto token = [&] {
    for (int64_t l = 0; l < layers; ++l) model::attention(c, l, tok, caches, q.data(), out.data(), scale, pool);
  };
  token();  // warm-up
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = now();
    token();
    ms.push_back((now() - t0) * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  const double bytes =
      static_cast<double>(depth) * c.n_layer * c.n_head_kv * static_cast<double>(kv.k_row_bytes() + kv.v_row_bytes());
  const double med = ms[ms.size() / 2];
  if (queries > 1) {
    double flops = 0;  // QK and PV: 2 flops per multiply-add, per query head and key seen
    for (const auto& t : tok) flops += (t.pos + 1.0) * c.n_head * (c.head_dim_k + c.head_dim_v) * 2.0;
    std::printf(
        "attention prefill: %lld queries at %lld..%lld K %s V %s threads %d kernel %s: median %.2f ms/layer "
        "(min %.2f), %.1f GFLOP/s\n",
        static_cast<long long>(queries), static_cast<long long>(depth - queries), static_cast<long long>(depth - 1),
        model::kv_type_name(tk), model::kv_type_name(tv), threads,
        model::attention_kernel_name(c.head_dim_k, c.head_dim_v), med, ms.front(), flops / (med * 1e-3) / 1e9);
    return 0;
  }
  std::printf(
      "attention decode: depth %lld K %s V %s threads %d kernel %s: median %.3f ms/token (min %.3f), "
      "%.1f MB K/V read, %.2f GB/s\n",
      static_cast<long long>(depth), model::kv_type_name(tk), model::kv_type_name(tv), threads,
      model::attention_kernel_name(c.head_dim_k, c.head_dim_v), med, ms.front(), bytes / 1e6,
      bytes / (med * 1e-3) / 1e9);
  return 0;
}
