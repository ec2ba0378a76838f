// RequestRateTracker / RequestRateAggregator with explicit time points.
#include "engine/rate_tracker.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace bonsai::engine {
namespace {

using std::chrono::milliseconds;

TEST(Percentile, NearestRank) {
  const std::vector<double> v = {10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 5);  // ceil(5) = 5th
  EXPECT_DOUBLE_EQ(percentile(v, 90), 9);
  EXPECT_DOUBLE_EQ(percentile(v, 95), 10);  // ceil(9.5) = 10th
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{}, 50), 0);
}

TEST(RequestRateTracker, TtftItlAndRate) {
  const Clock::time_point t0 = Clock::now();
  RequestRateTracker t(t0);
  t.on_start(t0 + milliseconds(30));
  t.on_token(t0 + milliseconds(100));
  t.on_token(t0 + milliseconds(110));
  t.on_token(t0 + milliseconds(130));
  t.on_token(t0 + milliseconds(140));
  t.on_finish(t0 + milliseconds(150));
  const RequestRateSummary s = t.summary();
  EXPECT_EQ(s.tokens, 4u);
  EXPECT_NEAR(s.queue_ms, 30, 1e-6);
  EXPECT_NEAR(s.ttft_ms, 100, 1e-6);
  ASSERT_EQ(s.itl_ms.size(), 3u);  // 10, 20, 10
  EXPECT_NEAR(s.itl_p50_ms, 10, 1e-6);
  EXPECT_NEAR(s.itl_p95_ms, 20, 1e-6);
  EXPECT_NEAR(s.itl_mean_ms, 40.0 / 3, 1e-6);
  EXPECT_NEAR(s.total_ms, 150, 1e-6);
  EXPECT_NEAR(s.tokens_per_s, 3 / 0.040, 1e-6);  // 3 gaps over 40 ms
}

TEST(RequestRateTracker, NoTokens) {
  const Clock::time_point t0 = Clock::now();
  RequestRateTracker t(t0);
  t.on_finish(t0 + milliseconds(5));
  const RequestRateSummary s = t.summary();
  EXPECT_EQ(s.tokens, 0u);
  EXPECT_EQ(s.ttft_ms, 0);
  EXPECT_EQ(s.tokens_per_s, 0);
  EXPECT_NEAR(s.total_ms, 5, 1e-6);
}

TEST(RequestRateAggregator, RollsUp) {
  RequestRateAggregator agg(8);
  const Clock::time_point t0 = Clock::now();
  for (int r = 0; r < 3; ++r) {
    RequestRateTracker t(t0);
    t.on_token(t0 + milliseconds(10 * (r + 1)));      // ttft 10, 20, 30
    t.on_token(t0 + milliseconds(10 * (r + 1) + 5));  // one 5 ms gap
    agg.record(t.summary());
  }
  const RequestRateStats s = agg.snapshot();
  EXPECT_EQ(s.requests, 3u);
  EXPECT_EQ(s.tokens, 6u);
  EXPECT_EQ(s.ttft_count, 3u);
  EXPECT_NEAR(s.ttft_sum_ms, 60, 1e-6);
  EXPECT_NEAR(s.ttft_p50_ms, 20, 1e-6);
  EXPECT_NEAR(s.ttft_p95_ms, 30, 1e-6);
  EXPECT_EQ(s.itl_count, 3u);
  EXPECT_NEAR(s.itl_p50_ms, 5, 1e-6);
  EXPECT_NEAR(s.tokens_per_s_mean, 200, 1e-6);  // 1 gap of 5 ms
}

TEST(RequestRateAggregator, WindowBoundsPercentilesNotTotals) {
  RequestRateAggregator agg(2);
  const Clock::time_point t0 = Clock::now();
  for (int ttft : {100, 1, 2}) {
    RequestRateTracker t(t0);
    t.on_token(t0 + milliseconds(ttft));
    agg.record(t.summary());
  }
  const RequestRateStats s = agg.snapshot();
  EXPECT_EQ(s.requests, 3u);
  EXPECT_NEAR(s.ttft_sum_ms, 103, 1e-6);
  EXPECT_NEAR(s.ttft_p95_ms, 2, 1e-6);  // 100 fell out of the window
}

TEST(RequestRateAggregator, ConcurrentRecords) {
  RequestRateAggregator agg;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 500; ++k) {
        RequestRateTracker t;
        t.on_token();
        agg.record(t.summary());
        if (k % 50 == 0) (void)agg.snapshot();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(agg.snapshot().requests, 2000u);
  EXPECT_EQ(agg.snapshot().tokens, 2000u);
}

}  // namespace
}  // namespace bonsai::engine
