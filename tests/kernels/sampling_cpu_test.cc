// The sampling reference (kernels/sampling.h): greedy is argmax, top-k 1 is argmax at any
// temperature, the same seed and offset give the same token, top-k / top-p keep exactly the
// expected set, and draws follow the softmax (chi-square bound on a small vocabulary).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <numeric>
#include <set>

#include "kernels/sampling.h"

namespace mqa {
namespace {

int32_t SampleOne(const std::vector<float>& logits, const RowSamplingParams& p) {
  int32_t token = -1;
  SampleTokensParams sp;
  sp.logits = logits.data();
  sp.rows = 1;
  sp.vocab = static_cast<int64_t>(logits.size());
  sp.ld = sp.vocab;
  sp.params = &p;
  sp.tokens = &token;
  EXPECT_TRUE(SampleTokensCpu(sp).ok());
  return token;
}

TEST(SamplingCpu, GreedyAndTopKOneAreArgmax) {
  std::mt19937 rng{std::random_device{}()};
  std::normal_distribution<float> normal;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits(500);
    for (float& x : logits) x = normal(rng);
    const int32_t argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
    RowSamplingParams p;
    EXPECT_EQ(SampleOne(logits, p), argmax);
    p.temperature = 2.0f;
    p.top_k = 1;
    p.seed = rng();
    EXPECT_EQ(SampleOne(logits, p), argmax);
  }
}

TEST(SamplingCpu, SeededDrawsRepeatAndFollowTheKeptSet) {
  std::mt19937 rng{std::random_device{}()};
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(200);
  for (float& x : logits) x = normal(rng);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  RowSamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 7;
  std::set<int> top7(order.begin(), order.begin() + 7);
  std::set<int> seen;
  for (uint64_t off = 0; off < 400; ++off) {
    p.seed = 1234;
    p.offset = off;
    const int32_t a = SampleOne(logits, p);
    EXPECT_EQ(a, SampleOne(logits, p));
    EXPECT_TRUE(top7.contains(a)) << a;
    seen.insert(a);
  }
  EXPECT_GT(seen.size(), 1u);
  // top-p: the smallest prefix (by probability) reaching 0.5.
  p.top_k = -1;
  p.top_p = 0.5f;
  std::vector<double> e(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += e[i] = std::exp(logits[i] / 0.8 - logits[order[0]] / 0.8);
  std::set<int> nucleus;
  double cum = 0;
  for (int i : order) {
    nucleus.insert(i);
    cum += e[i];
    if (cum >= 0.5 * z) break;
  }
  for (uint64_t off = 0; off < 300; ++off) {
    p.offset = off;
    EXPECT_TRUE(nucleus.contains(SampleOne(logits, p)));
  }
}

TEST(SamplingCpu, DrawsFollowTheSoftmax) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f};
  std::vector<double> prob(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += prob[i] = std::exp(logits[i]);
  for (double& q : prob) q /= z;
  std::vector<int> count(logits.size());
  RowSamplingParams p;
  p.temperature = 1.0f;
  p.seed = std::random_device{}();
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    p.offset = i;
    ++count[SampleOne(logits, p)];
  }
  double chi2 = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    chi2 += (count[i] - n * prob[i]) * (count[i] - n * prob[i]) / (n * prob[i]);
  }
  EXPECT_LT(chi2, 25.0);  // 4 degrees of freedom: p < 1e-4 by chance
}

}  // namespace
}  // namespace mqa
