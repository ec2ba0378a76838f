// Decode attention at depth alone: model::attention for one query token at
// position DEPTH - 1 over every layer of a KV cache of the Bonsai-1.7B shape
// (28 layers, 16 query heads, 8 KV heads, head dim 128), filled with random
// rows, next to the cache bytes it reads. The KV read per token at depth
// 4096 rivals the weights (issue 8), so this is the attention share of a
// decode step at depth, without the matrix products or a 4,096-token prefill.
//   bonsai_bench_attention_decode -t THREADS -d DEPTH -k f16|f32|q8_0 [-v TYPE, default K's] [-r ROUNDS=20]
//                                 [-q QUERIES=1] [--json FILE]
//   (the old positional form, THREADS DEPTH K [V] [ROUNDS] [QUERIES], still works)
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

#include "bench_report.h"  // CLI11 flags, --json
#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "model/attention.h"
#include "model/kv_cache.h"

using namespace bonsai;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CLI11 check of a KV type name: "" when parse_kv_type knows it.
std::string check_kv_type(const std::string& s) {
  return model::parse_kv_type(s) ? "" : "unknown KV type '" + s + "' (f16, f32, q8_0)";
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
  int threads = 0, rounds = 20;
  int64_t depth = 0, queries = 1;
  std::string k_name, v_name, json;
  CLI::App app("Decode attention at depth alone on the Bonsai-1.7B shape (or a prefill chunk with --queries > 1)");
  app.add_option("THREADS,-t,--threads", threads, "Worker threads")->required()->check(bench::kPositive);
  app.add_option("DEPTH,-d,--depth", depth, "Keys in the cache (the query sits at DEPTH - 1)")
      ->required()
      ->check(bench::kPositive);
  app.add_option("K,-k,--type-k", k_name, "K cache type: f16, f32, q8_0")->required()->check(check_kv_type);
  app.add_option("V,-v,--type-v", v_name, "V cache type (default: K's)")->check(check_kv_type);
  app.add_option("ROUNDS,-r,--rounds", rounds, "Timed rounds (median)")->capture_default_str()->check(bench::kPositive);
  app.add_option("QUERIES,-q,--queries", queries, "Queries (> 1: a prefill chunk ending at DEPTH, layer 0 only)")
      ->capture_default_str()
      ->check(bench::kPositive);
  bench::add_json_option(app, json);
  if (auto rc = bench::parse(app, argc, argv)) return *rc;
  if (queries > depth) {
    std::fprintf(stderr, "--queries %lld: at most DEPTH (%lld)\n", static_cast<long long>(queries),
                 static_cast<long long>(depth));
    return 2;
  }
  const model::KvType tk = *model::parse_kv_type(k_name);
  const model::KvType tv = v_name.empty() ? tk : *model::parse_kv_type(v_name);

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
  nlohmann::json res = {{"threads", threads},
                        {"depth", depth},
                        {"queries", queries},
                        {"rounds", rounds},
                        {"type_k", model::kv_type_name(tk)},
                        {"type_v", model::kv_type_name(tv)},
                        {"kernel", model::attention_kernel_name(c.head_dim_k, c.head_dim_v)}};
  if (queries > 1) {
    double flops = 0;  // QK and PV: 2 flops per multiply-add, per query head and key seen
    for (const auto& t : tok) flops += (t.pos + 1.0) * c.n_head * (c.head_dim_k + c.head_dim_v) * 2.0;
    std::printf(
        "attention prefill: %lld queries at %lld..%lld K %s V %s threads %d kernel %s: median %.2f ms/layer "
        "(min %.2f), %.1f GFLOP/s\n",
        static_cast<long long>(queries), static_cast<long long>(depth - queries), static_cast<long long>(depth - 1),
        model::kv_type_name(tk), model::kv_type_name(tv), threads,
        model::attention_kernel_name(c.head_dim_k, c.head_dim_v), med, ms.front(), flops / (med * 1e-3) / 1e9);
    res["ms_per_layer_median"] = med;
    res["ms_per_layer_min"] = ms.front();
    res["gflop_s"] = flops / (med * 1e-3) / 1e9;
    return bench::write_json(json, "attention_decode", argc, argv, res) ? 0 : 1;
  }
  std::printf(
      "attention decode: depth %lld K %s V %s threads %d kernel %s: median %.3f ms/token (min %.3f), "
      "%.1f MB K/V read, %.2f GB/s\n",
      static_cast<long long>(depth), model::kv_type_name(tk), model::kv_type_name(tv), threads,
      model::attention_kernel_name(c.head_dim_k, c.head_dim_v), med, ms.front(), bytes / 1e6,
      bytes / (med * 1e-3) / 1e9);
  res["ms_per_token_median"] = med;
  res["ms_per_token_min"] = ms.front();
  res["kv_read_mb"] = bytes / 1e6;
  res["kv_read_gb_s"] = bytes / (med * 1e-3) / 1e9;
  return bench::write_json(json, "attention_decode", argc, argv, res) ? 0 : 1;
}
