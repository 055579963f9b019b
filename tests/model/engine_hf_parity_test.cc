// The whole CPU serving path against Hugging Face: Engine (scheduler, block manager, sampler)
// over GptBigCodeRunner, greedy, on every fixture made by tests/fixtures/make_fixtures.py. The
// continuations must equal HF's token for token (up to a step whose HF top-1 margin is under
// 1e-4), whether the prompts run one at a time or all together, with block sizes 8 and 16, with
// prefix caching on (some prompts repeat), and with a KV pool small enough to force preemption.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt_bigcode_runner.h"
#include "parallel/collectives.h"
#include "runtime/engine.h"
#include "tests/model/churn_workload.h"
#include "tests/model/hf_fixture.h"
#include "tests/model/prompt_scores_util.h"

namespace mqa {
namespace {

struct Case {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;  // HF's tokens, cut before the first step with a margin < 1e-4
};

using testing::FixtureModelDir;

// HF's prompts and greedy tokens, cut before the first step whose top-1 margin is under 1e-4.
std::vector<Case> LoadCases(const std::string& dir) {
  std::vector<Case> cases;
  for (const testing::HfReference& r : testing::LoadHfReferences(dir, /*vocab=*/0)) {
    Case c;
    c.prompt = r.prompt;
    for (size_t i = 0; i < r.greedy.size() && r.margins[i] >= 1e-4; ++i) {
      c.greedy.push_back(r.greedy[i]);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

struct EngineSetup {
  int block_size = 16;
  int num_kv_blocks = 256;
  bool prefix_caching = true;
  bool together = true;
  int max_num_batched_tokens = 64;  // small: long prompts are chunked
  SpeculativeConfig speculative;
  // The engine samples through the runner (ExecuteSampled, on the CPU as on the GPU), with decode
  // lookahead (EngineOptions::decode_lookahead) when `lookahead`.
  bool device_sampling = false;
  bool lookahead = false;
  int lookahead_max_seqs = 16;  // EngineOptions::decode_lookahead_max_seqs (its default is 1)
};

struct RunResult {
  std::vector<std::vector<int32_t>> outputs;
  EngineMetrics metrics;
  int cached_prompt_tokens = 0;
  LookaheadStats lookahead;
};

// The CPU runner as the engine sees a GPU runner: it samples "on the device"
// (GptBigCodeRunner::ExecuteSampled, the same sampling function), so that the engine sends
// per-row sampling parameters and, with decode lookahead, may_look_ahead hints.
class DeviceSamplingCpuRunner final : public ModelRunner {
 public:
  explicit DeviceSamplingCpuRunner(std::unique_ptr<GptBigCodeRunner> inner)
      : inner_(std::move(inner)) {}
  absl::StatusOr<Tensor> Execute(const StepInput& input) override { return inner_->Execute(input); }
  bool samples_on_device() const override { return true; }
  absl::StatusOr<SampledStep> ExecuteSampled(const StepInput& input,
                                             absl::Span<const RowSamplingParams> params,
                                             bool with_logits) override {
    return inner_->ExecuteSampled(input, params, with_logits);
  }
  absl::Status KeepAlive() override { return inner_->KeepAlive(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  int block_size() const override { return inner_->block_size(); }
  const GptBigCodeRunner& inner() const { return *inner_; }

 private:
  std::unique_ptr<GptBigCodeRunner> inner_;
};

// An engine over the CPU runner of fixture `model`; `collectives` must outlive it. `runner_out`
// (optional) gets the runner, which the engine owns.
std::unique_ptr<Engine> MakeEngine(const std::string& model, const EngineSetup& s,
                                   Collectives* collectives, int max_prompt_logprob_rows = 256,
                                   const GptBigCodeRunner** runner_out = nullptr) {
  LoadOptions load;
  load.model_dir = FixtureModelDir(model);
  GptBigCodeRunnerOptions ro;
  ro.block_size = s.block_size;
  ro.num_kv_blocks = s.num_kv_blocks;
  auto loaded = CreateGptBigCodeRunnerFromDir(load, collectives, ro);
  MQA_CHECK_OK(loaded.status());
  if (runner_out != nullptr) *runner_out = loaded->get();
  std::unique_ptr<ModelRunner> runner = *std::move(loaded);
  if (s.device_sampling || s.lookahead) {
    runner = std::make_unique<DeviceSamplingCpuRunner>(
        std::unique_ptr<GptBigCodeRunner>(static_cast<GptBigCodeRunner*>(runner.release())));
  }
  EngineOptions eo;
  eo.decode_lookahead = s.lookahead;
  eo.decode_lookahead_max_seqs = s.lookahead_max_seqs;
  eo.max_num_batched_tokens = s.max_num_batched_tokens;
  eo.max_num_seqs = 16;
  eo.max_model_len = 128;
  eo.enable_prefix_caching = s.prefix_caching;
  eo.eos_token_id = -1;  // HF's reference loop never stops early
  eo.max_prompt_logprob_rows = max_prompt_logprob_rows;
  eo.speculative = s.speculative;
  auto engine = Engine::Create(std::move(runner), eo);
  MQA_CHECK_OK(engine.status());
  return *std::move(engine);
}

RunResult RunEngine(const std::string& model, const std::vector<Case>& cases,
                    const EngineSetup& s) {
  auto collectives = MakeLocalCollectives();
  const GptBigCodeRunner* runner = nullptr;
  std::unique_ptr<Engine> engine = MakeEngine(model, s, collectives.get(), 256, &runner);

  RunResult result;
  result.outputs.resize(cases.size());
  std::vector<RequestOutputQueue> queues(cases.size());
  auto submit = [&](size_t i) {
    EngineRequest r;
    r.request_id = "r" + std::to_string(i);
    r.prompt_token_ids = cases[i].prompt;
    r.params.temperature = 0;
    r.params.max_tokens = static_cast<int>(cases[i].greedy.size());
    r.on_output = queues[i].Callback();
    MQA_CHECK_OK(engine->AddRequest(std::move(r)));
  };
  auto drain = [&](size_t i, bool& finished) {
    while (auto out = queues[i].Pop(absl::ZeroDuration())) {
      EXPECT_TRUE(out->error.ok()) << out->error;
      for (const auto& sample : out->samples) {
        result.outputs[i].insert(result.outputs[i].end(), sample.token_ids.begin(),
                                 sample.token_ids.end());
      }
      result.cached_prompt_tokens += out->num_cached_prompt_tokens;
      finished = finished || out->finished;
    }
  };
  if (s.together) {
    for (size_t i = 0; i < cases.size(); ++i) submit(i);
    while (engine->HasWork()) MQA_CHECK_OK(engine->Step());
    for (size_t i = 0; i < cases.size(); ++i) {
      bool finished = false;
      drain(i, finished);
      EXPECT_TRUE(finished) << "request " << i;
    }
  } else {
    for (size_t i = 0; i < cases.size(); ++i) {
      submit(i);
      while (engine->HasWork()) MQA_CHECK_OK(engine->Step());
      bool finished = false;
      drain(i, finished);
      EXPECT_TRUE(finished) << "request " << i;
    }
  }
  result.metrics = engine->metrics();
  result.lookahead = runner->lookahead_stats();
  EXPECT_EQ(engine->block_manager().NumFreeBlocks(), s.num_kv_blocks) << "blocks leaked";
  return result;
}

class EngineHfParity : public ::testing::TestWithParam<std::string> {
 protected:
  void Check(const EngineSetup& setup, const char* what, bool expect_preemption = false,
             bool expect_cache_hits = false) {
    std::vector<Case> cases = LoadCases(FixtureModelDir(GetParam()));
    ASSERT_GE(cases.size(), 5u);
    // Repeat the longest prompts, so that prefix caching has something to find.
    cases.push_back(cases[4]);
    cases.push_back(cases[3]);
    const RunResult r = RunEngine(GetParam(), cases, setup);
    int steps = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(r.outputs[i], cases[i].greedy) << GetParam() << " " << what << " prompt " << i;
      steps += static_cast<int>(cases[i].greedy.size());
    }
    EXPECT_GT(steps, 200);
    if (expect_preemption) EXPECT_GT(r.metrics.num_preemptions, 0) << what;
    if (expect_cache_hits) EXPECT_GT(r.cached_prompt_tokens, 0) << what;
    if (setup.lookahead) {
      // Predicted steps were launched and used (a decode step can be predicted unless some
      // sequence's next token starts a block, a request ends by length, or one waits: together,
      // block 8, about half the steps), and every one launched was used or dropped.
      std::printf(
          "%s %s: decode lookahead launched %lld predicted steps, %lld used, %lld "
          "dropped, in %lld engine steps\n",
          GetParam().c_str(), what, static_cast<long long>(r.lookahead.launched),
          static_cast<long long>(r.lookahead.used), static_cast<long long>(r.lookahead.dropped),
          static_cast<long long>(r.metrics.num_steps));
      EXPECT_GT(r.lookahead.used, 10) << what;
      EXPECT_EQ(r.lookahead.launched, r.lookahead.used + r.lookahead.dropped) << what;
    } else {
      EXPECT_EQ(r.lookahead.launched, 0) << what;
    }
    if (setup.speculative.enabled()) {
      // These random-weight models seldom repeat themselves, so few drafts are kept (the tests
      // of engine_test.cc and the demo model's e2e test see many): what matters here is that
      // the tokens are HF's whatever was kept.
      EXPECT_LE(r.metrics.spec_accepted_tokens, r.metrics.spec_draft_tokens) << what;
      std::printf("%s %s: %lld of %lld drafts accepted, %lld steps for %d tokens\n",
                  GetParam().c_str(), what, static_cast<long long>(r.metrics.spec_accepted_tokens),
                  static_cast<long long>(r.metrics.spec_draft_tokens),
                  static_cast<long long>(r.metrics.num_steps), steps);
    } else {
      EXPECT_EQ(r.metrics.spec_draft_tokens, 0) << what;
    }
  }
};

TEST_P(EngineHfParity, OneAtATimeBlock16) {
  Check({.block_size = 16, .prefix_caching = false, .together = false}, "alone");
}
TEST_P(EngineHfParity, TogetherBlock8) {
  Check({.block_size = 8, .prefix_caching = false, .together = true}, "together, block 8");
}
TEST_P(EngineHfParity, TogetherBlock16PrefixCaching) {
  Check({.block_size = 16, .prefix_caching = true, .together = true}, "prefix caching",
        /*expect_preemption=*/false, /*expect_cache_hits=*/true);
}
// Speculative decoding by prompt lookup: the same greedy tokens, alone and together, with block
// sizes 8 and 16, prefix caching, and a pool small enough that drafts must go without blocks.
TEST_P(EngineHfParity, SpeculativeNgramOneAtATime) {
  Check({.block_size = 16,
         .prefix_caching = false,
         .together = false,
         .speculative = {.num_speculative_tokens = 5, .prompt_lookup_max = 3}},
        "speculative, alone");
}
TEST_P(EngineHfParity, SpeculativeNgramTogetherBlock8PrefixCaching) {
  Check({.block_size = 8,
         .prefix_caching = true,
         .together = true,
         .speculative = {.num_speculative_tokens = 7,
                         .prompt_lookup_max = 4,
                         .prompt_lookup_min = 2}},
        "speculative, together, block 8", /*expect_preemption=*/false, /*expect_cache_hits=*/true);
}
TEST_P(EngineHfParity, SpeculativeNgramSmallPool) {
  Check({.block_size = 8,
         .num_kv_blocks = 16,
         .prefix_caching = true,
         .together = true,
         .speculative = {.num_speculative_tokens = 4}},
        "speculative, small pool", /*expect_preemption=*/true);
}
TEST_P(EngineHfParity, DeviceSamplingOneAtATime) {
  Check({.block_size = 16, .prefix_caching = false, .together = false, .device_sampling = true},
        "device sampling, alone");
}
// Decode lookahead (runtime/decode_lookahead.h) on the CPU runner: the runner launches (here:
// computes) each predicted next step before the engine asks for it; HF's tokens either way, alone
// (nothing else to predict wrongly) and together (requests finishing and starting mid-run),
// with block sizes 8 and 16, prefix caching, and a pool small enough to preempt.
TEST_P(EngineHfParity, LookaheadOneAtATime) {
  Check({.block_size = 16,
         .prefix_caching = false,
         .together = false,
         .lookahead = true,
         .lookahead_max_seqs = EngineOptions().decode_lookahead_max_seqs},
        "lookahead, alone");
}
TEST_P(EngineHfParity, LookaheadTogetherBlock8PrefixCaching) {
  Check({.block_size = 8, .prefix_caching = true, .together = true, .lookahead = true},
        "lookahead, together, block 8", /*expect_preemption=*/false, /*expect_cache_hits=*/true);
}
TEST_P(EngineHfParity, LookaheadSmallPool) {
  Check({.block_size = 8,
         .num_kv_blocks = 16,
         .prefix_caching = true,
         .together = true,
         .lookahead = true},
        "lookahead, small pool", /*expect_preemption=*/true);
}
TEST_P(EngineHfParity, SmallPoolForcesPreemption) {
  // 9 sequences of up to 65 tokens need ~70 blocks of 8 at once; 16 blocks force recompute.
  Check({.block_size = 8, .num_kv_blocks = 16, .prefix_caching = true, .together = true},
        "small pool", /*expect_preemption=*/true);
}

// Prompt log-probabilities (what echo + logprobs returns) against HF's logits at every prompt
// position: each prompt token's log-softmax score and the best alternative, with every prompt
// running at once in chunks of at most 24 scored rows, twice (the repeat would find the first in
// the prefix cache, and must not use it), some without generating.
TEST_P(EngineHfParity, PromptLogprobsMatchTransformers) {
  const std::string dir = FixtureModelDir(GetParam());
  auto collectives = MakeLocalCollectives();
  std::unique_ptr<Engine> engine = MakeEngine(GetParam(), {.block_size = 8, .prefix_caching = true},
                                              collectives.get(), /*max_prompt_logprob_rows=*/24);
  std::vector<testing::HfReference> refs = testing::LoadHfReferences(dir, /*vocab=*/1001);
  ASSERT_GE(refs.size(), 5u);
  const size_t unique = refs.size();
  for (size_t i = 0; i < unique; ++i) refs.push_back(refs[i]);
  const std::vector<testing::ScoredPrompt> got = testing::ScorePrompts(*engine, refs, 2, 2);
  double worst = 0;
  int scored = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    const testing::HfReference& ref = refs[i];
    ASSERT_TRUE(got[i].scores.has_value() && got[i].scores->size() + 1 == ref.prompt.size());
    EXPECT_EQ(got[i].cached_prompt_tokens, 0) << "prompt " << i;
    for (size_t p = 1; p < ref.prompt.size(); ++p) {
      const testing::HfScore want = testing::HfPromptScore(ref, p, /*vocab=*/1001);
      const SampleResult& entry = (*got[i].scores)[p - 1];
      EXPECT_EQ(entry.token_id, ref.prompt[p]);
      worst = std::max(worst, std::abs(entry.logprob - want.logprob));
      ASSERT_NEAR(entry.logprob, want.logprob, 1e-3)
          << GetParam() << " prompt " << i << " position " << p;
      ASSERT_EQ(entry.top_logprobs.size(), 2u);
      // HF's best token, unless HF's own top two are within rounding of each other.
      if (want.margin > 1e-4) EXPECT_EQ(entry.top_logprobs[0].token_id, want.best);
      ++scored;
    }
  }
  std::printf("%s: %d prompt positions scored, worst |log-prob error| %.3g\n", GetParam().c_str(),
              scored, worst);
  EXPECT_GT(scored, 140);  // 7 prompts of 1 to 33 tokens, twice
  EXPECT_EQ(engine->block_manager().NumFreeBlocks(), 256);
}

// Decode lookahead under churn (tests/model/churn_workload.h): the outputs with lookahead are the
// outputs without it, token for token; predicted steps were both used and dropped.
// With lookahead on steps of up to 16 sequences (the runner's predictions over batches, dropped
// on every stop and arrival), then with the engine's default (a lone sequence only).
TEST(EngineLookahead, SampledOutputsUnchangedUnderChurn) {
  const std::string model = "tiny-mqa-d64";
  const std::vector<testing::HfReference> refs =
      testing::LoadHfReferences(FixtureModelDir(model), /*vocab=*/0);
  ASSERT_GE(refs.size(), 5u);
  auto run = [&](bool lookahead, int max_seqs) {
    auto collectives = MakeLocalCollectives();
    const GptBigCodeRunner* runner = nullptr;
    std::unique_ptr<Engine> engine = MakeEngine(model,
                                                {.block_size = 8,
                                                 .prefix_caching = true,
                                                 .device_sampling = true,
                                                 .lookahead = lookahead,
                                                 .lookahead_max_seqs = max_seqs},
                                                collectives.get(), 256, &runner);
    testing::ChurnResult result = testing::RunChurnWorkload(*engine, refs);
    result.lookahead = runner->lookahead_stats();
    EXPECT_EQ(engine->block_manager().NumFreeBlocks(), 256) << "blocks leaked";
    return result;
  };
  const testing::ChurnResult off = run(false, 16);
  testing::ExpectLookaheadChangesNothing(off, run(true, 16), "CPU, up to 16 sequences", 20);
  testing::ExpectLookaheadChangesNothing(off, run(true, EngineOptions().decode_lookahead_max_seqs),
                                         "CPU, the default", 1);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineHfParity,
                         ::testing::Values("tiny-mqa-d64", "tiny-mqa-d128", "tiny-mha-d64"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

}  // namespace
}  // namespace mqa
