// Speculative decoding by prompt lookup (vLLM's "ngram" method): a sequence's next tokens are
// guessed from its own text — the tokens that followed the last earlier occurrence of its final
// n-gram — and the model checks all the guesses in one step: the step computes the real last
// token and the k draft tokens after it, the model's token at each position is drawn from its row
// as it would be without speculation (greedy: the argmax), and the drafts are kept while they
// equal it, plus the model's token after the last kept one. For a deterministic draft that is
// exact rejection sampling, so output is unchanged (with a seed, token for token) in fewer steps;
// code, which repeats itself, often accepts several drafts a step, and a memory-bound decode step
// costs about the same with k + 1 tokens as with one.
//
// Every request speculates: greedy or sampled, one sample or several (forked samples draft from
// their own text), with or without (prompt) log-probabilities.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/sampling_params.h"

namespace mqa {

struct SpeculativeConfig {
  int num_speculative_tokens = 0;  // drafts a step at most; 0: off
  int prompt_lookup_max = 4;       // longest n-gram matched
  int prompt_lookup_min = 1;       // shortest n-gram matched

  bool enabled() const { return num_speculative_tokens > 0; }
};

// vLLM's --speculative-config JSON: {"method": "ngram", "num_speculative_tokens": k,
// "prompt_lookup_max": n, "prompt_lookup_min": m}. An empty string: off. InvalidArgument naming
// the field for anything else (another method, k outside 1..15, min > max ...).
absl::StatusOr<SpeculativeConfig> ParseSpeculativeConfig(absl::string_view json);

// Up to `max_tokens` draft tokens for the sequence `tokens` (prompt + output): for n from
// prompt_lookup_max down to prompt_lookup_min, the last n tokens are looked for earlier in
// `tokens` (the latest occurrence with a token after it wins) and the tokens that followed it are
// proposed. Empty when nothing matches.
std::vector<int32_t> ProposeNgramDraft(absl::Span<const int32_t> tokens,
                                       const SpeculativeConfig& config, int max_tokens);

}  // namespace mqa
