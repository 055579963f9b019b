#include "runtime/stats_log.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace mqa {

std::string StatsLine(const EngineMetrics& before, const EngineMetrics& now, double seconds) {
  const double s = seconds > 0 ? seconds : 1.0;
  const int64_t queried = now.prefix_cache_queried_blocks - before.prefix_cache_queried_blocks;
  const int64_t hits = now.prefix_cache_hit_blocks - before.prefix_cache_hit_blocks;
  std::string line = absl::StrFormat(
      "prompt %.1f tokens/s, generation %.1f tokens/s, running %d reqs, waiting %d reqs, KV cache "
      "%.1f%%, prefix cache hits %.1f%%, preemptions %d",
      (now.prompt_tokens - before.prompt_tokens) / s,
      (now.generation_tokens - before.generation_tokens) / s, now.num_running, now.num_waiting,
      100.0 * now.kv_cache_usage, queried > 0 ? 100.0 * hits / queried : 0.0,
      now.num_preemptions - before.num_preemptions);
  const int64_t drafts = now.spec_draft_tokens - before.spec_draft_tokens;
  if (drafts > 0) {
    absl::StrAppendFormat(
        &line, ", draft acceptance %.1f%%",
        100.0 * (now.spec_accepted_tokens - before.spec_accepted_tokens) / drafts);
  }
  return line;
}

bool StatsChanged(const EngineMetrics& before, const EngineMetrics& now) {
  return now.num_steps != before.num_steps || now.num_running > 0 || now.num_waiting > 0;
}

StatsLogger::StatsLogger(const Engine* engine, absl::Duration interval,
                         std::function<void(const std::string&)> sink)
    : engine_(engine), interval_(interval), sink_(std::move(sink)), thread_([this] { Loop(); }) {}

StatsLogger::~StatsLogger() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StatsLogger::Loop() {
  EngineMetrics before = engine_->metrics();
  absl::Time last = absl::Now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, absl::ToChronoNanoseconds(interval_), [this] { return stop_; })) {
    const EngineMetrics now = engine_->metrics();
    const absl::Time at = absl::Now();
    if (StatsChanged(before, now)) sink_(StatsLine(before, now, absl::ToDoubleSeconds(at - last)));
    before = now;
    last = at;
  }
}

}  // namespace mqa
