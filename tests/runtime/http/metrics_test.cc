#include "runtime/http/metrics.h"

#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/runtime/http/prometheus_text.h"

namespace mqa {
namespace {

TEST(MetricsTest, HistogramBucketsAreCumulativeAndInclusive) {
  const std::vector<double> bounds = {0.01, 0.1, 0.5, 1.0, 5.0};
  Histogram histogram(bounds);
  std::mt19937_64 rng(42);
  std::exponential_distribution<double> dist(2.0);
  std::vector<double> values;
  for (int i = 0; i < 1000; ++i) values.push_back(dist(rng));
  values.push_back(0.1);  // exactly on a bound: counted in that bucket ("le")
  double sum = 0.0;
  for (double v : values) {
    histogram.Observe(v);
    sum += v;
  }
  Histogram::Snapshot s = histogram.Read();
  ASSERT_EQ(s.cumulative_counts.size(), bounds.size() + 1);
  for (size_t b = 0; b < bounds.size(); ++b) {
    uint64_t expected = 0;
    for (double v : values) expected += v <= bounds[b];
    EXPECT_EQ(s.cumulative_counts[b], expected) << "le=" << bounds[b];
  }
  EXPECT_EQ(s.cumulative_counts.back(), values.size());
  EXPECT_EQ(s.count, values.size());
  EXPECT_NEAR(s.sum, sum, 1e-9 * sum);
}

TEST(MetricsTest, HistogramIsThreadSafe) {
  Histogram histogram({1.0, 2.0});
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5000; ++i) histogram.Observe((i + t) % 3 * 1.0 + 0.5);
    });
  }
  for (std::thread& t : threads) t.join();
  Histogram::Snapshot s = histogram.Read();
  EXPECT_EQ(s.count, 40000u);
  uint64_t low = 0;  // values 0.5
  for (int t = 0; t < 8; ++t) {
    for (int i = 0; i < 5000; ++i) low += (i + t) % 3 == 0;
  }
  EXPECT_EQ(s.cumulative_counts[0], low);
}

TEST(MetricsTest, ValueAndLabelFormatting) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(12345), "12345");
  EXPECT_EQ(FormatMetricValue(-3), "-3");
  EXPECT_EQ(FormatMetricValue(0.25), "0.25");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  double parsed = 0;
  ASSERT_TRUE(absl::SimpleAtod(FormatMetricValue(0.1 + 0.2), &parsed));
  EXPECT_EQ(parsed, 0.1 + 0.2);  // round-trips exactly
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(MetricsTest, RenderedPageParsesWithEveryFamily) {
  ServerMetrics metrics("my \"model\"");
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> unit(0.0, 3.0);
  const int ttft_n = 37, itl_n = 211, e2e_n = 19;
  for (int i = 0; i < ttft_n; ++i) metrics.ObserveTimeToFirstToken(unit(rng));
  for (int i = 0; i < itl_n; ++i) metrics.ObserveInterTokenLatency(unit(rng) / 10);
  for (int i = 0; i < e2e_n; ++i) metrics.ObserveE2eLatency(unit(rng) * 10);
  const int stops = 1 + rng() % 50, lengths = 1 + rng() % 50, aborts = 1 + rng() % 50;
  for (int i = 0; i < stops; ++i) metrics.CountFinished(FinishReason::kStop);
  for (int i = 0; i < lengths; ++i) metrics.CountFinished(FinishReason::kLength);
  for (int i = 0; i < aborts; ++i) metrics.CountFinished(FinishReason::kAbort);
  // Finished requests: the last never ran (aborted while queued), so it has lengths but no times.
  const int finished_n = 7;
  for (int i = 0; i < finished_n; ++i) {
    ServerMetrics::FinishedRequest r{.prompt_tokens = 3 + i * 50, .generation_tokens = i};
    if (i + 1 < finished_n) {
      r.queue_seconds = unit(rng);
      r.prefill_seconds = unit(rng);
      r.decode_seconds = unit(rng);
      r.inference_seconds = unit(rng);
    }
    metrics.ObserveFinishedRequest(r);
  }
  EngineMetrics engine;
  engine.prefix_cache_queried_tokens = 1 + rng() % 100000;
  engine.prefix_cache_hit_tokens = engine.prefix_cache_queried_tokens / 3;
  engine.num_running = 1 + rng() % 100;
  engine.num_waiting = 1 + rng() % 100;
  engine.kv_cache_usage = 0.375;
  engine.prompt_tokens = 1 + rng() % 100000;
  engine.generation_tokens = 1 + rng() % 100000;
  engine.num_preemptions = 1 + rng() % 100;

  const std::string page = metrics.Render(engine);
  absl::StatusOr<testing::PrometheusPage> parsed = testing::ParsePrometheusText(page);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << page;
  const std::string model = "model_name=\"my \\\"model\\\"\"";
  auto value = [&](const std::string& name, const std::string& labels) {
    auto it = parsed->samples.find(name + "{" + labels + "}");
    EXPECT_NE(it, parsed->samples.end()) << name << "{" << labels << "}\n" << page;
    return it == parsed->samples.end() ? -1.0 : it->second;
  };
  EXPECT_EQ(parsed->types.at("mqaserve_num_requests_running"), "gauge");
  EXPECT_EQ(value("mqaserve_num_requests_running", model), engine.num_running);
  EXPECT_EQ(value("mqaserve_num_requests_waiting", model), engine.num_waiting);
  EXPECT_EQ(value("mqaserve_kv_cache_usage_perc", model), 0.375);
  EXPECT_EQ(parsed->types.at("mqaserve_prompt_tokens_total"), "counter");
  EXPECT_EQ(value("mqaserve_prompt_tokens_total", model), engine.prompt_tokens);
  EXPECT_EQ(value("mqaserve_generation_tokens_total", model), engine.generation_tokens);
  EXPECT_EQ(value("mqaserve_num_preemptions_total", model), engine.num_preemptions);
  EXPECT_EQ(value("mqaserve_prefix_cache_queries_total", model),
            engine.prefix_cache_queried_tokens);
  EXPECT_EQ(value("mqaserve_prefix_cache_hits_total", model), engine.prefix_cache_hit_tokens);
  // Request lengths in vLLM's 1-2-5 buckets up to max_model_len (2048 by default).
  EXPECT_EQ(value("mqaserve_request_prompt_tokens_count", model), finished_n);
  EXPECT_EQ(value("mqaserve_request_prompt_tokens_bucket", model + ",le=\"50\""), 1);  // 3
  EXPECT_EQ(value("mqaserve_request_prompt_tokens_bucket", model + ",le=\"2000\""), finished_n);
  EXPECT_EQ(
      parsed->samples.count("mqaserve_request_prompt_tokens_bucket{" + model + ",le=\"5000\"}"),
      0u);
  EXPECT_EQ(value("mqaserve_request_generation_tokens_sum", model), 21);  // 0 + ... + 6
  EXPECT_EQ(value("mqaserve_request_success_total", model + ",finished_reason=\"stop\""), stops);
  EXPECT_EQ(value("mqaserve_request_success_total", model + ",finished_reason=\"length\""),
            lengths);
  EXPECT_EQ(value("mqaserve_request_success_total", model + ",finished_reason=\"abort\""), aborts);
  for (const auto& [name, n] : std::vector<std::pair<std::string, int>>{
           {"mqaserve_time_to_first_token_seconds", ttft_n},
           {"mqaserve_inter_token_latency_seconds", itl_n},
           {"mqaserve_e2e_request_latency_seconds", e2e_n},
           {"mqaserve_request_queue_time_seconds", finished_n - 1},
           {"mqaserve_request_prefill_time_seconds", finished_n - 1},
           {"mqaserve_request_decode_time_seconds", finished_n - 1},
           {"mqaserve_request_inference_time_seconds", finished_n - 1}}) {
    EXPECT_EQ(parsed->types.at(name), "histogram");
    EXPECT_EQ(value(name + "_count", model), n);
    EXPECT_EQ(value(name + "_bucket", model + ",le=\"+Inf\""), n);
    EXPECT_GT(value(name + "_sum", model), 0.0);
    // Buckets never decrease.
    double previous = 0;
    int buckets = 0;
    for (const auto& [key, v] : parsed->ordered) {
      if (key.rfind(name + "_bucket{", 0) != 0) continue;
      EXPECT_GE(v, previous) << key;
      previous = v;
      ++buckets;
    }
    EXPECT_GT(buckets, 5);
  }
}

TEST(MetricsTest, PrefixNamesEveryFamily) {
  EXPECT_TRUE(IsMetricNamePrefix("vllm:"));
  EXPECT_TRUE(IsMetricNamePrefix("my_server_2_"));
  EXPECT_FALSE(IsMetricNamePrefix("2x"));
  EXPECT_FALSE(IsMetricNamePrefix("a b"));
  EXPECT_FALSE(IsMetricNamePrefix("a-b"));
  ServerMetrics metrics("m", "vllm:", 4096);
  metrics.ObserveFinishedRequest({.prompt_tokens = 4096, .generation_tokens = 1});
  absl::StatusOr<testing::PrometheusPage> parsed =
      testing::ParsePrometheusText(metrics.Render(EngineMetrics{}));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_FALSE(parsed->types.empty());
  for (const auto& [name, type] : parsed->types) {
    EXPECT_EQ(name.rfind("vllm:", 0), 0u) << name;
  }
  EXPECT_EQ(parsed->types.at("vllm:request_queue_time_seconds"), "histogram");
  // The longest bucket is the largest 1-2-5 bound within 4096.
  EXPECT_EQ(
      parsed->samples.count("vllm:request_prompt_tokens_bucket{model_name=\"m\",le=\"2000\"}"), 1u);
  EXPECT_EQ(parsed->samples.at("vllm:request_prompt_tokens_bucket{model_name=\"m\",le=\"2000\"}"),
            0);
  EXPECT_EQ(parsed->samples.at("vllm:request_prompt_tokens_bucket{model_name=\"m\",le=\"+Inf\"}"),
            1);
}

}  // namespace
}  // namespace mqa
