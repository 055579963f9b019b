#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "runtime/stop_strings.h"

namespace mqa {
namespace {

// Distinct random logits in [-4, 4).
std::vector<float> RandomLogits(std::mt19937_64& rng, int vocab) {
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = dist(rng);
  return logits;
}

std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  double max = *std::max_element(logits.begin(), logits.end()) / temperature;
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(logits[i] / temperature - max);
  for (double& x : p) x /= sum;
  return p;
}

std::set<int> Support(const std::vector<double>& probs) {
  std::set<int> s;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0) s.insert(static_cast<int>(i));
  }
  return s;
}

// Indices by probability, most likely first.
std::vector<int> Ranked(const std::vector<double>& p) {
  std::vector<int> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  return order;
}

TEST(Sampler, TemperatureScalesTheSoftmax) {
  std::mt19937_64 rng(1);
  const std::vector<float> logits = RandomLogits(rng, 50);
  SamplingParams params;
  params.temperature = 0.7f;
  const std::vector<double> got = FilteredProbs(params, logits);
  const std::vector<double> want = Softmax(logits, params.temperature);
  // The weights are single precision: e^x to a relative error of about 1.2e-7 x |x|.
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]);
}

TEST(Sampler, TopKKeepsExactlyTheKMostLikely) {
  std::mt19937_64 rng(2);
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, 64);
    SamplingParams params;
    params.temperature = 0.5f + trial * 0.05f;
    params.top_k = 1 + static_cast<int>(rng() % 64);
    const std::vector<double> got = FilteredProbs(params, logits);
    const std::vector<double> full = Softmax(logits, params.temperature);
    const std::vector<int> ranked = Ranked(full);
    std::set<int> want(ranked.begin(), ranked.begin() + params.top_k);
    ASSERT_EQ(Support(got), want);
    double mass = 0;
    for (int t : want) mass += full[t];
    for (int t : want) EXPECT_NEAR(got[t], full[t] / mass, 1e-5 * full[t] / mass);
  }
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, 40);
    const std::vector<double> full = Softmax(logits, 1.0);
    const std::vector<int> ranked = Ranked(full);
    // Aim between two cumulative sums, so the expected set has an unambiguous size m.
    const size_t m = 1 + rng() % 39;
    double before = 0;
    for (size_t i = 0; i + 1 < m; ++i) before += full[ranked[i]];
    SamplingParams params;
    params.top_p = static_cast<float>(before + 0.5 * full[ranked[m - 1]]);
    const std::vector<double> got = FilteredProbs(params, logits);
    std::set<int> want(ranked.begin(), ranked.begin() + m);
    ASSERT_EQ(Support(got), want) << "m=" << m << " top_p=" << params.top_p;
    EXPECT_NEAR(std::accumulate(got.begin(), got.end(), 0.0), 1.0, 1e-12);
  }
}

TEST(Sampler, TopKAndTopPOnALargeVocabulary) {
  std::mt19937_64 rng(33);
  for (int trial = 0; trial < 20; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, 3000);
    const std::vector<double> full = Softmax(logits, 1.0);
    const std::vector<int> ranked = Ranked(full);
    SamplingParams params;
    params.top_k = trial % 2 == 0 ? -1 : 100 + static_cast<int>(rng() % 2500);
    const size_t k = params.top_k > 0 ? params.top_k : 3000;
    double mass = 0;
    for (size_t i = 0; i < k; ++i) mass += full[ranked[i]];
    const size_t m = 1 + rng() % (k - 1);
    double before = 0;
    for (size_t i = 0; i + 1 < m; ++i) before += full[ranked[i]];
    params.top_p = static_cast<float>((before + 0.5 * full[ranked[m - 1]]) / mass);
    // float rounding of top_p may move the boundary: recompute the expected size from it.
    const double target = static_cast<double>(params.top_p) * mass;
    size_t want_size = 0;
    for (double b = 0; want_size < k && b < target;) b += full[ranked[want_size++]];
    std::set<int> want(ranked.begin(), ranked.begin() + want_size);
    ASSERT_EQ(Support(FilteredProbs(params, logits)), want) << "trial " << trial;
  }
}

// Large rows with many equal logits and masked tokens (what allowed_token_ids and min_tokens
// leave), top-k above and below the one-pass limit, top-p aimed between two tokens of the order:
// the kept set is the reference's, a full sort by logit (ties by lower id).
TEST(Sampler, TopKAndTopPMatchASortOnRowsWithTiesAndMaskedTokens) {
  std::mt19937_64 rng(34);
  const float masked = -std::numeric_limits<float>::infinity();
  for (int trial = 0; trial < 40; ++trial) {
    const int vocab = 2000 + static_cast<int>(rng() % 6000);
    std::vector<float> logits(vocab);
    std::normal_distribution<float> normal(0.0f, 1.0f + trial % 4);
    for (float& l : logits) {
      const uint64_t kind = rng() % 8;
      l = kind == 0 ? masked : kind < 4 ? static_cast<float>(rng() % 6) - 2.0f : normal(rng);
    }
    logits[rng() % vocab] = 3.5f;  // at least one unmasked
    std::vector<int> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return logits[a] > logits[b]; });
    SamplingParams params;
    params.temperature = 0.6f + 0.1f * (trial % 5);
    const std::vector<double> full = Softmax(logits, params.temperature);
    const int finite = static_cast<int>(
        std::count_if(logits.begin(), logits.end(), [&](float l) { return l != masked; }));
    const int kinds[] = {-1, 1 + static_cast<int>(rng() % 128),
                         129 + static_cast<int>(rng() % 3000)};
    params.top_k = kinds[trial % 3];
    const size_t k = params.top_k > 0 ? std::min(params.top_k, vocab) : vocab;
    double mass = 0;
    for (size_t i = 0; i < k; ++i) mass += full[order[i]];
    size_t want_size = k;
    if (trial % 2 == 1) {
      // Aim halfway into an unmasked token of the top-k order.
      const size_t m = 1 + rng() % std::min<size_t>(k, finite);
      double before = 0;
      for (size_t i = 0; i + 1 < m; ++i) before += full[order[i]];
      params.top_p = static_cast<float>((before + 0.5 * full[order[m - 1]]) / mass);
      const double target = static_cast<double>(params.top_p) * mass;
      want_size = 0;
      for (double b = 0; want_size < k && b < target;) b += full[order[want_size++]];
    }
    std::set<int> want;
    for (size_t i = 0; i < want_size; ++i) {
      if (full[order[i]] > 0) want.insert(order[i]);
    }
    ASSERT_EQ(Support(FilteredProbs(params, logits)), want)
        << "trial " << trial << " vocab " << vocab << " top_k " << params.top_k << " top_p "
        << params.top_p;
  }
}

TEST(Sampler, TopPAppliesToTheTopKRenormalised) {
  // Probabilities 0.4 0.3 0.2 0.1: top_k 2 leaves 4/7, 3/7; top_p 0.5 then keeps only 4/7.
  const std::vector<float> logits = {std::log(0.3f), std::log(0.4f), std::log(0.1f),
                                     std::log(0.2f)};
  SamplingParams params;
  params.top_k = 2;
  params.top_p = 0.5f;
  EXPECT_EQ(Support(FilteredProbs(params, logits)), std::set<int>({1}));
  params.top_p = 0.6f;
  EXPECT_EQ(Support(FilteredProbs(params, logits)), std::set<int>({0, 1}));
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheBest) {
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, 48);
    const std::vector<double> full = Softmax(logits, 1.0);
    const double best = *std::max_element(full.begin(), full.end());
    SamplingParams params;
    params.min_p = std::uniform_real_distribution<float>(0.01f, 0.9f)(rng);
    std::set<int> want;
    bool ambiguous = false;
    for (int t = 0; t < 48; ++t) {
      if (full[t] >= params.min_p * best) want.insert(t);
      ambiguous |= std::abs(full[t] - params.min_p * best) < 1e-9;
    }
    if (ambiguous) continue;
    EXPECT_EQ(Support(FilteredProbs(params, logits)), want);
  }
}

// Locally typical sampling, against transformers' TypicalLogitsWarper written out here: over the
// top-p survivors renormalised, sort by |-log p - entropy|, keep through the first position whose
// cumulative probability reaches typical_p (ties with it too).
TEST(Sampler, TypicalPKeepsTheTokensNearestTheEntropy) {
  std::mt19937_64 rng(9);
  int differs = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, 40);
    SamplingParams params;
    params.temperature = std::uniform_real_distribution<float>(0.5f, 1.5f)(rng);
    params.typical_p = std::uniform_real_distribution<float>(0.05f, 0.95f)(rng);
    if (trial % 2 == 1) params.top_p = 0.9f;
    // The tokens before typical_p, and their probabilities renormalised.
    SamplingParams before = params;
    before.typical_p = 1.0f;
    const std::vector<double> p = FilteredProbs(before, logits);
    double entropy = 0;
    for (double q : p) {
      if (q > 0) entropy -= q * std::log(q);
    }
    std::vector<std::pair<double, int>> order;
    for (int t = 0; t < 40; ++t) {
      if (p[t] > 0) order.push_back({std::abs(-std::log(p[t]) - entropy), t});
    }
    std::stable_sort(order.begin(), order.end());
    size_t last = 0;
    double cumulative = p[order[0].second];
    while (last + 1 < order.size() && cumulative < params.typical_p) {
      cumulative += p[order[++last].second];
    }
    if (std::abs(cumulative - p[order[last].second] - params.typical_p) < 1e-6) continue;
    std::set<int> want;
    for (const auto& [score, t] : order) {
      if (score <= order[last].first) want.insert(t);
    }
    const std::set<int> got = Support(FilteredProbs(params, logits));
    EXPECT_EQ(got, want) << "trial " << trial;
    differs += got != Support(p);
  }
  EXPECT_GT(differs, 40) << "typical_p should usually drop tokens";
  SamplingParams bad;
  bad.typical_p = 0.0f;
  EXPECT_FALSE(bad.Validate().ok());
  SamplingParams typical;
  typical.typical_p = 0.5f;
  EXPECT_FALSE(DeviceSamplable(typical));
}

// llama.cpp's repeat_last_n (penalty_last_n): the three penalties look at the last n tokens of
// prompt and output only, presence and frequency counting the window's prompt tokens too.
TEST(Sampler, PenaltyWindowLooksAtTheLastNTokens) {
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  const std::vector<int32_t> output = {5, 5, 6};
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  params.penalty_last_n = 4;  // tokens 4, 5, 5, 6
  std::vector<float> logits(8, 1.0f);
  ApplyPenalties(params, prompt, output, absl::MakeSpan(logits));
  // Outside the window (0, 1, 2, 3, 7): untouched. 4 and 6: once; 5: twice.
  for (int t : {0, 1, 2, 3, 7}) EXPECT_EQ(logits[t], 1.0f) << t;
  EXPECT_FLOAT_EQ(logits[4], 0.5f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[6], 0.5f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[5], 0.5f - 0.5f - 0.5f);
  // A window longer than everything: the prompt's tokens count for presence too.
  params.penalty_last_n = 100;
  std::vector<float> all(8, 1.0f);
  ApplyPenalties(params, prompt, output, absl::MakeSpan(all));
  EXPECT_FLOAT_EQ(all[1], 0.5f - 0.5f - 0.25f);
  // Without a window (the default): repetition over everything, presence over the output only.
  params.penalty_last_n = -1;
  std::vector<float> plain(8, 1.0f);
  ApplyPenalties(params, prompt, output, absl::MakeSpan(plain));
  EXPECT_FLOAT_EQ(plain[1], 0.5f);
  SamplingParams zero;
  zero.penalty_last_n = 0;
  EXPECT_FALSE(zero.Validate().ok());
}

TEST(Sampler, PenaltiesFollowTheFormulas) {
  std::mt19937_64 rng(5);
  const std::vector<float> logits = RandomLogits(rng, 10);
  SamplingParams params;
  params.repetition_penalty = 1.3f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  const std::vector<int32_t> prompt = {1, 2, 2};
  const std::vector<int32_t> output = {2, 3, 3, 3, 9};
  std::vector<float> got = logits;
  ApplyPenalties(params, prompt, output, absl::MakeSpan(got));
  const int count[10] = {0, 0, 1, 3, 0, 0, 0, 0, 0, 1};
  for (int t = 0; t < 10; ++t) {
    float want = logits[t];
    if (t == 1 || t == 2 || t == 3 || t == 9) want = want > 0 ? want / 1.3f : want * 1.3f;
    want -= 0.25f * count[t] + (count[t] > 0 ? 0.5f : 0.0f);
    EXPECT_FLOAT_EQ(got[t], want) << "token " << t;
  }
}

// logit_bias is added first (a repetition penalty then scales the biased logit); ids outside the
// row are ignored.
TEST(Sampler, LogitBiasIsAddedBeforeThePenalties) {
  std::mt19937_64 rng(6);
  const std::vector<float> logits = RandomLogits(rng, 10);
  SamplingParams params;
  params.logit_bias = {{4, 2.5f}, {2, -1.0f}, {99, 3.0f}};
  params.repetition_penalty = 1.3f;
  const std::vector<int32_t> prompt = {2};
  std::vector<float> got = logits;
  ApplyPenalties(params, prompt, {}, absl::MakeSpan(got));
  for (int t = 0; t < 10; ++t) {
    float want = logits[t] + (t == 4 ? 2.5f : t == 2 ? -1.0f : 0.0f);
    if (t == 2) want = want > 0 ? want / 1.3f : want * 1.3f;
    EXPECT_FLOAT_EQ(got[t], want) << "token " << t;
  }
  params = SamplingParams();
  params.temperature = 0;
  params.logit_bias = {{7, 100.0f}};
  SamplingContext context{&params, {}, {}, -1, nullptr};
  EXPECT_EQ(Sample(logits, context).token_id, 7);
}

// vLLM's allowed_token_ids: only those tokens are ever drawn, greedy or sampled, and a
// log-probability is still the model's (the raw row's).
TEST(Sampler, AllowedTokenIdsRestrictTheDraws) {
  std::mt19937_64 rng(21);
  const std::vector<float> logits = RandomLogits(rng, 64);
  SamplingParams params;
  params.allowed_token_ids = {3, 17, 40};
  params.logprobs = 0;
  SampleRng draws(5);
  std::set<int32_t> seen;
  for (int i = 0; i < 300; ++i) {
    SamplingContext context{&params, {}, {}, -1, &draws};
    seen.insert(Sample(logits, context).token_id);
  }
  EXPECT_EQ(seen, std::set<int32_t>({3, 17, 40}));
  params.temperature = 0;
  SamplingContext greedy{&params, {}, {}, -1, nullptr};
  const SampleResult best = Sample(logits, greedy);
  int32_t want = 3;
  for (int32_t t : params.allowed_token_ids) want = logits[t] > logits[want] ? t : want;
  EXPECT_EQ(best.token_id, want);
  EXPECT_FLOAT_EQ(best.logprob, ScoreToken(logits, want, 0).logprob);
  params.allowed_token_ids = {-1};
  EXPECT_NE(params.Validate().message().find("allowed_token_ids"), std::string::npos);
}

// bad_words (vLLM): a one-token word is never drawn; a longer word's last token only where the
// output ends with the rest of it (the prompt does not count).
TEST(Sampler, BadWordsMaskTheTokenThatWouldCompleteThem) {
  std::vector<float> logits(8, 0.0f);
  logits[5] = 9.0f;  // the argmax, unless masked
  logits[6] = 8.0f;
  SamplingParams params;
  params.temperature = 0;
  params.bad_words_token_ids = {{2, 3, 5}, {7}};
  auto greedy = [&](std::vector<int32_t> prompt, std::vector<int32_t> output) {
    SamplingContext context{&params, prompt, output, -1, nullptr};
    return Sample(logits, context).token_id;
  };
  EXPECT_EQ(greedy({}, {1, 2, 3}), 6);     // "2 3" then 5 would complete the word
  EXPECT_EQ(greedy({}, {2, 3, 1}), 5);     // not at the end
  EXPECT_EQ(greedy({2}, {3}), 5);          // the prompt does not count
  EXPECT_EQ(greedy({}, {2}), 5);
  logits[7] = 20.0f;
  EXPECT_EQ(greedy({}, {}), 5);            // a one-token word never
  EXPECT_FALSE(DeviceSamplable(params));
}

TEST(Sampler, GreedyTakesTheArgmaxAfterPenaltiesWithoutRandomness) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f};
  SamplingParams params;
  params.temperature = 0;
  SampleRng rng(7);
  const SampleRng before = rng;
  SamplingContext context{&params, {}, {}, -1, &rng};
  EXPECT_EQ(Sample(logits, context).token_id, 1);
  const std::vector<int32_t> output = {1};
  params.frequency_penalty = 0.2f;
  context.output_tokens = output;
  EXPECT_EQ(Sample(logits, context).token_id, 2);
  EXPECT_TRUE(rng == before);
}

TEST(Sampler, MinTokensMasksEosAndStopTokens) {
  std::vector<float> logits = {5.0f, 4.0f, 0.0f, -1.0f};  // EOS = 0, stop token 1
  SamplingParams params;
  params.temperature = 0;
  params.min_tokens = 2;
  params.stop_token_ids = {1};
  SamplingContext context{&params, {}, {}, /*eos=*/0, nullptr};
  const std::vector<int32_t> one = {2};
  context.output_tokens = one;
  EXPECT_EQ(Sample(logits, context).token_id, 2);
  const std::vector<int32_t> two = {2, 2};
  context.output_tokens = two;
  EXPECT_EQ(Sample(logits, context).token_id, 0);
  params.ignore_eos = true;
  context.output_tokens = one;
  EXPECT_EQ(Sample(logits, context).token_id, 0);  // EOS is not masked with ignore_eos
}

TEST(Sampler, SameSeedSameDrawsAndFrequenciesMatchProbabilities) {
  std::mt19937_64 rng(6);
  const std::vector<float> logits = RandomLogits(rng, 8);
  SamplingParams params;
  params.temperature = 1.2f;
  SampleRng a(SampleSeed(42, 0)), b(SampleSeed(42, 0)), c(SampleSeed(42, 1));
  std::vector<int> counts(8, 0);
  int differ = 0;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) {
    const int32_t ta = Sample(logits, {&params, {}, {}, -1, &a}).token_id;
    const int32_t tb = Sample(logits, {&params, {}, {}, -1, &b}).token_id;
    const int32_t tc = Sample(logits, {&params, {}, {}, -1, &c}).token_id;
    ASSERT_EQ(ta, tb);
    differ += ta != tc;
    ++counts[ta];
  }
  EXPECT_GT(differ, draws / 4);  // another sample index is another stream
  const std::vector<double> p = Softmax(logits, params.temperature);
  for (int t = 0; t < 8; ++t) {
    const double sigma = std::sqrt(draws * p[t] * (1 - p[t]));
    EXPECT_NEAR(counts[t], draws * p[t], 5 * sigma + 1) << "token " << t;
  }
}

TEST(Sampler, LogprobsAreTheRawLogSoftmax) {
  std::mt19937_64 rng(8);
  const std::vector<float> logits = RandomLogits(rng, 20);
  SamplingParams params;
  params.logprobs = 20;
  params.temperature = 0.3f;
  params.repetition_penalty = 1.5f;
  SampleRng sample_rng(3);
  const std::vector<int32_t> output = {4, 5};
  const SampleResult result = Sample(logits, {&params, {}, output, -1, &sample_rng});
  const std::vector<double> p = Softmax(logits, 1.0);
  EXPECT_NEAR(result.logprob, std::log(p[result.token_id]), 1e-5);
  ASSERT_EQ(result.top_logprobs.size(), 20u);
  double sum = 0;
  for (size_t i = 0; i < result.top_logprobs.size(); ++i) {
    const TokenLogprob& lp = result.top_logprobs[i];
    EXPECT_NEAR(lp.logprob, std::log(p[lp.token_id]), 1e-5);
    if (i > 0) EXPECT_GE(result.top_logprobs[i - 1].logprob, lp.logprob);
    sum += std::exp(lp.logprob);
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
  params.logprobs = 3;
  const SampleResult top3 = Sample(logits, {&params, {}, output, -1, &sample_rng});
  ASSERT_EQ(top3.top_logprobs.size(), 3u);
  const std::vector<int> ranked = Ranked(p);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(top3.top_logprobs[i].token_id, ranked[i]);
}

// ScoreToken's vectorised passes (max, log-sum-exp with its own exp, rank, one-pass top-k)
// against a plain double-precision reference on StarCoder-sized rows with repeated values (ties),
// a masked (-inf) entry, a length that is not a multiple of the vector width, and a row spread
// wide enough that the exp's clamp is reached.
TEST(Sampler, ScoreTokenMatchesAPlainReferenceOnLargeRows) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 6; ++trial) {
    const size_t vocab = 49152 + trial;
    const float spread = trial == 5 ? 60.0f : 4.0f;
    std::normal_distribution<float> dist(0.0f, spread);
    std::vector<float> row(vocab);
    for (float& x : row) x = std::round(dist(rng) * 8.0f) / 8.0f;  // coarse: many ties
    row[rng() % vocab] = -std::numeric_limits<float>::infinity();
    const double max = *std::max_element(row.begin(), row.end());
    double sum = 0;
    for (float x : row) sum += std::exp(static_cast<double>(x) - max);
    const double log_z = max + std::log(sum);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    for (int32_t token : {order[0], order[7], order[vocab / 2], static_cast<int32_t>(vocab - 1)}) {
      const SampleResult got = ScoreToken(row, token, 20);
      EXPECT_NEAR(got.logprob, row[token] - log_z, 1e-5) << trial;
      const int32_t rank =
          1 + static_cast<int32_t>(
                  std::count_if(row.begin(), row.end(), [&](float x) { return x > row[token]; }));
      EXPECT_EQ(got.rank, rank) << trial;
      ASSERT_EQ(got.top_logprobs.size(), 20u);
      for (int k = 0; k < 20; ++k) {
        EXPECT_EQ(got.top_logprobs[k].token_id, order[k]) << trial << " " << k;
        EXPECT_NEAR(got.top_logprobs[k].logprob, row[order[k]] - log_z, 1e-5);
      }
    }
  }
}

TEST(SamplingParams, ValidateNamesTheBadField) {
  SamplingParams params;
  EXPECT_TRUE(params.Validate().ok());
  params.top_p = 0;
  EXPECT_NE(params.Validate().message().find("top_p"), std::string::npos);
  params = SamplingParams();
  params.min_tokens = 20;
  EXPECT_EQ(params.Validate().code(), absl::StatusCode::kInvalidArgument);
  params = SamplingParams();
  params.logprobs = 21;
  EXPECT_FALSE(params.Validate().ok());
  params = SamplingParams();
  params.n = 0;
  EXPECT_FALSE(params.Validate().ok());
  params = SamplingParams();
  params.logit_bias = {{3, 100.5f}};
  EXPECT_NE(params.Validate().message().find("logit_bias"), std::string::npos);
  params.logit_bias = {{-1, 1.0f}};
  EXPECT_NE(params.Validate().message().find("logit_bias"), std::string::npos);
  params.logit_bias = {{3, -100.0f}};
  EXPECT_TRUE(params.Validate().ok());
  // max_tokens 0 only scores a prompt: it needs prompt_logprobs and one sample.
  params = SamplingParams();
  params.max_tokens = 0;
  EXPECT_NE(params.Validate().message().find("max_tokens"), std::string::npos);
  params.prompt_logprobs = 0;
  EXPECT_TRUE(params.Validate().ok());
  params.n = 2;
  EXPECT_NE(params.Validate().message().find("max_tokens"), std::string::npos);
  params = SamplingParams();
  params.prompt_logprobs = 21;
  EXPECT_NE(params.Validate().message().find("prompt_logprobs"), std::string::npos);
}

TEST(Sampler, ScoreTokenIsTheLogSoftmaxAndTheBestTokens) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  const SampleResult scored = ScoreToken(logits, 4, 3);
  EXPECT_EQ(scored.token_id, 4);
  EXPECT_NEAR(scored.logprob, 0.5 - std::log(z), 1e-6);
  ASSERT_EQ(scored.top_logprobs.size(), 3u);
  EXPECT_EQ(scored.top_logprobs[0].token_id, 1);  // ties by id
  EXPECT_EQ(scored.top_logprobs[1].token_id, 3);
  EXPECT_EQ(scored.top_logprobs[2].token_id, 0);
  EXPECT_NEAR(scored.top_logprobs[2].logprob, 1.0 - std::log(z), 1e-6);
  EXPECT_EQ(scored.rank, 4);
  EXPECT_EQ(ScoreToken(logits, 3, 1).rank, 1);  // tied with token 1: nothing is more likely
  EXPECT_TRUE(ScoreToken(logits, 2, 0).top_logprobs.empty());
  EXPECT_EQ(ScoreToken(logits, 2, 0).rank, 5);
}

TEST(StopStringMatcher, FindsStopsAcrossDeltasAndHoldsBackPrefixes) {
  StopStringMatcher matcher({"END", "xy"});
  std::string emitted;
  emitted += matcher.Push("abc E").text;
  EXPECT_EQ(emitted, "abc ");  // "E" may start "END"
  emitted += matcher.Push("N").text;
  EXPECT_EQ(emitted, "abc ");
  StopStringMatcher::Result r = matcher.Push("Dzz");
  emitted += r.text;
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stop, "END");
  EXPECT_EQ(emitted, "abc ");
  EXPECT_TRUE(matcher.Push("more").text.empty());

  StopStringMatcher include({"xy"}, /*include_stop=*/true);
  r = include.Push("axxy!");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "axxy");

  StopStringMatcher flush({"abc"});
  EXPECT_EQ(flush.Push("xxab").text, "xx");
  EXPECT_EQ(flush.Flush(), "ab");
}

}  // namespace
}  // namespace mqa
