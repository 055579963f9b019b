#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/layer_norm.h"

namespace mqa {
namespace {

std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>& b, int64_t rows, int64_t cols, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += x[r * cols + c];
    mean /= cols;
    for (int64_t c = 0; c < cols; ++c) var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
    var /= cols;
    for (int64_t c = 0; c < cols; ++c) {
      y[r * cols + c] = (x[r * cols + c] - mean) / std::sqrt(var + eps) * w[c] + b[c];
    }
  }
  return y;
}

class LayerNormCpuTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(LayerNormCpuTest, MatchesDoubleReference) {
  const int64_t rows = 7, cols = GetParam();
  const float eps = 1e-5f;
  std::mt19937 rng(1234 + cols);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * cols), w(cols), b(cols), y(rows * cols, NAN);
  // A large per-row offset: a one-pass (E[x^2] - mean^2) variance would lose digits here.
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = 3.0f * normal(rng) + 50.0f * r;
  }
  for (auto& v : w) v = 1.0f + 0.5f * normal(rng);
  for (auto& v : b) v = normal(rng);
  LayerNormParams p;
  p.input = x.data();
  p.output = y.data();
  p.weight = w.data();
  p.bias = b.data();
  p.rows = rows;
  p.cols = cols;
  p.epsilon = eps;
  ASSERT_TRUE(LayerNormCpu(p).ok());
  const std::vector<double> ref = Reference(x, w, b, rows, cols, eps);
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_NEAR(y[i], ref[i], 1e-5 * (1 + std::abs(ref[i]))) << i;
  }

  // In place gives the same result.
  std::vector<float> z = x;
  p.input = z.data();
  p.output = z.data();
  ASSERT_TRUE(LayerNormCpu(p).ok());
  EXPECT_EQ(z, y);
}

INSTANTIATE_TEST_SUITE_P(Widths, LayerNormCpuTest, ::testing::Values(1, 5, 64, 257));

TEST(LayerNormCpuErrors, RejectsBadParams) {
  std::vector<float> x(8, 1.0f);
  LayerNormParams p;
  p.input = p.output = x.data();
  p.weight = p.bias = x.data();
  p.rows = 2;
  p.cols = 4;
  p.dtype = DType::kF16;
  EXPECT_EQ(LayerNormCpu(p).code(), absl::StatusCode::kInvalidArgument);
  p.dtype = DType::kF32;
  p.bias = nullptr;
  EXPECT_EQ(LayerNormCpu(p).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mqa
