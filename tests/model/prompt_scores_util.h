// Prompt log-probabilities of the Hugging Face fixtures through an Engine (CPU or CUDA runner),
// and HF's own scores to compare them with.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "tests/model/hf_fixture.h"

namespace mqa::testing {

struct ScoredPrompt {
  std::optional<std::vector<SampleResult>> scores;  // as the engine delivered them
  int cached_prompt_tokens = 0;
};

// Submits every reference prompt at once with prompt_logprobs = `top` (greedy; even-numbered
// requests score only, the others generate `max_tokens`), steps the engine until idle and returns
// what each request received. Failures are reported through gtest.
inline std::vector<ScoredPrompt> ScorePrompts(Engine& engine, const std::vector<HfReference>& refs,
                                              int top, int max_tokens) {
  std::vector<RequestOutputQueue> queues(refs.size());
  for (size_t i = 0; i < refs.size(); ++i) {
    EngineRequest r;
    r.request_id = "p" + std::to_string(i);
    r.prompt_token_ids = refs[i].prompt;
    r.params.temperature = 0;
    r.params.max_tokens = i % 2 == 0 ? 0 : max_tokens;
    r.params.prompt_logprobs = top;
    r.on_output = queues[i].Callback();
    const absl::Status added = engine.AddRequest(std::move(r));
    EXPECT_TRUE(added.ok()) << added;
  }
  while (engine.HasWork()) {
    const absl::Status step = engine.Step();
    if (!step.ok()) {
      ADD_FAILURE() << step;
      break;
    }
  }
  std::vector<ScoredPrompt> scored(refs.size());
  for (size_t i = 0; i < refs.size(); ++i) {
    while (auto out = queues[i].Pop(absl::ZeroDuration())) {
      EXPECT_TRUE(out->error.ok()) << out->error;
      if (out->prompt_logprobs.has_value()) scored[i].scores = out->prompt_logprobs;
      scored[i].cached_prompt_tokens += out->num_cached_prompt_tokens;
    }
    EXPECT_TRUE(scored[i].scores.has_value()) << "prompt " << i;
    if (scored[i].scores.has_value()) {
      EXPECT_EQ(scored[i].scores->size() + 1, refs[i].prompt.size()) << "prompt " << i;
    }
  }
  return scored;
}

// HF's score of prompt token `p` (p >= 1): the log-softmax of its logits at position p - 1, with
// that row's largest |logit| (the scale its rounding works at) and its best token.
struct HfScore {
  double logprob = 0;
  double scale = 0;
  int32_t best = 0;
  double margin = 0;  // best minus second-best logit
};

inline HfScore HfPromptScore(const HfReference& ref, size_t p, int64_t vocab) {
  const float* row = ref.logits.data() + (p - 1) * vocab;
  HfScore s;
  double max = row[0], second = -INFINITY, sum = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    s.scale = std::max<double>(s.scale, std::abs(row[v]));
    if (row[v] > max) {
      second = max;
      max = row[v];
      s.best = static_cast<int32_t>(v);
    } else if (v > 0 && row[v] > second) {
      second = row[v];
    }
  }
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
  s.logprob = row[ref.prompt[p]] - max - std::log(sum);
  s.margin = max - second;
  return s;
}

}  // namespace mqa::testing
