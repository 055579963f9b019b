// Engine tests against an oracle: the FakeRunner's logits are a function of the token history,
// so every sample's tokens can be recomputed by a plain loop over Sample() that knows nothing of
// batching, paging, forks, preemption or prefix caching. The engine must agree with it whatever
// else runs beside a request.
#include "runtime/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/sampling.h"
#include "runtime/grammar.h"
#include "runtime/guided.h"
#include "runtime/stats_log.h"
#include "tests/runtime/fake_runner.h"

namespace mqa {
namespace {

using testing::FakeRunner;
using testing::FakeRunnerOptions;
using testing::ReferenceLogits;

constexpr int32_t kEos = 0;

struct Expected {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kLength;
};

// One sample of a request, computed alone without the engine. device_sampler: the runner samples
// on the device, so a request the device sampler covers (DeviceSamplable) is drawn with its
// function (SampleTokensCpu: seed from the sample, offset = tokens drawn so far), others with the
// host Sampler.
Expected Oracle(const std::vector<int32_t>& prompt, const SamplingParams& params, int sample_index,
                int vocab, int max_model_len, bool device_sampler = false, float cycle_boost = 0) {
  SampleRng rng(SampleSeed(*params.seed, sample_index));
  const bool on_device = device_sampler && DeviceSamplable(params);
  std::vector<int32_t> history = prompt;
  Expected expected;
  while (params.max_tokens > 0) {
    const std::vector<float> logits = ReferenceLogits(history, vocab, cycle_boost);
    int32_t token = 0;
    if (on_device) {
      RowSamplingParams row;
      row.temperature = params.temperature;
      row.top_k = params.top_k;
      row.top_p = params.top_p;
      row.seed = SampleSeed(*params.seed, sample_index);
      row.offset = expected.tokens.size();
      SampleTokensParams sp;
      sp.logits = logits.data();
      sp.rows = 1;
      sp.vocab = sp.ld = vocab;
      sp.params = &row;
      sp.tokens = &token;
      MQA_CHECK_OK(SampleTokensCpu(sp));
    } else {
      SamplingContext context{&params, prompt, expected.tokens, kEos, &rng};
      token = Sample(logits, context).token_id;
    }
    history.push_back(token);
    expected.tokens.push_back(token);
    const bool stop_token = std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                                      token) != params.stop_token_ids.end();
    if ((token == kEos && !params.ignore_eos) || stop_token) {
      expected.reason = FinishReason::kStop;
      return expected;
    }
    if (static_cast<int>(expected.tokens.size()) >= params.max_tokens ||
        static_cast<int>(history.size()) >= max_model_len) {
      expected.reason = FinishReason::kLength;
      return expected;
    }
  }
  return expected;  // max_tokens 0: the prompt is only scored
}

// What prompt_logprobs must return: each prompt token after the first scored under the logits of
// the tokens before it.
void ExpectPromptLogprobs(const std::vector<int32_t>& prompt, int top,
                          const std::vector<SampleResult>& got, int vocab, const std::string& id,
                          float cycle_boost = 0) {
  ASSERT_EQ(got.size(), prompt.size() - 1) << id;
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    const std::vector<int32_t> history(prompt.begin(), prompt.begin() + i + 1);
    const SampleResult want =
        ScoreToken(ReferenceLogits(history, vocab, cycle_boost), prompt[i + 1], top);
    EXPECT_EQ(got[i].token_id, prompt[i + 1]) << id << " position " << i + 1;
    EXPECT_FLOAT_EQ(got[i].logprob, want.logprob) << id << " position " << i + 1;
    ASSERT_EQ(got[i].top_logprobs.size(), want.top_logprobs.size()) << id;
    for (size_t k = 0; k < want.top_logprobs.size(); ++k) {
      EXPECT_EQ(got[i].top_logprobs[k].token_id, want.top_logprobs[k].token_id) << id;
      EXPECT_FLOAT_EQ(got[i].top_logprobs[k].logprob, want.top_logprobs[k].logprob) << id;
    }
  }
}

// What one request received, accumulated from its outputs.
struct Received {
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, std::string> text;
  std::map<int, FinishReason> reasons;
  std::map<int, std::string> stop_reasons;
  std::vector<SampleResult> logprobs;
  std::vector<SampleResult> prompt_logprobs;
  int outputs_with_prompt_logprobs = 0;
  int finished_outputs = 0;
  int outputs_after_finish = 0;
  RequestOutput last;
};

// Builds requests and collects their outputs (callbacks run on the thread that steps).
class Harness {
 public:
  Harness(FakeRunnerOptions runner_options, EngineOptions options)
      : runner_options_(runner_options), options_(options) {
    auto runner = std::make_unique<FakeRunner>(runner_options);
    runner_ = runner.get();
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(std::move(runner), options);
    MQA_CHECK_OK(engine.status());
    engine_ = std::move(*engine);
  }

  absl::Status Add(const std::string& id, std::vector<int32_t> prompt, SamplingParams params,
                   std::function<std::unique_ptr<IncrementalDetokenizer>()> detok = nullptr) {
    EngineRequest request;
    request.request_id = id;
    request.prompt_token_ids = prompt;
    request.params = params;
    request.make_detokenizer = std::move(detok);
    request.on_output = [this, id](RequestOutput output) { Collect(id, std::move(output)); };
    absl::Status status = engine_->AddRequest(std::move(request));
    if (status.ok()) {
      prompts_[id] = std::move(prompt);
      params_[id] = params;
    }
    return status;
  }

  void StepChecked() {
    MQA_CHECK_OK(engine_->Step());
    engine_->scheduler().CheckInvariants();
  }
  void RunToCompletion(int max_steps = 100000) {
    for (int i = 0; i < max_steps && engine_->HasWork(); ++i) StepChecked();
    ASSERT_FALSE(engine_->HasWork());
  }

  // Every sample of every request (not aborted) equals the oracle; aborted ones are a prefix.
  void ExpectMatchesOracle() {
    for (const auto& [id, prompt] : prompts_) {
      const Received& got = received_.at(id);
      const SamplingParams& params = params_.at(id);
      ASSERT_EQ(got.finished_outputs, 1) << id;
      EXPECT_EQ(got.outputs_after_finish, 0) << id;
      const bool aborted = std::any_of(got.reasons.begin(), got.reasons.end(), [](const auto& r) {
        return r.second == FinishReason::kAbort;
      });
      if (params.prompt_logprobs.has_value() && !aborted) {
        EXPECT_EQ(got.outputs_with_prompt_logprobs, 1) << id;
        ExpectPromptLogprobs(prompt, *params.prompt_logprobs, got.prompt_logprobs,
                             runner_options_.vocab_size, id, runner_options_.cycle_boost);
      } else if (!params.prompt_logprobs.has_value()) {
        EXPECT_EQ(got.outputs_with_prompt_logprobs, 0) << id;
      }
      for (int i = 0; i < params.n; ++i) {
        const Expected want =
            Oracle(prompt, params, i, runner_options_.vocab_size, options_.max_model_len,
                   runner_options_.device_sampling && options_.device_sampling,
                   runner_options_.cycle_boost);
        ASSERT_TRUE(got.reasons.contains(i)) << id << " sample " << i;
        const std::vector<int32_t> tokens =
            got.tokens.contains(i) ? got.tokens.at(i) : std::vector<int32_t>{};
        if (got.reasons.at(i) == FinishReason::kAbort) {
          ASSERT_LE(tokens.size(), want.tokens.size()) << id;
          EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), want.tokens.begin()))
              << id << " sample " << i;
        } else {
          EXPECT_EQ(tokens, want.tokens) << id << " sample " << i;
          EXPECT_EQ(got.reasons.at(i), want.reason) << id << " sample " << i;
        }
      }
    }
  }

  Engine& engine() { return *engine_; }
  FakeRunner& runner() { return *runner_; }
  std::map<std::string, Received>& received() { return received_; }
  const std::vector<int32_t>& prompt(const std::string& id) const { return prompts_.at(id); }

 private:
  void Collect(const std::string& id, RequestOutput output) {
    Received& r = received_[id];
    EXPECT_EQ(output.request_id, id);
    if (r.finished_outputs > 0) ++r.outputs_after_finish;
    if (output.prompt_logprobs.has_value()) {
      ++r.outputs_with_prompt_logprobs;
      r.prompt_logprobs = *output.prompt_logprobs;
    }
    for (const SampleOutput& s : output.samples) {
      auto& tokens = r.tokens[s.index];
      tokens.insert(tokens.end(), s.token_ids.begin(), s.token_ids.end());
      r.text[s.index] += s.text;
      r.logprobs.insert(r.logprobs.end(), s.logprobs.begin(), s.logprobs.end());
      if (s.finish_reason.has_value()) {
        EXPECT_FALSE(r.reasons.contains(s.index)) << id << " finished twice";
        r.reasons[s.index] = *s.finish_reason;
        r.stop_reasons[s.index] = s.stop_reason;
      }
    }
    if (output.finished) ++r.finished_outputs;
    r.last = std::move(output);
  }

  FakeRunnerOptions runner_options_;
  EngineOptions options_;
  FakeRunner* runner_ = nullptr;
  std::unique_ptr<Engine> engine_;
  std::map<std::string, std::vector<int32_t>> prompts_;
  std::map<std::string, SamplingParams> params_;
  std::map<std::string, Received> received_;
};

// Prompts that often share a prefix, so that prefix caching has something to find.
std::vector<int32_t> RandomPrompt(std::mt19937_64& rng, int vocab, int max_len,
                                  const std::vector<std::vector<int32_t>>& prefixes) {
  std::vector<int32_t> prompt;
  if (rng() % 3 != 0) prompt = prefixes[rng() % prefixes.size()];
  const int extra = 1 + static_cast<int>(rng() % std::max<size_t>(1, max_len - prompt.size()));
  for (int i = 0; i < extra && static_cast<int>(prompt.size()) < max_len; ++i) {
    prompt.push_back(1 + static_cast<int32_t>(rng() % (vocab - 1)));
  }
  return prompt;
}

SamplingParams RandomParams(std::mt19937_64& rng, int max_n, int max_tokens) {
  SamplingParams params;
  params.n = 1 + static_cast<int>(rng() % max_n);
  params.seed = rng();
  params.max_tokens = 1 + static_cast<int>(rng() % max_tokens);
  switch (rng() % 4) {
    case 0:
      params.temperature = 0;
      break;
    case 1:
      params.top_k = 1 + static_cast<int>(rng() % 8);
      params.top_p = 0.9f;
      break;
    case 2:
      params.min_p = 0.05f;
      params.repetition_penalty = 1.2f;
      params.frequency_penalty = 0.3f;
      break;
    default:
      params.temperature = 0.8f;
      params.presence_penalty = 0.5f;
      break;
  }
  if (rng() % 5 == 0) params.ignore_eos = true;
  if (rng() % 5 == 0) params.stop_token_ids = {static_cast<int32_t>(1 + rng() % 31)};
  if (rng() % 4 == 0) params.min_tokens = static_cast<int>(rng() % (params.max_tokens + 1));
  // From the seed's bits, so that the other tests' random streams stay as they were.
  const uint64_t bits = *params.seed;
  if (bits % 6 == 0) {
    params.prompt_logprobs = static_cast<int>((bits >> 8) % 4);
    if ((bits >> 16) % 3 == 0) {  // scoring only
      params.n = 1;
      params.max_tokens = 0;
      params.min_tokens = 0;
    }
  }
  return params;
}

std::vector<std::vector<int32_t>> RandomPrefixes(std::mt19937_64& rng, int vocab, int count,
                                                 int len) {
  std::vector<std::vector<int32_t>> prefixes(count);
  for (auto& p : prefixes) {
    for (int i = 0; i < len; ++i) p.push_back(1 + static_cast<int32_t>(rng() % (vocab - 1)));
  }
  return prefixes;
}

struct OracleCase {
  std::string name;
  int num_blocks;
  int block_size;
  int max_num_batched_tokens;
  bool prefix_caching;
  bool chunked_prefill;
  bool staggered;  // requests arrive over time instead of all at once
  bool device_sampling = false;  // the runner samples on the device (FakeRunnerOptions)
  // Speculative decoding with this many drafts (and repetitive greedy text: a cycle boost of 4.5,
  // half of the requests greedy); 0: off.
  int speculative = 0;
  // Priority scheduling, each request a random priority in -1..1.
  bool priority = false;
};

class EngineOracleTest : public ::testing::TestWithParam<OracleCase> {};

TEST_P(EngineOracleTest, EverySampleMatchesTheOracle) {
  const OracleCase& c = GetParam();
  FakeRunnerOptions runner_options;
  runner_options.num_blocks = c.num_blocks;
  runner_options.block_size = c.block_size;
  runner_options.device_sampling = c.device_sampling;
  if (c.speculative > 0) runner_options.cycle_boost = 4.5f;
  EngineOptions options;
  options.speculative.num_speculative_tokens = c.speculative;
  options.host_threads = 4;  // rows sampled and scored in parallel (results must not change)
  options.priority_scheduling = c.priority;
  options.max_num_seqs = 16;
  options.max_num_batched_tokens = c.max_num_batched_tokens;
  options.max_model_len = 64;
  options.eos_token_id = kEos;
  options.enable_prefix_caching = c.prefix_caching;
  options.enable_chunked_prefill = c.chunked_prefill;
  // Small enough that prompt log-probabilities split prompts into chunks of their own.
  options.max_prompt_logprob_rows = c.chunked_prefill ? 10 : 48;
  Harness h(runner_options, options);
  int64_t max_step_tokens = 0;
  h.runner().on_step = [&](const StepInput& in) {
    max_step_tokens = std::max<int64_t>(max_step_tokens, in.num_tokens());
    EXPECT_LE(in.num_seqs(), options.max_num_seqs);
    EXPECT_LE(in.logits_rows.size(), options.max_num_seqs + options.max_prompt_logprob_rows);
  };

  std::mt19937_64 rng(std::hash<std::string>()(c.name));
  const auto prefixes = RandomPrefixes(rng, 32, 3, 20);
  const int num_requests = 40;
  int added = 0;
  auto add_one = [&] {
    const std::string id = absl::StrCat("req", added++);
    SamplingParams params = RandomParams(rng, 3, c.speculative > 0 ? 24 : 16);
    if (c.priority) params.priority = static_cast<int>(rng() % 3) - 1;
    if (c.speculative > 0 && rng() % 2 == 0 && params.max_tokens > 0) {
      params.temperature = 0;  // greedy, one sample: most of its drafts are kept
      params.n = 1;
      if (rng() % 3 != 0) {
        params.repetition_penalty = 1;
        params.presence_penalty = params.frequency_penalty = params.min_p = 0;
        params.min_tokens = 0;
      }
    }
    ASSERT_TRUE(h.Add(id, RandomPrompt(rng, 32, 40, prefixes), params).ok());
  };
  if (!c.staggered) {
    while (added < num_requests) add_one();
  }
  for (int step = 0; step < 20000 && (added < num_requests || h.engine().HasWork()); ++step) {
    if (c.staggered && added < num_requests && rng() % 2 == 0) add_one();
    h.StepChecked();
  }
  h.ExpectMatchesOracle();
  EXPECT_LE(max_step_tokens, c.max_num_batched_tokens);
  EXPECT_EQ(h.engine().block_manager().NumFreeBlocks(), c.num_blocks);
  const EngineMetrics m = h.engine().metrics();
  EXPECT_EQ(m.num_running + m.num_waiting, 0);
  EXPECT_EQ(m.kv_cache_usage, 0.0);
  if (c.num_blocks <= 40) EXPECT_GT(m.num_preemptions, 0) << "the pool should force preemption";
  if (c.num_blocks > 400) EXPECT_EQ(m.num_preemptions, 0);
  if (c.prefix_caching) EXPECT_GT(m.prefix_cache_hit_blocks, 0);
  if (c.speculative > 0) {
    // Drafts were made and many kept (the boosted cycle; random prompts give 1-gram matches
    // that are not), never more kept than made.
    EXPECT_GT(m.spec_draft_tokens, 50) << c.name;
    EXPECT_GT(m.spec_accepted_tokens, 15) << c.name;
    EXPECT_LE(m.spec_accepted_tokens, m.spec_draft_tokens) << c.name;
  } else {
    EXPECT_EQ(m.spec_draft_tokens, 0);
  }
  if (c.device_sampling) {
    // The random parameters mix device-samplable requests with host-sampled ones (penalties,
    // min-p, min_tokens): both kinds of step happened.
    EXPECT_GT(h.runner().sampled_steps_without_logits + h.runner().sampled_steps_with_logits, 0);
    EXPECT_GT(h.runner().sampled_steps_with_logits, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, EngineOracleTest,
    ::testing::Values(
        OracleCase{"LargePool", 1024, 8, 512, false, true, false},
        OracleCase{"TinyPoolPreemptsChunks", 32, 8, 16, false, true, false},
        OracleCase{"TinyPoolPrefixCache", 32, 8, 24, true, true, true},
        OracleCase{"LargePoolPrefixCache", 1024, 16, 512, true, true, true},
        OracleCase{"NoChunkedPrefill", 40, 8, 64, true, false, false},
        OracleCase{"Block32Preempts", 12, 32, 32, true, true, true},
        OracleCase{"DeviceSamplingLargePool", 1024, 8, 512, false, true, false, true},
        OracleCase{"DeviceSamplingTinyPool", 32, 8, 24, true, true, true, true},
        OracleCase{"SpeculativeLargePool", 1024, 8, 512, true, true, false, false, 5},
        OracleCase{"SpeculativeTinyPoolPreempts", 32, 8, 24, true, true, true, false, 4},
        OracleCase{"SpeculativeDeviceSampling", 1024, 16, 64, true, true, true, true, 7},
        OracleCase{"SpeculativeBlock32", 14, 32, 40, false, true, true, true, 3},
        OracleCase{"PriorityTinyPool", 32, 8, 24, true, true, true, false, 0, true},
        OracleCase{"PrioritySpeculative", 40, 8, 32, true, true, false, true, 4, true}),
    [](const ::testing::TestParamInfo<OracleCase>& info) { return info.param.name; });

// The device-sampling tests' runner (it samples on the device) and engine options.
struct DeviceSampling {
  FakeRunnerOptions runner;
  EngineOptions engine;
};
DeviceSampling DeviceSamplingSetup() {
  DeviceSampling d;
  d.runner.device_sampling = true;
  d.engine.max_model_len = 64;
  d.engine.eos_token_id = kEos;
  return d;
}

// A speculating engine (k drafts) over the fake runner's repetitive text (cycle boost 6, so that
// there are drafts to check), sampling on the device or on the host.
DeviceSampling SpeculativeSetup(bool device, int k) {
  DeviceSampling d = DeviceSamplingSetup();
  d.runner.device_sampling = device;
  d.runner.cycle_boost = 6.0f;
  d.engine.speculative.num_speculative_tokens = k;
  return d;
}

// logit_bias is not the device sampler's: with device sampling on, such a request is sampled on the
// host from its logits (the bias added first), beside device-sampled ones, and a +100 bias forces
// its token.
TEST(Engine, LogitBiasRequestsAreSampledOnTheHost) {
  auto [runner_options, options] = DeviceSamplingSetup();
  Harness h(runner_options, options);
  SamplingParams forced;
  forced.seed = 1;
  forced.temperature = 0;
  forced.max_tokens = 6;
  forced.ignore_eos = true;
  forced.logit_bias = {{5, 100.0f}};
  const std::vector<int32_t> prompt = {1, 2, 3};
  EXPECT_FALSE(DeviceSamplable(forced));
  SamplingParams allowed;
  allowed.allowed_token_ids = {4};
  EXPECT_FALSE(DeviceSamplable(allowed));
  EXPECT_EQ(Oracle(prompt, forced, 0, runner_options.vocab_size, 64).tokens,
            std::vector<int32_t>(6, 5));
  ASSERT_TRUE(h.Add("forced", prompt, forced).ok());
  SamplingParams drawn;
  drawn.seed = 2;
  drawn.max_tokens = 10;
  drawn.logit_bias = {{3, -100.0f}, {9, 4.0f}};
  const Expected with_bias = Oracle(prompt, drawn, 0, runner_options.vocab_size, 64);
  SamplingParams unbiased = drawn;
  unbiased.logit_bias.clear();
  EXPECT_NE(with_bias.tokens, Oracle(prompt, unbiased, 0, runner_options.vocab_size, 64).tokens);
  EXPECT_EQ(std::count(with_bias.tokens.begin(), with_bias.tokens.end(), 3), 0);
  ASSERT_TRUE(h.Add("drawn", prompt, drawn).ok());
  SamplingParams plain;  // device-samplable, in the same batch
  plain.seed = 3;
  plain.max_tokens = 10;
  ASSERT_TRUE(h.Add("plain", {4, 5}, plain).ok());
  h.RunToCompletion();
  h.ExpectMatchesOracle();
  EXPECT_GT(h.runner().sampled_steps_with_logits, 0);
}

// Log-probabilities keep a request on the device sampler: its tokens are the device's draws (the
// oracle's device path), and their scores come from the step's logits, which are copied back only
// for steps that hold such a request.
TEST(Engine, LogprobsRequestsAreDeviceSampledAndScoredOnTheHost) {
  auto [runner_options, options] = DeviceSamplingSetup();
  Harness h(runner_options, options);
  SamplingParams scored;
  scored.seed = 4;
  scored.max_tokens = 8;
  scored.ignore_eos = true;
  scored.temperature = 0.9f;
  scored.logprobs = 2;
  ASSERT_TRUE(DeviceSamplable(scored));
  const std::vector<int32_t> prompt = {6, 7, 8};
  ASSERT_TRUE(h.Add("scored", prompt, scored).ok());
  h.RunToCompletion();
  h.ExpectMatchesOracle();  // device draws
  const Received& r = h.received().at("scored");
  const std::vector<int32_t>& tokens = r.tokens.at(0);
  ASSERT_EQ(r.logprobs.size(), tokens.size());
  std::vector<int32_t> history = prompt;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const SampleResult want =
        ScoreToken(ReferenceLogits(history, runner_options.vocab_size), tokens[i], 2);
    EXPECT_EQ(r.logprobs[i].token_id, tokens[i]);
    EXPECT_FLOAT_EQ(r.logprobs[i].logprob, want.logprob);
    ASSERT_EQ(r.logprobs[i].top_logprobs.size(), 2u);
    EXPECT_EQ(r.logprobs[i].top_logprobs[0].token_id, want.top_logprobs[0].token_id);
    history.push_back(tokens[i]);
  }
  EXPECT_EQ(h.runner().sampled_steps_with_logits, static_cast<int>(tokens.size()));
  EXPECT_EQ(h.runner().sampled_steps_without_logits, 0);
  // The same request without logprobs draws the same tokens, and ships no logits.
  SamplingParams plain = scored;
  plain.logprobs.reset();
  ASSERT_TRUE(h.Add("plain", prompt, plain).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.received().at("plain").tokens.at(0), tokens);
  EXPECT_EQ(h.runner().sampled_steps_with_logits, static_cast<int>(tokens.size()));
  EXPECT_GT(h.runner().sampled_steps_without_logits, 0);
}

// n samples are drawn on the device too: the prompt's last row appears n times among the step's
// logits rows, one draw per sample (its own seed), and the samples fork from it; no logits cross.
TEST(Engine, SeveralSamplesAreDrawnOnTheDeviceFromOnePromptRow) {
  auto [runner_options, options] = DeviceSamplingSetup();
  Harness h(runner_options, options);
  size_t max_duplicates = 0;
  h.runner().on_step = [&](const StepInput& in) {
    std::map<int32_t, size_t> count;
    for (int32_t row : in.logits_rows) max_duplicates = std::max(max_duplicates, ++count[row]);
  };
  SamplingParams params;
  params.n = 4;
  params.seed = 8;
  params.max_tokens = 10;
  params.ignore_eos = true;
  params.top_p = 0.9f;
  ASSERT_TRUE(DeviceSamplable(params));
  ASSERT_TRUE(h.Add("four", {3, 1, 4, 1, 5}, params).ok());
  h.RunToCompletion();
  h.ExpectMatchesOracle();  // each sample: the device's draws with its own seed
  EXPECT_EQ(max_duplicates, 4u);
  EXPECT_EQ(h.runner().sampled_steps_with_logits, 0);
  const Received& r = h.received().at("four");
  std::set<std::vector<int32_t>> distinct;
  for (int i = 0; i < 4; ++i) distinct.insert(r.tokens.at(i));
  EXPECT_GT(distinct.size(), 1u);
}

// A batch the device sampler covers entirely: only token ids come back (no logits copied), and
// every request gets the device sampler's draws, which differ from the host sampler's.
TEST(Engine, DeviceSamplingShipsNoLogitsAndUsesTheDeviceDraws) {
  auto [runner_options, options] = DeviceSamplingSetup();
  Harness h(runner_options, options);
  std::mt19937_64 rng(5);
  int differs_from_host = 0;
  for (int i = 0; i < 12; ++i) {
    SamplingParams params;
    params.seed = rng();
    params.max_tokens = 12;
    params.ignore_eos = true;
    params.temperature = i % 3 == 0 ? 0.0f : 1.0f;
    if (i % 3 == 1) params.top_k = 5;
    if (i % 3 == 2) params.top_p = 0.8f;
    std::vector<int32_t> prompt = {1 + i, 2, 3 + i % 5};
    const Expected host = Oracle(prompt, params, 0, runner_options.vocab_size, 64);
    const Expected device = Oracle(prompt, params, 0, runner_options.vocab_size, 64, true);
    if (host.tokens != device.tokens) ++differs_from_host;
    ASSERT_TRUE(h.Add(absl::StrCat(i), prompt, params).ok());
  }
  EXPECT_GT(differs_from_host, 4) << "the test cannot tell the samplers apart";
  h.RunToCompletion();
  h.ExpectMatchesOracle();
  EXPECT_GT(h.runner().sampled_steps_without_logits, 0);
  EXPECT_EQ(h.runner().sampled_steps_with_logits, 0);

  // Off: the same requests through the host sampler.
  options.device_sampling = false;
  Harness off(runner_options, options);
  ASSERT_TRUE(off.Add("a", {1, 2, 3}, [] {
                   SamplingParams p;
                   p.seed = 9;
                   p.max_tokens = 8;
                   return p;
                 }()).ok());
  off.RunToCompletion();
  off.ExpectMatchesOracle();
  EXPECT_EQ(off.runner().sampled_steps_without_logits + off.runner().sampled_steps_with_logits, 0);
}

// The literal statement: a request's output is the same alone as in company.
TEST(Engine, OutputAloneEqualsOutputTogether) {
  FakeRunnerOptions runner_options;
  runner_options.num_blocks = 12;
  EngineOptions options;
  options.max_model_len = 64;
  options.max_num_batched_tokens = 12;
  options.max_num_seqs = 8;
  options.eos_token_id = kEos;
  std::mt19937_64 rng(77);
  const auto prefixes = RandomPrefixes(rng, 32, 2, 12);
  std::vector<std::pair<std::vector<int32_t>, SamplingParams>> requests;
  for (int i = 0; i < 12; ++i) {
    requests.emplace_back(RandomPrompt(rng, 32, 30, prefixes), RandomParams(rng, 2, 16));
  }
  Harness together(runner_options, options);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(together.Add(absl::StrCat(i), requests[i].first, requests[i].second).ok());
  }
  together.RunToCompletion();
  EXPECT_GT(together.engine().metrics().num_preemptions, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    Harness alone(runner_options, options);
    ASSERT_TRUE(alone.Add("only", requests[i].first, requests[i].second).ok());
    alone.RunToCompletion();
    EXPECT_EQ(alone.received().at("only").tokens, together.received().at(absl::StrCat(i)).tokens)
        << "request " << i;
    EXPECT_EQ(alone.received().at("only").reasons, together.received().at(absl::StrCat(i)).reasons);
  }
}

// Thousands of arrivals, aborts, forks and preemptions in a tiny cache with prefix caching.
TEST(Engine, RandomisedSoakLeaksNothingAndFinishesEverything) {
  FakeRunnerOptions runner_options;
  runner_options.num_blocks = 40;
  runner_options.block_size = 4;
  EngineOptions options;
  options.max_num_seqs = 8;
  options.max_num_batched_tokens = 24;
  options.max_model_len = 48;
  options.eos_token_id = kEos;
  options.max_queued_requests = 64;
  options.watermark = 0.05;
  Harness h(runner_options, options);
  h.runner().on_step = [&](const StepInput& in) {
    ASSERT_LE(in.num_tokens(), options.max_num_batched_tokens);
    ASSERT_LE(in.num_seqs(), options.max_num_seqs);
  };
  std::mt19937_64 rng(2024);
  const auto prefixes = RandomPrefixes(rng, 32, 4, 10);
  std::vector<std::string> live;
  int accepted = 0, refused_invalid = 0, refused_full = 0, aborts = 0;
  const int arrivals = 3000;
  for (int arrived = 0; arrived < arrivals || h.engine().HasWork();) {
    if (arrived < arrivals && rng() % 3 == 0) {
      const int i = arrived++;
      const std::string id = absl::StrCat("r", i);
      std::vector<int32_t> prompt = RandomPrompt(rng, 32, 30, prefixes);
      SamplingParams params = RandomParams(rng, 3, 24);
      if (rng() % 20 == 0) params.max_tokens = 40;  // prompt + max_tokens may exceed 48
      absl::Status status = h.Add(id, prompt, params);
      if (status.ok()) {
        ++accepted;
        live.push_back(id);
      } else if (status.code() == absl::StatusCode::kInvalidArgument) {
        ++refused_invalid;
        EXPECT_FALSE(status.message().empty());
      } else {
        ASSERT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
        ++refused_full;
      }
    }
    if (!live.empty() && rng() % 8 == 0) {
      const size_t k = rng() % live.size();
      h.engine().Abort(live[k]);
      live.erase(live.begin() + k);
      ++aborts;
    }
    h.StepChecked();
  }
  h.engine().Abort("r0");  // finished long ago: ignored
  h.StepChecked();
  EXPECT_EQ(h.received().size(), static_cast<size_t>(accepted));
  h.ExpectMatchesOracle();
  const EngineMetrics m = h.engine().metrics();
  EXPECT_EQ(h.engine().block_manager().NumFreeBlocks(), runner_options.num_blocks);
  EXPECT_EQ(m.kv_cache_usage, 0.0);
  EXPECT_GT(m.num_preemptions, 10);
  EXPECT_GT(m.prefix_cache_hit_blocks, 10);
  EXPECT_GT(refused_invalid, 0);
  EXPECT_GT(refused_full, 0);
  EXPECT_GT(m.finished_abort, 0);
  EXPECT_GT(m.finished_stop, 0);
  EXPECT_GT(m.finished_length, 0);
  EXPECT_GT(accepted, 1000);
  std::printf(
      "soak: %d accepted, %d invalid, %d queue full, %d aborted, %lld steps, "
      "%lld preemptions, %lld/%lld prefix blocks hit, %lld tokens generated\n",
      accepted, refused_invalid, refused_full, aborts, static_cast<long long>(m.num_steps),
      static_cast<long long>(m.num_preemptions), static_cast<long long>(m.prefix_cache_hit_blocks),
      static_cast<long long>(m.prefix_cache_queried_blocks),
      static_cast<long long>(m.generation_tokens));
}

TEST(Engine, ChunkedPrefillDoesNotStallRunningDecodes) {
  FakeRunnerOptions runner_options;
  runner_options.num_blocks = 64;
  EngineOptions options;
  options.max_num_batched_tokens = 8;
  options.max_num_seqs = 4;
  options.max_model_len = 128;
  Harness h(runner_options, options);
  SamplingParams decode_params;
  decode_params.seed = 1;
  decode_params.max_tokens = 40;
  ASSERT_TRUE(h.Add("decoding", {1, 2, 3}, decode_params).ok());
  h.StepChecked();  // the short prompt
  std::vector<StepInput> steps;
  h.runner().on_step = [&](const StepInput& in) { steps.push_back(in); };
  SamplingParams long_params;
  long_params.seed = 2;
  long_params.max_tokens = 2;
  std::vector<int32_t> long_prompt(60);
  for (int i = 0; i < 60; ++i) long_prompt[i] = 1 + i % 30;
  ASSERT_TRUE(h.Add("long", long_prompt, long_params).ok());
  while (!h.received()["long"].reasons.contains(0)) h.StepChecked();
  // 60 prompt tokens at most 7 a step beside the decode: 9 steps, then one to decode the second
  // token; the decode runs first in every one of them.
  ASSERT_EQ(steps.size(), 10u);
  int prompt_tokens = 0;
  for (const StepInput& in : steps) {
    ASSERT_EQ(in.num_seqs(), 2);
    EXPECT_EQ(in.query_start[1] - in.query_start[0], 1);
    prompt_tokens += in.query_start[2] - in.query_start[1];
    EXPECT_LE(in.num_tokens(), 8);
  }
  EXPECT_EQ(prompt_tokens, 61);
  EXPECT_EQ(h.received().at("decoding").tokens.at(0).size(), 11u);
  h.RunToCompletion();
  h.ExpectMatchesOracle();
}

TEST(Engine, AbortReleasesBlocksOnTheNextStep) {
  FakeRunnerOptions runner_options;
  EngineOptions options;
  options.enable_prefix_caching = false;
  options.max_model_len = 200;
  Harness h(runner_options, options);
  SamplingParams params;
  params.seed = 3;
  params.n = 2;
  params.max_tokens = 100;
  ASSERT_TRUE(h.Add("a", std::vector<int32_t>(20, 5), params).ok());
  for (int i = 0; i < 5; ++i) h.StepChecked();
  EXPECT_GT(h.engine().block_manager().Usage(), 0.0);
  h.engine().Abort("a");
  h.StepChecked();
  EXPECT_EQ(h.engine().block_manager().NumFreeBlocks(), runner_options.num_blocks);
  const Received& r = h.received().at("a");
  EXPECT_EQ(r.finished_outputs, 1);
  EXPECT_EQ(r.reasons.at(0), FinishReason::kAbort);
  EXPECT_EQ(r.reasons.at(1), FinishReason::kAbort);
  EXPECT_TRUE(r.last.error.ok());
  EXPECT_EQ(r.last.num_generated_tokens, 10);  // 5 steps, 2 samples
  EXPECT_FALSE(h.engine().HasWork());
  EXPECT_EQ(h.engine().metrics().finished_abort, 2);
  // The id is free again.
  EXPECT_TRUE(h.Add("a", {1, 2}, params).ok());
}

TEST(Engine, RefusesRequestsWithAReason) {
  FakeRunnerOptions runner_options;
  runner_options.num_blocks = 8;
  EngineOptions options;
  options.max_model_len = 100;
  options.max_num_seqs = 4;
  options.max_queued_requests = 2;
  Harness h(runner_options, options);
  SamplingParams params;
  params.max_tokens = 30;

  absl::Status s = h.Add("long", std::vector<int32_t>(80, 1), params);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("80"), std::string::npos) << s;
  EXPECT_NE(s.message().find("100"), std::string::npos) << s;
  params.n = 3;
  s = h.Add("too-big-for-cache", std::vector<int32_t>(20, 1), params);  // 2 + 3 * 5 blocks > 8
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("blocks"), std::string::npos) << s;
  params.n = 5;
  EXPECT_EQ(h.Add("n", {1}, params).code(), absl::StatusCode::kInvalidArgument);
  params.n = 1;
  EXPECT_EQ(h.Add("vocab", {1, 99}, params).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.Add("empty", {}, params).code(), absl::StatusCode::kInvalidArgument);
  params.stop = {"x"};
  EXPECT_EQ(h.Add("stop", {1}, params).code(), absl::StatusCode::kInvalidArgument);
  params.stop.clear();
  params.top_p = 2;
  EXPECT_EQ(h.Add("top_p", {1}, params).code(), absl::StatusCode::kInvalidArgument);
  params.top_p = 1;

  EXPECT_TRUE(h.Add("q1", {1}, params).ok());
  EXPECT_EQ(h.Add("q1", {1}, params).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(h.Add("q2", {1}, params).ok());
  EXPECT_EQ(h.Add("q3", {1}, params).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(h.engine().metrics().num_waiting, 2);
  h.RunToCompletion();
  EXPECT_TRUE(h.Add("q3", {1}, params).ok());
}

// Maps token t to one letter, so texts and stop strings are easy to predict.
class LetterDetokenizer : public IncrementalDetokenizer {
 public:
  std::string Next(int32_t token) override {
    return std::string(1, static_cast<char>('a' + token % 26));
  }
};

std::string Letters(const std::vector<int32_t>& tokens) {
  std::string s;
  for (int32_t t : tokens) s += static_cast<char>('a' + t % 26);
  return s;
}

TEST(Engine, StopStringsStopTokensAndMinTokens) {
  FakeRunnerOptions runner_options;
  EngineOptions options;
  options.max_model_len = 256;
  options.eos_token_id = kEos;
  Harness h(runner_options, options);
  auto letters = [] { return std::make_unique<LetterDetokenizer>(); };
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  SamplingParams params;
  params.seed = 11;
  params.max_tokens = 60;
  params.ignore_eos = true;
  const Expected free_run = Oracle(prompt, params, 0, 32, 256);
  ASSERT_EQ(free_run.tokens.size(), 60u);
  const std::string text = Letters(free_run.tokens);

  // A stop string taken from the middle of the free-running text.
  SamplingParams with_stop = params;
  with_stop.stop = {text.substr(20, 3)};
  const size_t at = text.find(with_stop.stop[0]);
  ASSERT_TRUE(h.Add("stop-string", prompt, with_stop, letters).ok());
  SamplingParams included = with_stop;
  included.include_stop_str_in_output = true;
  ASSERT_TRUE(h.Add("include", prompt, included, letters).ok());
  // A stop token: the first occurrence of the token sampled at position 10 (min_tokens 0) or
  // the first one at or after index 10 when min_tokens masks the earlier ones.
  SamplingParams with_token = params;
  with_token.stop_token_ids = {free_run.tokens[10]};
  ASSERT_TRUE(h.Add("stop-token", prompt, with_token, letters).ok());
  SamplingParams plain = params;
  ASSERT_TRUE(h.Add("plain", prompt, plain, letters).ok());
  SamplingParams eos_params = params;
  eos_params.ignore_eos = false;
  eos_params.min_tokens = 5;
  ASSERT_TRUE(h.Add("eos", prompt, eos_params, letters).ok());
  h.RunToCompletion();

  const Received& s = h.received().at("stop-string");
  EXPECT_EQ(s.reasons.at(0), FinishReason::kStop);
  EXPECT_EQ(s.stop_reasons.at(0), with_stop.stop[0]);
  EXPECT_EQ(s.text.at(0), text.substr(0, at));
  EXPECT_EQ(s.tokens.at(0).size(), at + 3);  // the token completing the stop string is kept
  EXPECT_EQ(h.received().at("include").text.at(0), text.substr(0, at + 3));

  const Received& t = h.received().at("stop-token");
  const size_t first =
      std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[10]) -
      free_run.tokens.begin();
  EXPECT_EQ(t.tokens.at(0).size(), first + 1);
  EXPECT_EQ(t.reasons.at(0), FinishReason::kStop);
  EXPECT_EQ(t.stop_reasons.at(0), std::to_string(free_run.tokens[10]));
  EXPECT_EQ(t.text.at(0), text.substr(0, first));  // the stop token adds no text

  const Received& p = h.received().at("plain");
  EXPECT_EQ(p.text.at(0), text);
  EXPECT_EQ(p.reasons.at(0), FinishReason::kLength);
  const Received& e = h.received().at("eos");
  EXPECT_EQ(e.tokens.at(0), Oracle(prompt, eos_params, 0, 32, 256).tokens);
  EXPECT_GE(e.tokens.at(0).size(), 5u);
}

TEST(Engine, LogprobsOfEachTokenAreTheModelsLogSoftmax) {
  FakeRunnerOptions runner_options;
  EngineOptions options;
  options.max_model_len = 64;
  Harness h(runner_options, options);
  SamplingParams params;
  params.seed = 5;
  params.max_tokens = 6;
  params.logprobs = 3;
  params.temperature = 0.5f;
  const std::vector<int32_t> prompt = {7, 8, 9};
  ASSERT_TRUE(h.Add("lp", prompt, params).ok());
  h.RunToCompletion();
  const Received& r = h.received().at("lp");
  const std::vector<int32_t>& tokens = r.tokens.at(0);
  ASSERT_EQ(r.logprobs.size(), tokens.size());
  std::vector<int32_t> history = prompt;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<float> logits = ReferenceLogits(history, 32);
    double z = 0;
    for (float l : logits) z += std::exp(static_cast<double>(l));
    EXPECT_NEAR(r.logprobs[i].logprob, logits[tokens[i]] - std::log(z), 1e-5);
    ASSERT_EQ(r.logprobs[i].top_logprobs.size(), 3u);
    const int32_t best =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(r.logprobs[i].top_logprobs[0].token_id, best);
    history.push_back(tokens[i]);
  }
  EXPECT_EQ(r.last.num_prompt_tokens, 3);
  EXPECT_EQ(r.last.num_generated_tokens, static_cast<int>(tokens.size()));
}

// Speculation for sampled requests (exact rejection sampling against the deterministic drafts):
// seeded requests of every kind the host or the device sampler draws — temperature, top-k / top-p,
// penalties with min-p and min_tokens, logprobs — give the tokens they give without speculation
// (the oracle), drafts are kept for them, and each returned log-probability is the model's at that
// position. With the host sampler and with the device sampler.
TEST(Engine, SampledRequestsSpeculateAndDrawWhatTheyWouldWithout) {
  for (const bool device : {false, true}) {
    SCOPED_TRACE(device ? "device sampler" : "host sampler");
    auto [runner_options, options] = SpeculativeSetup(device, 4);
    Harness h(runner_options, options);
    std::mt19937_64 rng(device ? 11 : 7);
    const auto prefixes = RandomPrefixes(rng, 32, 3, 12);
    for (int i = 0; i < 16; ++i) {
      SamplingParams params;
      params.seed = rng();
      params.max_tokens = 20 + static_cast<int>(rng() % 20);
      params.temperature = 0.7f;
      params.ignore_eos = i % 2 == 0;
      switch (i % 4) {
        case 0:
          break;
        case 1:
          params.top_k = 4;
          params.top_p = 0.9f;
          break;
        case 2:  // host-sampled also on a device-sampling runner
          params.min_p = 0.05f;
          params.repetition_penalty = 1.1f;
          params.min_tokens = 3;
          break;
        default:
          params.logprobs = 2;
          break;
      }
      ASSERT_TRUE(h.Add(absl::StrCat("s", i), RandomPrompt(rng, 32, 30, prefixes), params).ok());
    }
    h.RunToCompletion();
    h.ExpectMatchesOracle();
    const EngineMetrics m = h.engine().metrics();
    EXPECT_GT(m.spec_accepted_tokens, 20) << "sampled requests should keep drafts";
    EXPECT_LE(m.spec_accepted_tokens, m.spec_draft_tokens);
    for (int i = 3; i < 16; i += 4) {
      const Received& r = h.received().at(absl::StrCat("s", i));
      const std::vector<int32_t>& tokens = r.tokens.at(0);
      ASSERT_EQ(r.logprobs.size(), tokens.size()) << i;
      std::vector<int32_t> history(h.prompt(absl::StrCat("s", i)));
      for (size_t j = 0; j < tokens.size(); ++j) {
        const SampleResult want =
            ScoreToken(ReferenceLogits(history, 32, runner_options.cycle_boost), tokens[j], 2);
        EXPECT_EQ(r.logprobs[j].token_id, tokens[j]);
        EXPECT_NEAR(r.logprobs[j].logprob, want.logprob, 1e-5) << "request " << i << " token " << j;
        ASSERT_EQ(r.logprobs[j].top_logprobs.size(), 2u);
        EXPECT_EQ(r.logprobs[j].top_logprobs[0].token_id, want.top_logprobs[0].token_id);
        history.push_back(tokens[j]);
      }
    }
  }
}

// Requests of several samples (forked after the prompt, sharing its blocks copy-on-write) and
// with prompt log-probabilities speculate too: with a pool small enough to preempt and a block
// size that leaves shared, partly filled last blocks, every sample equals the oracle, the prompt
// scores are right, drafts are kept, and no block leaks.
TEST(Engine, SeveralSamplesAndPromptLogprobsSpeculateToo) {
  for (const bool device : {false, true}) {
    SCOPED_TRACE(device ? "device sampler" : "host sampler");
    auto [runner_options, options] = SpeculativeSetup(device, 3);
    runner_options.num_blocks = 40;
    runner_options.block_size = 8;
    options.max_num_seqs = 16;
    options.max_num_batched_tokens = 48;
    Harness h(runner_options, options);
    std::mt19937_64 rng(device ? 5 : 9);
    const auto prefixes = RandomPrefixes(rng, 32, 2, 13);
    for (int i = 0; i < 10; ++i) {
      SamplingParams params;
      params.seed = rng();
      params.n = 2 + i % 3;
      params.max_tokens = 16 + static_cast<int>(rng() % 16);
      params.temperature = i % 4 == 0 ? 0.0f : 0.6f;
      params.ignore_eos = true;
      if (i % 3 == 0) params.prompt_logprobs = 1;
      if (i % 5 == 1) params.repetition_penalty = 1.1f;
      ASSERT_TRUE(h.Add(absl::StrCat("m", i), RandomPrompt(rng, 32, 21, prefixes), params).ok());
    }
    h.RunToCompletion();
    h.ExpectMatchesOracle();
    const EngineMetrics m = h.engine().metrics();
    EXPECT_GT(m.spec_accepted_tokens, 20) << "forked samples should keep drafts";
    EXPECT_GT(m.num_preemptions, 0) << "the pool should force preemption";
    EXPECT_EQ(h.engine().block_manager().NumFreeBlocks(), runner_options.num_blocks);
  }
}

// Guided decoding (SamplingParams::guide): every sample's text matches the pattern in full and
// the sample stops by itself ("stop") once nothing may extend it, with the host sampler or beside
// the device sampler, greedy or sampled, with speculation on, n samples, and min_tokens (which
// cannot push a guided sample out of its pattern).
TEST(Engine, GuidedSamplesMatchTheirPatternAndStopThemselves) {
  const std::string letters = "_abcdefghijklmnopqrstuvwxyz01234";  // token t's text; 0 is EOS
  auto vocab = std::make_shared<GuideVocab>();
  for (char c : letters) vocab->bytes.push_back(std::string(1, c));
  vocab->bytes[kEos].clear();
  vocab->eos = kEos;
  const std::string pattern = "(?:b|cd)+e|[x-z]{2,4}|" + RegexGuide::ChoicePattern({"hello"});
  // The same language as a grammar (runtime/grammar.h), whose states are found as texts reach
  // them.
  const std::string grammar = "root ::= (\"b\" | \"cd\")+ \"e\" | [x-z]{2,4} | \"hello\"";
  auto regex_guide = RegexGuide::Compile(pattern, vocab);
  ASSERT_TRUE(regex_guide.ok()) << regex_guide.status();
  auto grammar_guide = GrammarGuide::Compile(grammar, vocab);
  ASSERT_TRUE(grammar_guide.ok()) << grammar_guide.status();
  const std::regex want(pattern);
  // host sampler; device sampler; device and speculation; host sampler with the grammar
  for (const int mode : {0, 1, 2, 3}) {
    SCOPED_TRACE(mode);
    const bool by_grammar = mode == 3;
    const std::shared_ptr<const Guide> guide =
        by_grammar ? std::shared_ptr<const Guide>(*grammar_guide) : *regex_guide;
    FakeRunnerOptions runner_options;
    runner_options.device_sampling = mode > 0;
    runner_options.cycle_boost = mode == 2 ? 6.0f : 0.0f;
    EngineOptions options;
    options.max_model_len = 64;
    options.eos_token_id = kEos;
    if (mode == 2) options.speculative.num_speculative_tokens = 3;
    Harness h(runner_options, options);
    std::mt19937_64 rng(mode);
    for (int i = 0; i < 12; ++i) {
      SamplingParams params;
      params.seed = rng();
      params.n = 1 + i % 3;
      params.temperature = i % 4 == 0 ? 0.0f : 1.0f;
      params.max_tokens = 40;
      params.min_tokens = i % 5 == 0 ? 6 : 0;
      params.ignore_eos = i % 3 == 1;
      (by_grammar ? params.guided_grammar : params.guided_regex) = by_grammar ? grammar : pattern;
      params.guide = guide;
      ASSERT_TRUE(h.Add(absl::StrCat("g", i), {1 + static_cast<int32_t>(rng() % 30)}, params).ok());
    }
    h.RunToCompletion();
    for (int i = 0; i < 12; ++i) {
      const Received& r = h.received().at(absl::StrCat("g", i));
      for (const auto& [index, tokens] : r.tokens) {
        std::string text;
        for (int32_t t : tokens) text += vocab->bytes[t];
        EXPECT_TRUE(std::regex_match(text, want)) << "request " << i << " sample " << index
                                                  << ": \"" << text << "\"";
        EXPECT_EQ(r.reasons.at(index), FinishReason::kStop) << i << " \"" << text << "\"";
      }
      EXPECT_EQ(static_cast<int>(r.reasons.size()), 1 + i % 3);
    }
  }
  SamplingParams unguided;
  unguided.guided_regex = "a+";  // a pattern without its compiled guide is refused
  EXPECT_TRUE(absl::IsInvalidArgument(unguided.Validate()));
  SamplingParams both;
  both.guided_regex = pattern;
  both.guided_grammar = grammar;
  both.guide = *regex_guide;
  EXPECT_TRUE(absl::IsInvalidArgument(both.Validate()));
}

// Priority scheduling (vLLM's --scheduling-policy priority): with one sequence at a time, requests
// run in (priority, arrival) order whatever order they came in; first come, first served refuses
// a priority other than 0.
TEST(Engine, PrioritySchedulingRunsTheMostUrgentFirst) {
  FakeRunnerOptions runner_options;
  EngineOptions options;
  options.max_model_len = 64;
  options.max_num_seqs = 1;
  options.max_num_batched_tokens = 64;
  options.priority_scheduling = true;
  Harness h(runner_options, options);
  std::vector<std::string> finished;
  const std::vector<std::pair<std::string, int>> requests = {
      {"late-0", 0}, {"urgent", -5}, {"late-1", 0}, {"lazy", 3}, {"urgent-too", -5}};
  for (const auto& [id, priority] : requests) {
    SamplingParams params;
    params.temperature = 0;
    params.max_tokens = 3;
    params.ignore_eos = true;
    params.priority = priority;
    ASSERT_TRUE(h.Add(id, {1, 2, 3}, params).ok());
  }
  for (int step = 0; step < 100 && h.engine().HasWork(); ++step) {
    h.StepChecked();
    for (const auto& [id, priority] : requests) {
      if (h.received().contains(id) && h.received().at(id).finished_outputs > 0 &&
          std::find(finished.begin(), finished.end(), id) == finished.end()) {
        finished.push_back(id);
      }
    }
  }
  EXPECT_EQ(finished, (std::vector<std::string>{"urgent", "urgent-too", "late-0", "late-1", "lazy"}));

  options.priority_scheduling = false;
  Harness fcfs(runner_options, options);
  SamplingParams params;
  params.priority = 1;
  const absl::Status refused = fcfs.Add("p", {1, 2}, params);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find("priority"), std::string::npos);
}

TEST(Engine, PrefixCacheHitsAreReportedPerRequest) {
  FakeRunnerOptions runner_options;
  EngineOptions options;
  options.max_model_len = 64;
  Harness h(runner_options, options);
  SamplingParams params;
  params.seed = 9;
  params.max_tokens = 2;
  std::vector<int32_t> prompt(29);
  for (int i = 0; i < 29; ++i) prompt[i] = 1 + i;
  ASSERT_TRUE(h.Add("first", prompt, params).ok());
  h.RunToCompletion();
  ASSERT_TRUE(h.Add("second", prompt, params).ok());
  h.RunToCompletion();
  // Same later blocks behind a different first token: nothing may be reused.
  std::vector<int32_t> other = prompt;
  other[0] = 30;
  ASSERT_TRUE(h.Add("third", other, params).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.received().at("first").last.num_cached_prompt_tokens, 0);
  EXPECT_EQ(h.received().at("second").last.num_cached_prompt_tokens, 24);  // 3 blocks of 8
  EXPECT_EQ(h.received().at("third").last.num_cached_prompt_tokens, 0);
  h.ExpectMatchesOracle();
}

// prompt_logprobs: a request computes its whole prompt even when the prefix cache holds it (an
// identical earlier prompt), in chunks of at most max_prompt_logprob_rows tokens; max_tokens 0
// only scores the prompt. Requests that could not run are refused.
TEST(Engine, PromptLogprobsScoreEveryPromptTokenAndBypassThePrefixCache) {
  FakeRunnerOptions runner_options;
  EngineOptions options;
  options.max_model_len = 64;
  options.max_prompt_logprob_rows = 7;
  Harness h(runner_options, options);
  size_t max_rows = 0;
  h.runner().on_step = [&](const StepInput& in) {
    max_rows = std::max(max_rows, in.logits_rows.size());
  };
  std::vector<int32_t> prompt(29);
  for (int i = 0; i < 29; ++i) prompt[i] = 1 + i;
  SamplingParams params;
  params.seed = 3;
  params.max_tokens = 3;
  ASSERT_TRUE(h.Add("plain", prompt, params).ok());
  h.RunToCompletion();
  params.prompt_logprobs = 2;
  ASSERT_TRUE(h.Add("scored", prompt, params).ok());
  h.RunToCompletion();
  SamplingParams only = params;
  only.max_tokens = 0;
  only.prompt_logprobs = 0;
  ASSERT_TRUE(h.Add("only", prompt, only).ok());
  ASSERT_TRUE(h.Add("one-token", {5}, only).ok());
  h.RunToCompletion();
  h.ExpectMatchesOracle();  // checks the log-probabilities too
  EXPECT_EQ(h.received().at("scored").last.num_cached_prompt_tokens, 0);
  EXPECT_EQ(h.received().at("only").last.num_cached_prompt_tokens, 0);
  EXPECT_EQ(h.received().at("only").reasons.at(0), FinishReason::kLength);
  EXPECT_TRUE(h.received().at("only").tokens[0].empty());
  EXPECT_EQ(h.received().at("one-token").outputs_with_prompt_logprobs, 1);
  EXPECT_TRUE(h.received().at("one-token").prompt_logprobs.empty());
  EXPECT_EQ(h.received().at("plain").outputs_with_prompt_logprobs, 0);
  // Two prompt-logprob requests ran at once: at most 7 prompt rows and one sampling row each.
  EXPECT_LE(max_rows, 7u + 2u);

  SamplingParams bad = params;
  bad.max_tokens = 0;
  bad.prompt_logprobs.reset();
  EXPECT_FALSE(h.Add("no-tokens", prompt, bad).ok());
  bad.prompt_logprobs = 21;
  bad.max_tokens = 1;
  EXPECT_FALSE(h.Add("too-many", prompt, bad).ok());

  EngineOptions no_chunks = options;
  no_chunks.enable_chunked_prefill = false;
  no_chunks.max_num_batched_tokens = 64;
  no_chunks.max_num_seqs = 64;
  Harness whole(runner_options, no_chunks);
  absl::Status status = whole.Add("long", prompt, params);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("chunked prefill"), std::string::npos) << status;
  EXPECT_TRUE(whole.Add("short", {1, 2, 3, 4, 5, 6, 7}, params).ok());
  whole.RunToCompletion();
  whole.ExpectMatchesOracle();

  EngineOptions disabled = options;
  disabled.max_prompt_logprob_rows = 0;
  Harness off(runner_options, disabled);
  EXPECT_FALSE(off.Add("off", prompt, params).ok());
}

TEST(Engine, RunnerFailureFailsEveryRequestInFlight) {
  FakeRunnerOptions runner_options;
  runner_options.fail_at_step = 3;
  EngineOptions options;
  options.max_model_len = 64;
  Harness h(runner_options, options);
  SamplingParams params;
  params.seed = 1;
  params.max_tokens = 20;
  params.ignore_eos = true;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(h.Add(absl::StrCat(i), {1, 2, 3}, params).ok());
  absl::Status status;
  for (int i = 0; i < 10 && status.ok(); ++i) status = h.engine().Step();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  for (int i = 0; i < 3; ++i) {
    const Received& r = h.received().at(absl::StrCat(i));
    EXPECT_EQ(r.finished_outputs, 1);
    EXPECT_EQ(r.reasons.at(0), FinishReason::kAbort);
    EXPECT_EQ(r.last.error.code(), absl::StatusCode::kInternal);
  }
  EXPECT_EQ(h.engine().block_manager().Usage(), 0.0);
}

TEST(Engine, RunLoopServesClientThreadsAndSleepsWhenIdle) {
  FakeRunnerOptions runner_options;
  runner_options.num_blocks = 48;
  EngineOptions options;
  options.max_model_len = 64;
  options.max_num_batched_tokens = 32;
  options.max_num_seqs = 16;
  options.eos_token_id = kEos;
  auto runner = std::make_unique<FakeRunner>(runner_options);
  std::atomic<bool> slow{false};
  runner->on_step = [&](const StepInput&) {
    if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  auto engine = *Engine::Create(std::move(runner), options);
  absl::Status run_status;
  std::thread loop([&] { run_status = engine->Run(); });

  constexpr int kClients = 4, kPerClient = 15;
  std::atomic<int> mismatches{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937_64 rng(100 + c);
      for (int i = 0; i < kPerClient; ++i) {
        std::vector<int32_t> prompt(1 + rng() % 20);
        for (int32_t& t : prompt) t = 1 + static_cast<int32_t>(rng() % 31);
        SamplingParams params = RandomParams(rng, 2, 12);
        RequestOutputQueue queue;
        EngineRequest request;
        request.request_id = absl::StrCat(c, "/", i);
        request.prompt_token_ids = prompt;
        request.params = params;
        request.on_output = queue.Callback();
        MQA_CHECK_OK(engine->AddRequest(std::move(request)));
        std::map<int, std::vector<int32_t>> tokens;
        while (true) {
          std::optional<RequestOutput> out = queue.Pop(absl::Seconds(20));
          MQA_CHECK(out.has_value());
          for (const SampleOutput& s : out->samples) {
            tokens[s.index].insert(tokens[s.index].end(), s.token_ids.begin(), s.token_ids.end());
          }
          if (out->finished) break;
        }
        for (int k = 0; k < params.n; ++k) {
          if (tokens[k] != Oracle(prompt, params, k, 32, 64).tokens) ++mismatches;
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  // Metrics are published at the end of a step, after its outputs.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int64_t steps = engine->metrics().num_steps;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(engine->metrics().num_steps, steps);  // idle: no steps taken

  // Stop with a request in flight (slow steps keep it there): it is aborted, later requests
  // are refused.
  slow = true;
  RequestOutputQueue queue;
  EngineRequest request;
  request.request_id = "late";
  request.prompt_token_ids = {1, 2};
  request.params.max_tokens = 50;
  request.params.ignore_eos = true;
  request.on_output = queue.Callback();
  ASSERT_TRUE(engine->AddRequest(std::move(request)).ok());
  engine->Stop();
  loop.join();
  EXPECT_TRUE(run_status.ok()) << run_status;
  std::optional<RequestOutput> out;
  do {
    out = queue.Pop(absl::Seconds(5));
    ASSERT_TRUE(out.has_value());
  } while (!out->finished);
  EXPECT_EQ(out->samples.back().finish_reason, FinishReason::kAbort);
  EXPECT_EQ(out->error.code(), absl::StatusCode::kUnavailable);
  EngineRequest after;
  after.request_id = "after";
  after.prompt_token_ids = {1};
  after.on_output = [](RequestOutput) {};
  EXPECT_EQ(engine->AddRequest(std::move(after)).code(), absl::StatusCode::kUnavailable);
}

TEST(Engine, IdleRunCallsKeepAliveAndStopsOnItsError) {
  EngineOptions options;
  options.keep_alive_interval = absl::Milliseconds(5);
  auto runner = std::make_unique<FakeRunner>(FakeRunnerOptions{});
  FakeRunner* fake = runner.get();
  auto engine = *Engine::Create(std::move(runner), options);
  absl::Status run_status;
  std::thread loop([&] { run_status = engine->Run(); });
  while (fake->keep_alives < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine->Stop();
  loop.join();
  EXPECT_TRUE(run_status.ok());
  EXPECT_EQ(engine->metrics().num_steps, 0);

  auto failing = std::make_unique<FakeRunner>(FakeRunnerOptions{});
  failing->keep_alive_status = absl::UnavailableError("worker 1 is gone");
  auto engine2 = *Engine::Create(std::move(failing), options);
  EXPECT_EQ(engine2->Run().code(), absl::StatusCode::kUnavailable);
}

// The operator's periodic line: throughputs over the interval from two snapshots, quiet when
// nothing happened; the logger thread writes it while the engine serves and stops cleanly.
TEST(StatsLog, LineFromTwoSnapshotsAndALoggerThatStaysQuietWhenIdle) {
  EngineMetrics before;
  before.prompt_tokens = 100;
  before.generation_tokens = 50;
  before.prefix_cache_queried_blocks = 10;
  before.prefix_cache_hit_blocks = 2;
  before.num_steps = 7;
  EngineMetrics now = before;
  now.prompt_tokens = 300;
  now.generation_tokens = 90;
  now.prefix_cache_queried_blocks = 20;
  now.prefix_cache_hit_blocks = 6;
  now.num_running = 3;
  now.num_waiting = 1;
  now.kv_cache_usage = 0.125;
  now.num_preemptions = 2;
  now.num_steps = 9;
  EXPECT_EQ(StatsLine(before, now, 2.0),
            "prompt 100.0 tokens/s, generation 20.0 tokens/s, running 3 reqs, waiting 1 reqs, KV "
            "cache 12.5%, prefix cache hits 40.0%, preemptions 2");
  now.spec_draft_tokens = 40;  // speculative decoding adds its acceptance over the interval
  now.spec_accepted_tokens = 30;
  before.spec_draft_tokens = 20;
  before.spec_accepted_tokens = 20;
  EXPECT_TRUE(absl::EndsWith(StatsLine(before, now, 2.0), "preemptions 2, draft acceptance 50.0%"));
  EXPECT_TRUE(StatsChanged(before, now));
  EngineMetrics idle = before;
  EXPECT_FALSE(StatsChanged(before, idle));

  FakeRunnerOptions runner_options;
  EngineOptions options;
  options.max_model_len = 64;
  Harness h(runner_options, options);
  std::mutex mu;
  std::vector<std::string> lines;
  {
    StatsLogger logger(&h.engine(), absl::Milliseconds(20), [&](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu);
      lines.push_back(line);
    });
    absl::SleepFor(absl::Milliseconds(80));  // idle: nothing to say
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_TRUE(lines.empty()) << lines.front();
    }
    SamplingParams params;
    params.seed = 1;
    params.max_tokens = 20;
    params.ignore_eos = true;
    ASSERT_TRUE(h.Add("r", {1, 2, 3}, params).ok());
    h.RunToCompletion();
    absl::SleepFor(absl::Milliseconds(80));
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.front().find("generation "), std::string::npos) << lines.front();
  EXPECT_EQ(lines.front().find("generation 0.0 tokens/s"), std::string::npos) << lines.front();
}

TEST(Engine, CreateRejectsInconsistentOptions) {
  EngineOptions options;
  options.enable_chunked_prefill = false;
  options.max_num_batched_tokens = 100;
  options.max_model_len = 200;
  EXPECT_EQ(
      Engine::Create(std::make_unique<FakeRunner>(FakeRunnerOptions{}), options).status().code(),
      absl::StatusCode::kInvalidArgument);
  options = EngineOptions();
  options.max_num_batched_tokens = 100;
  options.max_num_seqs = 200;
  EXPECT_FALSE(Engine::Create(std::make_unique<FakeRunner>(FakeRunnerOptions{}), options).ok());
  options = EngineOptions();
  options.eos_token_id = 32;
  EXPECT_FALSE(Engine::Create(std::make_unique<FakeRunner>(FakeRunnerOptions{}), options).ok());
  EXPECT_FALSE(Engine::Create(nullptr, EngineOptions()).ok());
}

}  // namespace
}  // namespace mqa
