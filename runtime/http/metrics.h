// Prometheus metrics of the HTTP server, in the text exposition format (version 0.0.4).
//
// Gauges and token / preemption counters come from the engine (EngineMetrics, read at scrape
// time); the server itself counts finished samples by reason and observes the latency
// histograms. Names are vLLM's after a prefix, `mqaserve_` by default (`vllm:` gives vLLM's own
// names, so that dashboards made for vLLM read them); every sample carries a `model_name` label.
//
// Thread safety: Histogram::Observe, ServerMetrics' Observe*/Count* and Render may be called from
// any thread at once (one mutex per histogram; atomics for the counters).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "runtime/engine.h"
#include "runtime/sequence.h"

namespace mqa {

// Cumulative buckets with fixed upper bounds (seconds); +Inf is implicit.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);

  void Observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative_counts;  // per bound, then +Inf (== count)
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> upper_bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last = above every bound
  double sum_ = 0.0;
};

// Appends one metric family in text format. `labels` is the rendered label set without braces
// ("model_name=\"m\""), possibly empty.
void AppendGauge(std::string* out, absl::string_view name, absl::string_view help,
                 absl::string_view labels, double value);
void AppendCounter(std::string* out, absl::string_view name, absl::string_view help,
                   absl::string_view labels, double value);
void AppendHistogram(std::string* out, absl::string_view name, absl::string_view help,
                     absl::string_view labels, const Histogram::Snapshot& snapshot);
// A label value escaped for the text format (backslash, double quote, newline).
std::string EscapeLabelValue(absl::string_view value);
// A sample value: integers without a fraction, +Inf / -Inf / NaN spelled as Prometheus does.
std::string FormatMetricValue(double value);

// Whether `prefix` can start a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*).
bool IsMetricNamePrefix(absl::string_view prefix);

class ServerMetrics {
 public:
  // `max_model_len` bounds the request-length histograms' buckets (1, 2, 5, 10, 20, 50, ...).
  explicit ServerMetrics(std::string model_name, std::string prefix = "mqaserve_",
                         int max_model_len = 2048);

  void ObserveTimeToFirstToken(double seconds) { ttft_.Observe(seconds); }
  void ObserveInterTokenLatency(double seconds) { itl_.Observe(seconds); }
  void ObserveE2eLatency(double seconds) { e2e_.Observe(seconds); }
  // One finished sample (vLLM counts each of a request's n samples).
  void CountFinished(FinishReason reason);
  // One finished engine request (a prompt with its samples): its lengths, and where its time went
  // (queue: arrival to first scheduled; prefill: to the first token; decode: first to last
  // token; inference: first scheduled to the end). Times are left out when it never ran.
  struct FinishedRequest {
    int prompt_tokens = 0;
    int generation_tokens = 0;
    std::optional<double> queue_seconds, prefill_seconds, decode_seconds, inference_seconds;
  };
  void ObserveFinishedRequest(const FinishedRequest& request);

  // The whole /metrics page.
  std::string Render(const EngineMetrics& engine) const;

 private:
  const std::string labels_;
  const std::string prefix_;
  std::array<std::atomic<int64_t>, 3> finished_{};  // by FinishReason
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  Histogram prompt_tokens_;
  Histogram generation_tokens_;
  Histogram queue_;
  Histogram prefill_;
  Histogram decode_;
  Histogram inference_;
};

}  // namespace mqa
