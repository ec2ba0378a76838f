// bonsai_bench_repack: A/B of the load-time repacked weight layout
// (kernels::Packing, issue 8 decision 2) against the stored layout, on one
// matrix shape, same binary, alternating rounds.
//
// Usage: bonsai_bench_repack -t THREADS -f q1|q2|t1 --rows ROWS --cols COLS -n N [-r ROUNDS=7] [--copies COPIES]
//                            [--packing PACKING] [--base PACKING] [--json FILE]
//   (the old positional form, THREADS q1|q2 ROWS COLS N [ROUNDS] [COPIES] [PACKING], still works)
//   Prints one line: the median time per product (and min..max over the
//   rounds) of the stored and the packed layout, weight GB/s (stored bytes
//   per second), the speed-up, whether every output was bit-identical, and
//   the packing cost (s per GB) on THREADS threads.
// Memory, not cache: the matrix is copied across a 512 MiB arena (both
// layouts, huge-page advised as the model's packed copies are) and each
// product reads the next copy, so the weights stream from DRAM. COPIES (> 0)
// overrides the count (0: the default): 1 keeps a small matrix in cache, which measures the
// kernel's instruction throughput without the memory stream. The active
// tier's packing is used (BONSAI_KERNEL applies), or PACKING (a
// packing_name: "avx512-row-quad", "tile16", "avx2-tile16") when given and defined
// for the shape, so that two layouts compare in one binary; with none the packed
// column repeats the stored one. --base PACKING packs the "stored" side too,
// so two packings compare directly. GB/s count the stored format's bytes
// (t1: PTQ1_0's 28 per 128 weights) whatever the layout reads.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
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

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, rounds = 7, copies_arg = 0;
  std::string format, packing_arg, base_arg, json;
  int64_t rows = 0, cols = 0, n = 0;
  CLI::App app("Stored vs load-time repacked weight layout, A/B on one matrix shape");
  app.add_option("THREADS,-t,--threads", threads, "Worker threads")->required()->check(bonsai::bench::kPositive);
  app.add_option("FORMAT,-f,--format", format, "Weight format")->required()->check(CLI::IsMember({"q1", "q2", "t1"}));
  app.add_option("ROWS,--rows", rows, "Matrix rows (outputs)")->required()->check(bonsai::bench::kPositive);
  app.add_option("COLS,--cols", cols, "Matrix columns (inputs, a multiple of the block)")
      ->required()
      ->check(bonsai::bench::kPositive);
  app.add_option("N,-n,--n", n, "Activation columns (1: GEMV)")->required()->check(bonsai::bench::kPositive);
  app.add_option("ROUNDS,-r,--rounds", rounds, "Alternating rounds (median)")
      ->capture_default_str()
      ->check(bonsai::bench::kPositive);
  app.add_option("COPIES,--copies", copies_arg, "Matrix copies streamed (0: fill 512 MiB; 1: stay in cache)")
      ->capture_default_str()
      ->check(bonsai::bench::kNonNegative);
  app.add_option("PACKING,--packing", packing_arg,
                 "Packing to compare (a packing_name, e.g. avx512-row-quad, tile16, avx2-tile16; default: the tier's)");
  app.add_option("--base", base_arg, "Packing of the baseline side (a packing_name; default none: the stored layout)");
  bonsai::bench::add_json_option(app, json);
  if (auto rc = bonsai::bench::parse(app, argc, argv)) return *rc;
  if (auto t = kn::init_tier_from_env(); !t) {
    std::fprintf(stderr, "%s\n", t.error().message.c_str());
    return 2;
  }
  const bool q1 = format == "q1";
  const kn::Format f = q1 ? kn::Format::kQ1_0 : format == "t1" ? kn::Format::kPTQ1_0 : kn::Format::kQ2_0;
  const char* fname = q1 ? "Q1_0" : format == "t1" ? "PTQ1_0" : "Q2_0";
  const size_t stride = kn::row_bytes(f, cols), mb = stride * static_cast<size_t>(rows);
  const kn::MatrixView w0{nullptr, f, rows, cols, stride};
  const size_t pb =
      (std::max({kn::packed_bytes(w0, kn::Packing::kAvx512RowQuad), kn::packed_bytes(w0, kn::Packing::kTile16),
                 kn::packed_bytes(w0, kn::Packing::kAvx2Tile16), mb}) +
       63) /
      64 * 64;
  const int copies = copies_arg > 0 ? copies_arg : static_cast<int>(std::max<size_t>(2, (size_t{512} << 20) / pb));
  uint8_t* a = huge_alloc(mb * static_cast<size_t>(copies));
  uint8_t* b = huge_alloc(pb * static_cast<size_t>(copies));
  // The packing named `name` if defined for the shape (else an error).
  const auto named = [&](const std::string& name) -> std::optional<kn::Packing> {
    for (size_t i = 0; i < kn::kPackingCount; ++i) {
      const auto p = static_cast<kn::Packing>(i);
      if (kn::packing_name(p) != name) continue;
      if (p != kn::Packing::kNone && kn::packed_bytes(w0, p) == 0) break;  // not defined for this shape
      return p;
    }
    std::fprintf(stderr, "PACKING '%s': not a packing name defined for %s %lldx%lld\n", name.c_str(), format.c_str(),
                 static_cast<long long>(rows), static_cast<long long>(cols));
    return std::nullopt;
  };
  kn::Packing packing = kn::packing_for(kn::MatrixView{a, f, rows, cols, stride});
  if (!packing_arg.empty()) {
    const auto p = named(packing_arg);
    if (!p) return 2;
    packing = *p;
  }
  kn::Packing base = kn::Packing::kNone;
  if (!base_arg.empty()) {
    const auto p = named(base_arg);
    if (!p) return 2;
    base = *p;
  }
  uint8_t* c = base == kn::Packing::kNone ? nullptr : huge_alloc(pb * static_cast<size_t>(copies));
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= mb; i += 8) {
    const uint64_t z = rng();
    std::memcpy(a + i, &z, 8);
  }
  // Finite fp16 scales: Q1_0 / Q2_0 g64 blocks of 18 bytes, d first; PTQ1_0 of 28, d last.
  const size_t blk_bytes = f == kn::Format::kPTQ1_0 ? 28 : 18, d_at = f == kn::Format::kPTQ1_0 ? 26 : 0;
  for (size_t blk = 0; blk < mb; blk += blk_bytes) {
    const uint16_t h = bonsai::core::fp32_to_fp16(0.01f + 0.0001f * static_cast<float>(a[blk + 1]));
    std::memcpy(a + blk + d_at, &h, 2);
  }
  for (int k = 1; k < copies; ++k) std::memcpy(a + k * mb, a, mb);
  bonsai::core::ThreadPool pool(threads);
  bonsai::core::ThreadPool* tp = threads > 1 ? &pool : nullptr;
  std::vector<kn::MatrixView> stored(static_cast<size_t>(copies)), packed(static_cast<size_t>(copies));
  double pack_s = 0;
  // The destination pages faulted in before the timed packs: "pack s/GB"
  // is the packing's own work, not the kernel zeroing fresh pages (on these
  // VMs the first touch of a page can cost more than the packing itself).
  std::memset(b, 0, pb * static_cast<size_t>(copies));
  for (int k = 0; k < copies; ++k) {
    stored[k] = kn::MatrixView{a + k * mb, f, rows, cols, stride};
    packed[k] = stored[k];
    if (base != kn::Packing::kNone) {
      kn::pack_matrix(packed[k], base, c + k * pb, tp);
      stored[k].packed = c + k * pb;
      stored[k].packing = base;
    }
    if (packing == kn::Packing::kNone) continue;
    const double t0 = now_s();
    kn::pack_matrix(stored[k], packing, b + k * pb, tp);
    if (k > 0) pack_s += now_s() - t0;  // (copy 0 warms the code and tables)
    packed[k].packed = b + k * pb;
    packed[k].packing = packing;
  }
  std::vector<float> x(static_cast<size_t>(n * cols)), y0(static_cast<size_t>(n * rows)), y1(y0.size());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  kn::ActScratch scratch;
  auto product = [&](const kn::MatrixView& w, float* y) {
    if (n == 1) {
      kn::gemv(w, x.data(), y, tp, &scratch);
    } else {
      kn::gemm(w, x.data(), n, y, tp, &scratch);
    }
  };
  bool same = true;
  const int iters = static_cast<int>(std::max<int64_t>(8, (int64_t{1} << 30) / static_cast<int64_t>(mb) / n));
  std::vector<double> ts, tq;
  for (int r = 0; r < rounds; ++r) {
    double t0 = now_s();
    for (int i = 0; i < iters; ++i) product(stored[static_cast<size_t>(i % copies)], y0.data());
    double t1 = now_s();
    for (int i = 0; i < iters; ++i) product(packed[static_cast<size_t>(i % copies)], y1.data());
    double t2 = now_s();
    ts.push_back((t1 - t0) / iters);
    tq.push_back((t2 - t1) / iters);
    same = same && std::memcmp(y0.data(), y1.data(), y0.size() * sizeof(float)) == 0;
  }
  const double ms = median(ts), mq = median(tq);
  std::printf(
      "%s %s %lldx%lld N=%lld t=%d: %s %.1f us [%.1f..%.1f] %.1f GB/s | %s %.1f us [%.1f..%.1f] %.1f GB/s | "
      "speed-up %.3f | bit-identical %s | pack %.2f s/GB\n",
      std::string(kn::tier_name(kn::active_tier())).c_str(), fname, static_cast<long long>(rows),
      static_cast<long long>(cols), static_cast<long long>(n), threads,
      base == kn::Packing::kNone ? "stored" : std::string(kn::packing_name(base)).c_str(), ms * 1e6,
      *std::min_element(ts.begin(), ts.end()) * 1e6, *std::max_element(ts.begin(), ts.end()) * 1e6, mb / ms / 1e9,
      std::string(kn::packing_name(packing)).c_str(), mq * 1e6, *std::min_element(tq.begin(), tq.end()) * 1e6,
      *std::max_element(tq.begin(), tq.end()) * 1e6, mb / mq / 1e9, ms / mq, same ? "yes" : "NO",
      copies > 1 && pack_s > 0 ? pack_s / (static_cast<double>(mb) * (copies - 1) / 1e9) : 0.0);
  const double pack_s_per_gb = copies > 1 && pack_s > 0 ? pack_s / (static_cast<double>(mb) * (copies - 1) / 1e9) : 0.0;
  const nlohmann::json out = {{"tier", std::string(kn::tier_name(kn::active_tier()))},
                              {"format", fname},
                              {"base_packing", std::string(kn::packing_name(base))},
                              {"rows", rows},
                              {"cols", cols},
                              {"n", n},
                              {"threads", threads},
                              {"rounds", rounds},
                              {"copies", copies},
                              {"stored_us", ms * 1e6},
                              {"stored_us_min", *std::min_element(ts.begin(), ts.end()) * 1e6},
                              {"stored_us_max", *std::max_element(ts.begin(), ts.end()) * 1e6},
                              {"stored_gb_s", mb / ms / 1e9},
                              {"packing", std::string(kn::packing_name(packing))},
                              {"packed_us", mq * 1e6},
                              {"packed_us_min", *std::min_element(tq.begin(), tq.end()) * 1e6},
                              {"packed_us_max", *std::max_element(tq.begin(), tq.end()) * 1e6},
                              {"packed_gb_s", mb / mq / 1e9},
                              {"speed_up", ms / mq},
                              {"bit_identical", same},
                              {"pack_s_per_gb", pack_s_per_gb}};
  std::free(a);
  std::free(b);
  std::free(c);
  const bool written = bonsai::bench::write_json(json, "repack", argc, argv, out);
  return same && written ? 0 : 1;
}
