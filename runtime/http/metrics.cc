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

// vLLM's request-length buckets: 1, 2, 5 times powers of ten up to the longest request.
std::vector<double> LengthBuckets(int max_model_len) {
  std::vector<double> bounds;
  for (double decade = 1;; decade *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * decade > max_model_len) return bounds;
      bounds.push_back(m * decade);
    }
  }
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

bool IsMetricNamePrefix(absl::string_view prefix) {
  for (size_t i = 0; i < prefix.size(); ++i) {
    const char c = prefix[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

ServerMetrics::ServerMetrics(std::string model_name, std::string prefix, int max_model_len)
    : labels_(absl::StrCat("model_name=\"", EscapeLabelValue(model_name), "\"")),
      prefix_(std::move(prefix)),
      ttft_(TtftBuckets()),
      itl_(ItlBuckets()),
      e2e_(E2eBuckets()),
      prompt_tokens_(LengthBuckets(max_model_len)),
      generation_tokens_(LengthBuckets(max_model_len)),
      queue_(E2eBuckets()),
      prefill_(E2eBuckets()),
      decode_(E2eBuckets()),
      inference_(E2eBuckets()) {
  MQA_CHECK(IsMetricNamePrefix(prefix_));
}

void ServerMetrics::ObserveFinishedRequest(const FinishedRequest& request) {
  prompt_tokens_.Observe(request.prompt_tokens);
  generation_tokens_.Observe(request.generation_tokens);
  for (const auto& [seconds, histogram] :
       {std::pair{request.queue_seconds, &queue_}, std::pair{request.prefill_seconds, &prefill_},
        std::pair{request.decode_seconds, &decode_},
        std::pair{request.inference_seconds, &inference_}}) {
    if (seconds.has_value()) histogram->Observe(std::max(0.0, *seconds));
  }
}

void ServerMetrics::CountFinished(FinishReason reason) {
  finished_[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
}

std::string ServerMetrics::Render(const EngineMetrics& engine) const {
  auto Name = [&](absl::string_view name) { return absl::StrCat(prefix_, name); };
  std::string out;
  AppendGauge(&out, Name("num_requests_running"), "Requests in the running batch.", labels_,
              engine.num_running);
  AppendGauge(&out, Name("num_requests_waiting"), "Requests waiting to be scheduled.", labels_,
              engine.num_waiting);
  AppendGauge(&out, Name("kv_cache_usage_perc"),
              "Fraction of KV-cache blocks in use (1 means 100 percent).", labels_,
              engine.kv_cache_usage);
  AppendCounter(&out, Name("prompt_tokens_total"), "Prompt tokens of admitted requests.", labels_,
                static_cast<double>(engine.prompt_tokens));
  AppendCounter(&out, Name("generation_tokens_total"), "Generated tokens.", labels_,
                static_cast<double>(engine.generation_tokens));
  AppendCounter(&out, Name("num_preemptions_total"), "Sequences preempted.", labels_,
                static_cast<double>(engine.num_preemptions));
  AppendCounter(&out, Name("spec_decode_num_draft_tokens_total"),
                "Speculative decoding: draft tokens checked.", labels_,
                static_cast<double>(engine.spec_draft_tokens));
  AppendCounter(&out, Name("spec_decode_num_accepted_tokens_total"),
                "Speculative decoding: draft tokens accepted.", labels_,
                static_cast<double>(engine.spec_accepted_tokens));

  const std::string success = Name("request_success_total");
  AppendHeader(&out, success, "Finished samples, by finish reason.", "counter");
  for (FinishReason reason : {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort}) {
    absl::StrAppend(&out, success,
                    Braced(WithLabel(labels_, "finished_reason", FinishReasonName(reason))), " ",
                    finished_[static_cast<size_t>(reason)].load(std::memory_order_relaxed), "\n");
  }
  AppendHistogram(&out, Name("time_to_first_token_seconds"),
                  "Time from request arrival to its first generated token.", labels_, ttft_.Read());
  AppendHistogram(&out, Name("inter_token_latency_seconds"),
                  "Time between successive outputs of a request.", labels_, itl_.Read());
  AppendHistogram(&out, Name("e2e_request_latency_seconds"),
                  "Time from request arrival to its last output.", labels_, e2e_.Read());
  AppendCounter(&out, Name("prefix_cache_queries_total"),
                "Prefix cache: prompt tokens looked up (those of requests admitted with it on).",
                labels_, static_cast<double>(engine.prefix_cache_queried_tokens));
  AppendCounter(&out, Name("prefix_cache_hits_total"),
                "Prefix cache: prompt tokens found in the cache.", labels_,
                static_cast<double>(engine.prefix_cache_hit_tokens));
  AppendHistogram(&out, Name("request_prompt_tokens"), "Prompt tokens of finished requests.",
                  labels_, prompt_tokens_.Read());
  AppendHistogram(&out, Name("request_generation_tokens"),
                  "Generated tokens of finished requests (all samples).", labels_,
                  generation_tokens_.Read());
  AppendHistogram(&out, Name("request_queue_time_seconds"),
                  "Time from request arrival to its first scheduling.", labels_, queue_.Read());
  AppendHistogram(&out, Name("request_prefill_time_seconds"),
                  "Time from first scheduling to the first generated token.", labels_,
                  prefill_.Read());
  AppendHistogram(&out, Name("request_decode_time_seconds"),
                  "Time from the first generated token to the last.", labels_, decode_.Read());
  AppendHistogram(&out, Name("request_inference_time_seconds"),
                  "Time from first scheduling to the last output.", labels_, inference_.Read());
  return out;
}

}  // namespace mqa
