#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <thread>
#include <vector>

namespace bonsai::core {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 7, 64, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << i;
  }
}

TEST(ThreadPool, MinChunkRespected) {
  ThreadPool pool(2);
  std::atomic<int64_t> smallest{1 << 30};
  pool.parallel_for(
      1000,
      [&](int64_t b, int64_t e) {
        int64_t cur = smallest.load();
        while (e - b < cur && !smallest.compare_exchange_weak(cur, e - b)) {
        }
        (void)cur;
      },
      100);
  EXPECT_GE(smallest.load(), 100);
}

TEST(ThreadPool, ConcurrentCallersGetCorrectSums) {
  ThreadPool pool(2);
  std::vector<std::thread> callers;
  std::vector<int64_t> sums(4, 0);
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 200; ++rep) {
        std::atomic<int64_t> s{0};
        pool.parallel_for(1000, [&](int64_t b, int64_t e) {
          int64_t local = 0;
          for (int64_t i = b; i < e; ++i) local += i;
          s.fetch_add(local);
        });
        sums[static_cast<size_t>(c)] += s.load();
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int64_t s : sums) EXPECT_EQ(s, 200 * (999 * 1000 / 2));
}

TEST(ThreadPool, NestedCallRunsInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.parallel_for(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.parallel_for(10, [&](int64_t bb, int64_t ee) { total.fetch_add(ee - bb); });
    }
  });
  EXPECT_EQ(total.load(), 40);
}

TEST(ThreadPool, SingleThreadPoolRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1);
  const auto caller = std::this_thread::get_id();
  bool same = true;
  pool.parallel_for(100, [&](int64_t, int64_t) { same = same && std::this_thread::get_id() == caller; });
  EXPECT_TRUE(same);
}

// -t 100000 used to start 99999 std::threads until the OS refused one, and the
// std::system_error escaped the constructor (abort). The pool now caps the
// count at kMaxThreads and never throws.
TEST(ThreadPool, AbsurdThreadCountIsCappedNotFatal) {
  ThreadPool pool(1'000'000);
  EXPECT_GE(pool.size(), 1);
  EXPECT_LE(pool.size(), ThreadPool::kMaxThreads);
  std::atomic<int64_t> total{0};
  pool.parallel_for(10'000, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  EXPECT_EQ(total.load(), 10'000);
}

}  // namespace
}  // namespace bonsai::core
