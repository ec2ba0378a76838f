// ShutdownSignals (src/server/shutdown.h): the first SIGINT/SIGTERM runs the
// graceful shutdown, a second one during it exits at once with 128 + signal.
// Signals are process-wide, so each case runs in a death-test child (forked
// while this binary has no other thread), which reports through its exit
// status and stderr.
#include "server/shutdown.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/test_util.h"
#include "engine/model_pool.h"
#include "server/server.h"

namespace bonsai::server {
namespace {

using Clock = std::chrono::steady_clock;

// Waits up to `timeout_s` for `pred`.
template <class Pred>
bool wait_for(Pred pred, double timeout_s = 10.0) {
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  while (!pred()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// A second signal while the graceful shutdown is still running (here: one
// that never finishes, as a drain stuck on a wedged request) exits at once
// with 128 + the signal number and says so on stderr.
void second_signal_child(int first, int second) {
  ShutdownSignals::block();
  ShutdownSignals signals([](int) { std::this_thread::sleep_for(std::chrono::seconds(30)); },  // a drain that hangs
                          {}, [](int sig) { std::fprintf(stderr, "graceful shutdown started by signal %d\n", sig); });
  if (!signals.watching()) std::_Exit(10);
  ::kill(::getpid(), first);
  if (!wait_for([&] { return signals.received() == 1; })) std::_Exit(11);
  ::kill(::getpid(), second);
  std::this_thread::sleep_for(std::chrono::seconds(20));
  std::_Exit(12);  // not forced: the test sees 12, not 128 + signal
}

TEST(ShutdownSignalsDeathTest, SecondSigintDuringShutdownExitsAtOnceWith130) {
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_EXIT(second_signal_child(SIGTERM, SIGINT), ::testing::ExitedWithCode(128 + SIGINT),
              "graceful shutdown started by signal 15\n.*bonsai serve: second SIGINT during shutdown, exiting now");
}

TEST(ShutdownSignalsDeathTest, SecondSigtermDuringShutdownExitsAtOnceWith143) {
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_EXIT(second_signal_child(SIGINT, SIGTERM), ::testing::ExitedWithCode(128 + SIGTERM),
              "graceful shutdown started by signal 2\n.*bonsai serve: second SIGTERM during shutdown, exiting now");
}

// One signal: graceful runs exactly once, with that signal; force never
// runs; the destructor returns (it stops the watcher and joins graceful).
void one_signal_child() {
  ShutdownSignals::block();
  std::atomic<int> graceful_calls{0};
  std::atomic<int> graceful_sig{0};
  std::atomic<int> forced{0};
  {
    ShutdownSignals signals(
        [&](int sig) {
          graceful_sig = sig;
          ++graceful_calls;
        },
        [&](int) { ++forced; });
    if (!signals.watching()) std::_Exit(10);
    ::kill(::getpid(), SIGINT);
    if (!wait_for([&] { return graceful_calls.load() == 1; })) std::_Exit(11);
    if (signals.received() != 1) std::_Exit(12);
  }
  if (graceful_calls != 1 || graceful_sig != SIGINT || forced != 0) std::_Exit(13);
  std::_Exit(0);
}

TEST(ShutdownSignalsDeathTest, OneSignalRunsGracefulOnce) {
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_EXIT(one_signal_child(), ::testing::ExitedWithCode(0), "");
}

// With no signal, constructing and destroying the watcher calls nothing.
TEST(ShutdownSignals, NoSignalNoCalls) {
  int graceful = 0, forced = 0;
  {
    ShutdownSignals signals([&](int) { ++graceful; }, [&](int) { ++forced; });
    EXPECT_TRUE(signals.watching());
    EXPECT_EQ(signals.received(), 0);
  }
  EXPECT_EQ(graceful, 0);
  EXPECT_EQ(forced, 0);
}

// End to end with a real Server: SIGTERM stops it gracefully, and with an
// idle keep-alive connection open run() still returns well under a second
// (httplib alone waits 5 s for such a connection).
void server_child(const std::string& model_path) {
  ShutdownSignals::block();
  auto pool = std::make_shared<engine::ModelPool>(1, 0, engine::gguf_model_loader(), engine::gguf_model_estimator());
  engine::ModelSpec spec;
  spec.path = model_path;
  spec.pool_size = 1;
  spec.ctx_size = 128;
  pool->loader_register("stories", spec);
  ServerOptions so;
  so.port = 0;
  so.default_model = "stories";
  so.http_threads = 4;
  Server srv(pool, so);
  auto port = srv.bind();
  if (!port) std::_Exit(10);
  ShutdownSignals signals([&](int) { srv.stop(); });
  std::atomic<bool> returned{false};
  std::thread runner([&] {
    srv.run();
    returned = true;
  });
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) std::_Exit(11);
  const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  if (::send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) std::_Exit(12);
  char buf[4096];
  if (::recv(fd, buf, sizeof buf, 0) <= 0) std::_Exit(13);  // the answer; the connection stays open
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto t0 = Clock::now();
  ::kill(::getpid(), SIGTERM);
  const bool prompt = wait_for([&] { return returned.load(); }, 1.0);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  std::fprintf(stderr, "run() returned %.3f s after SIGTERM\n", took);
  if (!prompt) std::_Exit(14);
  runner.join();
  if (signals.received() != 1) std::_Exit(15);
  ::close(fd);
  std::_Exit(0);
}

TEST(ShutdownSignalsDeathTest, SigtermStopsTheServerPromptlyWithAnIdleConnection) {
  const std::string model = bonsai::test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(model);
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_EXIT(server_child(model), ::testing::ExitedWithCode(0), "run\\(\\) returned 0\\.[0-9]+ s after SIGTERM");
}

}  // namespace
}  // namespace bonsai::server
