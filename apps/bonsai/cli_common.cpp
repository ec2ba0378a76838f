#include "apps/bonsai/cli_common.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "core/cpu_features.h"  // physical_cores
#include "core/thread_pool.h"   // set_global_thread_count, kMaxThreads
#include "model/model.h"        // Model::load

namespace bonsai::app {

core::Expected<model::LoadOptions> open_options_from_cli(const std::string& flag, bool no_repack) {
  model::LoadOptions options;
  bool env_no_repack = false;
  if (const char* env = std::getenv("BONSAI_NO_REPACK"); env != nullptr && *env != '\0') {
    const std::string_view v(env);
    if (v != "1" && v != "0") {
      return core::fail(core::Errc::kInvalidArgument,
                        "BONSAI_NO_REPACK='" + std::string(v) + "' is not a switch (expected 1 or 0)");
    }
    env_no_repack = v == "1";
  }
  options.repack = !no_repack && !env_no_repack;
  std::string layout = flag;
  if (layout.empty()) {
    if (const char* env = std::getenv("BONSAI_Q2_LAYOUT"); env != nullptr) layout = env;
  }
  if (layout.empty()) return options;
  options.file.q2_layout = core::parse_q2_layout(layout);
  if (!options.file.q2_layout) {
    return core::fail(core::Errc::kInvalidArgument,
                      "unknown Q2_0 layout '" + layout + "' (expected g64, g128-d-first or g128-qs-first)");
  }
  return options;
}

bool progress_enabled() {
  if (const char* env = std::getenv("BONSAI_PROGRESS"); env != nullptr && *env != '\0') {
    return std::string_view(env) != "0";
  }
  return ::isatty(STDERR_FILENO) == 1;
}

core::Expected<Runtime> init_runtime(std::string_view cmd, const RuntimeFlags& flags) {
  Runtime rt;
  if (auto t = kernels::init_tier_from_env(); !t) {
    // init_tier_from_env names the variable for an unknown name; an
    // unsupported tier's message ("kernel tier 'avx512' is not supported by
    // this CPU") does not say where the tier came from.
    std::string msg = t.error().message;
    if (msg.find("BONSAI_KERNEL") == std::string::npos) msg = "BONSAI_KERNEL: " + msg;
    return core::fail(core::Errc::kInvalidArgument, std::move(msg));
  }
  rt.tier = kernels::active_tier();
  auto open = open_options_from_cli(flags.q2_layout, flags.no_repack);
  if (!open) return std::unexpected(open.error());
  rt.open_options = *open;
  rt.threads = flags.threads > 0 ? std::min(flags.threads, core::ThreadPool::kMaxThreads)
                                 : std::max(1, core::cpu_features().physical_cores);
  if (flags.threads > 0 && flags.size_global_pool && !core::set_global_thread_count(rt.threads)) {
    std::cerr << "bonsai " << cmd << ": warning: -t ignored (the thread pool already started)\n";
  }
  rt.progress = progress_enabled();
  return rt;
}

std::optional<Runtime> init_runtime_or_report(std::string_view cmd, const RuntimeFlags& flags) {
  auto rt = init_runtime(cmd, flags);
  if (!rt) {
    std::cerr << "bonsai " << cmd << ": " << rt.error().message << "\n";
    return std::nullopt;
  }
  return *rt;
}

// ---- Progress ------------------------------------------------------------------------

namespace {

std::string format_bytes(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1u << 30));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1u << 20));
  }
  return buf;
}

}  // namespace

Progress::Progress(std::string label, uint64_t total, Unit unit, bool enabled)
    : enabled_(enabled),
      unit_(unit),
      label_(std::move(label)),
      total_(total),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  if (!finished_) finish();
}

void Progress::set_label(std::string label) {
  if (!enabled_) return;
  {
    std::lock_guard lock(mu_);
    label_ = std::move(label);
  }
  draw(true);
}

void Progress::set_total(uint64_t total) { total_.store(total, std::memory_order_relaxed); }

void Progress::update(uint64_t done) {
  if (!enabled_) return;
  done_.store(done, std::memory_order_relaxed);
  draw(false);
}

void Progress::add(uint64_t delta) {
  if (!enabled_) return;
  done_.fetch_add(delta, std::memory_order_relaxed);
  draw(false);
}

void Progress::draw(bool force) {
  std::lock_guard lock(mu_);
  if (finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double secs = std::chrono::duration<double>(now - start_).count();
  const uint64_t total = total_.load(std::memory_order_relaxed);
  const uint64_t done = std::min(done_.load(std::memory_order_relaxed), total ? total : UINT64_MAX);
  std::string line = "\r\033[K" + label_;
  char buf[96];
  if (total > 0) {
    constexpr int kWidth = 24;
    const double frac = static_cast<double>(done) / static_cast<double>(total);
    const int filled = static_cast<int>(frac * kWidth);
    line += " [";
    for (int i = 0; i < kWidth; ++i) line += i < filled ? '=' : (i == filled ? '>' : ' ');
    std::snprintf(buf, sizeof buf, "] %3d%%  ", static_cast<int>(frac * 100.0));
    line += buf;
    if (unit_ == Unit::kBytes) {
      line += format_bytes(done) + " / " + format_bytes(total);
    } else {
      line += std::to_string(done) + "/" + std::to_string(total);
    }
  } else {
    line += " ...";
  }
  std::snprintf(buf, sizeof buf, "  %.1f s", secs);
  line += buf;
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::clear() {
  if (!enabled_) return;
  std::lock_guard lock(mu_);
  if (drawn_) {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
    drawn_ = false;
  }
}

void Progress::tick_in_background() {
  if (!enabled_ || ticker_.joinable()) return;
  draw(true);
  ticker_ = std::thread([this] {
    while (!stop_.load(std::memory_order_relaxed)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (!stop_.load(std::memory_order_relaxed)) draw(true);
    }
  });
}

void Progress::stop_ticker() {
  stop_.store(true, std::memory_order_relaxed);
  if (ticker_.joinable()) ticker_.join();
}

void Progress::finish(std::string_view final_line) {
  if (!enabled_) {
    finished_ = true;
    return;
  }
  stop_ticker();
  std::lock_guard lock(mu_);
  if (finished_) return;
  finished_ = true;
  if (drawn_) std::fputs("\r\033[K", stderr);
  if (!final_line.empty()) {
    std::fwrite(final_line.data(), 1, final_line.size(), stderr);
    std::fputc('\n', stderr);
  }
  std::fflush(stderr);
  drawn_ = false;
}

core::Expected<std::shared_ptr<const model::Model>> load_model(const std::string& path, const Runtime& rt) {
  Progress progress("loading " + path, 0, Progress::Unit::kBytes, rt.progress);
  progress.tick_in_background();
  auto model = model::Model::load(path, rt.open_options);
  progress.finish(model ? "loaded " + path + ": " + model::describe((*model)->repack_stats()) : std::string());
  return model;
}

}  // namespace bonsai::app
