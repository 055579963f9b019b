#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/sampling.h"

namespace mqa {
namespace {

int32_t SampleRow(const float* logits, int64_t vocab, const RowSamplingParams& rp) {
  if (rp.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  std::vector<float> x(vocab);
  for (int64_t i = 0; i < vocab; ++i) x[i] = logits[i] / rp.temperature;
  const float max_x = *std::max_element(x.begin(), x.end());
  float threshold = -INFINITY;
  if (rp.top_k > 0 && rp.top_k < vocab) {
    std::vector<float> sorted = x;
    std::nth_element(sorted.begin(), sorted.begin() + (rp.top_k - 1), sorted.end(),
                     std::greater<float>());
    threshold = sorted[rp.top_k - 1];
  }
  std::vector<float> e(vocab);
  for (int64_t i = 0; i < vocab; ++i) e[i] = std::exp(x[i] - max_x);
  if (rp.top_p < 1.0f) {
    double kept_mass = 0;
    std::vector<int64_t> order;
    for (int64_t i = 0; i < vocab; ++i) {
      if (x[i] >= threshold) {
        kept_mass += e[i];
        order.push_back(i);
      }
    }
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[a] > x[b]; });
    const double target = static_cast<double>(rp.top_p) * kept_mass;
    double cum = 0;
    for (size_t j = 0; j < order.size(); ++j) {
      // Whole groups of equal values: the cut falls after the group that reaches the target.
      const float v = x[order[j]];
      size_t end = j;
      while (end < order.size() && x[order[end]] == v) cum += e[order[end++]];
      if (cum >= target) {
        threshold = std::max(threshold, v);
        break;
      }
      j = end - 1;
    }
  }
  double mass = 0;
  int32_t last = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (x[i] >= threshold) {
      mass += e[i];
      last = static_cast<int32_t>(i);
    }
  }
  const double target = static_cast<double>(SampleUniform(rp.seed, rp.offset)) * mass;
  double cum = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (x[i] >= threshold) {
      cum += e[i];
      if (cum > target) return static_cast<int32_t>(i);
    }
  }
  return last;
}

}  // namespace

absl::Status SampleTokensCpu(const SampleTokensParams& p) {
  if (p.vocab <= 0 || p.ld < p.vocab || p.rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleTokensCpu: vocab ", p.vocab, ", ld ", p.ld, ", rows ", p.rows));
  }
  if (p.rows == 0) return absl::OkStatus();
  if (!p.logits || !p.params || !p.tokens) {
    return absl::InvalidArgumentError("SampleTokensCpu: null pointer");
  }
  for (int64_t r = 0; r < p.rows; ++r) {
    p.tokens[r] = SampleRow(p.logits + r * p.ld, p.vocab, p.params[r]);
  }
  return absl::OkStatus();
}

}  // namespace mqa
