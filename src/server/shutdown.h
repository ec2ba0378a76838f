// Graceful-then-forced shutdown on SIGINT / SIGTERM for `bonsai serve`, as
// llama.cpp's server and most daemons do it: the first signal starts a
// graceful shutdown (`bonsai serve`: Server::drain, which lets running
// requests finish within --drain-timeout, then Server::stop), a
// second one while that is still in progress exits the process at once with
// a non-zero status (128 + the signal number: 130 for SIGINT, 143 for
// SIGTERM, the shell's convention for "killed by a signal").
//
// Use (the order matters: the signals must be blocked in every thread, or a
// thread that has them unblocked is killed by the default action instead):
//
//   server::ShutdownSignals::block();      // first, before any thread starts
//   ... build the pools, the Server, bind ...
//   server::ShutdownSignals signals([&](int) { srv.stop(); }, {},
//                                   [](int sig) { log(sig); });
//   srv.run();                             // returns after the first signal
//   pool->wait_background();               // a second signal still forces exit
//   // ~ShutdownSignals: stops watching
//
// Linux only (signalfd + eventfd); the watcher is one thread that sleeps in
// poll(2) until a signal or the destructor wakes it.
#pragma once

#include <atomic>
#include <functional>
#include <thread>

namespace bonsai::server {

class ShutdownSignals {
 public:
  // Blocks SIGINT and SIGTERM in the calling thread (pthread_sigmask);
  // threads it creates afterwards inherit the mask. Call before starting
  // any thread.
  static void block();

  // Starts watching SIGINT and SIGTERM (which must be blocked, see block()).
  // `graceful(sig)` runs once, on a thread of its own, at the first signal,
  // so the watcher stays ready for a second one. `force(sig)` runs (on the
  // watcher thread) at the second signal and at every later one; the
  // default, force_exit, writes "bonsai serve: second SIGINT during
  // shutdown, exiting now" to stderr and calls std::_Exit(128 + sig): no
  // destructors, no atexit handlers, in-flight work is abandoned.
  // `announce(sig)`, if given, runs on the watcher thread at the first
  // signal, before `graceful` starts and before a second signal is read:
  // what it writes (the "shutting down" log line) always precedes the
  // force message of a second signal. Keep it short; it must not block.
  // (A log line written by `graceful` itself races a quick second signal:
  // the forced exit could come first.)
  // If signalfd/eventfd cannot be created, nothing is watched and
  // watching() is false (the signals stay blocked: the caller decides).
  explicit ShutdownSignals(std::function<void(int sig)> graceful, std::function<void(int sig)> force = {},
                           std::function<void(int sig)> announce = {});
  // Stops watching (a signal arriving later stays pending, blocked), then
  // joins the graceful thread if one was started.
  ~ShutdownSignals();
  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;

  bool watching() const { return watcher_.joinable(); }
  // SIGINT/SIGTERM received so far (0: none; 1: graceful shutdown started).
  int received() const { return received_.load(); }

  // The default `force`: the stderr line, then std::_Exit(128 + sig).
  [[noreturn]] static void force_exit(int sig);

 private:
  void watch();

  std::function<void(int)> graceful_;
  std::function<void(int)> force_;
  std::function<void(int)> announce_;
  int signal_fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<int> received_{0};
  std::thread graceful_thread_;  // started by the watcher at the first signal
  std::thread watcher_;
};

}  // namespace bonsai::server
