#include "runtime/worker_pool.h"

namespace mqa {

WorkerPool::WorkerPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void WorkerPool::Drain(Loop& loop) {
  for (int64_t i = loop.next.fetch_add(1); i < loop.n; i = loop.next.fetch_add(1)) loop.fn(i);
}

void WorkerPool::WorkerLoop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    Loop* loop = current_;  // null: that loop has already ended
    if (loop == nullptr) continue;
    ++busy_;
    lock.unlock();
    Drain(*loop);
    lock.lock();
    if (--busy_ == 0) done_cv_.notify_one();
  }
}

void WorkerPool::ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn) {
  if (workers_.empty() || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Loop loop{fn, n};
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = &loop;
    ++generation_;
  }
  work_cv_.notify_all();
  Drain(loop);
  // Every item is claimed; wait for the workers still running theirs, then close the loop so
  // that a worker waking only now skips it.
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return busy_ == 0; });
  current_ = nullptr;
}

}  // namespace mqa
