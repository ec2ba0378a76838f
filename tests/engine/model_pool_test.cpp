// ModelPool bookkeeping (LRU, capacity, memory budget, in-flight protection,
// background loads, unload errors) with an injected fake loader, so no real
// model is needed.
#include "engine/model_pool.h"

#include <gtest/gtest.h>
#include <unistd.h>  // getpid

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace bonsai::engine {
namespace {

using namespace std::chrono_literals;
constexpr uint64_t kMiB = 1ull << 20;

// A fake model zoo: id -> size in MiB. Counts loads; can block a load until
// released, or fail it.
struct Zoo {
  std::map<std::string, uint64_t> size_mib;
  std::map<std::string, int> loads;
  std::mutex mu;
  std::condition_variable cv;
  bool gate_open = true;
  std::string fail_id;
  std::string fail_path;                         // the loader fails for this file
  std::map<std::string, std::string> last_path;  // id -> file of its last load

  ModelPool make(size_t capacity, uint64_t budget_mb) {
    return ModelPool(
        capacity, budget_mb,
        [this](const std::string& id, const ModelSpec& spec) -> core::Expected<std::shared_ptr<LoadedModel>> {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return gate_open; });
          ++loads[id];
          last_path[id] = spec.path;
          if (id == fail_id || (!fail_path.empty() && spec.path == fail_path))
            return core::fail(core::Errc::kFormat, spec.path + ": bad magic at offset 0");
          auto m = std::make_shared<LoadedModel>();
          m->id = id;
          m->spec = spec;
          m->mem_bytes = (size_mib.contains(spec.path) ? size_mib.at(spec.path) : size_mib.at(id)) * kMiB;
          return m;
        },
        [this](const ModelSpec& spec) -> core::Expected<uint64_t> {
          std::lock_guard lock(mu);
          if (!size_mib.contains(spec.path)) return core::fail(core::Errc::kFormat, spec.path + ": not a GGUF file");
          return size_mib.at(spec.path) * kMiB;
        });
  }
  void set_gate(bool open) {
    {
      std::lock_guard lock(mu);
      gate_open = open;
    }
    cv.notify_all();
  }
};

void reg(ModelPool& pool, const std::string& id) { pool.loader_register(id, ModelSpec{.path = id}); }

std::vector<std::string> listed_ids(const ModelPool& pool) {
  std::vector<std::string> ids;
  for (const auto& m : pool.list()) ids.push_back(m.id);
  return ids;
}

// acquire + release: one short request.
void touch(ModelPool& pool, const std::string& id) {
  auto m = pool.acquire(id);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  m->release();
}

// The handle of acquire() is the request's use: dropping it (or moving
// another handle over it) ends the use exactly once; a moved-from handle is
// empty and ends nothing.
TEST(ModelPool, HandleEndsItsUseOnceWhenDroppedOrReplaced) {
  Zoo zoo;
  zoo.size_mib = {{"a", 1}};
  auto pool = zoo.make(2, 0);
  reg(pool, "a");
  {
    auto h = pool.acquire("a");
    ASSERT_TRUE(h.has_value()) << h.error().message;
    ASSERT_EQ(pool.list().size(), 1u);
    EXPECT_EQ(pool.list()[0].in_flight, 1);
    ModelHandle moved = std::move(*h);
    EXPECT_FALSE(static_cast<bool>(*h));
    EXPECT_EQ(pool.list()[0].in_flight, 1);
    auto h2 = pool.acquire_loaded("a");
    ASSERT_TRUE(h2.has_value());
    EXPECT_EQ(pool.list()[0].in_flight, 2);
    moved = std::move(*h2);  // the first use ends; the second moves in
    EXPECT_EQ(pool.list()[0].in_flight, 1);
    EXPECT_EQ(moved->id, "a");
    h2->release();  // empty: nothing to end
    EXPECT_EQ(pool.list()[0].in_flight, 1);
  }
  EXPECT_EQ(pool.list()[0].in_flight, 0);
}

TEST(ModelPool, UnknownModelIsNotFound) {
  Zoo zoo;
  auto pool = zoo.make(2, 0);
  auto m = pool.acquire("nope");
  ASSERT_FALSE(m.has_value());
  EXPECT_EQ(m.error().code, core::Errc::kNotFound);
  EXPECT_NE(m.error().message.find("nope"), std::string::npos);
}

TEST(ModelPool, LruOrderAndCapacity) {
  Zoo zoo;
  zoo.size_mib = {{"a", 1}, {"b", 1}, {"c", 1}};
  auto pool = zoo.make(2, 0);
  for (auto id : {"a", "b", "c"}) reg(pool, id);
  touch(pool, "a");
  touch(pool, "b");
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"b", "a"}));
  touch(pool, "a");  // a is promoted to MRU
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"a", "b"}));
  EXPECT_NE(pool.peek("b"), nullptr);  // peeking neither promotes b nor counts it in flight
  EXPECT_EQ(pool.peek("c"), nullptr);
  EXPECT_EQ(pool.list()[1].in_flight, 0);
  touch(pool, "c");  // capacity 2: the LRU (b) goes
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"c", "a"}));
  EXPECT_EQ(pool.loaded_count(), 2u);
  touch(pool, "a");  // still resident: no reload
  EXPECT_EQ(zoo.loads["a"], 1);
  touch(pool, "b");  // reloaded, evicting c (LRU now)
  EXPECT_EQ(zoo.loads["b"], 2);
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(pool.current_mem_bytes(), 2 * kMiB);
}

TEST(ModelPool, MemoryBudgetEvictsLruAndRefusesWhatCannotFitAlone) {
  Zoo zoo;
  zoo.size_mib = {{"a", 4}, {"b", 4}, {"c", 4}, {"huge", 11}};
  auto pool = zoo.make(10, 10);
  for (auto id : {"a", "b", "c", "huge"}) reg(pool, id);
  touch(pool, "a");
  touch(pool, "b");
  EXPECT_EQ(pool.current_mem_bytes(), 8 * kMiB);
  touch(pool, "c");  // 12 > 10: a (LRU) is evicted
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"c", "b"}));
  EXPECT_EQ(pool.current_mem_bytes(), 8 * kMiB);

  auto h = pool.acquire("huge");
  ASSERT_FALSE(h.has_value());
  EXPECT_EQ(h.error().code, core::Errc::kResourceExhausted);
  EXPECT_NE(h.error().message.find("even alone"), std::string::npos) << h.error().message;
  EXPECT_NE(h.error().message.find("11 MiB"), std::string::npos) << h.error().message;
  EXPECT_EQ(zoo.loads["huge"], 0);                                    // refused before loading
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"c", "b"}));  // nothing evicted for it
}

TEST(ModelPool, InFlightModelIsNeverTornDown) {
  Zoo zoo;
  zoo.size_mib = {{"a", 4}, {"b", 4}};
  {
    // Capacity 1: a in flight (running or queued) keeps its slot; b's load
    // is refused, naming a and why, and loads once a is released.
    auto pool = zoo.make(1, 0);
    reg(pool, "a");
    reg(pool, "b");
    auto a = pool.acquire("a");
    ASSERT_TRUE(a.has_value());
    std::weak_ptr<LoadedModel> weak_a = a->shared();
    auto b = pool.acquire("b");
    ASSERT_FALSE(b.has_value());
    EXPECT_EQ(b.error().code, core::Errc::kResourceExhausted);
    EXPECT_EQ(b.error().message,
              "cannot make room for model 'b': all 1 model slots (--models-max) are busy: 'a' (1 request in flight); "
              "retry later");
    EXPECT_EQ(zoo.loads["b"], 0);
    EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"a"}));
    a->release();  // ends the use; a stays resident (idle)
    EXPECT_FALSE(weak_a.expired());
    auto b2 = pool.acquire("b");
    ASSERT_TRUE(b2.has_value()) << b2.error().message;
    EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"b"}));
    EXPECT_TRUE(weak_a.expired());  // evicted once idle
    EXPECT_EQ(pool.current_mem_bytes(), 4 * kMiB);
    b2->release();
  }
  {
    // Budget 6 MiB: a in flight holds 4; b (4) cannot fit until a is released.
    auto pool = zoo.make(4, 6);
    reg(pool, "a");
    reg(pool, "b");
    auto a = pool.acquire("a");
    ASSERT_TRUE(a.has_value());
    auto b = pool.acquire("b");
    ASSERT_FALSE(b.has_value());
    EXPECT_EQ(b.error().code, core::Errc::kResourceExhausted);
    EXPECT_NE(b.error().message.find("in flight"), std::string::npos) << b.error().message;
    EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"a"}));
    EXPECT_EQ(pool.list()[0].in_flight, 1);
    a->release();
    EXPECT_EQ(pool.list()[0].in_flight, 0);
    auto b2 = pool.acquire("b");
    ASSERT_TRUE(b2.has_value()) << b2.error().message;
    EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"b"}));
    b2->release();
  }
}

// Issue 33.3: an admin load (load_in_background, mark_loading) never evicts
// a model with requests in flight (running or queued: each holds a handle)
// to make room; it is refused with a reason naming the busy models, and
// evicts the model once it is idle (the recent-use grace does not protect
// against an operator's load).
TEST(ModelPool, AdminLoadNeverEvictsAModelInFlight) {
  Zoo zoo;
  zoo.size_mib = {{"a", 4}, {"b", 4}, {"c", 4}};
  auto pool = zoo.make(2, 0);
  pool.set_recent_use_grace(std::chrono::hours(1));
  for (auto id : {"a", "b", "c"}) reg(pool, id);
  auto a = pool.acquire("a");
  ASSERT_TRUE(a.has_value());
  auto a2 = pool.acquire("a");  // a second request (e.g. queued behind the first)
  ASSERT_TRUE(a2.has_value());
  auto b = pool.acquire("b");
  ASSERT_TRUE(b.has_value()) << b.error().message;
  auto r = pool.load_in_background("c", ModelSpec{.path = "c"});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, core::Errc::kResourceExhausted);
  EXPECT_EQ(r.error().message,
            "cannot make room for model 'c': all 2 model slots (--models-max) are busy: 'a' (2 requests in flight), "
            "'b' (1 request in flight); retry later");
  EXPECT_EQ(pool.mark_loading("c", 4 * kMiB).error().code, core::Errc::kResourceExhausted);
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(zoo.loads["c"], 0);
  b->release();  // b idle (used just now: the grace does not apply to an admin load)
  ASSERT_TRUE(pool.load_in_background("c", ModelSpec{.path = "c"}).has_value());
  pool.wait_background();
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"c", "a"}));
  EXPECT_EQ(pool.list()[1].in_flight, 2);  // a untouched
  a->release();
  a2->release();
}

// Issue 33.3: no ping-pong. With a recent-use grace, a model that served a
// request within it is not evicted for another model's request, which gets
// kResourceExhausted "all N model slots are busy" naming it; once the grace
// has passed, it is.
TEST(ModelPool, RecentlyUsedModelIsNotEvictedForAnotherModelsRequest) {
  Zoo zoo;
  zoo.size_mib = {{"a", 1}, {"b", 1}};
  auto pool = zoo.make(1, 0);
  reg(pool, "a");
  reg(pool, "b");
  constexpr auto kGrace = std::chrono::milliseconds(200);
  pool.set_recent_use_grace(kGrace);
  touch(pool, "a");
  auto b = pool.acquire("b");
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.error().code, core::Errc::kResourceExhausted);
  const std::string& msg = b.error().message;
  EXPECT_EQ(msg.rfind("cannot make room for model 'b': all 1 model slots (--models-max) are busy: 'a' (served a "
                      "request ",
                      0),
            0u)
      << msg;
  EXPECT_NE(msg.find(" ago; a model is kept 0.2 s after its last request so that two models do not evict each other "
                     "on every request); retry later"),
            std::string::npos)
      << msg;
  EXPECT_EQ(zoo.loads["b"], 0);
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"a"}));
  // Alternating requests do not reload a: it stays until it has been idle for the grace.
  touch(pool, "a");
  EXPECT_EQ(zoo.loads["a"], 1);
  std::this_thread::sleep_until(std::chrono::steady_clock::now() + kGrace + 10ms);
  auto b2 = pool.acquire("b");
  ASSERT_TRUE(b2.has_value()) << b2.error().message;
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"b"}));
  b2->release();
  // A grace of 0 (the default) protects only models in flight.
  pool.set_recent_use_grace(std::chrono::steady_clock::duration::zero());
  touch(pool, "a");
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"a"}));
}

// The grace counts from a request: a model loaded by an admin load (as
// `serve` preloads its models) that has served nothing is evicted for
// another model's request at once, even within the grace.
TEST(ModelPool, PreloadedUnusedModelHasNoGrace) {
  Zoo zoo;
  zoo.size_mib = {{"a", 1}, {"b", 1}};
  auto pool = zoo.make(1, 0);
  reg(pool, "a");
  reg(pool, "b");
  pool.set_recent_use_grace(std::chrono::seconds(10));
  ASSERT_TRUE(pool.load_in_background("a").has_value());
  pool.wait_background();
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"a"}));
  auto b = pool.acquire("b");
  ASSERT_TRUE(b.has_value()) << b.error().message;
  EXPECT_EQ(listed_ids(pool), (std::vector<std::string>{"b"}));
  b->release();
  // serve's preload: acquired and released, then forgotten.
  pool.forget_recent_use("b");
  auto a0 = pool.acquire("a");
  ASSERT_TRUE(a0.has_value()) << a0.error().message;
  a0->release();
  auto b1 = pool.acquire("b");
  ASSERT_FALSE(b1.has_value());  // a served a request just now
  EXPECT_NE(b1.error().message.find("'a' (served a request "), std::string::npos) << b1.error().message;
  pool.set_recent_use_grace(std::chrono::steady_clock::duration::zero());
  b1 = pool.acquire("b");
  ASSERT_TRUE(b1.has_value()) << b1.error().message;
  b1->release();
  pool.set_recent_use_grace(std::chrono::seconds(10));
  // b served a request: now it is the one kept for the grace.
  auto a = pool.acquire("a");
  ASSERT_FALSE(a.has_value());
  EXPECT_NE(a.error().message.find("'b' (served a request "), std::string::npos) << a.error().message;
}

TEST(ModelPool, BackgroundLoadSucceedsWithoutBlockingOtherModels) {
  Zoo zoo;
  zoo.size_mib = {{"a", 1}, {"slow", 2}};
  auto pool = zoo.make(3, 0);
  reg(pool, "a");
  reg(pool, "slow");
  touch(pool, "a");
  zoo.set_gate(false);
  // The gate blocks the loader; a's load already happened, so only slow waits.
  ASSERT_TRUE(pool.load_in_background("slow").has_value());
  auto rows = pool.list();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].id, "slow");
  EXPECT_EQ(rows[0].state, ModelState::kLoading);
  EXPECT_EQ(pool.current_mem_bytes(), 3 * kMiB);  // the estimate is reserved
  auto busy = pool.acquire("slow");
  ASSERT_FALSE(busy.has_value());
  EXPECT_EQ(busy.error().code, core::Errc::kResourceExhausted);
  EXPECT_NE(busy.error().message.find("loading"), std::string::npos);
  EXPECT_FALSE(pool.load_in_background("slow").has_value());  // already loading
  // Requests to the other model are served while slow loads.
  for (int i = 0; i < 3; ++i) touch(pool, "a");
  auto u = pool.unload("slow");
  ASSERT_FALSE(u.has_value());
  EXPECT_EQ(u.error().code, core::Errc::kInvalidArgument);
  zoo.set_gate(true);
  pool.wait_background();
  rows = pool.list();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].id, "slow");
  EXPECT_EQ(rows[0].state, ModelState::kLoaded);
  EXPECT_GT(rows[0].created_unix, 0u);
  touch(pool, "slow");
  EXPECT_EQ(zoo.loads["slow"], 1);
}

TEST(ModelPool, BackgroundLoadFailureIsListedWithReason) {
  Zoo zoo;
  zoo.size_mib = {{"bad", 1}};
  zoo.fail_id = "bad";
  auto pool = zoo.make(2, 0);
  reg(pool, "bad");
  ASSERT_TRUE(pool.load_in_background("bad").has_value());
  pool.wait_background();
  auto rows = pool.list();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].state, ModelState::kFailed);
  EXPECT_NE(rows[0].reason.find("bad magic"), std::string::npos) << rows[0].reason;
  EXPECT_EQ(pool.current_mem_bytes(), 0u);
  EXPECT_EQ(pool.loaded_count(), 0u);
  // An on-demand acquire reports the loader's error; the file is unchanged,
  // so it is not loaded again (see FailedLoadIsNotRetriedUntilTheFileChanges).
  auto m = pool.acquire("bad");
  ASSERT_FALSE(m.has_value());
  EXPECT_EQ(m.error().code, core::Errc::kFormat);
  EXPECT_NE(m.error().message.find("bad magic"), std::string::npos) << m.error().message;
  EXPECT_EQ(zoo.loads["bad"], 1);
  // An explicit background load does try again.
  ASSERT_TRUE(pool.load_in_background("bad").has_value());
  pool.wait_background();
  EXPECT_EQ(zoo.loads["bad"], 2);
}

// Register-and-load (the admin API's load with a path): a refused or failed
// load must not re-point an id that is served (regression: the server used
// to register first, so a rejected load of a bad file broke the model at its
// next reload).
TEST(ModelPool, RegisterAndLoadLeavesRegistryAloneWhenRefusedOrFailed) {
  Zoo zoo;
  zoo.size_mib = {{"a.gguf", 1}, {"b.gguf", 1}, {"broken.gguf", 1}};
  zoo.fail_path = "broken.gguf";
  auto pool = zoo.make(2, 0);
  pool.loader_register("a", ModelSpec{.path = "a.gguf"});
  touch(pool, "a");

  // Loaded: refused before anything changes.
  auto r = pool.load_in_background("a", ModelSpec{.path = "b.gguf", .ctx_size = 7});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, core::Errc::kInvalidArgument);
  ASSERT_TRUE(pool.unload("a").has_value());
  touch(pool, "a");
  EXPECT_EQ(zoo.last_path["a"], "a.gguf");
  ASSERT_TRUE(pool.unload("a").has_value());

  // The estimator rejects the file: nothing changes.
  r = pool.load_in_background("a", ModelSpec{.path = "garbage.gguf"});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, core::Errc::kFormat);
  EXPECT_TRUE(pool.list().empty());

  // The background load fails: listed as failed, the old file comes back.
  ASSERT_TRUE(pool.load_in_background("a", ModelSpec{.path = "broken.gguf"}).has_value());
  pool.wait_background();
  auto rows = pool.list();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].state, ModelState::kFailed);
  EXPECT_NE(rows[0].reason.find("broken.gguf"), std::string::npos) << rows[0].reason;
  touch(pool, "a");
  EXPECT_EQ(zoo.last_path["a"], "a.gguf");

  // A new id whose load fails is not left registered.
  ASSERT_TRUE(pool.load_in_background("new", ModelSpec{.path = "broken.gguf"}).has_value());
  pool.wait_background();
  EXPECT_FALSE(pool.is_registered("new"));
  auto m = pool.acquire("new");
  ASSERT_FALSE(m.has_value());
  EXPECT_EQ(m.error().code, core::Errc::kNotFound);

  // A good one is registered and loaded.
  ASSERT_TRUE(pool.load_in_background("c", ModelSpec{.path = "b.gguf"}).has_value());
  pool.wait_background();
  EXPECT_TRUE(pool.is_registered("c"));
  EXPECT_NE(pool.peek("c"), nullptr);
  EXPECT_EQ(zoo.last_path["c"], "b.gguf");
}

// Regression: every on-demand request for a model whose file fails to load
// evicted a healthy LRU model first (to make room), then failed. Once failed,
// it fails fast until its file changes.
TEST(ModelPool, FailedLoadIsNotRetriedUntilTheFileChanges) {
  const std::string file = ::testing::TempDir() + "/bonsai_model_pool_failed.gguf";
  auto write = [&](const char* text) {
    std::FILE* f = std::fopen(file.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs(text, f);
    std::fclose(f);
  };
  write("broken");
  Zoo zoo;
  zoo.size_mib = {{"a", 1}, {file, 1}};
  zoo.fail_path = file;
  auto pool = zoo.make(1, 0);
  reg(pool, "a");
  pool.loader_register("bad", ModelSpec{.path = file});
  touch(pool, "a");

  auto m = pool.acquire("bad");  // tried once (this evicts "a": it had to make room)
  ASSERT_FALSE(m.has_value());
  EXPECT_EQ(m.error().code, core::Errc::kFormat);
  EXPECT_EQ(zoo.loads["bad"], 1);
  touch(pool, "a");
  EXPECT_EQ(zoo.loads["a"], 2);
  for (int i = 0; i < 3; ++i) {
    m = pool.acquire("bad");
    ASSERT_FALSE(m.has_value());
    EXPECT_EQ(m.error().code, core::Errc::kFormat);  // the recorded error, fast
    EXPECT_NE(m.error().message.find("bad magic"), std::string::npos) << m.error().message;
  }
  EXPECT_EQ(zoo.loads["bad"], 1);
  EXPECT_NE(pool.peek("a"), nullptr) << "a healthy model was evicted for a load that was bound to fail";
  EXPECT_EQ(zoo.loads["a"], 2);

  // The file changes: tried again (and now it loads).
  write("fixed, and a different size");
  zoo.fail_path.clear();
  m = pool.acquire("bad");
  ASSERT_TRUE(m.has_value()) << m.error().message;
  m->release();
  EXPECT_EQ(zoo.loads["bad"], 2);
  std::remove(file.c_str());
}

// A split model that failed because a part was missing is tried again once
// the part is there (its siblings are part of the failed load's stamp).
TEST(ModelPool, FailedSplitLoadIsRetriedWhenAMissingPartAppears) {
  const std::string prefix = ::testing::TempDir() + "/bonsai_model_pool_split_" + std::to_string(::getpid());
  const std::string part1 = prefix + "-00001-of-00002.gguf", part2 = prefix + "-00002-of-00002.gguf";
  std::remove(part2.c_str());
  std::FILE* f = std::fopen(part1.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fputs("part one", f);
  std::fclose(f);
  Zoo zoo;
  zoo.size_mib = {{part1, 1}};
  zoo.fail_path = part1;
  auto pool = zoo.make(1, 0);
  pool.loader_register("split", ModelSpec{.path = part1});
  ASSERT_FALSE(pool.acquire("split").has_value());
  ASSERT_FALSE(pool.acquire("split").has_value());
  EXPECT_EQ(zoo.loads["split"], 1);  // part 1 unchanged: not retried
  f = std::fopen(part2.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fclose(f);  // the missing part appears (even empty)
  zoo.fail_path.clear();
  auto m = pool.acquire("split");
  ASSERT_TRUE(m.has_value()) << m.error().message;
  m->release();
  EXPECT_EQ(zoo.loads["split"], 2);
  std::remove(part1.c_str());
  std::remove(part2.c_str());
}

// Regression: every background load left an unjoined thread behind (8 MiB
// of address space each) until shutdown; finished ones are now reaped.
TEST(ModelPool, FinishedBackgroundLoadThreadsAreReaped) {
  Zoo zoo;
  zoo.size_mib = {{"m", 1}};
  auto pool = zoo.make(1, 0);
  reg(pool, "m");
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(pool.load_in_background("m").has_value()) << i;
    for (int k = 0; k < 2000 && pool.peek("m") == nullptr; ++k) std::this_thread::sleep_for(1ms);
    ASSERT_NE(pool.peek("m"), nullptr) << i;
    ASSERT_TRUE(pool.unload("m").has_value());
  }
  EXPECT_LE(pool.background_threads(), 2u);
  pool.wait_background();
  EXPECT_EQ(pool.background_threads(), 0u);
  EXPECT_EQ(zoo.loads["m"], 50);
}

TEST(ModelPool, MarkLoadingReadyFailedTransitions) {
  Zoo zoo;
  zoo.size_mib = {{"m", 3}};
  auto pool = zoo.make(2, 0);
  EXPECT_EQ(pool.mark_loading("m", kMiB).error().code, core::Errc::kNotFound);  // unregistered
  reg(pool, "m");
  EXPECT_FALSE(pool.mark_ready("m", std::make_shared<LoadedModel>()).has_value());  // not loading
  EXPECT_FALSE(pool.mark_failed("m", "x").has_value());
  ASSERT_TRUE(pool.mark_loading("m", kMiB).has_value());
  EXPECT_EQ(pool.mark_loading("m", kMiB).error().code, core::Errc::kInvalidArgument);
  auto lm = std::make_shared<LoadedModel>();
  lm->id = "m";
  lm->mem_bytes = 3 * kMiB;
  ASSERT_TRUE(pool.mark_ready("m", lm).has_value());
  EXPECT_EQ(pool.current_mem_bytes(), 3 * kMiB);  // the real size replaces the estimate
  EXPECT_EQ(pool.mark_loading("m", kMiB).error().code, core::Errc::kInvalidArgument);  // loaded
}

TEST(ModelPool, UnloadErrorsAndSuccess) {
  Zoo zoo;
  zoo.size_mib = {{"a", 2}};
  auto pool = zoo.make(2, 0);
  reg(pool, "a");
  auto e = pool.unload("a");  // registered but not loaded
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code, core::Errc::kNotFound);
  EXPECT_EQ(pool.unload("ghost").error().code, core::Errc::kNotFound);
  touch(pool, "a");
  ASSERT_TRUE(pool.unload("a").has_value());
  EXPECT_TRUE(pool.list().empty());
  EXPECT_EQ(pool.current_mem_bytes(), 0u);
  EXPECT_EQ(pool.unload("a").error().code, core::Errc::kNotFound);
  // Unloading a model in flight unlists it; its memory goes when released.
  auto h = pool.acquire("a");
  ASSERT_TRUE(h.has_value());
  ASSERT_TRUE(pool.unload("a").has_value());
  EXPECT_TRUE(pool.list().empty());
  EXPECT_EQ(pool.current_mem_bytes(), 2 * kMiB);
  EXPECT_EQ(pool.acquire_loaded("a").error().code, core::Errc::kNotFound);
  h->release();
  EXPECT_EQ(pool.current_mem_bytes(), 0u);
}

TEST(ModelPool, ConcurrentAcquireReleaseKeepsCountsConsistent) {
  Zoo zoo;
  zoo.size_mib = {{"a", 1}, {"b", 1}, {"c", 1}};
  auto pool = zoo.make(2, 0);
  for (auto id : {"a", "b", "c"}) reg(pool, id);
  std::atomic<int> ok{0}, busy{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      const char* ids[] = {"a", "b", "c"};
      for (int i = 0; i < 200; ++i) {
        auto m = pool.acquire(ids[(t + i) % 3]);
        if (m) {
          ++ok;
          m->release();
        } else if (m.error().code == core::Errc::kResourceExhausted) {
          ++busy;  // loading elsewhere or no evictable slot: retry later
        } else {
          ++other;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(ok.load() + busy.load(), 1200);
  EXPECT_LE(pool.list().size(), 2u);
  for (const auto& m : pool.list()) EXPECT_EQ(m.in_flight, 0) << m.id;
  EXPECT_EQ(pool.current_mem_bytes(), pool.list().size() * kMiB);
}

// set_keep_alive: a model idle for its keep-alive is unloaded by the pool's
// own thread (no call needed), never while a request holds it; list() says
// when (expires_at); nullopt clears it; only a loaded model takes one.
TEST(ModelPool, KeepAliveUnloadsAModelOnceIdleThatLong) {
  Zoo zoo;
  zoo.size_mib = {{"a", 1}, {"b", 1}};
  ModelPool pool = zoo.make(4, 0);
  reg(pool, "a");
  reg(pool, "b");
  EXPECT_EQ(pool.set_keep_alive("a", 1s).error().code, core::Errc::kNotFound);  // not loaded
  touch(pool, "a");
  touch(pool, "b");
  auto expires = [&](const std::string& id) {
    for (const auto& m : pool.list())
      if (m.id == id) return m.expires_at;
    return std::optional<std::chrono::system_clock::time_point>();
  };
  EXPECT_FALSE(expires("a").has_value());  // none by default
  // Held by a request: not unloaded however long it is past due.
  auto held = pool.acquire("a");
  ASSERT_TRUE(held.has_value());
  const auto before = std::chrono::system_clock::now();
  ASSERT_TRUE(pool.set_keep_alive("a", 200ms).has_value());
  ASSERT_TRUE(expires("a").has_value());
  EXPECT_GE(*expires("a"), before + 150ms);
  EXPECT_LE(*expires("a"), std::chrono::system_clock::now() + 250ms);
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(listed_ids(pool).size(), 2u);
  const auto released = std::chrono::steady_clock::now();
  held->release();
  // Idle now: gone about 200 ms later (allow a loaded machine 5 s).
  while (listed_ids(pool).size() == 2u && std::chrono::steady_clock::now() - released < 5s)
    std::this_thread::sleep_for(10ms);
  const auto took = std::chrono::steady_clock::now() - released;
  EXPECT_EQ(listed_ids(pool), std::vector<std::string>{"b"});
  EXPECT_GE(took, 190ms);
  // Cleared: "b" stays past the keep-alive it had. Held while it is set and
  // cleared, so a stalled test thread cannot let the 100 ms run out first.
  {
    auto hold_b = pool.acquire("b");
    ASSERT_TRUE(hold_b.has_value());
    ASSERT_TRUE(pool.set_keep_alive("b", 100ms).has_value());
    ASSERT_TRUE(pool.set_keep_alive("b", std::nullopt).has_value());
    EXPECT_FALSE(expires("b").has_value());
    hold_b->release();
  }
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(listed_ids(pool), std::vector<std::string>{"b"});
  // Loaded again, "a" starts without one; zero unloads it once idle.
  touch(pool, "a");
  EXPECT_FALSE(expires("a").has_value());
  ASSERT_TRUE(pool.set_keep_alive("a", 0s).has_value());
  for (int i = 0; i < 500 && listed_ids(pool).size() == 2u; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(listed_ids(pool), std::vector<std::string>{"b"});
}

// pin (bonsai serve's default model): set_keep_alive keeps no timer on it,
// for the instance loaded now and any loaded later; eviction and unload()
// still apply; an unpinned model beside it expires as before.
TEST(ModelPool, PinnedModelTakesNoKeepAlive) {
  Zoo zoo;
  zoo.size_mib = {{"default", 1}, {"other", 1}};
  ModelPool pool = zoo.make(4, 0);
  reg(pool, "default");
  reg(pool, "other");
  pool.pin("default");
  EXPECT_TRUE(pool.pinned("default"));
  EXPECT_FALSE(pool.pinned("other"));
  touch(pool, "default");
  touch(pool, "other");
  auto expires = [&](const std::string& id) {
    for (const auto& m : pool.list())
      if (m.id == id) return m.expires_at;
    return std::optional<std::chrono::system_clock::time_point>();
  };
  ASSERT_TRUE(pool.set_keep_alive("default", 0s).has_value());  // accepted, no timer
  ASSERT_TRUE(pool.set_keep_alive("other", 50ms).has_value());
  EXPECT_FALSE(expires("default").has_value());
  EXPECT_TRUE(expires("other").has_value());
  // "other" goes once idle 50 ms; "default" stays (a slow machine only waits longer).
  for (int i = 0; i < 500 && listed_ids(pool).size() == 2u; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(listed_ids(pool), std::vector<std::string>{"default"});
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(listed_ids(pool), std::vector<std::string>{"default"});
  // unload() is still an unload; loaded again, still pinned.
  ASSERT_TRUE(pool.unload("default").has_value());
  EXPECT_TRUE(listed_ids(pool).empty());
  touch(pool, "default");
  ASSERT_TRUE(pool.set_keep_alive("default", 1ms).has_value());
  EXPECT_FALSE(expires("default").has_value());
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(listed_ids(pool), std::vector<std::string>{"default"});
}

}  // namespace
}  // namespace bonsai::engine
