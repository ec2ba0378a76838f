// `bonsai bench`: prompt-processing and generation speed, with llama-bench's
// flags and table (llama.cpp tools/llama-bench), plus two columns it lacks:
//
//   bonsai bench [-m FILE[,FILE...]] [-p 512[,N...]] [-n 128[,N...]]
//                [-pg PP,TG ...] [-d 0[,N...]] [-t T[,T...]] [-r 5]
//                [-o md|csv|json|jsonl] [-ctk T] [-ctv T] [--no-warmup] [--q2-layout L]
//
// Tests (each repeated -r times after one untimed warm-up, for every model,
// depth and thread count):
//   ppN         N random tokens as one prompt (logits of the last only)
//   tgN         N tokens decoded one at a time (logits every step)
//   ppN+tgM     (-pg N,M) both, timed together
//   ... @ dD    (-d D) the KV cache first holds D tokens (filled once per
//               model and depth, untimed), as llama-bench's -d
// KV cache types: -ctk / -ctv (--cache-type-k / --cache-type-v) f16 (default),
// f32 or q8_0, one value each (llama-bench also takes comma lists).
// t/s = tokens / seconds per repetition; the table gives mean ± sample sd.
//
// The extra columns (ratios measured in the same run, same thread count):
//   bw roofline  tg only: t/s / (read bandwidth / bytes read per token). The
//                bytes are every matrix a token streams (the layers and the
//                output head) plus the KV cache read at the test's mean
//                position (depth + (N+1)/2 positions, K and V, every layer).
//                The bandwidth is measured once before the models load and,
//                with --bw-probe each (auto: where the matrices exceed the
//                last-level cache or its size is unknown), again right
//                before and after every tg repetition: each repetition is
//                then rated against the mean of its two neighbours and the
//                column is the mean of those ratios, so bandwidth that
//                drifts during a run (shared VMs: 2x within the hour) moves
//                the ratio less; the md footer lists the range the probes
//                saw, JSON read_bw_gbs_reps.
//   int8 peak    pp only: (2 x matrix weights each token passes through x
//                t/s) / the int8 dot peak. The output head counts once per
//                prompt (only the last token's logits are computed).
// See kernels/roofline.h for how bandwidth and peak are measured.
// Where the matrices fit in the last-level cache (its size from sysfs,
// /sys/devices/system/cpu/cpu0/cache/index*/), a decode step reads them from
// the cache, not from DRAM: tg is not bandwidth-bound and the ratio can pass
// 100%. The md table marks it "%*" with a footnote "* weights fit in L3
// (N MiB): not bandwidth-bound"; JSON says weights_in_llc and llc_bytes.
//
// Depth: every test's positions (-d + -p + -n) must fit the model's context
// (<arch>.context_length); beyond it the bench refuses with a usage error
// naming the context (llama-bench runs on past it, with only llama.cpp's
// "possible training context overflow" log line; RoPE positions beyond
// training are not a measurement of the model).
//
// Progress goes to stderr when it is a terminal. Usage errors (bad flag
// value, a depth beyond the context, BONSAI_KERNEL, --q2-layout) exit 2; a
// model that fails to load or run exits 1.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "apps/bonsai/cli_common.h"  // init_runtime, Progress, load_model
#include "apps/bonsai/commands.h"
#include "apps/bonsai/hub_cli.h"       // -hf / -hff
#include "apps/bonsai/llama_compat.h"  // llama-bench's GPU flags (-ngl, -fa, -mmp, ...), accepted and ignored
#include "apps/bonsai/synth.h"         // synth::ensure_default_model
#include "core/ggml_types.h"           // ggml_type_name
#include "core/thread_pool.h"          // ThreadPool
#include "kernels/roofline.h"          // measure_read_bandwidth, measure_int8_peak
#include "model/model.h"               // Model, KvCache, Workspace, Batch

namespace bonsai::app {
namespace {

using Clock = std::chrono::steady_clock;
using kernels::Int8Peak;
using kernels::measure_int8_peak;
using kernels::measure_read_bandwidth;

struct BenchFlags {
  std::vector<std::string> models;
  HfFlags hf;  // -hf: one more model, from Hugging Face (after the -m ones)
  std::vector<std::string> n_prompt{"512"};
  std::vector<std::string> n_gen{"128"};
  std::vector<std::string> pg;  // "PP,TG" each
  std::vector<std::string> depth{"0"};
  std::vector<std::string> threads;
  int reps = 5;
  std::string output = "md";
  bool no_warmup = false;
  std::string q2_layout;
  bool no_repack = false;  // --no-repack
  int bw_mib = 1024;
  std::string bw_probe = "auto";     // --bw-probe: auto, start or each
  std::string cache_type_k = "f16";  // -ctk (model::parse_kv_type)
  std::string cache_type_v = "f16";  // -ctv
  IgnoredLlamaFlags llama;           // -ngl, -fa, -b, -ub, -mmp, ... (llama_compat.h)
};

// One test of the plan: tokens of prompt, of generation, KV depth before it.
struct TestSpec {
  int n_prompt = 0;
  int n_gen = 0;
  int n_depth = 0;
  std::string name() const {
    std::string s;
    if (n_prompt > 0) s += "pp" + std::to_string(n_prompt);
    if (n_prompt > 0 && n_gen > 0) s += "+";
    if (n_gen > 0) s += "tg" + std::to_string(n_gen);
    if (n_depth > 0) s += " @ d" + std::to_string(n_depth);
    return s;
  }
};

// What a model streams and computes per token, from its weight views.
struct ModelStats {
  std::string filename;
  std::string type;               // "qwen3 1.7B Q1_0" (llama-bench's model_type)
  uint64_t size_bytes = 0;        // every tensor's bytes (llama-bench's model_size)
  uint64_t n_params = 0;          // every tensor's elements (model_n_params)
  uint64_t matrix_bytes = 0;      // layer matrices + output head: bytes a decode step streams
  uint64_t layer_weights = 0;     // weights of the layer matrices (multiply-adds per token)
  uint64_t head_weights = 0;      // weights of the output head
  uint64_t kv_bytes_per_pos = 0;  // K + V bytes per cached position, all layers (-ctk / -ctv types)
  model::KvType type_k = model::KvType::kF16, type_v = model::KvType::kF16;
};

uint64_t view_bytes(const kernels::MatrixView& v) { return static_cast<uint64_t>(v.rows) * v.row_stride; }
uint64_t view_weights(const kernels::MatrixView& v) { return static_cast<uint64_t>(v.rows * v.cols); }

ModelStats model_stats(const model::Model& m, const std::string& path, model::KvType type_k, model::KvType type_v) {
  ModelStats s;
  s.type_k = type_k;
  s.type_v = type_v;
  s.filename = path;
  for (const auto& t : m.file().tensors()) {
    s.size_bytes += t.n_bytes;
    s.n_params += static_cast<uint64_t>(t.n_elements());
  }
  for (const auto& l : m.weights().layers) {
    // (qwen35: a GDN layer's matrices instead of attention's; the absent ones are empty views.)
    for (const auto* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.gdn.w_qkv, &l.gdn.w_z,
                          &l.gdn.w_beta, &l.gdn.w_alpha, &l.gdn.w_out}) {
      s.matrix_bytes += view_bytes(*v);
      s.layer_weights += view_weights(*v);
    }
  }
  s.matrix_bytes += view_bytes(m.weights().output);
  s.head_weights = view_weights(m.weights().output);
  const auto& c = m.config();
  s.kv_bytes_per_pos = model::KvCache::bytes_per_position(c, type_k, type_v);
  // model_type as llama.cpp prints it: architecture, size label, weight type.
  std::string label;
  if (auto l = m.file().get<std::string>("general.size_label"); l && !l->empty()) {
    label = *l;
  } else {
    char buf[32];
    const double p = static_cast<double>(s.n_params);
    if (p >= 1e9) {
      std::snprintf(buf, sizeof buf, "%.1fB", p / 1e9);
    } else {
      std::snprintf(buf, sizeof buf, p >= 1e6 ? "%.0fM" : "%.0fK", p >= 1e6 ? p / 1e6 : p / 1e3);
    }
    label = buf;
  }
  std::string type = "?";
  // The layer matrices' type (qwen35's layer 0 is a GDN layer: its ffn_up).
  if (const auto* t = m.file().find_tensor("blk.0.attn_q.weight")) {
    type = core::ggml_type_name(t->type_id);
  } else if (const auto* u = m.file().find_tensor("blk.0.ffn_up.weight")) {
    type = core::ggml_type_name(u->type_id);
  }
  s.type = c.arch_name + " " + label + " " + type;
  return s;
}

// The last-level cache: the highest-level unified cache of cpu0 in sysfs.
struct LastLevelCache {
  int level = 0;       // 3 for an L3; 0: sysfs does not say
  uint64_t bytes = 0;  // its size
};

// Reads /sys/devices/system/cpu/cpu0/cache/index*/{level,type,size} (size
// as "32768K" or "32M"); {0, 0} where sysfs has no cache entries.
LastLevelCache last_level_cache() {
  LastLevelCache llc;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    int level = 0;
    std::string type, size;
    if (!(std::ifstream(dir + "level") >> level) || !(std::ifstream(dir + "type") >> type) ||
        !(std::ifstream(dir + "size") >> size))
      continue;
    if (type != "Unified" || level <= llc.level || size.empty()) continue;
    char* end = nullptr;
    uint64_t bytes = std::strtoull(size.c_str(), &end, 10);
    if (*end == 'K') bytes <<= 10;
    if (*end == 'M') bytes <<= 20;
    if (*end == 'G') bytes <<= 30;
    llc = {level, bytes};
  }
  return llc;
}

// Passes (after one warm-up pass) of each bandwidth probe around a tg
// repetition (--bw-probe): 1 GiB at 30-80 GB/s is 15-35 ms a pass.
constexpr int kProbePasses = 3;

// Hardware ceilings per thread count.
struct Ceilings {
  double read_gbs = 0;
  Int8Peak peak;
};

// One finished test row.
struct Row {
  const ModelStats* model = nullptr;
  std::string backend;
  int threads = 0;
  TestSpec test;
  std::vector<double> samples_ns;
  std::string test_time;
  Ceilings ceil;
  // Read bandwidth (GB/s) around each timed repetition, the mean of the
  // probes just before and just after it (--bw-probe); empty: the ratio
  // uses the run's start probe, ceil.read_gbs.
  std::vector<double> read_gbs_reps;
  LastLevelCache llc;

  // The matrices a decode step streams fit in the last-level cache: tg reads
  // them from there, so the bandwidth roofline is no ceiling.
  bool weights_in_llc() const { return llc.bytes > 0 && model->matrix_bytes <= llc.bytes; }

  std::vector<double> samples_ts() const {
    std::vector<double> ts;
    const double n = test.n_prompt + test.n_gen;
    for (double ns : samples_ns) ts.push_back(n * 1e9 / ns);
    return ts;
  }
  static double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / static_cast<double>(v.size());
  }
  static double stdev(const std::vector<double>& v) {
    if (v.size() < 2) return 0;
    const double m = mean(v);
    double s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return std::sqrt(s / static_cast<double>(v.size() - 1));
  }
  double avg_ts() const { return mean(samples_ts()); }
  double stddev_ts() const { return stdev(samples_ts()); }
  // Bytes read per generated token at the test's mean position.
  double bytes_per_token() const {
    const double mean_ctx = test.n_depth + (test.n_gen + 1) / 2.0;
    return static_cast<double>(model->matrix_bytes) + mean_ctx * static_cast<double>(model->kv_bytes_per_pos);
  }
  // tg only: t/s over the read-bandwidth roofline; nullopt otherwise. With
  // probes around the repetitions, the mean of each repetition's t/s over
  // its own bandwidth; else the mean t/s over the start probe's.
  std::optional<double> bw_ratio() const {
    if (test.n_prompt != 0 || test.n_gen == 0) return std::nullopt;
    if (!read_gbs_reps.empty() && read_gbs_reps.size() == samples_ns.size()) {
      const auto ts = samples_ts();
      double s = 0;
      for (size_t i = 0; i < ts.size(); ++i) {
        if (read_gbs_reps[i] <= 0) return std::nullopt;
        s += ts[i] / (read_gbs_reps[i] * 1e9 / bytes_per_token());
      }
      return s / static_cast<double>(ts.size());
    }
    if (ceil.read_gbs <= 0) return std::nullopt;
    return avg_ts() / (ceil.read_gbs * 1e9 / bytes_per_token());
  }
  // Integer ops per prompt token (2 per multiply-add; the head once per prompt).
  double ops_per_token() const {
    if (test.n_prompt == 0) return 0;
    return 2.0 * (static_cast<double>(model->layer_weights) + static_cast<double>(model->head_weights) / test.n_prompt);
  }
  // pp only: op rate over the int8 dot peak; nullopt otherwise.
  std::optional<double> peak_ratio() const {
    if (test.n_prompt == 0 || test.n_gen != 0 || ceil.peak.gops <= 0) return std::nullopt;
    return avg_ts() * ops_per_token() / (ceil.peak.gops * 1e9);
  }
};

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        auto v = line.substr(colon + 1);
        v.erase(0, v.find_first_not_of(" \t"));
        return v;
      }
    }
  }
  return "unknown CPU";
}

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string format_size(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1u << 30));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1u << 20));
  }
  return buf;
}

std::string format_params(uint64_t n) {
  char buf[32];
  const double p = static_cast<double>(n);
  if (p >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f B", p / 1e9);
  } else if (p >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2f M", p / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f K", p / 1e3);
  }
  return buf;
}

std::string format_ratio(std::optional<double> r) {
  if (!r) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", *r * 100.0);
  return buf;
}

// ---- Output -----------------------------------------------------------------------

nlohmann::ordered_json row_json(const Row& r, const std::string& cpu) {
  auto opt = [](std::optional<double> v) -> nlohmann::ordered_json {
    return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
  };
  const auto ts = r.samples_ts();
  std::vector<int64_t> ns;
  for (double x : r.samples_ns) ns.push_back(static_cast<int64_t>(x));
  nlohmann::ordered_json j;
  // llama-bench's fields, in its order, so that its tools (the SQL / CSV
  // consumers, scripts/compare-llama-bench.py, which keys rows on the build
  // and the run properties) read ours: what is the same carries its value;
  // the GPU and placement fields say what bonsai does (CPU only, the file
  // mapped, no flash attention kernel switch).
  j["build_commit"] = "bonsai-0.1.0";
  j["build_number"] = 0;
  j["cpu_info"] = cpu;
  j["gpu_info"] = "";
  j["backends"] = r.backend;
  j["model_filename"] = r.model->filename;
  j["model_type"] = r.model->type;
  j["model_size"] = r.model->size_bytes;
  j["model_n_params"] = r.model->n_params;
  j["n_batch"] = model::Model::kMaxUbatch;
  j["n_ubatch"] = model::Model::kMaxUbatch;
  j["n_threads"] = r.threads;
  j["type_k"] = model::kv_type_name(r.model->type_k);
  j["type_v"] = model::kv_type_name(r.model->type_v);
  j["n_gpu_layers"] = 0;
  j["split_mode"] = "none";
  j["main_gpu"] = 0;
  j["no_kv_offload"] = false;
  j["flash_attn"] = false;
  j["tensor_split"] = "0.00";
  j["use_mmap"] = true;
  j["embeddings"] = false;
  j["n_prompt"] = r.test.n_prompt;
  j["n_gen"] = r.test.n_gen;
  j["n_depth"] = r.test.n_depth;
  j["test"] = r.test.name();
  j["test_time"] = r.test_time;
  j["avg_ns"] = static_cast<int64_t>(Row::mean(r.samples_ns));
  j["stddev_ns"] = static_cast<int64_t>(Row::stdev(r.samples_ns));
  j["avg_ts"] = r.avg_ts();
  j["stddev_ts"] = r.stddev_ts();
  j["samples_ns"] = ns;
  j["samples_ts"] = ts;
  // Ours: the ceilings and the ratios to them.
  j["read_bw_gbs"] = r.ceil.read_gbs;
  j["read_bw_gbs_reps"] =
      r.read_gbs_reps.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.read_gbs_reps);
  j["bytes_per_token"] = r.test.n_gen > 0 ? nlohmann::ordered_json(r.bytes_per_token()) : nullptr;
  j["bw_ratio"] = opt(r.bw_ratio());
  j["weights_in_llc"] = r.weights_in_llc();
  j["llc_bytes"] = r.llc.bytes;
  j["int8_peak_gops"] = r.ceil.peak.gops;
  j["int8_peak_isa"] = r.ceil.peak.isa;
  j["amx_int8_peak_gops"] = r.ceil.peak.amx_gops > 0 ? nlohmann::ordered_json(r.ceil.peak.amx_gops) : nullptr;
  j["ops_per_token"] = r.test.n_prompt > 0 ? nlohmann::ordered_json(r.ops_per_token()) : nullptr;
  j["int8_peak_ratio"] = opt(r.peak_ratio());
  return j;
}

// Streams rows in one format as they finish (as llama-bench does).
class Printer {
 public:
  Printer(std::string format, std::string cpu) : format_(std::move(format)), cpu_(std::move(cpu)) {}

  void row(const Row& r) {
    if (format_ == "md") {
      if (n_ == 0) {
        std::printf("| %-30s | %10s | %10s | %-12s | %7s | %15s | %20s | %11s | %9s |\n", "model", "size", "params",
                    "backend", "threads", "test", "t/s", "bw roofline", "int8 peak");
        std::printf("| %s | %s: | %s: | %s | %s: | %s: | %s: | %s: | %s: |\n", std::string(30, '-').c_str(),
                    std::string(9, '-').c_str(), std::string(9, '-').c_str(), std::string(12, '-').c_str(),
                    std::string(6, '-').c_str(), std::string(14, '-').c_str(), std::string(19, '-').c_str(),
                    std::string(10, '-').c_str(), std::string(8, '-').c_str());
      }
      char ts[64];
      std::snprintf(ts, sizeof ts, "%.2f ± %.2f", r.avg_ts(), r.stddev_ts());
      std::printf("| %-30s | %10s | %10s | %-12s | %7d | %15s | %20s | %11s | %9s |\n", r.model->type.c_str(),
                  format_size(r.model->size_bytes).c_str(), format_params(r.model->n_params).c_str(), r.backend.c_str(),
                  r.threads, r.test.name().c_str(), ts,
                  (format_ratio(r.bw_ratio()) + (r.bw_ratio() && r.weights_in_llc() ? "*" : "")).c_str(),
                  format_ratio(r.peak_ratio()).c_str());
      if (r.bw_ratio() && r.weights_in_llc()) llc_marked_ = r.llc;
      if (!r.read_gbs_reps.empty()) {
        const auto [lo, hi] = std::minmax_element(r.read_gbs_reps.begin(), r.read_gbs_reps.end());
        char note[256];
        std::snprintf(note, sizeof note, "%s, %d thread%s: %.2f-%.2f GB/s", r.test.name().c_str(), r.threads,
                      r.threads == 1 ? "" : "s", *lo, *hi);
        probed_.emplace_back(note);
      }
    } else if (format_ == "csv") {
      const auto j = row_json(r, cpu_);
      if (n_ == 0) {
        std::string header;
        for (auto it = j.begin(); it != j.end(); ++it) header += (header.empty() ? "" : ",") + it.key();
        std::printf("%s\n", header.c_str());
      }
      std::string line;
      for (auto it = j.begin(); it != j.end(); ++it) {
        std::string v = it->is_string() ? it->get<std::string>() : it->is_null() ? "" : it->dump();
        std::string q = "\"";
        for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
        line += (line.empty() ? "" : ",") + q + "\"";
      }
      std::printf("%s\n", line.c_str());
    } else if (format_ == "json") {
      std::printf("%s%s", n_ == 0 ? "[\n  " : ",\n  ", row_json(r, cpu_).dump().c_str());
    } else {  // jsonl
      std::printf("%s\n", row_json(r, cpu_).dump().c_str());
    }
    std::fflush(stdout);
    ++n_;
  }

  // Closes the output; for md, a footer with the ceilings the ratios used.
  void end(const std::map<int, Ceilings>& ceilings, const std::vector<std::unique_ptr<ModelStats>>& models) {
    if (format_ == "json") std::printf(n_ == 0 ? "[]\n" : "\n]\n");
    if (format_ == "md" && n_ > 0) {
      std::printf("\n");
      for (const auto& [t, c] : ceilings) {
        std::printf("%d thread%s: read bandwidth %.2f GB/s, int8 dot peak %.1f GOPS (%s)", t, t == 1 ? "" : "s",
                    c.read_gbs, c.peak.gops, c.peak.isa.c_str());
        if (c.peak.amx_gops > 0) std::printf(", AMX int8 peak %.1f GOPS", c.peak.amx_gops);
        std::printf("\n");
      }
      for (const auto& m : models) {
        std::printf("%s: %.1f MB of matrices streamed per token, KV %llu B per position (K %s, V %s)\n",
                    m->type.c_str(), static_cast<double>(m->matrix_bytes) / 1e6,
                    static_cast<unsigned long long>(m->kv_bytes_per_pos), model::kv_type_name(m->type_k),
                    model::kv_type_name(m->type_v));
      }
      if (!probed_.empty()) {
        std::printf(
            "bw roofline of these rows: each repetition's t/s over the read bandwidth measured right before and "
            "after it (their mean), averaged:\n");
        for (const auto& n : probed_) std::printf("  %s\n", n.c_str());
      }
      if (llc_marked_.bytes > 0)
        std::printf(
            "* weights fit in L%d (%llu MiB): not bandwidth-bound (the ratio compares with DRAM read "
            "bandwidth)\n",
            llc_marked_.level, static_cast<unsigned long long>(llc_marked_.bytes >> 20));
      std::printf("cpu: %s\n", cpu_.c_str());
    }
    std::fflush(stdout);
  }

 private:
  std::string format_;
  std::string cpu_;
  int n_ = 0;
  LastLevelCache llc_marked_;        // a row's ratio was marked '*' (weights in this cache): the footnote
  std::vector<std::string> probed_;  // md rows rated by probes around their repetitions: "test, threads: range"
};

// ---- Flag parsing -------------------------------------------------------------------

// "512,1024" items (already split on ','): non-negative ints (>= `min`).
core::Expected<std::vector<int>> parse_int_list(const char* flag, const std::vector<std::string>& items, int min) {
  std::vector<int> out;
  for (const auto& s : items) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || end == s.c_str() || *end != '\0' || errno == ERANGE || v < min || v > (1 << 24)) {
      return core::fail(core::Errc::kInvalidArgument,
                        std::string(flag) + ": '" + s + "' is not an integer >= " + std::to_string(min));
    }
    out.push_back(static_cast<int>(v));
  }
  return out;
}

// Deterministic token ids in [0, n_vocab) (llama-bench feeds random tokens).
class TokenSource {
 public:
  explicit TokenSource(int64_t n_vocab) : n_vocab_(n_vocab) {}
  int32_t next() {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int32_t>((state_ >> 33) % static_cast<uint64_t>(n_vocab_));
  }
  std::vector<int32_t> take(int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& t : v) t = next();
    return v;
  }

 private:
  int64_t n_vocab_;
  uint64_t state_ = 0x853c49e6748fea9bull;
};

// Runs tests on one model with one KV cache (filled to the depth once).
class Runner {
 public:
  Runner(const model::Model& m, model::KvCache& cache) : m_(m), cache_(cache), tokens_(m.config().n_vocab) {
    logits_.resize(static_cast<size_t>(m.config().n_vocab));
  }

  // Prompt of n tokens at the cache's current end.
  core::Expected<void> prompt(int n, core::ThreadPool& pool) {
    if (n <= 0) return {};
    const auto ids = tokens_.take(n);
    const auto b = model::Batch::for_sequence(ids, static_cast<int32_t>(cache_.size()));
    model::KvCache* caches[] = {&cache_};
    return m_.forward(b, caches, ws_, logits_, pool);
  }
  // n decode steps, one token each.
  core::Expected<void> generate(int n, core::ThreadPool& pool) {
    model::KvCache* caches[] = {&cache_};
    for (int i = 0; i < n; ++i) {
      const int32_t id = tokens_.next();
      const auto b = model::Batch::for_sequence(std::span<const int32_t>(&id, 1), static_cast<int32_t>(cache_.size()));
      if (auto r = m_.forward(b, caches, ws_, logits_, pool); !r) return r;
    }
    return {};
  }
  // Fills the cache to `depth` positions (in ubatch slices, reporting each).
  core::Expected<void> fill(int depth, core::ThreadPool& pool, Progress& progress) {
    cache_.clear();
    while (cache_.size() < depth) {
      const int n = static_cast<int>(std::min<int64_t>(model::Model::kMaxUbatch, depth - cache_.size()));
      if (auto r = prompt(n, pool); !r) return r;
      progress.update(static_cast<uint64_t>(cache_.size()));
    }
    return {};
  }

 private:
  const model::Model& m_;
  model::KvCache& cache_;
  model::Workspace ws_;
  std::vector<float> logits_;  // [n_vocab]: one wanted row per forward
  TokenSource tokens_;
};

// The flag values after the usage checks.
struct ParsedFlags {
  model::KvType type_k = model::KvType::kF16, type_v = model::KvType::kF16;  // -ctk, -ctv
  std::vector<int> n_prompt, n_gen, depths, threads;                         // -p, -n, -d, -t
  std::vector<std::pair<int, int>> pgs;                                      // -pg PP,TG each
};

// Checks and parses every flag value; the error message is the usage line (exit 2).
core::Expected<ParsedFlags> parse_flags(const BenchFlags& f) {
  auto usage = [](std::string msg) { return core::fail(core::Errc::kInvalidArgument, std::move(msg)); };
  if (f.output != "md" && f.output != "csv" && f.output != "json" && f.output != "jsonl") {
    return usage("-o: unknown output format '" + f.output + "' (expected md, csv, json or jsonl)");
  }
  if (f.reps < 1) return usage("-r: repetitions must be >= 1");
  if (f.bw_mib < 1) return usage("--bw-mib must be >= 1");
  ParsedFlags pf;
  const auto type_k = model::parse_kv_type(f.cache_type_k);
  if (!type_k) return usage("-ctk: " + type_k.error().message);
  const auto type_v = model::parse_kv_type(f.cache_type_v);
  if (!type_v) return usage("-ctv: " + type_v.error().message);
  pf.type_k = *type_k;
  pf.type_v = *type_v;
  auto n_prompt = parse_int_list("-p", f.n_prompt, 0);
  if (!n_prompt) return usage(n_prompt.error().message);
  auto n_gen = parse_int_list("-n", f.n_gen, 0);
  if (!n_gen) return usage(n_gen.error().message);
  auto depths = parse_int_list("-d", f.depth, 0);
  if (!depths) return usage(depths.error().message);
  auto threads = parse_int_list("-t", f.threads, 1);
  if (!threads) return usage(threads.error().message);
  pf.n_prompt = std::move(*n_prompt);
  pf.n_gen = std::move(*n_gen);
  pf.depths = std::move(*depths);
  pf.threads = std::move(*threads);
  for (const auto& s : f.pg) {
    const auto comma = s.find(',');
    auto parts = comma == std::string::npos
                     ? core::Expected<std::vector<int>>(core::fail(core::Errc::kInvalidArgument, ""))
                     : parse_int_list("-pg", {s.substr(0, comma), s.substr(comma + 1)}, 1);
    if (!parts) return usage("-pg: '" + s + "' is not PP,TG (two integers >= 1)");
    pf.pgs.emplace_back((*parts)[0], (*parts)[1]);
  }
  for (int v : pf.threads) {
    if (v > core::ThreadPool::kMaxThreads) {
      return usage("-t: " + std::to_string(v) + " is more than " + std::to_string(core::ThreadPool::kMaxThreads));
    }
  }
  return pf;
}

// The tests to run, per depth in llama-bench's order: pp, tg, pg.
std::vector<TestSpec> make_plan(const ParsedFlags& pf) {
  std::vector<TestSpec> plan;
  for (int d : pf.depths) {
    for (int p : pf.n_prompt)
      if (p > 0) plan.push_back({p, 0, d});
    for (int n : pf.n_gen)
      if (n > 0) plan.push_back({0, n, d});
    for (auto [p, n] : pf.pgs) plan.push_back({p, n, d});
  }
  return plan;
}

// The -m paths, or the built-in default model (written on first use) when none.
core::Expected<std::vector<std::string>> model_paths(const BenchFlags& f) {
  std::vector<std::string> paths;
  for (const auto& m : f.models) {
    if (!m.empty()) paths.push_back(m);
  }
  if (!f.hf.repo.empty()) {
    auto p = resolve_hf_model("bench", f.hf.repo, f.hf.file);
    if (!p) return core::fail(core::Errc::kNotFound, "the -hf model is not available (see above)");
    paths.push_back(*p);
  }
  if (paths.empty()) {
    auto p = synth::ensure_default_model();
    if (!p) return std::unexpected(p.error());
    paths.push_back(*p);
  }
  return paths;
}

// One `bonsai bench` run after the usage checks: a pool and its hardware
// ceilings per thread count, the printer, and the progress count over every
// (model, test, thread count, repetition). Borrows the flags and the runtime
// from bench_main, which outlive it.
class BenchRun {
 public:
  BenchRun(const BenchFlags& f, const ParsedFlags& pf, const Runtime& rt, std::vector<TestSpec> plan, size_t n_models)
      : f_(f),
        pf_(pf),
        rt_(rt),
        plan_(std::move(plan)),
        backend_("CPU/" + kernels::kernel_name()),  // "CPU/avx512-amx" where AMX runs the batches
        printer_(f.output, cpu_model_name()),
        runs_per_test_(static_cast<uint64_t>(f.reps) + (f.no_warmup ? 0 : 1)),
        total_runs_(n_models * pf.threads.size() * plan_.size() * runs_per_test_) {}

  // Creates one pool per distinct thread count and measures its read
  // bandwidth and int8 peak.
  void measure_ceilings() {
    for (int t : pf_.threads) {
      if (pools_.count(t)) continue;
      pools_[t] = std::make_unique<core::ThreadPool>(t);
      Progress p("bench: measuring read bandwidth and int8 peak, " + std::to_string(t) + " thread(s)", 0,
                 Progress::Unit::kItems, rt_.progress);
      p.tick_in_background();
      Ceilings c;
      c.read_gbs = measure_read_bandwidth(*pools_[t], static_cast<size_t>(f_.bw_mib) << 20);
      c.peak = measure_int8_peak(*pools_[t], rt_.tier);
      ceilings_[t] = c;
    }
    fill_threads_ = std::max_element(pools_.begin(), pools_.end(), [](const auto& a, const auto& b) {
                      return a.first < b.first;
                    })->first;
  }

  // Loads the model at `path` and runs the plan on it, printing each row;
  // 0, or the exit code after printing why it stopped (kExitUsage: a test
  // beyond the model's context, checked before anything runs on it; 1: a
  // load or compute failure). Measures the ceilings first if not done yet.
  int run_model(const std::string& path) {
    auto loaded = load_model(path, rt_);
    if (!loaded) {
      std::cerr << "bonsai bench: cannot load model: " << loaded.error().message << "\n";
      return 1;
    }
    const model::Model& m = **loaded;
    // Every test's positions within the model's context (a usage error).
    if (const int64_t n_ctx = m.config().n_ctx_train; n_ctx > 0) {
      for (const auto& t : plan_) {
        if (const int64_t need = int64_t{t.n_depth} + t.n_prompt + t.n_gen; need > n_ctx) {
          std::cerr << "bonsai bench: " << path << ": test " << t.name() << " needs " << need
                    << " positions, beyond the model's context (" << n_ctx << "); lower -d, -p or -n\n";
          return kExitUsage;
        }
      }
    }
    if (ceilings_.empty()) measure_ceilings();  // after the checks: they take seconds
    stats_.push_back(std::make_unique<ModelStats>(model_stats(m, path, pf_.type_k, pf_.type_v)));
    const ModelStats& ms = *stats_.back();
    int max_ctx = 0;
    for (const auto& t : plan_) max_ctx = std::max(max_ctx, t.n_depth + t.n_prompt + t.n_gen + 1);
    auto cache = model::KvCache::create(m.config(), max_ctx, pf_.type_k, pf_.type_v);
    if (!cache) {
      std::cerr << "bonsai bench: " << path << ": " << cache.error().message << "\n";
      return 1;
    }
    Runner runner(m, *cache);
    int filled_depth = -1;  // the depth the cache's first positions hold now
    for (const TestSpec& test : plan_) {
      if (test.n_depth != filled_depth) {
        if (auto r = fill(runner, ms, test.n_depth); !r) {
          std::cerr << "bonsai bench: " << path << ": " << r.error().message << "\n";
          return 1;
        }
        filled_depth = test.n_depth;
      }
      for (int t : pf_.threads) {
        auto row = time_test(runner, *cache, ms, test, t);
        if (!row) {
          std::cerr << "bonsai bench: " << path << ": " << test.name() << ": " << row.error().message << "\n";
          return 1;
        }
        printer_.row(*row);
      }
    }
    return 0;
  }

  // Closes the output: for md, the footer with the ceilings and the models.
  void end() { printer_.end(ceilings_, stats_); }

 private:
  // Fills the cache to `depth` positions (untimed, on the largest pool); 0: nothing.
  core::Expected<void> fill(Runner& runner, const ModelStats& ms, int depth) {
    if (depth == 0) return {};
    Progress p("bench: " + ms.type + ": filling the KV cache to depth " + std::to_string(depth),
               static_cast<uint64_t>(depth), Progress::Unit::kItems, rt_.progress);
    auto r = runner.fill(depth, *pools_[fill_threads_], p);
    if (!r) p.finish();
    return r;
  }

  // Times `test` on `threads` threads: the warm-up (unless --no-warmup), then
  // -r repetitions, each from the cache truncated to the test's depth.
  core::Expected<Row> time_test(Runner& runner, model::KvCache& cache, const ModelStats& ms, const TestSpec& test,
                                int threads) {
    core::ThreadPool& pool = *pools_[threads];
    Row row;
    row.model = &ms;
    row.backend = backend_;
    row.threads = threads;
    row.test = test;
    row.test_time = iso_now();
    row.ceil = ceilings_[threads];
    row.llc = llc_;
    Progress p("", total_runs_, Progress::Unit::kItems, rt_.progress);
    // --bw-probe: the bandwidth measured again right before each timed tg
    // repetition and after the last, on the same pool (auto: where the
    // matrices do not fit in the last-level cache, so the ratio means
    // something and the probe cannot evict weights the test would have found
    // in the cache; or where its size is unknown). A buffer that cannot be
    // allocated leaves the row on the start probe.
    const bool is_tg = test.n_prompt == 0 && test.n_gen > 0;
    const bool probe_each = is_tg && (f_.bw_probe == "each" || (f_.bw_probe == "auto" && !row.weights_in_llc()));
    std::optional<kernels::ReadBandwidthProbe> probe;
    std::vector<double> probes;  // GB/s: before timed rep 0, 1, ..., after the last
    if (probe_each) {
      probe.emplace(pool, static_cast<size_t>(f_.bw_mib) << 20);
      if (!probe->ok()) probe.reset();
    }
    auto measure_probe = [&] { probes.push_back(probe->measure(pool, kProbePasses)); };
    auto one = [&](int n_prompt, int n_gen) -> core::Expected<void> {
      cache.truncate(test.n_depth);
      if (auto r = runner.prompt(n_prompt, pool); !r) return r;
      return runner.generate(n_gen, pool);
    };
    for (uint64_t rep = 0; rep < runs_per_test_; ++rep) {
      const bool warmup = !f_.no_warmup && rep == 0;
      p.set_label("bench: " + ms.type + ", " + std::to_string(threads) + " thread(s), " + test.name() + ", " +
                  (warmup ? std::string("warm-up")
                          : "rep " + std::to_string(rep + (f_.no_warmup ? 1 : 0)) + "/" + std::to_string(f_.reps)));
      p.update(runs_done_);
      if (probe && !warmup && probes.empty()) measure_probe();
      // llama-bench's warm-up: the prompt once, one generated token.
      const auto t0 = Clock::now();
      auto r = warmup ? one(test.n_prompt, test.n_gen > 0 ? 1 : 0) : one(test.n_prompt, test.n_gen);
      const auto t1 = Clock::now();
      if (!r) {
        p.finish();
        return std::unexpected(r.error());
      }
      if (!warmup) row.samples_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
      if (probe && !warmup) measure_probe();
      p.update(++runs_done_);
    }
    p.finish();
    for (size_t i = 0; i + 1 < probes.size(); ++i) row.read_gbs_reps.push_back((probes[i] + probes[i + 1]) / 2);
    return row;
  }

  const BenchFlags& f_;
  const ParsedFlags& pf_;
  const Runtime& rt_;
  const std::vector<TestSpec> plan_;
  std::map<int, std::unique_ptr<core::ThreadPool>> pools_;  // one per distinct -t value
  std::map<int, Ceilings> ceilings_;                        // by thread count
  const LastLevelCache llc_ = last_level_cache();
  int fill_threads_ = 1;  // the largest thread count: fills the cache
  const std::string backend_;
  Printer printer_;
  std::vector<std::unique_ptr<ModelStats>> stats_;  // one per model loaded so far (rows point into them)
  const uint64_t runs_per_test_;                    // -r, plus the warm-up
  const uint64_t total_runs_;
  uint64_t runs_done_ = 0;
};

// `bonsai bench`: usage checks, runtime, plan, then the plan on every model; the exit code.
int bench_main(const BenchFlags& f) {
  auto usage = [](const std::string& msg) {
    std::cerr << "bonsai bench: " << msg << "\n";
    return kExitUsage;
  };
  // Usage checks (exit 2) before anything runs.
  auto pf = parse_flags(f);
  if (!pf) return usage(pf.error().message);
  // Runtime: BONSAI_KERNEL, --q2-layout (usage errors). The bench sizes its
  // own pools per -t value, not the global one.
  RuntimeFlags rf;
  rf.size_global_pool = false;
  rf.q2_layout = f.q2_layout;
  rf.no_repack = f.no_repack;
  auto rt = init_runtime_or_report("bench", rf);
  if (!rt) return kExitUsage;
  if (pf->threads.empty()) pf->threads.push_back(rt->threads);
  auto plan = make_plan(*pf);
  if (plan.empty()) return usage("nothing to run: every -p and -n is 0 and no -pg was given");
  if (f.hf.repo.empty() && !f.hf.file.empty()) return usage("-hff needs -hf OWNER/NAME");
  auto paths = model_paths(f);
  if (!paths) {
    if (!f.hf.repo.empty()) return 1;  // resolve_hf_model printed why
    std::cerr << "bonsai bench: cannot prepare the built-in default model: " << paths.error().message << "\n";
    return 1;
  }

  BenchRun run(f, *pf, *rt, std::move(plan), paths->size());  // (ceilings measured once the first model loads)
  for (const auto& path : *paths) {
    if (int rc = run.run_model(path); rc != 0) return rc;
  }
  run.end();
  return 0;
}

}  // namespace

void register_bench(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  auto* cmd = app.add_subcommand("bench", "Measure prompt and generation speed (llama-bench's flags and table)");
  cmd->add_option("-m,--model", f->models,
                  "GGUF model file(s), comma-separated or repeated (default: the built-in tiny model)")
      ->delimiter(',');
  add_hf_flags(cmd, f->hf);
  cmd->add_option("-p,--n-prompt", f->n_prompt, "Prompt tokens per pp test, comma list (0: no pp test)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", f->n_gen, "Generated tokens per tg test, comma list (0: no tg test)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--pg", f->pg, "Prompt + generation test PP,TG (repeatable; also -pg, as llama-bench)");
  cmd->add_option("-d,--n-depth", f->depth, "KV cache depth before each test, comma list")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-t,--threads", f->threads, "Thread counts, comma list (default: the physical cores)")
      ->delimiter(',');
  cmd->add_option("-r,--repetitions", f->reps, "Timed repetitions of each test")->capture_default_str();
  cmd->add_option("-o,--output", f->output, "Output format: md, csv, json or jsonl")->capture_default_str();
  cmd->add_option("--cache-type-k", f->cache_type_k, "KV cache type for K: f16, f32, q8_0 (also -ctk, as llama-bench)")
      ->capture_default_str();
  cmd->add_option("--cache-type-v", f->cache_type_v, "KV cache type for V: f16, f32, q8_0 (also -ctv, as llama-bench)")
      ->capture_default_str();
  cmd->add_flag("--no-warmup", f->no_warmup, "Skip the untimed warm-up run of each test");
  cmd->add_option("--q2-layout", f->q2_layout,
                  "Force the type-42 layout: g64, g128-d-first, g128-qs-first (env BONSAI_Q2_LAYOUT)");
  cmd->add_flag("--no-repack", f->no_repack, kNoRepackHelp);
  cmd->add_option("--bw-mib", f->bw_mib, "Buffer streamed by the read-bandwidth measurement, MiB")
      ->capture_default_str();
  cmd->add_option("--bw-probe", f->bw_probe,
                  "When tg's bw roofline measures the bandwidth: start (once, before the models load), each (also "
                  "right before and after every tg repetition), auto (each where the matrices exceed the "
                  "last-level cache, or its size is unknown)")
      ->check(CLI::IsMember({"auto", "start", "each"}))
      ->capture_default_str();
  add_ignored_llama_flags(cmd, f->llama, LlamaCommand::kBench);
  cmd->callback([cmd, f] {
    if (!report_ignored_llama_flags("bench", *cmd)) return set_exit_code(kExitUsage);
    set_exit_code(bench_main(*f));
  });
}

}  // namespace bonsai::app
