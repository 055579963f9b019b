// A fixed set of threads for fork-join loops over independent items: the engine's host sampling
// and scoring of one step's logits rows (Engine::Step), which a batch of penalised, min-p or
// logprobs requests otherwise serialises on the engine thread at ~0.1-0.3 ms a row.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace mqa {

class WorkerPool {
 public:
  // `threads` counts the caller of ParallelFor, which works too: threads - 1 are started
  // (none for 1 or less).
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // fn(0) ... fn(n - 1), each once, on the pool's threads and the caller's; returns when all have
  // returned. Items must not depend on each other's order. One caller at a time; fn must not
  // call ParallelFor.
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn);

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  // One ParallelFor call: on its caller's stack; workers reach it through current_ (under mu_),
  // and the caller waits for every worker to leave it before returning.
  struct Loop {
    absl::FunctionRef<void(int64_t)> fn;
    int64_t n;
    std::atomic<int64_t> next{0};
  };
  void WorkerLoop();
  static void Drain(Loop& loop);  // claims and runs items until none are left

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // a new loop, or stopping
  std::condition_variable done_cv_;  // a worker left the current loop
  uint64_t generation_ = 0;          // loops started
  Loop* current_ = nullptr;          // the running loop, null between loops
  int busy_ = 0;                     // workers inside current_
  bool stop_ = false;
};

}  // namespace mqa
