#include "runtime/http/metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/status.h"

namespace mqa {
namespace {

// Bucket bounds in seconds. TTFT spans a cached short prompt on the GPU to a long prompt behind a
// full queue on the CPU backend; inter-token latency is one decode step; end-to-end is a whole
// request.
std::vector<double> TtftBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,  0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0};
}
std::vector<double> ItlBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,
          0.3,   0.4,    0.5,   0.75, 1.0,   2.5,  5.0,   10.0, 20.0, 80.0};
}
std::vector<double> E2eBuckets() {
  return {0.1,  0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,
          20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

void AppendHeader(std::string* out, absl::string_view name, absl::string_view help,
                  absl::string_view type) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

std::string Braced(absl::string_view labels) {
  return labels.empty() ? std::string() : absl::StrCat("{", labels, "}");
}

std::string WithLabel(absl::string_view labels, absl::string_view key, absl::string_view value) {
  std::string extra = absl::StrCat(key, "=\"", value, "\"");
  return labels.empty() ? extra : absl::StrCat(labels, ",", extra);
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {
  MQA_CHECK(std::is_sorted(upper_bounds_.begin(), upper_bounds_.end()));
}

void Histogram::Observe(double value) {
  // Bucket i holds values in (bound[i-1], bound[i]]: Prometheus buckets are "less or equal".
  size_t bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin();
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.upper_bounds = upper_bounds_;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t running = 0;
  for (uint64_t c : counts_) {
    running += c;
    snapshot.cumulative_counts.push_back(running);
  }
  snapshot.count = running;
  snapshot.sum = sum_;
  return snapshot;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  return absl::StrFormat("%.17g", value);
}

void AppendGauge(std::string* out, absl::string_view name, absl::string_view help,
                 absl::string_view labels, double value) {
  AppendHeader(out, name, help, "gauge");
  absl::StrAppend(out, name, Braced(labels), " ", FormatMetricValue(value), "\n");
}

void AppendCounter(std::string* out, absl::string_view name, absl::string_view help,
                   absl::string_view labels, double value) {
  AppendHeader(out, name, help, "counter");
  absl::StrAppend(out, name, Braced(labels), " ", FormatMetricValue(value), "\n");
}

void AppendHistogram(std::string* out, absl::string_view name, absl::string_view help,
                     absl::string_view labels, const Histogram::Snapshot& snapshot) {
  AppendHeader(out, name, help, "histogram");
  for (size_t i = 0; i < snapshot.upper_bounds.size(); ++i) {
    absl::StrAppend(out, name, "_bucket",
                    Braced(WithLabel(labels, "le", FormatMetricValue(snapshot.upper_bounds[i]))),
                    " ", snapshot.cumulative_counts[i], "\n");
  }
  absl::StrAppend(out, name, "_bucket", Braced(WithLabel(labels, "le", "+Inf")), " ",
                  snapshot.count, "\n");
  absl::StrAppend(out, name, "_sum", Braced(labels), " ", FormatMetricValue(snapshot.sum), "\n");
  absl::StrAppend(out, name, "_count", Braced(labels), " ", snapshot.count, "\n");
}

ServerMetrics::ServerMetrics(std::string model_name)
    : labels_(absl::StrCat("model_name=\"", EscapeLabelValue(model_name), "\"")),
      ttft_(TtftBuckets()),
      itl_(ItlBuckets()),
      e2e_(E2eBuckets()) {}

void ServerMetrics::CountFinished(FinishReason reason) {
  finished_[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
}

std::string ServerMetrics::Render(const EngineMetrics& engine) const {
  std::string out;
  AppendGauge(&out, "mqaserve_num_requests_running", "Requests in the running batch.", labels_,
              engine.num_running);
  AppendGauge(&out, "mqaserve_num_requests_waiting", "Requests waiting to be scheduled.", labels_,
              engine.num_waiting);
  AppendGauge(&out, "mqaserve_kv_cache_usage_perc",
              "Fraction of KV-cache blocks in use (1 means 100 percent).", labels_,
              engine.kv_cache_usage);
  AppendCounter(&out, "mqaserve_prompt_tokens_total", "Prompt tokens of admitted requests.",
                labels_, static_cast<double>(engine.prompt_tokens));
  AppendCounter(&out, "mqaserve_generation_tokens_total", "Generated tokens.", labels_,
                static_cast<double>(engine.generation_tokens));
  AppendCounter(&out, "mqaserve_num_preemptions_total", "Sequences preempted.", labels_,
                static_cast<double>(engine.num_preemptions));
  AppendCounter(&out, "mqaserve_spec_decode_num_draft_tokens_total",
                "Speculative decoding: draft tokens checked.", labels_,
                static_cast<double>(engine.spec_draft_tokens));
  AppendCounter(&out, "mqaserve_spec_decode_num_accepted_tokens_total",
                "Speculative decoding: draft tokens accepted.", labels_,
                static_cast<double>(engine.spec_accepted_tokens));

  constexpr char kSuccess[] = "mqaserve_request_success_total";
  AppendHeader(&out, kSuccess, "Finished samples, by finish reason.", "counter");
  for (FinishReason reason : {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort}) {
    absl::StrAppend(&out, kSuccess,
                    Braced(WithLabel(labels_, "finished_reason", FinishReasonName(reason))), " ",
                    finished_[static_cast<size_t>(reason)].load(std::memory_order_relaxed), "\n");
  }
  AppendHistogram(&out, "mqaserve_time_to_first_token_seconds",
                  "Time from request arrival to its first generated token.", labels_, ttft_.Read());
  AppendHistogram(&out, "mqaserve_inter_token_latency_seconds",
                  "Time between successive outputs of a request.", labels_, itl_.Read());
  AppendHistogram(&out, "mqaserve_e2e_request_latency_seconds",
                  "Time from request arrival to its last output.", labels_, e2e_.Read());
  return out;
}

}  // namespace mqa
