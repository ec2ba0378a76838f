// The process's compute thread pool: one per process, sized by `-t` (default:
// physical cores). parallel_for splits an index range into chunks that the
// calling thread and the workers claim from an atomic counter.
//
// Several callers (engine replicas) may call parallel_for at once: their jobs
// share the same workers, so the process never runs more compute threads than
// `size()` plus the callers themselves. Workers spin briefly before sleeping,
// so the hundreds of small GEMVs of one decode step pay microseconds, not a
// futex round trip each.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace bonsai::core {

class ThreadPool {
 public:
  // Most compute threads a pool runs (ggml's GGML_MAX_N_THREADS is the same).
  static constexpr int kMaxThreads = 512;

  // `n_threads` >= 1 is the total number of compute threads including the
  // caller: n_threads - 1 workers are started. Values < 1 are treated as 1,
  // values above kMaxThreads as kMaxThreads. Never throws: if the system
  // refuses to start a worker (thread limit, memory), the pool runs with the
  // workers it has, and size() says how many threads that is.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n), in parallel,
  // and returns when all chunks are done. `min_chunk` is the smallest chunk
  // worth handing out (e.g. 16 rows). fn must not throw. Safe to call from
  // several threads at once; not re-entrant from inside fn (fn runs inline
  // then, single-threaded, which is still correct).
  template <class F>
  void parallel_for(int64_t n, F&& fn, int64_t min_chunk = 1) {
    auto tramp = [](void* ctx, int64_t b, int64_t e) { (*static_cast<F*>(ctx))(b, e); };
    run(n, tramp, &fn, min_chunk);
  }

  // Type-erased form of parallel_for.
  void run(int64_t n, void (*fn)(void*, int64_t, int64_t), void* ctx, int64_t min_chunk);

 private:
  struct Job;
  void worker_loop();
  bool work_on(Job& job);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;               // guards jobs_ and stop_
  std::condition_variable cv_;  // workers sleep here when no job is pending
  std::deque<Job*> jobs_;       // jobs with chunks left to claim
  bool stop_ = false;
  std::atomic<uint64_t> epoch_{0};  // bumped on every new job; spinning workers watch it
};

// The process-wide pool. Created on first use with physical-core count
// threads unless set_global_thread_count ran first.
ThreadPool& global_pool();

// Sets the size of the global pool (e.g. from `-t`). Must be called before
// the first global_pool() use; later calls return false and change nothing.
bool set_global_thread_count(int n_threads);

}  // namespace bonsai::core
