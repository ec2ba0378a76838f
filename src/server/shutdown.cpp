// SIGINT/SIGTERM: graceful at the first, immediate exit at the second. See shutdown.h.
#include "server/shutdown.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace bonsai::server {
namespace {

sigset_t shutdown_set() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  return s;
}

}  // namespace

void ShutdownSignals::block() {
  const sigset_t s = shutdown_set();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

void ShutdownSignals::force_exit(int sig) {
  const std::string msg =
      std::string("bonsai serve: second ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + " during shutdown, exiting now\n";
  ssize_t ignored = ::write(STDERR_FILENO, msg.data(), msg.size());
  (void)ignored;
  std::_Exit(128 + sig);
}

ShutdownSignals::ShutdownSignals(std::function<void(int)> graceful, std::function<void(int)> force,
                                 std::function<void(int)> announce)
    : graceful_(std::move(graceful)), force_(std::move(force)), announce_(std::move(announce)) {
  if (!force_) force_ = [](int sig) { force_exit(sig); };
  const sigset_t s = shutdown_set();
  signal_fd_ = ::signalfd(-1, &s, SFD_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (signal_fd_ < 0 || wake_fd_ < 0) return;
  watcher_ = std::thread([this] { watch(); });
}

ShutdownSignals::~ShutdownSignals() {
  if (watcher_.joinable()) {
    const uint64_t one = 1;
    ssize_t ignored = ::write(wake_fd_, &one, sizeof one);
    (void)ignored;
    watcher_.join();
  }
  if (graceful_thread_.joinable()) graceful_thread_.join();
  if (signal_fd_ >= 0) ::close(signal_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void ShutdownSignals::watch() {
  while (true) {
    pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if ((fds[1].revents & POLLIN) != 0) return;  // the destructor
    if ((fds[0].revents & POLLIN) == 0) continue;
    signalfd_siginfo info{};
    if (::read(signal_fd_, &info, sizeof info) != static_cast<ssize_t>(sizeof info)) continue;
    const int sig = static_cast<int>(info.ssi_signo);
    if (received_.load() == 0) {
      // The announcement first, on this thread: a second signal is read only
      // after it, so its force message cannot overtake it.
      if (announce_) announce_(sig);
      received_.store(1);
      // Graceful, off this thread: the watcher must stay ready for a second
      // signal while the drain (which may block) runs.
      if (graceful_) graceful_thread_ = std::thread(graceful_, sig);
    } else {
      received_.fetch_add(1);
      force_(sig);
    }
  }
}

}  // namespace bonsai::server
