// The drivers' shared command line and machine-readable result: every
// non-Google-Benchmark driver in bench/ takes named flags (CLI11, which also
// keeps the old positional form) and, with --json FILE, writes one JSON object
// per run:
//   {"bench": "step", "cpu": "AMD EPYC 7B13", "command": "bonsai_bench_step -m ... -t 2",
//    "results": {...the driver's figures, the same numbers it prints...}}
// The text on stdout is unchanged by --json.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai::bench {

// The CPU's model name ("model name" in /proc/cpuinfo, else lscpu's
// "Model name"); "unknown" when neither says.
std::string cpu_model();

// argv joined by spaces, arguments with spaces or quotes single-quoted.
std::string command_line(int argc, char** argv);

// Checks of a number option with a plain message ("must be >= 1, got '0'").
inline const CLI::Validator kPositive(
    [](std::string& s) {
      double v = 0;
      return CLI::detail::lexical_cast(s, v) && v >= 1 ? std::string() : "must be >= 1, got '" + s + "'";
    },
    "POSITIVE");
inline const CLI::Validator kNonNegative(
    [](std::string& s) {
      double v = 0;
      return CLI::detail::lexical_cast(s, v) && v >= 0 ? std::string() : "must be >= 0, got '" + s + "'";
    },
    "NONNEGATIVE");

// Parses argv into `app`'s options: the exit code after --help or a bad
// value (CLI11's message printed), nullopt to go on.
std::optional<int> parse(CLI::App& app, int argc, char** argv);

// Adds --json FILE (the result object, written after the run) to `app`.
void add_json_option(CLI::App& app, std::string& path);

// Writes {"bench", "cpu", "command", "results"} to `path` (nothing when
// `path` is empty). False after printing why the file could not be written.
bool write_json(const std::string& path, std::string_view bench, int argc, char** argv, nlohmann::json results);

// Helpers the timing drivers share.
// n bytes (rounded up to 2 MiB), 2 MiB-aligned; with `huge_pages`,
// transparent huge pages are asked for (madvise MADV_HUGEPAGE). Freed with
// std::free. Exits the process with a message when the memory is not there.
uint8_t* huge_alloc(size_t n, bool huge_pages = true);
// Seconds on a monotonic clock (std::chrono::steady_clock).
double now_s();
// The median of `v` (the upper one for an even count); 0 when empty.
double median(std::vector<double> v);

}  // namespace bonsai::bench
