// The periodic engine-statistics line an operator watches (vLLM's "Avg prompt throughput ..."):
// throughputs over the last interval from two EngineMetrics snapshots, the queues and the caches.
//
// Thread safety: StatsLine is a pure function; StatsLogger runs one thread that only reads
// Engine::metrics() (thread-safe) and writes to its sink.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "runtime/engine.h"

namespace mqa {

// "prompt 812.4 tokens/s, generation 95.0 tokens/s, running 3 reqs, waiting 1 reqs, KV cache
// 12.5%, prefix cache hits 40.0%, preemptions 0" for the `seconds` between the two snapshots
// (prefix-cache hits and preemptions over that interval too).
std::string StatsLine(const EngineMetrics& before, const EngineMetrics& now, double seconds);

// Whether anything happened between the snapshots or is pending (an idle server stays quiet).
bool StatsChanged(const EngineMetrics& before, const EngineMetrics& now);

// Every `interval`, writes StatsLine to `sink` when StatsChanged. Stops (joins) on destruction.
class StatsLogger {
 public:
  StatsLogger(const Engine* engine, absl::Duration interval,
              std::function<void(const std::string&)> sink);
  ~StatsLogger();
  StatsLogger(const StatsLogger&) = delete;
  StatsLogger& operator=(const StatsLogger&) = delete;

 private:
  void Loop();

  const Engine* engine_;
  const absl::Duration interval_;
  std::function<void(const std::string&)> sink_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mqa
