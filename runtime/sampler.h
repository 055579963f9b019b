// Sampler: picks the next token from one fp32 logits row on the CPU.
//
// Order (vLLM's): allowed_token_ids (every other logit masked), logit bias, repetition / presence /
// frequency penalties, masking of EOS and stop tokens before min_tokens, temperature, then top-k,
// top-p (over the top-k renormalised), min-p, and a draw from the sample's own generator. The
// result depends only on the row, the sample's history and its generator, never on the rest of the
// batch. Stateless; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "runtime/sampling_params.h"
#include "runtime/sequence.h"

namespace mqa {

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token_id = 0;
  // Set when SamplingParams::logprobs is: the chosen token's log-probability under the model's
  // distribution (log_softmax of the raw row), and the `logprobs` most likely tokens, best first.
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;
  // Set by ScoreToken: 1 + the number of tokens more likely than token_id.
  int32_t rank = 0;
};

struct SamplingContext {
  const SamplingParams* params = nullptr;
  absl::Span<const int32_t> prompt_tokens;
  absl::Span<const int32_t> output_tokens;
  int32_t eos_token_id = -1;  // -1: none
  SampleRng* rng = nullptr;   // advanced once per non-greedy draw
  // With SamplingParams::guide: its state after output_tokens, where the caller keeps it (the
  // engine advances it token by token); unset, Sample walks the output from the start.
  std::optional<int> guide_state;
};

SampleResult Sample(absl::Span<const float> logits, const SamplingContext& context);

// `token` scored under the distribution of a raw logits row (log_softmax): its log-probability,
// its rank and the `top` most likely tokens, best first (ties by id). What Sample returns for
// logprobs, and what a prompt position yields for prompt_logprobs.
SampleResult ScoreToken(absl::Span<const float> logits, int32_t token, int top);

// The pieces, exposed for tests.
// Applies the three penalties in place.
void ApplyPenalties(const SamplingParams& params, absl::Span<const int32_t> prompt_tokens,
                    absl::Span<const int32_t> output_tokens, absl::Span<float> logits);
// Probabilities after temperature, top-k, top-p and min-p (0 for dropped tokens; sums to 1).
// Requires temperature > 0.
std::vector<double> FilteredProbs(const SamplingParams& params, absl::Span<const float> logits);

}  // namespace mqa
