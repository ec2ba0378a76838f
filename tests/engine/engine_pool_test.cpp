// EnginePool / EngineLease concurrency semantics, on a fake engine so the
// tests exercise only the pool (the real-engine tests are in
// engine_pool_real_test.cpp).
#include "engine/engine_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace bonsai::engine {
namespace {

using namespace std::chrono_literals;

// Records who uses it; `in_use` catches two leases on one engine at once.
struct FakeEngine {
  int id = 0;
  int metrics = 0;
  std::atomic<int> in_use{0};
  FakeEngine(int i) : id(i) {}
  FakeEngine(FakeEngine&& o) noexcept : id(o.id), metrics(o.metrics) {}
};

using Pool = BasicEnginePool<FakeEngine>;

std::vector<FakeEngine> make_engines(int n) {
  std::vector<FakeEngine> v;
  for (int i = 0; i < n; ++i) v.emplace_back(i);
  return v;
}

TEST(EnginePool, SizeIsAtLeastOneAndEmptyIsReported) {
  Pool empty(make_engines(0));
  EXPECT_EQ(empty.size(), 1);
  auto r = empty.acquire_for(10ms);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), PoolError::kEmpty);
  EXPECT_EQ(empty.available(), 1);  // the unused permit went back

  Pool three(make_engines(3));
  EXPECT_EQ(three.size(), 3);
  EXPECT_EQ(three.available(), 3);
}

TEST(EnginePool, AcquireBlocksWhenExhaustedAndResumesOnRelease) {
  Pool pool(make_engines(1));
  auto first = pool.acquire_for(1s);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(pool.available(), 0);

  std::atomic<bool> got{false};
  int got_id = -1;
  std::thread waiter([&] {
    auto l = pool.acquire_for(10s);
    ASSERT_TRUE(l.has_value());
    got_id = l->engine().id;
    got = true;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(got.load()) << "acquire must block while every replica is leased";
  { auto drop = std::move(*first); }  // releases the only replica
  waiter.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(got_id, 0);
  EXPECT_EQ(pool.available(), 1);
}

TEST(EnginePool, TimeoutWhenNothingIsReturned) {
  Pool pool(make_engines(1));
  auto held = pool.acquire_for(1s);
  ASSERT_TRUE(held.has_value());
  auto t0 = std::chrono::steady_clock::now();
  auto r = pool.acquire_for(50ms);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), PoolError::kTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 50ms);
}

TEST(EnginePool, CloseWakesEveryWaiterWithClosed) {
  Pool pool(make_engines(1));
  auto held = pool.acquire_for(1s);
  ASSERT_TRUE(held.has_value());
  std::vector<std::thread> waiters;
  std::atomic<int> closed{0};
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      auto r = pool.acquire_for(30s);
      if (!r.has_value() && r.error() == PoolError::kClosed) ++closed;
    });
  }
  std::this_thread::sleep_for(50ms);
  pool.close();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(closed.load(), 4);
  auto later = pool.acquire_for(1s);
  ASSERT_FALSE(later.has_value());
  EXPECT_EQ(later.error(), PoolError::kClosed);
  // A lease that was out when the pool closed still returns its engine.
  { auto drop = std::move(*held); }
  EXPECT_EQ(pool.available(), 1);
}

TEST(EnginePool, LeaseReturnOrderIsLifo) {
  Pool pool(make_engines(3));
  auto a = pool.acquire_for(1s);
  auto b = pool.acquire_for(1s);
  ASSERT_TRUE(a && b);
  int id_a = a->engine().id, id_b = b->engine().id;
  EXPECT_NE(id_a, id_b);
  { auto drop = std::move(*a); }
  { auto drop = std::move(*b); }
  // b was returned last, so it is handed out first; then a.
  auto c = pool.acquire_for(1s);
  auto d = pool.acquire_for(1s);
  ASSERT_TRUE(c && d);
  EXPECT_EQ(c->engine().id, id_b);
  EXPECT_EQ(d->engine().id, id_a);
}

TEST(EnginePool, MovedLeaseReturnsExactlyOnce) {
  Pool pool(make_engines(2));
  {
    auto r = pool.acquire_for(1s);
    ASSERT_TRUE(r.has_value());
    auto lease = std::move(*r);
    EXPECT_FALSE(static_cast<bool>(*r));
    EXPECT_TRUE(static_cast<bool>(lease));
    auto other = pool.acquire_for(1s);
    ASSERT_TRUE(other.has_value());
    lease = std::move(*other);  // returns the first engine, takes the second
    EXPECT_EQ(pool.available(), 1);
  }
  EXPECT_EQ(pool.available(), 2);
  // Both engines are back: two leases at once succeed, a third times out.
  auto x = pool.acquire_for(1s);
  auto y = pool.acquire_for(1s);
  auto z = pool.acquire_for(10ms);
  EXPECT_TRUE(x && y);
  ASSERT_FALSE(z.has_value());
  EXPECT_EQ(z.error(), PoolError::kTimeout);
}

TEST(EnginePool, LeaseReturnsOnException) {
  Pool pool(make_engines(1));
  try {
    auto r = pool.acquire_for(1s);
    ASSERT_TRUE(r.has_value());
    throw std::runtime_error("request failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(pool.available(), 1);
  EXPECT_TRUE(pool.acquire_for(10ms).has_value());
}

// Engine pushed back before the permit is released: a woken waiter never
// finds the idle list empty, and no engine is ever leased twice at once.
TEST(EnginePool, StressNeverEmptyNeverShared) {
  Pool pool(make_engines(2));
  std::atomic<int> empties{0}, errors{0}, shared{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        auto r = pool.acquire_for(10s);
        if (!r) {
          (r.error() == PoolError::kEmpty ? empties : errors)++;
          continue;
        }
        if (r->engine().in_use.fetch_add(1) != 0) ++shared;
        std::this_thread::yield();
        r->engine().in_use.fetch_sub(1);
        ++done;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(empties.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(shared.load(), 0);
  EXPECT_EQ(done.load(), 8 * 300);
  EXPECT_EQ(pool.available(), 2);
}

TEST(EnginePool, SetMetricsAllReachesIdleAndLeasedReplicas) {
  Pool pool(make_engines(3));
  auto held = pool.acquire_for(1s);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->engine().metrics, 0);
  pool.set_metrics_all([](FakeEngine& e) { e.metrics = 7; });
  // The leased engine is not touched while leased ...
  EXPECT_EQ(held->engine().metrics, 0);
  { auto drop = std::move(*held); }
  // ... and gets the setting when it comes back. All three now have it.
  std::vector<Pool::Lease> all;
  for (int i = 0; i < 3; ++i) {
    auto r = pool.acquire_for(1s);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->engine().metrics, 7) << "engine " << r->engine().id;
    all.push_back(std::move(*r));
  }
}

TEST(EnginePool, PoolSizing) {
  int d = default_cpu_pool_size();
  EXPECT_GE(d, 1);
  EXPECT_LE(d, 4);
  EXPECT_EQ(d, static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u)));
  EXPECT_EQ(resolve_pool_size(0, ComputeTier::kCpu), d);
  EXPECT_EQ(resolve_pool_size(-3, ComputeTier::kCpu), d);
  EXPECT_EQ(resolve_pool_size(6, ComputeTier::kCpu), 6);
  EXPECT_EQ(resolve_pool_size(6, ComputeTier::kGpu), 1);
  EXPECT_EQ(resolve_pool_size(0, ComputeTier::kGpu), 1);
  EXPECT_STREQ(pool_error_name(PoolError::kClosed), "closed");
}

}  // namespace
}  // namespace bonsai::engine
