// Helpers shared by the CLI's subcommands: the one runtime initialisation
// every command runs first (kernel tier from BONSAI_KERNEL, the Q2_0 layout
// from --q2-layout / BONSAI_Q2_LAYOUT, -t, whether progress is shown), the
// progress line on stderr, and model loading with progress.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "core/error.h"
#include "gguf/gguf.h"        // gguf::OpenOptions
#include "kernels/kernels.h"  // kernels::Tier
#include "model/model.h"      // model::LoadOptions

namespace bonsai::model {
class Model;
}

namespace bonsai::app {

// Exit status of a usage error (bad flag value, bad environment variable),
// as CLI11's own parse errors are mapped to in main.cpp. Other failures exit 1.
inline constexpr int kExitUsage = 2;

// Model load options from the `--q2-layout` value (`flag`), else env
// BONSAI_Q2_LAYOUT, else none (the reader detects the layout); `no_repack`
// (`--no-repack`, or env BONSAI_NO_REPACK=1) clears LoadOptions::repack;
// BONSAI_NO_REPACK unset, empty or 0 leaves it set.
// Errors: kInvalidArgument "unknown Q2_0 layout 'X' (expected g64,
// g128-d-first or g128-qs-first)"; kInvalidArgument "BONSAI_NO_REPACK='X' is
// not a switch (expected 1 or 0)" for any other value of the variable.
core::Expected<model::LoadOptions> open_options_from_cli(const std::string& flag, bool no_repack = false);

// Help text of `--no-repack`, shared by every command that loads a model.
inline constexpr const char* kNoRepackHelp =
    "Keep every weight a zero-copy view of the file (no load-time repacked layout; env BONSAI_NO_REPACK=1)";

// The flags every command that opens or computes on a model shares.
struct RuntimeFlags {
  // -t: compute threads; 0 or -1: the physical cores. A value > 0 sizes the
  // process-wide pool (core::global_pool) when `size_global_pool`.
  int threads = 0;
  bool size_global_pool = true;
  std::string q2_layout;   // --q2-layout; empty: env BONSAI_Q2_LAYOUT, else detected per file
  bool no_repack = false;  // --no-repack (see open_options_from_cli)
};

// The runtime settings a command runs with, resolved once by init_runtime.
struct Runtime {
  model::LoadOptions open_options;                 // Model::load options; .file for gguf::File::open
  int threads = 1;                                 // >= 1: -t, or the physical cores
  kernels::Tier tier = kernels::Tier::kReference;  // the active kernel tier
  bool progress = false;                           // draw progress lines on stderr (see progress_enabled)
};

// Whether progress lines are drawn: env BONSAI_PROGRESS=1 / =0 forces it on /
// off, otherwise only when stderr is a terminal (never into a log file or pipe).
bool progress_enabled();

// The one runtime initialisation, run by every command before it opens a
// file: applies env BONSAI_KERNEL (reference | avx2 | avx512 | avx512-amx |
// neon | neon-dotprod | neon-i8mm; unset: the best tier), checks
// --q2-layout / BONSAI_Q2_LAYOUT, sizes the global pool from -t. All
// errors are usage errors (exit kExitUsage):
//   "BONSAI_KERNEL='bogus' is not a kernel tier (expected reference, avx2,
//    avx512, avx512-amx, neon, neon-dotprod or neon-i8mm)"
//   "BONSAI_KERNEL: kernel tier 'avx512' is not supported by this CPU"
//   "unknown Q2_0 layout 'X' (expected g64, g128-d-first or g128-qs-first)"
// A -t that cannot size the global pool any more (it already started) only
// warns on stderr, naming `cmd`.
core::Expected<Runtime> init_runtime(std::string_view cmd, const RuntimeFlags& flags);

// init_runtime that prints "bonsai <cmd>: <message>" on error; the caller
// then exits with kExitUsage.
std::optional<Runtime> init_runtime_or_report(std::string_view cmd, const RuntimeFlags& flags);

// A one-line progress display on stderr:
//   "<label> [=========>          ]  45%  1.23/2.71 GiB  3.4 s"     (known total)
//   "<label> ...  3.4 s"                                           (total 0)
// redrawn at most every 100 ms, and erased (or replaced by the line given to
// finish) at the end. A disabled Progress prints nothing at all, so callers
// use it unconditionally. update/add are thread-safe (compute threads may
// report); the rest is for the owning thread.
class Progress {
 public:
  // What the counts are: bytes print as MiB/GiB, items as "i/n".
  enum class Unit : uint8_t { kBytes, kItems };

  Progress(std::string label, uint64_t total, Unit unit, bool enabled);
  ~Progress();  // stops the ticker and erases the line if finish() was not called
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool enabled() const { return enabled_; }
  void set_label(std::string label);  // e.g. the step now running
  void set_total(uint64_t total);
  void update(uint64_t done);  // absolute count
  void add(uint64_t delta);    // relative count
  // Redraws every 200 ms from a background thread until finish(): for steps
  // that report nothing (a load without a progress hook), so the elapsed time runs.
  void tick_in_background();
  // Stops; erases the line, or replaces it with `final_line` (+ newline) if non-empty.
  void finish(std::string_view final_line = {});
  // Erases the line for a moment so that other output can be written to the
  // terminal; the next update redraws it.
  void clear();

 private:
  void draw(bool force);
  void stop_ticker();

  const bool enabled_;
  const Unit unit_;
  std::mutex mu_;  // guards label_, last_draw_, drawn_, and the terminal line
  std::string label_;
  std::atomic<uint64_t> total_;
  std::atomic<uint64_t> done_{0};
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;  // a line is on the terminal now
  bool finished_ = false;
  std::atomic<bool> stop_{false};
  std::thread ticker_;
};

// Model::load(path, rt.open_options) with a progress line ("loading <path>",
// elapsed time) while it runs, when rt.progress; the line is then replaced
// by "loaded <path>: <model::describe(repack stats)>". Errors: those of
// Model::load.
core::Expected<std::shared_ptr<const model::Model>> load_model(const std::string& path, const Runtime& rt);

}  // namespace bonsai::app
