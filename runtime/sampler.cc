#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "runtime/status.h"

namespace mqa {
namespace {

constexpr float kMasked = -std::numeric_limits<float>::infinity();

// Uniform in [0, 1) from 53 random bits: the same on every platform (unlike
// std::uniform_real_distribution, whose algorithm the standard leaves open).
double Uniform01(SampleRng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

int32_t Argmax(absl::Span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Indices ordered by value, largest first, ties by index.
template <typename T>
std::vector<int32_t> OrderDescending(const std::vector<T>& values, size_t count) {
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return values[a] != values[b] ? values[a] > values[b] : a < b;
  };
  count = std::min(count, order.size());
  std::partial_sort(order.begin(), order.begin() + count, order.end(), better);
  order.resize(count);
  return order;
}

}  // namespace

void ApplyPenalties(const SamplingParams& params, absl::Span<const int32_t> prompt_tokens,
                    absl::Span<const int32_t> output_tokens, absl::Span<float> logits) {
  const auto vocab = static_cast<int32_t>(logits.size());
  auto in_vocab = [&](int32_t t) { return t >= 0 && t < vocab; };
  for (const auto& [t, bias] : params.logit_bias) {
    if (in_vocab(t)) logits[t] += bias;
  }
  if (params.repetition_penalty != 1.0f) {
    std::vector<bool> seen(vocab, false);
    for (auto tokens : {prompt_tokens, output_tokens}) {
      for (int32_t t : tokens) {
        if (in_vocab(t)) seen[t] = true;
      }
    }
    for (int32_t t = 0; t < vocab; ++t) {
      if (!seen[t]) continue;
      logits[t] = logits[t] > 0 ? logits[t] / params.repetition_penalty
                                : logits[t] * params.repetition_penalty;
    }
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    absl::flat_hash_map<int32_t, int> counts;
    for (int32_t t : output_tokens) {
      if (in_vocab(t)) ++counts[t];
    }
    for (const auto& [t, count] : counts) {
      logits[t] -= params.frequency_penalty * static_cast<float>(count) + params.presence_penalty;
    }
  }
}

std::vector<double> FilteredProbs(const SamplingParams& params, absl::Span<const float> logits) {
  MQA_CHECK(params.temperature > 0.0f);
  const size_t vocab = logits.size();
  std::vector<double> probs(vocab);
  double max_logit = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < vocab; ++i) {
    probs[i] = static_cast<double>(logits[i]) / params.temperature;
    max_logit = std::max(max_logit, probs[i]);
  }
  MQA_CHECK(std::isfinite(max_logit));
  double sum = 0;
  for (double& p : probs) {
    p = std::exp(p - max_logit);
    sum += p;
  }
  for (double& p : probs) p /= sum;

  const bool use_top_k = params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab;
  const bool use_top_p = params.top_p < 1.0f;
  if (use_top_k || use_top_p) {
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    auto better = [&](int32_t a, int32_t b) {
      return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
    };
    size_t keep = vocab;
    if (use_top_k) {
      keep = static_cast<size_t>(params.top_k);
      std::nth_element(order.begin(), order.begin() + (keep - 1), order.end(), better);
    }
    if (use_top_p) {
      // Over the top-k renormalised: keep a token while the mass strictly before it is short
      // of top_p (so the kept set is the smallest whose mass reaches top_p). Most of the mass
      // usually lies in a few tokens, so sort only as much of the head as that takes.
      double mass = 0;
      for (size_t i = 0; i < keep; ++i) mass += probs[order[i]];
      const double target = static_cast<double>(params.top_p) * mass;
      double before = 0;
      size_t kept = 0;
      size_t sorted = 0;
      for (size_t count = std::min<size_t>(64, keep);; count = std::min(keep, count * 8)) {
        std::partial_sort(order.begin() + sorted, order.begin() + count, order.begin() + keep,
                          better);
        sorted = count;
        while (kept < sorted && before < target) before += probs[order[kept++]];
        if (before >= target || sorted == keep) break;
      }
      keep = std::max<size_t>(kept, 1);
    }
    std::vector<bool> kept(vocab, false);
    for (size_t i = 0; i < keep; ++i) kept[order[i]] = true;
    for (size_t i = 0; i < vocab; ++i) {
      if (!kept[i]) probs[i] = 0;
    }
  }
  if (params.min_p > 0.0f) {
    const double threshold = params.min_p * *std::max_element(probs.begin(), probs.end());
    for (double& p : probs) {
      if (p < threshold) p = 0;
    }
  }
  sum = std::accumulate(probs.begin(), probs.end(), 0.0);
  for (double& p : probs) p /= sum;
  return probs;
}

SampleResult Sample(absl::Span<const float> raw_logits, const SamplingContext& context) {
  const SamplingParams& params = *context.params;
  const auto vocab = static_cast<int32_t>(raw_logits.size());
  MQA_CHECK(vocab > 0);
  std::vector<float> logits(raw_logits.begin(), raw_logits.end());
  ApplyPenalties(params, context.prompt_tokens, context.output_tokens, absl::MakeSpan(logits));
  if (static_cast<int>(context.output_tokens.size()) < params.min_tokens) {
    for (int32_t t : params.stop_token_ids) {
      if (t < vocab) logits[t] = kMasked;
    }
    if (context.eos_token_id >= 0 && context.eos_token_id < vocab && !params.ignore_eos) {
      logits[context.eos_token_id] = kMasked;
    }
    // Masking every token would leave nothing to sample: fall back to the unmasked row.
    if (std::all_of(logits.begin(), logits.end(), [](float l) { return l == kMasked; })) {
      logits.assign(raw_logits.begin(), raw_logits.end());
    }
  }

  SampleResult result;
  if (params.greedy()) {
    result.token_id = Argmax(logits);
  } else {
    MQA_CHECK(context.rng != nullptr);
    const std::vector<double> probs = FilteredProbs(params, logits);
    const double u = Uniform01(*context.rng);
    double cumulative = 0;
    result.token_id = -1;
    int32_t last_nonzero = 0;
    for (int32_t t = 0; t < vocab; ++t) {
      if (probs[t] == 0) continue;
      last_nonzero = t;
      cumulative += probs[t];
      if (u < cumulative) {
        result.token_id = t;
        break;
      }
    }
    if (result.token_id < 0) result.token_id = last_nonzero;  // rounding left u above the sum
  }

  if (params.logprobs.has_value()) {
    SampleResult scored = ScoreToken(raw_logits, result.token_id, *params.logprobs);
    result.logprob = scored.logprob;
    result.top_logprobs = std::move(scored.top_logprobs);
  }
  return result;
}

SampleResult ScoreToken(absl::Span<const float> logits, int32_t token, int top) {
  MQA_CHECK(token >= 0 && token < static_cast<int64_t>(logits.size()));
  double max_logit = -std::numeric_limits<double>::infinity();
  for (float l : logits) max_logit = std::max<double>(max_logit, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
  const double log_z = max_logit + std::log(sum);
  SampleResult result;
  result.token_id = token;
  result.logprob = static_cast<float>(logits[token] - log_z);
  result.rank = 1 + static_cast<int32_t>(std::count_if(logits.begin(), logits.end(),
                                                       [&](float l) { return l > logits[token]; }));
  if (top > 0) {
    std::vector<float> values(logits.begin(), logits.end());
    for (int32_t t : OrderDescending(values, top)) {
      result.top_logprobs.push_back({t, static_cast<float>(logits[t] - log_z)});
    }
  }
  return result;
}

}  // namespace mqa
