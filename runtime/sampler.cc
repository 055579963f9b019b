#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// Whole-row passes in GCC / Clang vector types of 4 lanes (one SSE register on the baseline
// x86-64 target; wider types are lowered through memory there), so that they run as SIMD without
// -ffast-math: a StarCoder row (49152 logits) is scored in ~0.07 ms instead of ~0.3.
using Floats = float __attribute__((vector_size(16)));
using Ints = int32_t __attribute__((vector_size(16)));
constexpr size_t kLanes = sizeof(Floats) / sizeof(float);

inline Floats Load(const float* p) {
  Floats v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline Floats Splat(float x) { return Floats{} + x; }

// e^x for x <= 0 in single precision: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its degree-6
// Taylor polynomial (relative error below 2e-7), 2^n through the exponent bits. Below -87
// (e^-87 ~ 1.6e-38) x is clamped: a logit that far under the row's maximum adds nothing to a sum.
inline Floats ExpNonPositive(Floats x) {
  const Floats lo = Splat(-87.0f);
  x = x < lo ? lo : x;
  const Ints n = __builtin_convertvector(x * 1.44269504f - 0.5f, Ints);  // nearest, as x <= 0
  const Floats nf = __builtin_convertvector(n, Floats);
  const Floats r = x - nf * 0.693145751953125f - nf * 1.428606765330187e-6f;
  Floats p = Splat(1.0f / 720.0f);
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const Ints bits = (n + 127) << 23;
  Floats scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

float RowMax(absl::Span<const float> row) {
  Floats lanes = Splat(-std::numeric_limits<float>::infinity());
  size_t i = 0;
  for (; i + kLanes <= row.size(); i += kLanes) {
    const Floats v = Load(row.data() + i);
    lanes = v > lanes ? v : lanes;
  }
  float max = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < kLanes; ++j) max = std::max(max, lanes[j]);
  for (; i < row.size(); ++i) max = std::max(max, row[i]);
  return max;
}

// log(sum_v e^(row[v])), each term taken relative to `max` (the row's maximum); the float lanes
// are flushed into a double every 1024 elements, which bounds their rounding.
double RowLogSumExp(absl::Span<const float> row, float max) {
  const Floats m = Splat(max);
  double sum = 0;
  size_t i = 0;
  while (i + kLanes <= row.size()) {
    Floats lanes = {};
    const size_t end = std::min(row.size() - row.size() % kLanes, i + 1024);
    for (; i < end; i += kLanes) lanes += ExpNonPositive(Load(row.data() + i) - m);
    for (size_t j = 0; j < kLanes; ++j) sum += lanes[j];
  }
  for (; i < row.size(); ++i) sum += std::exp(static_cast<double>(row[i]) - max);
  return max + std::log(sum);
}

int32_t CountAbove(absl::Span<const float> row, float value) {
  const Floats v = Splat(value);
  Ints lanes = {};
  size_t i = 0;
  for (; i + kLanes <= row.size(); i += kLanes) lanes -= Load(row.data() + i) > v;  // true: -1
  int32_t count = 0;
  for (size_t j = 0; j < kLanes; ++j) count += lanes[j];
  for (; i < row.size(); ++i) count += row[i] > value;
  return count;
}

// The `k` largest entries, largest first, ties by lower index, in one
// pass: an entry enters only when it beats the current k-th, and once k are held a group of lanes
// none of which does is skipped whole, which is most of a row.
std::vector<int32_t> TopK(absl::Span<const float> row, int k) {
  std::vector<int32_t> best;  // sorted, best first
  best.reserve(k + 1);
  float kth = -std::numeric_limits<float>::infinity();  // meaningful once best.size() == k
  auto offer = [&](size_t v) {
    if (static_cast<int>(best.size()) == k && !(row[v] > kth)) return;
    auto pos = std::upper_bound(best.begin(), best.end(), row[v],
                                [&](float value, int32_t t) { return value > row[t]; });
    best.insert(pos, static_cast<int32_t>(v));
    if (static_cast<int>(best.size()) > k) best.pop_back();
    if (static_cast<int>(best.size()) == k) kth = row[best.back()];
  };
  size_t i = 0;
  for (; i + kLanes <= row.size(); i += kLanes) {
    if (static_cast<int>(best.size()) == k) {
      const Ints above = Load(row.data() + i) > Splat(kth);
      bool any = false;
      for (size_t j = 0; j < kLanes; ++j) any |= above[j] != 0;
      if (!any) continue;
    }
    for (size_t j = 0; j < kLanes; ++j) offer(i + j);
  }
  for (; i < row.size(); ++i) offer(i);
  return best;
}

}  // namespace

void ApplyPenalties(const SamplingParams& params, absl::Span<const int32_t> prompt_tokens,
                    absl::Span<const int32_t> output_tokens, absl::Span<float> logits) {
  const auto vocab = static_cast<int32_t>(logits.size());
  auto in_vocab = [&](int32_t t) { return t >= 0 && t < vocab; };
  if (!params.allowed_token_ids.empty()) {
    std::vector<float> kept(params.allowed_token_ids.size());
    for (size_t i = 0; i < kept.size(); ++i) {
      const int32_t t = params.allowed_token_ids[i];
      kept[i] = in_vocab(t) ? logits[t] : kMasked;
    }
    std::fill(logits.begin(), logits.end(), kMasked);
    for (size_t i = 0; i < kept.size(); ++i) {
      const int32_t t = params.allowed_token_ids[i];
      if (in_vocab(t)) logits[t] = kept[i];
    }
  }
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
    // Most likely first, ties by lower id; the logits order it as the probabilities do.
    auto better = [&](int32_t a, int32_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    };
    std::vector<int32_t> order;
    size_t keep = vocab;
    if (use_top_k && params.top_k <= 128) {
      order = TopK(logits, params.top_k);  // one pass, already in order
      keep = order.size();
    } else {
      order.resize(vocab);
      std::iota(order.begin(), order.end(), 0);
      if (use_top_k) {
        keep = static_cast<size_t>(params.top_k);
        std::nth_element(order.begin(), order.begin() + (keep - 1), order.end(), better);
      }
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
  const double log_z = RowLogSumExp(logits, RowMax(logits));
  SampleResult result;
  result.token_id = token;
  result.logprob = static_cast<float>(logits[token] - log_z);
  result.rank = 1 + CountAbove(logits, logits[token]);
  if (top > 0) {
    for (int32_t t : TopK(logits, top)) {
      result.top_logprobs.push_back({t, static_cast<float>(logits[t] - log_z)});
    }
  }
  return result;
}

}  // namespace mqa
