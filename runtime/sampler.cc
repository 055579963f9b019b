#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "runtime/guided.h"
#include "runtime/status.h"

namespace mqa {
namespace {

constexpr float kMasked = -std::numeric_limits<float>::infinity();

// Uniform in [0, 1) from 53 random bits: the same on every platform (unlike
// std::uniform_real_distribution, whose algorithm the standard leaves open).
double Uniform01(SampleRng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

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

// The sum of a row in double precision, in SIMD: each group of 4 widened and added to one of two
// double accumulators of 4 lanes.
double SumInDouble(absl::Span<const float> row) {
  using Doubles = double __attribute__((vector_size(32)));
  Doubles a = {}, b = {};
  size_t i = 0;
  for (; i + 2 * kLanes <= row.size(); i += 2 * kLanes) {
    a += __builtin_convertvector(Load(row.data() + i), Doubles);
    b += __builtin_convertvector(Load(row.data() + i + kLanes), Doubles);
  }
  a += b;
  double sum = (a[0] + a[1]) + (a[2] + a[3]);
  for (; i < row.size(); ++i) sum += row[i];
  return sum;
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

// The first index of the row's maximum (0 for a row of NaNs).
int32_t Argmax(absl::Span<const float> row) {
  const auto it = std::find(row.begin(), row.end(), RowMax(row));
  return it == row.end() ? 0 : static_cast<int32_t>(it - row.begin());
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
  // Bad words: a sequence's last token, where the output ends with the rest of it.
  for (const std::vector<int32_t>& word : params.bad_words_token_ids) {
    if (word.empty() || !in_vocab(word.back())) continue;
    const size_t rest = word.size() - 1;
    if (rest <= output_tokens.size() &&
        std::equal(word.begin(), word.end() - 1, output_tokens.end() - rest)) {
      logits[word.back()] = kMasked;
    }
  }
  if (params.penalty_last_n > 0) {
    // llama.cpp's window: the last n tokens of prompt and output, for all three penalties.
    const size_t n = static_cast<size_t>(params.penalty_last_n);
    const size_t from_output = std::min(n, output_tokens.size());
    const size_t from_prompt = std::min(n - from_output, prompt_tokens.size());
    prompt_tokens = prompt_tokens.subspan(prompt_tokens.size() - from_prompt);
    output_tokens = output_tokens.subspan(output_tokens.size() - from_output);
  }
  if (params.repetition_penalty != 1.0f) {
    // Each distinct token once, in a walk over the tokens rather than the vocabulary.
    std::vector<uint8_t> seen(vocab, 0);
    for (auto tokens : {prompt_tokens, output_tokens}) {
      for (int32_t t : tokens) {
        if (!in_vocab(t) || seen[t]) continue;
        seen[t] = 1;
        logits[t] = logits[t] > 0 ? logits[t] / params.repetition_penalty
                                  : logits[t] * params.repetition_penalty;
      }
    }
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    absl::flat_hash_map<int32_t, int> counts;
    for (int32_t t : output_tokens) {
      if (in_vocab(t)) ++counts[t];
    }
    if (params.penalty_last_n > 0) {  // the window's prompt tokens count too
      for (int32_t t : prompt_tokens) {
        if (in_vocab(t)) ++counts[t];
      }
    }
    for (const auto& [t, count] : counts) {
      logits[t] -= params.frequency_penalty * static_cast<float>(count) + params.presence_penalty;
    }
  }
}

namespace {

// The weights a draw is made from: e^((l - max) / T) for the kept tokens (the row's best weighs
// 1), 0 for the dropped ones, and their sum. Floats, computed in SIMD (a row of 49152 in tens of
// microseconds); the sum in double. Reused from row to row (`spare` too): a fresh row-sized
// vector a call cost more in page faults than the arithmetic.
struct FilteredRow {
  std::vector<float> weights;
  std::vector<float> spare;
  double total = 0;
};

// Most likely first, ties by lower id (the logits order the tokens as their weights do).
struct Better {
  absl::Span<const float> logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  }
};

// How much of the best-first order to keep: `count` tokens (top-k), or while the weight strictly
// before a token is short of `mass` (top-p: the smallest set whose weight reaches it).
struct Quota {
  size_t count = 0;
  double mass = std::numeric_limits<double>::infinity();
};

// The least and the greatest unmasked logit among `ids` (a separate function: inline, GCC kept
// the running maximum in memory, a store and a load each element).
[[gnu::noinline]] std::pair<float, float> FiniteExtremes(const float* l,
                                                         const std::vector<int32_t>& ids) {
  float max = -std::numeric_limits<float>::infinity();
  float min = std::numeric_limits<float>::infinity();
  for (int32_t t : ids) {
    max = l[t] > max ? l[t] : max;
    min = l[t] < min && l[t] != kMasked ? l[t] : min;
  }
  return {min, max};
}

// Appends to `kept` the longest best-first prefix of `ids` (any order, at least one) that the
// quota allows, and takes what it keeps off the quota. Instead of sorting the candidates (a
// sorted StarCoder row costs milliseconds), they are dealt into buckets of equal logit width, best
// first; buckets the quota takes whole are kept unsorted, and only the one it ends in is looked
// at further, the same way, until it is small enough to sort.
void KeepBestPrefix(absl::Span<const float> logits, absl::Span<const float> weights,
                    std::vector<int32_t> ids, Quota& quota, std::vector<int32_t>& kept) {
  // Raw pointers in the passes: the spans' checked indexing keeps the running extremes in memory.
  const float* l = logits.data();
  const float* w = weights.data();
  auto done = [&] { return quota.count == 0 || !(quota.mass > 0); };
  while (!ids.empty() && !done()) {
    const auto [min, max] = FiniteExtremes(l, ids);
    constexpr size_t kSortBelow = 256;
    constexpr int kBuckets = 1024;
    if (ids.size() <= kSortBelow || !(max > min)) {
      // Few, or one logit (and masked ones) left: the order is the sort's (ties by id).
      std::sort(ids.begin(), ids.end(), Better{logits});
      for (size_t i = 0; i < ids.size() && !done(); ++i) {
        kept.push_back(ids[i]);
        --quota.count;
        quota.mass -= w[ids[i]];
      }
      return;
    }
    // Bucket 0 holds the best logits; masked ones go last, in their own bucket.
    const float scale = static_cast<float>(kBuckets) / (max - min);
    std::vector<uint16_t> buckets(ids.size());
    std::vector<uint32_t> counts(kBuckets + 1, 0);
    std::vector<double> masses(kBuckets + 1, 0.0);
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t t = ids[i];
      const int b = l[t] == kMasked
                        ? kBuckets
                        : std::min(kBuckets - 1, static_cast<int>((max - l[t]) * scale));
      buckets[i] = static_cast<uint16_t>(b);
      ++counts[b];
      masses[b] += w[t];
    }
    // The first bucket the quota cannot take whole.
    int last = 0;
    while (last <= kBuckets && counts[last] <= quota.count && !(masses[last] >= quota.mass)) {
      quota.count -= counts[last];
      quota.mass -= masses[last];
      ++last;
    }
    std::vector<int32_t> rest;
    if (last <= kBuckets) rest.reserve(counts[last]);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (buckets[i] < last) {
        kept.push_back(ids[i]);
      } else if (buckets[i] == last) {
        rest.push_back(ids[i]);
      }
    }
    ids = std::move(rest);
  }
}

// Locally typical sampling over the kept tokens (weight > 0), as transformers'
// TypicalLogitsWarper: ordered by |surprisal - entropy|, the shortest prefix whose probability
// reaches `mass` is kept (with every token as close as the last one), the rest zeroed.
void KeepTypical(float mass, std::vector<float>& weights) {
  const double total = SumInDouble(weights);
  double entropy = 0;
  for (float w : weights) {
    if (w > 0) entropy -= w / total * std::log(w / total);
  }
  std::vector<std::pair<double, int32_t>> order;  // (|surprisal - entropy|, token)
  for (size_t t = 0; t < weights.size(); ++t) {
    if (weights[t] > 0) {
      order.push_back({std::abs(-std::log(weights[t] / total) - entropy), static_cast<int32_t>(t)});
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t last = 0;  // the first position whose cumulative probability reaches the mass
  double cumulative = weights[order[0].second] / total;
  while (last + 1 < order.size() && cumulative < mass) {
    ++last;
    cumulative += weights[order[last].second] / total;
  }
  for (size_t i = last + 1; i < order.size(); ++i) {
    if (order[i].first > order[last].first) weights[order[i].second] = 0;
  }
}

void FilterRow(const SamplingParams& params, absl::Span<const float> logits, FilteredRow& row) {
  MQA_CHECK(params.temperature > 0.0f);
  const size_t vocab = logits.size();
  const float max = RowMax(logits);
  MQA_CHECK(std::isfinite(max));
  const float inv_t = 1.0f / params.temperature;
  const bool use_top_k = params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab;
  const bool use_top_p = params.top_p < 1.0f;
  if (use_top_k && params.top_k <= 128) {
    // A few tokens: found in one pass (best first), and only they are weighed.
    const std::vector<int32_t> best = TopK(logits, params.top_k);
    row.weights.assign(vocab, 0.0f);
    double mass = 0;
    for (int32_t t : best) {
      if (logits[t] == kMasked) break;
      mass += row.weights[t] = std::exp((logits[t] - max) * inv_t);
    }
    if (use_top_p) {
      // Over the top-k renormalised: keep a token while the weight before it is short of top_p.
      const double target = static_cast<double>(params.top_p) * mass;
      double before = 0;
      size_t keep = 0;
      while (keep < best.size() && before < target) before += row.weights[best[keep++]];
      for (size_t i = std::max<size_t>(keep, 1); i < best.size(); ++i) row.weights[best[i]] = 0;
    }
  } else {
    row.weights.resize(vocab);
    const Floats m = Splat(max);
    const Floats masked = Splat(kMasked);
    size_t i = 0;
    for (; i + kLanes <= vocab; i += kLanes) {
      const Floats l = Load(logits.data() + i);
      Floats w = ExpNonPositive((l - m) * inv_t);
      w = l == masked ? Splat(0.0f) : w;
      std::memcpy(row.weights.data() + i, &w, sizeof(w));
    }
    for (; i < vocab; ++i) {
      row.weights[i] = logits[i] == kMasked ? 0.0f : std::exp((logits[i] - max) * inv_t);
    }
    if (use_top_k || use_top_p) {
      const auto weights = absl::MakeConstSpan(row.weights);
      std::vector<int32_t> kept;  // unordered
      std::vector<int32_t> candidates(vocab);
      std::iota(candidates.begin(), candidates.end(), 0);
      if (use_top_k) {
        Quota quota{static_cast<size_t>(params.top_k)};
        KeepBestPrefix(logits, weights, std::move(candidates), quota, kept);
        candidates = std::move(kept);
        kept.clear();
        std::sort(candidates.begin(), candidates.end());
      }
      if (use_top_p) {
        // Over the top-k renormalised.
        double mass = 0;
        if (use_top_k) {
          for (int32_t t : candidates) mass += weights[t];
        } else {
          mass = SumInDouble(row.weights);
        }
        Quota quota{candidates.size(), static_cast<double>(params.top_p) * mass};
        KeepBestPrefix(logits, weights, std::move(candidates), quota, kept);
      } else {
        kept = std::move(candidates);
      }
      if (kept.empty()) kept.push_back(Argmax(logits));  // a quota of nothing keeps the best
      row.spare.assign(vocab, 0.0f);
      for (int32_t t : kept) row.spare[t] = row.weights[t];
      std::swap(row.weights, row.spare);
    }
  }
  if (params.typical_p < 1.0f) KeepTypical(params.typical_p, row.weights);
  if (params.min_p > 0.0f) {
    // Below min_p times the best token's probability; the best weighs 1 (e^0), and dropping by
    // top-k / top-p never drops it.
    const float threshold = params.min_p;
    for (float& w : row.weights) {
      if (w < threshold) w = 0;
    }
  }
  row.total = SumInDouble(row.weights);
}

// The first token (by id) at which the running sum of the weights passes u times their total.
int32_t Draw(const FilteredRow& row, double u) {
  const double target = u * row.total;
  const size_t vocab = row.weights.size();
  constexpr size_t kBlock = 64;
  double before = 0;
  size_t i = 0;
  // Whole blocks the target lies beyond are summed in SIMD and skipped.
  for (; i + kBlock <= vocab; i += kBlock) {
    Floats lanes = {};
    for (size_t j = 0; j < kBlock; j += kLanes) lanes += Load(row.weights.data() + i + j);
    double block = 0;
    for (size_t j = 0; j < kLanes; ++j) block += lanes[j];
    if (before + block > target) break;
    before += block;
  }
  int32_t last_nonzero = -1;
  for (; i < vocab; ++i) {
    if (row.weights[i] == 0) continue;
    last_nonzero = static_cast<int32_t>(i);
    before += row.weights[i];
    if (target < before) return last_nonzero;
  }
  // Rounding left the target at or above the sum: the last kept token.
  if (last_nonzero >= 0) return last_nonzero;
  for (size_t t = vocab; t-- > 0;) {
    if (row.weights[t] != 0) return static_cast<int32_t>(t);
  }
  MQA_CHECK(false);  // FilterRow keeps at least the best token
  return 0;
}

}  // namespace

std::vector<double> FilteredProbs(const SamplingParams& params, absl::Span<const float> logits) {
  FilteredRow row;
  FilterRow(params, logits, row);
  std::vector<double> probs(row.weights.size());
  for (size_t i = 0; i < probs.size(); ++i) probs[i] = row.weights[i] / row.total;
  return probs;
}

SampleResult Sample(absl::Span<const float> raw_logits, const SamplingContext& context) {
  const SamplingParams& params = *context.params;
  const auto vocab = static_cast<int32_t>(raw_logits.size());
  MQA_CHECK(vocab > 0);
  thread_local std::vector<float> logits;  // reused: see FilteredRow
  logits.assign(raw_logits.begin(), raw_logits.end());
  ApplyPenalties(params, context.prompt_tokens, context.output_tokens, absl::MakeSpan(logits));
  // The guide's state after the output so far; its mask comes after the penalties (and survives
  // min_tokens' fallback below: a guided sample never leaves its pattern).
  const int guide_state = params.guide == nullptr ? Guide::kDead
                          : context.guide_state.has_value()
                              ? *context.guide_state
                              : params.guide->Advance(Guide::start(), context.output_tokens);
  if (params.guide != nullptr) params.guide->Mask(guide_state, absl::MakeSpan(logits));
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
      if (params.guide != nullptr) params.guide->Mask(guide_state, absl::MakeSpan(logits));
    }
  }

  SampleResult result;
  if (params.greedy()) {
    result.token_id = Argmax(logits);
  } else {
    MQA_CHECK(context.rng != nullptr);
    thread_local FilteredRow row;
    FilterRow(params, logits, row);
    result.token_id = Draw(row, Uniform01(*context.rng));
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
