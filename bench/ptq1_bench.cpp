// bonsai_bench_ptq1: GEMV time of a PTQ1_0 matrix against the same ternary
// weights stored as PQ2_0 (issue 30 item 4), per kernel tier, as weight
// GB/s read and the ratio to PQ2_0, next to the read bandwidth of the same
// arena and threads.
//
// Memory, not cache: each format's matrix is copied until the copies fill
// --arena_mb (default 512 MiB, beyond any LLC of the target machines) and
// each GEMV reads the next copy, so every product streams its weights from
// DRAM. Both formats hold the same weights (random digits 0..2, fp16 scales
// in [0.005, 0.05]), so their products are bit-identical (tiers_test).
//
// Usage: bonsai_bench_ptq1 [--rows R] [--cols C] [-t THREADS] [--arena_mb N]
//        [--min_s S] [--tiers reference,avx2,...] [--json FILE]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_report.h"  // CLI11 flags, --json
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"

namespace {

namespace kn = bonsai::kernels;
using bonsai::bench::huge_alloc;  // bench_report.h
using bonsai::bench::median;
using bonsai::bench::now_s;

// One PQ2_0 block (34 bytes: fp16 d, then 2-bit codes t, weight j at bits
// 2 (j % 4) of qs[j / 4]) of the same digits.
void encode_pq2_0(const int* t, uint16_t d, uint8_t* out) {
  std::memcpy(out, &d, 2);
  std::memset(out + 2, 0, 32);
  for (int j = 0; j < 128; ++j) out[2 + j / 4] = static_cast<uint8_t>(out[2 + j / 4] | (t[j] << (2 * (j % 4))));
}

// Copies of one matrix filling an arena; view(i) is copy i.
struct Arena {
  uint8_t* base = nullptr;
  size_t bytes = 0;  // one copy
  int copies = 0;
  kn::MatrixView proto;  // copy 0
  // The view of copy i (i < copies).
  kn::MatrixView view(int i) const {
    kn::MatrixView v = proto;
    v.data = base + static_cast<size_t>(i) * bytes;
    return v;
  }
};

// GB/s of reading `bytes` of `p` on the pool's threads (the best of `rounds`).
double read_bandwidth(const uint8_t* p, size_t bytes, bonsai::core::ThreadPool& pool, int rounds) {
  const int64_t lines = static_cast<int64_t>(bytes / 64);
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<uint64_t> sink(static_cast<size_t>(pool.size()) * 8, 0);
    const double t0 = now_s();
    pool.parallel_for(
        lines,
        [&](int64_t b, int64_t e) {
          uint64_t s0 = 0, s1 = 0;
          for (int64_t l = b; l < e; ++l) {
            const auto* q = reinterpret_cast<const uint64_t*>(p + l * 64);
            s0 += q[0] ^ q[2] ^ q[4] ^ q[6];
            s1 += q[1] ^ q[3] ^ q[5] ^ q[7];
          }
          sink[static_cast<size_t>(b % pool.size()) * 8] += s0 + s1;
        },
        lines / pool.size() + 1);
    const double dt = now_s() - t0;
    best = std::max(best, static_cast<double>(bytes) / dt / 1e9);
    if (sink[0] == 42) std::printf(" ");  // keep the reads
  }
  return best;
}

// Median seconds per GEMV of each arena, the two formats alternating one
// product at a time (so both see the same load on a shared machine), for
// >= min_s in all (>= 5 products each).
void time_gemv_pair(const Arena (&a)[2], const float* x, float* const (&y)[2], bonsai::core::ThreadPool& pool,
                    double min_s, double (&out)[2]) {
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 2; ++i) kn::gemv(a[k].view(i % a[k].copies), x, y[k], &pool);
  std::vector<double> ts[2];
  const double start = now_s();
  for (int i = 0; ts[0].size() < 5 || now_s() - start < min_s; ++i) {
    for (int k = 0; k < 2; ++k) {
      const double t0 = now_s();
      kn::gemv(a[k].view(i % a[k].copies), x, y[k], &pool);
      ts[k].push_back(now_s() - t0);
    }
  }
  for (int k = 0; k < 2; ++k) out[k] = median(ts[k]);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 4096, cols = 4096;
  int threads = 0, arena_mb = 512;
  double min_s = 2.0;
  std::string tiers = "reference,avx2,avx512", json;
  CLI::App app{"PTQ1_0 vs PQ2_0 GEMV per kernel tier (weight GB/s from DRAM)"};
  app.add_option("--rows", rows, "matrix rows")->check(bonsai::bench::kPositive);
  app.add_option("--cols", cols, "matrix columns (a multiple of 128)")->check(bonsai::bench::kPositive);
  app.add_option("-t,--threads", threads, "threads (0: hardware concurrency)")->check(bonsai::bench::kNonNegative);
  app.add_option("--arena_mb", arena_mb, "MiB of matrix copies per format")->check(bonsai::bench::kPositive);
  app.add_option("--min_s", min_s, "seconds per measurement (at least)")->check(bonsai::bench::kNonNegative);
  app.add_option("--tiers", tiers, "comma-separated tiers to run (unsupported ones are skipped)");
  bonsai::bench::add_json_option(app, json);
  if (auto rc = bonsai::bench::parse(app, argc, argv)) return *rc;
  if (cols % 128 != 0) {
    std::fprintf(stderr, "--cols must be a multiple of 128, got %lld\n", static_cast<long long>(cols));
    return 2;
  }
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  // The weights: digits and scales, encoded once per format, then copied.
  const int64_t nb = rows * cols / 128;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> scale(0.005f, 0.05f);
  const kn::Format fmts[2] = {kn::Format::kPTQ1_0, kn::Format::kPQ2_0};
  Arena arenas[2];
  for (int k = 0; k < 2; ++k) {
    Arena& a = arenas[k];
    a.bytes = kn::row_bytes(fmts[k], cols) * static_cast<size_t>(rows);
    a.copies = static_cast<int>(std::max<size_t>(2, ((size_t{1} << 20) * arena_mb + a.bytes - 1) / a.bytes));
    a.base = huge_alloc(a.bytes * static_cast<size_t>(a.copies));
    a.proto = kn::MatrixView{a.base, fmts[k], rows, cols, kn::row_bytes(fmts[k], cols)};
  }
  {
    int t[128];
    for (int64_t b = 0; b < nb; ++b) {
      for (int& v : t) v = static_cast<int>(rng() % 3);
      const uint16_t d = bonsai::core::fp32_to_fp16(scale(rng));
      int8_t w[128];
      for (int e = 0; e < 128; ++e) w[e] = static_cast<int8_t>(t[e] - 1);
      kn::encode_ptq1_0(w, d, arenas[0].base + b * 28);
      encode_pq2_0(t, d, arenas[1].base + b * 34);
    }
  }
  for (Arena& a : arenas)
    for (int i = 1; i < a.copies; ++i) std::memcpy(a.base + static_cast<size_t>(i) * a.bytes, a.base, a.bytes);

  std::vector<float> x(static_cast<size_t>(cols)), y0(static_cast<size_t>(rows)), y1(y0.size());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  bonsai::core::ThreadPool pool(threads);
  const double bw = read_bandwidth(arenas[1].base, arenas[1].bytes * static_cast<size_t>(arenas[1].copies), pool, 5);
  std::printf("bonsai_bench_ptq1: %lld x %lld, %d threads, copies %d (PTQ1_0, %.1f MiB each) / %d (PQ2_0, %.1f MiB)\n",
              static_cast<long long>(rows), static_cast<long long>(cols), threads, arenas[0].copies,
              static_cast<double>(arenas[0].bytes) / (1 << 20), arenas[1].copies,
              static_cast<double>(arenas[1].bytes) / (1 << 20));
  std::printf("read bandwidth (same arena, threads): %.1f GB/s\n", bw);
  std::printf("%-10s %-7s %10s %10s %9s %12s\n", "tier", "format", "ms/gemv", "weight_GB/s", "bw_ratio",
              "speed_vs_PQ2");
  nlohmann::json res = {{"rows", rows}, {"cols", cols}, {"threads", threads}, {"read_GB/s", bw}, {"tiers", {}}};
  const kn::Tier before = kn::active_tier();
  std::stringstream ss(tiers);
  for (std::string name; std::getline(ss, name, ',');) {
    kn::Tier tier;
    if (name == "reference") {
      tier = kn::Tier::kReference;
    } else if (name == "avx2") {
      tier = kn::Tier::kAvx2;
    } else if (name == "avx512") {
      tier = kn::Tier::kAvx512;
    } else if (name == "neon") {
      tier = kn::Tier::kNeon;
    } else {
      std::fprintf(stderr, "unknown tier '%s'\n", name.c_str());
      return 2;
    }
    if (!kn::tier_supported(tier) || !kn::set_active_tier(tier).has_value()) continue;
    double s[2];
    float* const ys[2] = {y0.data(), y1.data()};
    time_gemv_pair(arenas, x.data(), ys, pool, min_s, s);
    const bool same = std::memcmp(y0.data(), y1.data(), y0.size() * sizeof(float)) == 0;
    nlohmann::json jt = {{"tier", name}, {"outputs_bit_identical", same}};
    for (int k = 0; k < 2; ++k) {
      const double gbs = static_cast<double>(arenas[k].bytes) / s[k] / 1e9;
      std::printf("%-10s %-7s %10.3f %10.2f %9.2f %12.2f\n", name.c_str(), k == 0 ? "PTQ1_0" : "PQ2_0", s[k] * 1e3, gbs,
                  gbs / bw, s[1] / s[k]);
      jt[k == 0 ? "PTQ1_0" : "PQ2_0"] = {{"ms", s[k] * 1e3}, {"weight_GB/s", gbs}, {"bw_ratio", gbs / bw}};
    }
    jt["ptq1_speed_vs_pq2"] = s[1] / s[0];
    std::printf("%-10s outputs PTQ1_0 == PQ2_0 bit for bit: %s\n", name.c_str(), same ? "yes" : "NO");
    res["tiers"].push_back(jt);
  }
  (void)kn::set_active_tier(before);
  for (Arena& a : arenas) std::free(a.base);
  return bonsai::bench::write_json(json, "ptq1", argc, argv, res) ? 0 : 1;
}
