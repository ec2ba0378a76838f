// `bonsai bench` end to end: llama-bench's table and outputs, the roofline
// columns, usage errors (exit 2) and progress on stderr.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "gguf/gguf.h"

namespace {

namespace fs = std::filesystem;
using bonsai::test::run_bonsai;

const std::string kStories = bonsai::test::shared_path("models/stories260K/stories260K.gguf");

// Cells of a markdown table row "| a | b |" (trimmed).
std::vector<std::string> md_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream ss(line);
  std::string cell;
  std::getline(ss, cell, '|');  // before the first '|'
  while (std::getline(ss, cell, '|')) {
    const auto b = cell.find_first_not_of(' ');
    const auto e = cell.find_last_not_of(' ');
    cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
  }
  return cells;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string l; std::getline(ss, l);) out.push_back(l);
  return out;
}

TEST(CliBench, MarkdownTableHasLlamaBenchColumnsAndRatios) {
  BONSAI_REQUIRE_FILE(kStories);
  const auto r = run_bonsai("bench -m '" + kStories + "' -p 16 -n 8 -r 2 -t 1 --bw-mib 64");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "") << "no progress when stderr is not a terminal";
  const auto lines = lines_of(r.out);
  ASSERT_GE(lines.size(), 4u) << r.out;
  EXPECT_EQ(md_cells(lines[0]), (std::vector<std::string>{"model", "size", "params", "backend", "threads", "test",
                                                          "t/s", "bw roofline", "int8 peak"}));
  const auto pp = md_cells(lines[2]);
  const auto tg = md_cells(lines[3]);
  ASSERT_EQ(pp.size(), 9u) << lines[2];
  ASSERT_EQ(tg.size(), 9u) << lines[3];
  EXPECT_EQ(pp[0].rfind("llama ", 0), 0u) << pp[0];  // architecture first, as llama-bench
  EXPECT_EQ(pp[2], "292.80 K");                      // every tensor's elements
  EXPECT_EQ(pp[3].rfind("CPU/", 0), 0u) << pp[3];
  EXPECT_EQ(pp[4], "1");
  EXPECT_EQ(pp[5], "pp16");
  EXPECT_EQ(tg[5], "tg8");
  for (const auto* row : {&pp, &tg}) {
    const std::string& ts = (*row)[6];
    ASSERT_NE(ts.find(" ± "), std::string::npos) << ts;
    EXPECT_GT(std::stod(ts.substr(0, ts.find(' '))), 0.0) << ts;
  }
  // The roofline ratio only for tg, the int8-peak ratio only for pp.
  EXPECT_EQ(pp[7], "-");
  EXPECT_EQ(pp[8].back(), '%') << pp[8];
  // (A model whose matrices fit in the last-level cache gets the '*' marker: LlcResidentModelIsMarked.)
  EXPECT_TRUE(tg[7].back() == '%' || tg[7].ends_with("%*")) << tg[7];
  EXPECT_EQ(tg[8], "-");
  EXPECT_NE(r.out.find("1 thread: read bandwidth "), std::string::npos) << r.out;
}

TEST(CliBench, JsonHasTheFieldsAndPositiveSpeedsAtEveryDepthAndThreadCount) {
  const fs::path cache = fs::temp_directory_path() / ("bonsai_bench_cache_" + std::to_string(::getpid()));
  const auto r = run_bonsai("bench -p 32 -n 4 -r 2 -t 1,2 -d 0,8 -o json --bw-mib 64",
                            "BONSAI_CACHE_DIR='" + cache.string() + "' ");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 8u);  // 2 tests x 2 depths x 2 thread counts
  // The default model is the tiny synthetic Qwen3 in the cache dir.
  const std::string path = j[0].at("model_filename");
  auto file = bonsai::gguf::File::open(path);
  ASSERT_TRUE(file.has_value()) << path;
  uint64_t params = 0, bytes = 0;
  for (const auto& t : (*file)->tensors()) {
    params += static_cast<uint64_t>(t.n_elements());
    bytes += t.n_bytes;
  }
  const uint64_t n_layer = *(*file)->get<uint64_t>("qwen3.block_count");
  const uint64_t n_kv = *(*file)->get<uint64_t>("qwen3.attention.head_count_kv");
  const uint64_t hd = *(*file)->get<uint64_t>("qwen3.attention.key_length");
  const double kv_per_pos = static_cast<double>(n_layer * n_kv * hd * 2 * 2);  // K+V, f16

  std::set<std::string> names;
  std::map<std::string, double> tg_bytes;
  for (const auto& row : j) {
    names.insert(row.at("test").get<std::string>() + " t" + std::to_string(row.at("n_threads").get<int>()));
    EXPECT_EQ(row.at("model_n_params"), params);
    EXPECT_EQ(row.at("model_size"), bytes);
    EXPECT_EQ(row.at("model_type").get<std::string>().rfind("qwen3 ", 0), 0u) << row.at("model_type");
    EXPECT_GT(row.at("avg_ts").get<double>(), 0.0);
    EXPECT_GE(row.at("stddev_ts").get<double>(), 0.0);
    EXPECT_EQ(row.at("samples_ts").size(), 2u);
    EXPECT_EQ(row.at("samples_ns").size(), 2u);
    EXPECT_GT(row.at("avg_ns").get<int64_t>(), 0);
    EXPECT_GT(row.at("read_bw_gbs").get<double>(), 0.0);
    // The fields llama-bench's tools key rows on (compare-llama-bench.py).
    for (const char* key : {"build_commit", "build_number", "gpu_info", "n_batch", "n_gpu_layers", "split_mode",
                            "main_gpu", "no_kv_offload", "flash_attn", "tensor_split", "use_mmap", "embeddings"})
      EXPECT_TRUE(row.contains(key)) << key;
    EXPECT_EQ(row.at("n_gpu_layers"), 0);
    EXPECT_EQ(row.at("use_mmap"), true);
    EXPECT_EQ(row.at("n_batch"), row.at("n_ubatch"));
    const bool tg = row.at("n_gen").get<int>() > 0;
    if (tg) {
      EXPECT_TRUE(row.at("int8_peak_ratio").is_null());
      EXPECT_GT(row.at("bw_ratio").get<double>(), 0.0);
      tg_bytes[row.at("test")] = row.at("bytes_per_token").get<double>();
    } else {
      EXPECT_TRUE(row.at("bw_ratio").is_null());
      EXPECT_EQ(row.at("n_prompt"), 32);
      if (row.at("int8_peak_gops").get<double>() > 0) {
        EXPECT_GT(row.at("int8_peak_ratio").get<double>(), 0.0);
      }
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"pp32 t1", "pp32 t2", "tg4 t1", "tg4 t2", "pp32 @ d8 t1", "pp32 @ d8 t2",
                                          "tg4 @ d8 t1", "tg4 @ d8 t2"}));
  // Depth 8 reads 8 more cached positions per token.
  EXPECT_DOUBLE_EQ(tg_bytes["tg4 @ d8"] - tg_bytes["tg4"], 8 * kv_per_pos);
  fs::remove_all(cache);
}

// -ctk / -ctv (llama-bench's spelling, rewritten before parsing) choose the
// KV cache types: reported as type_k / type_v, and the tg bytes per token
// count the q8_0 rows (34 bytes per 32 values) instead of f16's 64.
TEST(CliBench, CacheTypeFlagsSetTheKvTypesAndTheirBytes) {
  const std::string tiny = bonsai::test::shared_path("fixtures/qwen3-tiny-q1_0.gguf");
  BONSAI_REQUIRE_FILE(tiny);
  auto file = bonsai::gguf::File::open(tiny);
  ASSERT_TRUE(file.has_value());
  const uint64_t n_layer = *(*file)->get<uint64_t>("qwen3.block_count");
  const uint64_t n_kv = *(*file)->get<uint64_t>("qwen3.attention.head_count_kv");
  const uint64_t hd = *(*file)->get<uint64_t>("qwen3.attention.key_length");
  ASSERT_EQ(hd % 32, 0u);
  const std::string base = "bench -m '" + tiny + "' -p 8 -n 4 -d 6 -r 1 -t 1 --bw-mib 16 --no-warmup -o json ";
  std::map<std::string, double> bpt;
  for (const std::string kv : {"f16", "q8_0"}) {
    const auto r = run_bonsai(base + "-ctk " + kv + " -ctv " + kv);
    ASSERT_EQ(r.rc, 0) << kv << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j.size(), 2u);
    for (const auto& row : j) {
      EXPECT_EQ(row.at("type_k"), kv);
      EXPECT_EQ(row.at("type_v"), kv);
      EXPECT_GT(row.at("avg_ts").get<double>(), 0.0);
    }
    bpt[kv] = j[1].at("bytes_per_token").get<double>();  // tg4 @ d6
  }
  // Mean position 6 + 5/2 = 8.5; per position and layer and KV head, K and V rows.
  const double rows = 8.5 * static_cast<double>(n_layer * n_kv * 2);
  EXPECT_DOUBLE_EQ(bpt["f16"] - bpt["q8_0"], rows * static_cast<double>(hd * 2 - hd / 32 * 34));
  // The long names work too; a bad type is a usage error naming the flag.
  const auto longf = run_bonsai(base + "--cache-type-k q8_0");
  ASSERT_EQ(longf.rc, 0) << longf.err;
  EXPECT_EQ(nlohmann::json::parse(longf.out)[0].at("type_k"), "q8_0");
  const auto bad = run_bonsai(base + "-ctv q4_0");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("-ctv: "), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("q4_0"), std::string::npos) << bad.err;
}

TEST(CliBench, CsvJsonlAndPromptPlusGeneration) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string m = "bench -m '" + kStories + "' -r 1 -t 1 --bw-mib 16 --no-warmup ";
  const auto jl = run_bonsai(m + "-p 8 -n 4 -pg 8,2 -o jsonl");
  ASSERT_EQ(jl.rc, 0) << jl.err;
  const auto rows = lines_of(jl.out);
  ASSERT_EQ(rows.size(), 3u) << jl.out;
  EXPECT_EQ(nlohmann::json::parse(rows[0]).at("test"), "pp8");
  EXPECT_EQ(nlohmann::json::parse(rows[1]).at("test"), "tg4");
  const auto pg = nlohmann::json::parse(rows[2]);
  EXPECT_EQ(pg.at("test"), "pp8+tg2");
  EXPECT_EQ(pg.at("n_prompt"), 8);
  EXPECT_EQ(pg.at("n_gen"), 2);
  EXPECT_TRUE(pg.at("bw_ratio").is_null());
  EXPECT_TRUE(pg.at("int8_peak_ratio").is_null());

  const auto csv = run_bonsai(m + "-p 8 -n 0 -o csv");
  ASSERT_EQ(csv.rc, 0) << csv.err;
  const auto l = lines_of(csv.out);
  ASSERT_EQ(l.size(), 2u) << csv.out;
  // llama-bench's CSV header starts so (build first, then the machine and the model).
  EXPECT_EQ(l[0].rfind("build_commit,build_number,cpu_info,gpu_info,backends,model_filename,", 0), 0u) << l[0];
  EXPECT_NE(l[0].find(",avg_ts,stddev_ts,"), std::string::npos) << l[0];
  EXPECT_NE(l[1].find("\"pp8\""), std::string::npos) << l[1];
}

TEST(CliBench, BadFlagsAreUsageErrorsExitCode2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"-o xml", "bonsai bench: -o: unknown output format 'xml' (expected md, csv, json or jsonl)\n"},
      {"-p 12x", "bonsai bench: -p: '12x' is not an integer >= 0\n"},
      {"-n 3.5", "bonsai bench: -n: '3.5' is not an integer >= 0\n"},
      {"-t 0", "bonsai bench: -t: '0' is not an integer >= 1\n"},
      {"-d 1,x", "bonsai bench: -d: 'x' is not an integer >= 0\n"},
      {"-r 0", "bonsai bench: -r: repetitions must be >= 1\n"},
      {"-pg 512", "bonsai bench: -pg: '512' is not PP,TG (two integers >= 1)\n"},
      {"-p 0 -n 0", "bonsai bench: nothing to run: every -p and -n is 0 and no -pg was given\n"},
      {"--q2-layout g32", "bonsai bench: unknown Q2_0 layout 'g32' (expected g64, g128-d-first or g128-qs-first)\n"},
  };
  for (const auto& [args, msg] : cases) {
    const auto r = run_bonsai("bench -m /nonexistent.gguf " + args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_EQ(r.err, msg) << args;
    EXPECT_EQ(r.out, "") << args;
  }
  const auto unknown = run_bonsai("bench --bogus");
  EXPECT_EQ(unknown.rc, 2) << unknown.err;
  EXPECT_NE(unknown.err.find("--bogus"), std::string::npos) << unknown.err;
  // A model that does not load is not a usage error.
  const auto missing = run_bonsai("bench -m /nonexistent.gguf -p 8 -n 0 -r 1 --bw-mib 16");
  EXPECT_EQ(missing.rc, 1) << missing.err;
  EXPECT_NE(missing.err.find("bonsai bench: cannot load model: "), std::string::npos) << missing.err;
}

TEST(CliBench, ProgressOnStderrOnlyWhenAsked) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string args = "bench -m '" + kStories + "' -p 8 -n 4 -r 1 -t 1 --bw-mib 16 -o jsonl";
  const auto shown = run_bonsai(args, "BONSAI_PROGRESS=1 ");
  ASSERT_EQ(shown.rc, 0) << shown.err;
  EXPECT_NE(shown.err.find("bench: measuring read bandwidth"), std::string::npos) << shown.err;
  EXPECT_NE(shown.err.find(", 1 thread(s), tg4, rep 1/1"), std::string::npos) << shown.err;
  EXPECT_NE(shown.err.find("\r\033[K"), std::string::npos);
  EXPECT_EQ(lines_of(shown.out).size(), 2u) << "progress never goes to stdout";
  const auto quiet = run_bonsai(args, "BONSAI_PROGRESS=0 ");
  ASSERT_EQ(quiet.rc, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
}

// The last-level cache's bytes from sysfs (the highest-level unified cache
// of cpu0), 0 where sysfs does not say.
uint64_t llc_bytes_from_sysfs() {
  uint64_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 8; ++i) {
    const fs::path d = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
    std::string level, type, size;
    std::ifstream(d / "level") >> level;
    std::ifstream(d / "type") >> type;
    std::ifstream(d / "size") >> size;
    if (level.empty() || type != "Unified" || size.empty()) continue;
    uint64_t v = std::stoull(size);
    if (size.back() == 'K') v <<= 10;
    if (size.back() == 'M') v <<= 20;
    if (std::stoi(level) > best_level) {
      best_level = std::stoi(level);
      best = v;
    }
  }
  return best;
}

// tg's roofline ratio of a model whose matrices fit in the last-level cache
// is not a bandwidth bound (it read 328% of DRAM bandwidth): marked '*' with
// a footnote in md, weights_in_llc in JSON.
TEST(CliBench, LlcResidentModelIsMarked) {
  BONSAI_REQUIRE_FILE(kStories);
  const uint64_t llc = llc_bytes_from_sysfs();
  if (llc == 0) GTEST_SKIP() << "no cache sizes in sysfs";
  const std::string args = "bench -m '" + kStories + "' -p 0 -n 4 -r 1 -t 1 --bw-mib 64";
  const auto r = run_bonsai(args);
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_GE(lines.size(), 3u) << r.out;
  const auto tg = md_cells(lines[2]);
  ASSERT_EQ(tg.size(), 9u) << lines[2];
  const auto j = nlohmann::json::parse(run_bonsai(args + " -o json").out);
  ASSERT_EQ(j.size(), 1u);
  const double matrix_bytes = j[0].at("bytes_per_token").get<double>();  // depth 0: ~the matrices (~1 MB)
  ASSERT_LT(matrix_bytes, static_cast<double>(llc));                     // stories260K fits any L3
  EXPECT_TRUE(j[0].at("weights_in_llc").get<bool>());
  EXPECT_EQ(j[0].at("llc_bytes").get<uint64_t>(), llc);
  EXPECT_GT(j[0].at("bw_ratio").get<double>(), 0.0);  // still reported, flagged
  EXPECT_TRUE(tg[7].ends_with("%*")) << tg[7];
  const std::string note = "* weights fit in L3 (" + std::to_string(llc >> 20) + " MiB): not bandwidth-bound";
  EXPECT_NE(r.out.find(note), std::string::npos) << r.out;
}

// --bw-probe each: the bandwidth measured again around every tg repetition;
// the column is the mean of each repetition's t/s over the mean of the probes
// before and after it (checked against the JSON's own samples), the md
// footer lists the range. The default (auto) does not probe a model that
// fits in the last-level cache, and pp rows never get probes.
TEST(CliBench, BandwidthProbedAroundEachTgRepetition) {
  BONSAI_REQUIRE_FILE(kStories);
  const std::string args = "bench -m '" + kStories + "' -p 8 -n 4 -r 3 -t 1 --bw-mib 32 --no-warmup";
  const auto r = run_bonsai(args + " --bw-probe each -o json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_TRUE(j[0].at("read_bw_gbs_reps").is_null());  // pp8
  const auto& tg = j[1];
  ASSERT_EQ(tg.at("test").get<std::string>(), "tg4");
  const auto bw = tg.at("read_bw_gbs_reps").get<std::vector<double>>();
  const auto ts = tg.at("samples_ts").get<std::vector<double>>();
  ASSERT_EQ(bw.size(), 3u);
  ASSERT_EQ(ts.size(), 3u);
  double want = 0;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_GT(bw[i], 0.0);
    want += ts[i] * tg.at("bytes_per_token").get<double>() / (bw[i] * 1e9) / 3;
  }
  EXPECT_NEAR(tg.at("bw_ratio").get<double>(), want, want * 1e-9);
  // The start-of-run probe is still reported beside them.
  EXPECT_GT(tg.at("read_bw_gbs").get<double>(), 0.0);

  const auto md = run_bonsai(args + " --bw-probe each");
  ASSERT_EQ(md.rc, 0) << md.err;
  EXPECT_NE(md.out.find("bw roofline of these rows: each repetition's t/s over the read bandwidth"), std::string::npos)
      << md.out;
  EXPECT_NE(md.out.find("  tg4, 1 thread: "), std::string::npos) << md.out;

  if (llc_bytes_from_sysfs() > 0) {  // auto: stories260K fits, so no probes
    const auto a = nlohmann::json::parse(run_bonsai(args + " -o json").out);
    ASSERT_EQ(a.size(), 2u);
    EXPECT_TRUE(a[1].at("read_bw_gbs_reps").is_null());
  }
  const auto bad = run_bonsai(args + " --bw-probe sometimes");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("--bw-probe"), std::string::npos) << bad.err;
}

// A depth (plus the test's tokens) beyond the model's context (stories260K:
// 2048) is refused as a usage error naming the context, before anything runs.
TEST(CliBench, DepthBeyondTheContextIsAUsageError) {
  BONSAI_REQUIRE_FILE(kStories);
  const auto r = run_bonsai("bench -m '" + kStories + "' -p 0 -n 4 -d 5000 -r 1 -t 1 --bw-mib 64");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("tg4 @ d5000 needs 5004 positions, beyond the model's context (2048)"), std::string::npos)
      << r.err;
  // Exactly the context still runs.
  const auto fits = run_bonsai("bench -m '" + kStories + "' -p 0 -n 4 -d 2044 -r 1 -t 1 --bw-mib 64 -o jsonl");
  EXPECT_EQ(fits.rc, 0) << fits.err;
  EXPECT_NE(fits.out.find("\"n_depth\":2044"), std::string::npos) << fits.out;
}

}  // namespace
