#include "runtime/worker_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace mqa {
namespace {

// Every item runs exactly once, whatever the pool's size and the loop's length, over many loops
// back to back (a worker that wakes late for one loop must not run items of the next twice);
// the items ran on more than one thread when the pool has several and the items take a while.
TEST(WorkerPool, EachItemOnceOverManyLoops) {
  for (const int threads : {1, 2, 4, 7}) {
    WorkerPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int loop = 0; loop < 300; ++loop) {
      const int64_t n = loop % 37;
      std::vector<std::atomic<int>> runs(n);
      pool.ParallelFor(n, [&](int64_t i) { runs[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(runs[i].load(), 1) << threads << " " << loop;
    }
  }
}

TEST(WorkerPool, SeveralThreadsShareTheItems) {
  WorkerPool pool(4);
  std::vector<std::thread::id> ran_on(64);
  pool.ParallelFor(64, [&](int64_t i) {
    ran_on[i] = std::this_thread::get_id();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  });
  std::vector<std::thread::id> distinct;
  for (const auto& id : ran_on) {
    if (std::find(distinct.begin(), distinct.end(), id) == distinct.end()) distinct.push_back(id);
  }
  EXPECT_GT(distinct.size(), 1u);
}

}  // namespace
}  // namespace mqa
