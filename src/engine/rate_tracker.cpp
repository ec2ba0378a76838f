// Request-rate metrics; see rate_tracker.h.
#include "engine/rate_tracker.h"

#include <algorithm>
#include <cmath>

namespace bonsai::engine {

namespace {
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
template <class C>
void push_bounded(C& c, double v, size_t cap) {
  c.push_back(v);
  while (c.size() > cap) c.pop_front();
}
}  // namespace

double percentile(std::span<const double> samples, double p) {
  if (samples.empty()) return 0.0;
  std::vector<double> v(samples.begin(), samples.end());
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size()));
  const size_t idx = rank < 1.0 ? 0 : static_cast<size_t>(rank) - 1;
  return v[std::min(idx, v.size() - 1)];
}

RequestRateTracker::RequestRateTracker(Clock::time_point admitted) : admitted_(admitted) {}

void RequestRateTracker::on_start(Clock::time_point t) {
  started_ = t;
  has_start_ = true;
}

void RequestRateTracker::on_token(Clock::time_point t) {
  if (tokens_ == 0) {
    first_ = t;
  } else {
    itl_ms_.push_back(ms_between(last_, t));
  }
  last_ = t;
  ++tokens_;
}

void RequestRateTracker::on_finish(Clock::time_point t) {
  finished_ = t;
  has_finish_ = true;
}

RequestRateSummary RequestRateTracker::summary() const {
  RequestRateSummary s;
  s.tokens = tokens_;
  if (has_start_) s.queue_ms = ms_between(admitted_, started_);
  if (tokens_ > 0) s.ttft_ms = ms_between(admitted_, first_);
  s.itl_p50_ms = percentile(itl_ms_, 50);
  s.itl_p95_ms = percentile(itl_ms_, 95);
  if (!itl_ms_.empty()) {
    double sum = 0;
    for (double x : itl_ms_) sum += x;
    s.itl_mean_ms = sum / static_cast<double>(itl_ms_.size());
  }
  Clock::time_point end = admitted_;
  if (has_start_) end = std::max(end, started_);
  if (tokens_ > 0) end = std::max(end, last_);
  if (has_finish_) end = std::max(end, finished_);
  s.total_ms = ms_between(admitted_, end);
  if (tokens_ >= 2) {
    const double span_ms = ms_between(first_, last_);
    if (span_ms > 0) s.tokens_per_s = static_cast<double>(tokens_ - 1) * 1000.0 / span_ms;
  }
  s.itl_ms = itl_ms_;
  return s;
}

RequestRateAggregator::RequestRateAggregator(size_t window) : window_(std::max<size_t>(window, 1)) {}

void RequestRateAggregator::record(const RequestRateSummary& s) {
  std::lock_guard lock(mu_);
  ++totals_.requests;
  totals_.tokens += s.tokens;
  totals_.queue_sum_ms += s.queue_ms;
  if (s.tokens > 0) {
    totals_.ttft_sum_ms += s.ttft_ms;
    ++totals_.ttft_count;
    push_bounded(ttft_, s.ttft_ms, window_);
  }
  if (s.tokens >= 2 && s.tokens_per_s > 0) push_bounded(tps_, s.tokens_per_s, window_);
  for (double x : s.itl_ms) {
    totals_.itl_sum_ms += x;
    ++totals_.itl_count;
    push_bounded(itl_, x, 64 * window_);
  }
}

RequestRateStats RequestRateAggregator::snapshot() const {
  std::vector<double> ttft, itl, tps;
  RequestRateStats out;
  {
    std::lock_guard lock(mu_);
    out = totals_;
    ttft.assign(ttft_.begin(), ttft_.end());
    itl.assign(itl_.begin(), itl_.end());
    tps.assign(tps_.begin(), tps_.end());
  }
  out.ttft_p50_ms = percentile(ttft, 50);
  out.ttft_p95_ms = percentile(ttft, 95);
  out.itl_p50_ms = percentile(itl, 50);
  out.itl_p95_ms = percentile(itl, 95);
  if (!tps.empty()) {
    double sum = 0;
    for (double x : tps) sum += x;
    out.tokens_per_s_mean = sum / static_cast<double>(tps.size());
  }
  return out;
}

}  // namespace bonsai::engine
