// Per-request latency and rate metrics (time to first token, inter-token
// latency, tokens/s) and a thread-safe roll-up over many requests.
//
// Percentiles use the nearest-rank method: p-th percentile of n sorted
// samples is sample[ceil(p/100 * n) - 1] (0 when there are no samples).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <vector>

namespace bonsai::engine {

using Clock = std::chrono::steady_clock;

// Nearest-rank percentile of `samples` (sorted or not; copied). p in [0, 100].
double percentile(std::span<const double> samples, double p);

// The figures of one finished (or cancelled) request. Times in milliseconds.
struct RequestRateSummary {
  uint64_t tokens = 0;    // generated tokens recorded with on_token
  double queue_ms = 0;    // admission -> start (0 if on_start was never called)
  double ttft_ms = 0;     // admission -> first token (0 if no token)
  double itl_p50_ms = 0;  // inter-token latency, median
  double itl_p95_ms = 0;  // inter-token latency, 95th percentile
  double itl_mean_ms = 0;
  double total_ms = 0;         // admission -> finish (or the last event)
  double tokens_per_s = 0;     // (tokens - 1) / (last token - first token); 0 if < 2 tokens
  std::vector<double> itl_ms;  // every inter-token gap, in order
};

// Tracks one request: admission (constructor), optional start (engine
// acquired), first token and each token after. Not thread-safe: one request
// is driven by one thread. Timestamps default to Clock::now().
class RequestRateTracker {
 public:
  explicit RequestRateTracker(Clock::time_point admitted = Clock::now());

  // The request left the queue and started running (e.g. lease acquired).
  void on_start(Clock::time_point t = Clock::now());
  // One generated token; the first call is the first token.
  void on_token(Clock::time_point t = Clock::now());
  // The request finished (any reason).
  void on_finish(Clock::time_point t = Clock::now());

  uint64_t tokens() const { return tokens_; }
  RequestRateSummary summary() const;

 private:
  Clock::time_point admitted_;
  Clock::time_point started_{};
  Clock::time_point first_{};
  Clock::time_point last_{};
  Clock::time_point finished_{};
  bool has_start_ = false;
  bool has_finish_ = false;
  uint64_t tokens_ = 0;
  std::vector<double> itl_ms_;
};

// Snapshot of a RequestRateAggregator. Cumulative counters (for Prometheus
// counters/sums) plus percentiles over the last `window` requests / gaps.
struct RequestRateStats {
  uint64_t requests = 0;   // cumulative
  uint64_t tokens = 0;     // cumulative generated tokens
  double ttft_sum_ms = 0;  // cumulative sum over requests with >= 1 token
  uint64_t ttft_count = 0;
  double itl_sum_ms = 0;  // cumulative sum of all inter-token gaps
  uint64_t itl_count = 0;
  double queue_sum_ms = 0;
  // Over the rolling window:
  double ttft_p50_ms = 0, ttft_p95_ms = 0;
  double itl_p50_ms = 0, itl_p95_ms = 0;
  double tokens_per_s_mean = 0;  // mean of per-request tokens_per_s (requests with >= 2 tokens)
};

// Rolls request summaries up. Thread-safe: every member takes mu_, which is
// held only to copy data in or out (never across a wait or a forward pass).
class RequestRateAggregator {
 public:
  // `window`: how many recent requests (and inter-token gaps, x64) the
  // percentiles cover. >= 1.
  explicit RequestRateAggregator(size_t window = 1024);

  void record(const RequestRateSummary& s);
  RequestRateStats snapshot() const;

 private:
  const size_t window_;
  mutable std::mutex mu_;    // guards everything below
  RequestRateStats totals_;  // cumulative fields only
  std::deque<double> ttft_;  // last window_ TTFTs
  std::deque<double> tps_;   // last window_ tokens/s (requests with >= 2 tokens)
  std::deque<double> itl_;   // last 64 * window_ gaps
};

}  // namespace bonsai::engine
