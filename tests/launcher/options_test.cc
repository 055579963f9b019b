#include "launcher/options.h"

#include <gtest/gtest.h>

#include "launcher/setup.h"

namespace mqa {
namespace {

TEST(Options, ParsesVllmStyleFlags) {
  auto o = ParseOptions({"mqaserve", "--model", "m", "--max-num-seqs=7", "--port", "9001",
                         "--no-enable-prefix-caching", "--device", "cuda", "--block-size", "32"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->model, "m");
  EXPECT_EQ(o->max_num_seqs, 7);
  EXPECT_EQ(o->port, 9001);
  EXPECT_FALSE(o->enable_prefix_caching);
  EXPECT_EQ(o->device, "cuda");
  EXPECT_EQ(o->block_size, 32);
  EXPECT_EQ(o->command, Command::kServe);
  EXPECT_FALSE(o->enforce_eager);
  EXPECT_TRUE(o->cuda_graph_warmup);  // the default since 2026-12-05
  auto graphs =
      ParseOptions({"mqaserve", "--model", "m", "--enforce-eager", "--cuda-graph-warmup"});
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  EXPECT_TRUE(graphs->enforce_eager);
  EXPECT_TRUE(graphs->cuda_graph_warmup);
}

TEST(Options, GenerateSubcommand) {
  auto o = ParseOptions({"mqaserve", "generate", "--model", "m", "--prompt", "def f(",
                         "--temperature", "0.5", "--sample-seed", "3"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->command, Command::kGenerate);
  EXPECT_EQ(o->prompt, "def f(");
  EXPECT_FLOAT_EQ(o->temperature, 0.5f);
  EXPECT_EQ(o->sample_seed, 3u);
}

TEST(Options, ErrorsNameTheFlag) {
  EXPECT_NE(ParseOptions({"x", "--model", "m", "--bogus", "1"}).status().message().find("--bogus"),
            std::string::npos);
  EXPECT_NE(ParseOptions({"x", "--model", "m", "--port", "abc"}).status().message().find("--port"),
            std::string::npos);
  EXPECT_NE(ParseOptions({"x", "--model", "m", "--device", "tpu"}).status().message().find("cpu"),
            std::string::npos);
  EXPECT_NE(ParseOptions({"x", "--model", "m", "--block-size", "12"}).status().message().find("8, 16"),
            std::string::npos);
  EXPECT_FALSE(ParseOptions({"x"}).ok());  // --model required
  EXPECT_FALSE(ParseOptions({"x", "--model"}).ok());
  EXPECT_FALSE(ParseOptions({"x", "generate", "--model", "m"}).ok());  // no prompt
  EXPECT_NE(ParseOptions({"x", "--model", "m", "--max-prompt-logprob-rows", "-1"})
                .status()
                .message()
                .find("--max-prompt-logprob-rows"),
            std::string::npos);
  auto rows = ParseOptions({"x", "--model", "m", "--max-prompt-logprob-rows", "64"});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->max_prompt_logprob_rows, 64);
  EXPECT_EQ(ParseOptions({"x", "--model", "m"})->max_prompt_logprob_rows, 256);
  auto logs = ParseOptions({"x", "--model", "m", "--disable-log-stats", "--log-requests",
                            "--log-stats-interval", "2.5"});
  ASSERT_TRUE(logs.ok()) << logs.status();
  EXPECT_FALSE(logs->log_stats);
  EXPECT_TRUE(logs->log_requests);
  EXPECT_DOUBLE_EQ(logs->log_stats_interval, 2.5);
  EXPECT_TRUE(ParseOptions({"x", "--model", "m"})->log_stats);
  EXPECT_FALSE(ParseOptions({"x", "--model", "m"})->log_requests);
  EXPECT_FALSE(ParseOptions({"x", "--model", "m", "--log-stats-interval", "0"}).ok());
  EXPECT_EQ(ParseOptions({"x", "--model", "m"})->allowed_origins, "*");
  EXPECT_EQ(ParseOptions({"x", "--model", "m", "--chat-template", "t.jinja"})->chat_template,
            "t.jinja");
  EXPECT_EQ(ParseOptions({"x", "--model", "m", "--allowed-origins", "http://a, http://b"})
                ->allowed_origins,
            "http://a, http://b");
  auto spec = ParseOptions({"x", "--model", "m", "--speculative-config",
                            R"({"method": "ngram", "num_speculative_tokens": 4})"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->speculative.num_speculative_tokens, 4);
  EXPECT_FALSE(ParseOptions({"x", "--model", "m"})->speculative.enabled());
  EXPECT_NE(ParseOptions({"x", "--model", "m", "--speculative-config", R"({"method": "medusa"})"})
                .status()
                .message()
                .find("--speculative-config"),
            std::string::npos);
  EXPECT_EQ(ParseOptions({"x", "--model", "m"})->scheduling_policy, "fcfs");
  EXPECT_EQ(ParseOptions({"x", "--model", "m", "--scheduling-policy", "priority"})->scheduling_policy,
            "priority");
  EXPECT_FALSE(ParseOptions({"x", "--model", "m", "--scheduling-policy", "lifo"}).ok());
  EXPECT_EQ(ParseOptions({"x", "--model", "m"})->metrics_prefix, "mqaserve_");
  EXPECT_EQ(ParseOptions({"x", "--model", "m", "--metrics-prefix", "vllm:"})->metrics_prefix,
            "vllm:");
  for (const char* bad : {"", "1x_", "a-b", "ä"}) {
    EXPECT_FALSE(ParseOptions({"x", "--model", "m", "--metrics-prefix", bad}).ok()) << bad;
  }
  // vLLM's auto tool choice: both flags or neither; a known parser.
  absl::StatusOr<Options> tools = ParseOptions(
      {"x", "--model", "m", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"});
  ASSERT_TRUE(tools.ok()) << tools.status();
  EXPECT_TRUE(tools->enable_auto_tool_choice);
  EXPECT_EQ(tools->tool_call_parser, "hermes");
  EXPECT_TRUE(ParseOptions({"x", "--model", "m"})->tool_call_parser.empty());
  EXPECT_FALSE(ParseOptions({"x", "--model", "m", "--enable-auto-tool-choice"}).ok());
  EXPECT_FALSE(ParseOptions({"x", "--model", "m", "--tool-call-parser", "hermes"}).ok());
  EXPECT_FALSE(ParseOptions({"x", "--model", "m", "--enable-auto-tool-choice", "--tool-call-parser",
                             "mistral"})
                   .ok());
  // The decode-graph warm-up: on unless turned off.
  EXPECT_TRUE(ParseOptions({"x", "--model", "m"})->cuda_graph_warmup);
  EXPECT_FALSE(ParseOptions({"x", "--model", "m", "--no-cuda-graph-warmup"})->cuda_graph_warmup);
  // Decode GEMM tuning during the graph warm-up: on unless turned off; two values.
  EXPECT_EQ(ParseOptions({"x", "--model", "m"})->gemm_autotune, "decode");
  EXPECT_EQ(ParseOptions({"x", "--model", "m", "--gemm-autotune", "off"})->gemm_autotune, "off");
  EXPECT_FALSE(ParseOptions({"x", "--model", "m", "--gemm-autotune", "all"}).ok());
  EXPECT_EQ(ParseOptions({"x", "--model", "m"})->max_stored_responses, 1024);
  EXPECT_EQ(
      ParseOptions({"x", "--model", "m", "--max-stored-responses", "0"})->max_stored_responses, 0);
  EXPECT_FALSE(ParseOptions({"x", "--model", "m", "--max-stored-responses", "-1"}).ok());
}

// The decode-graph warm-up (and the GEMM tuning inside it) by default for one CUDA rank, never
// at several ranks, on the CPU or with --enforce-eager; no tuning without the warm-up.
TEST(Options, DecodeWarmUpPlan) {
  const Options defaults = *ParseOptions({"x", "--model", "m", "--device", "cuda"});
  DecodeWarmUpPlan plan = PlanDecodeWarmUp(defaults, /*cuda=*/true, /*world_size=*/1);
  EXPECT_TRUE(plan.warm_up);
  EXPECT_TRUE(plan.tune_gemms);
  EXPECT_FALSE(PlanDecodeWarmUp(defaults, true, 2).warm_up);
  EXPECT_FALSE(PlanDecodeWarmUp(defaults, true, 2).tune_gemms);
  EXPECT_FALSE(PlanDecodeWarmUp(defaults, /*cuda=*/false, 1).warm_up);
  const Options eager = *ParseOptions({"x", "--model", "m", "--enforce-eager"});
  EXPECT_FALSE(PlanDecodeWarmUp(eager, true, 1).warm_up);
  EXPECT_FALSE(PlanDecodeWarmUp(eager, true, 1).tune_gemms);
  const Options no_warm = *ParseOptions({"x", "--model", "m", "--no-cuda-graph-warmup"});
  EXPECT_FALSE(PlanDecodeWarmUp(no_warm, true, 1).tune_gemms);
  const Options untuned = *ParseOptions({"x", "--model", "m", "--gemm-autotune", "off"});
  plan = PlanDecodeWarmUp(untuned, true, 1);
  EXPECT_TRUE(plan.warm_up);
  EXPECT_FALSE(plan.tune_gemms);
}

}  // namespace
}  // namespace mqa
