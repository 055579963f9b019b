#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/layer_norm.h"

namespace mqa {

absl::Status LayerNormCpu(const LayerNormParams& p) {
  if (p.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("LayerNormCpu: dtype ", std::string(DTypeName(p.dtype)), " (only float32)"));
  }
  if (p.rows < 0 || p.cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LayerNormCpu: rows ", p.rows, ", cols ", p.cols));
  }
  if (p.rows == 0) return absl::OkStatus();
  if (!p.input || !p.output || !p.weight || !p.bias) {
    return absl::InvalidArgumentError("LayerNormCpu: null pointer");
  }
  const float* in = static_cast<const float*>(p.input);
  float* out = static_cast<float*>(p.output);
  const float* w = static_cast<const float*>(p.weight);
  const float* b = static_cast<const float*>(p.bias);
  const int64_t n = p.cols;
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = in + r * n;
    float* y = out + r * n;
    // Two passes (mean, then centred squares): no cancellation for rows with a large mean.
    double sum = 0;
    for (int64_t c = 0; c < n; ++c) sum += x[c];
    const double mean = sum / n;
    double sq = 0;
    for (int64_t c = 0; c < n; ++c) {
      const double d = x[c] - mean;
      sq += d * d;
    }
    const double inv_std = 1.0 / std::sqrt(sq / n + static_cast<double>(p.epsilon));
    for (int64_t c = 0; c < n; ++c) {
      y[c] = static_cast<float>((x[c] - mean) * inv_std * w[c] + b[c]);
    }
  }
  return absl::OkStatus();
}

}  // namespace mqa
