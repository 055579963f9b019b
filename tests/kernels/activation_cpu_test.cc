#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/activation.h"

namespace mqa {
namespace {

double ActRef(Activation a, double x) {
  switch (a) {
    case Activation::kIdentity:
      return x;
    case Activation::kGeluTanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::kGeluErf:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
  }
  return NAN;
}

struct Case {
  Activation act;
  bool bias;
  bool residual;
};

class BiasActivationCpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(BiasActivationCpuTest, MatchesDoubleReference) {
  const Case c = GetParam();
  const int64_t rows = 5, cols = 37;
  std::mt19937 rng(99 + static_cast<int>(c.act) * 4 + c.bias * 2 + c.residual);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(rows * cols), b(cols), res(rows * cols), y(rows * cols, NAN);
  for (auto& v : x) v = normal(rng);
  for (auto& v : b) v = normal(rng);
  for (auto& v : res) v = normal(rng);
  BiasActivationParams p;
  p.input = x.data();
  p.bias = c.bias ? b.data() : nullptr;
  p.residual = c.residual ? res.data() : nullptr;
  p.output = y.data();
  p.rows = rows;
  p.cols = cols;
  p.activation = c.act;
  ASSERT_TRUE(BiasActivationCpu(p).ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      const double ref = ActRef(c.act, static_cast<double>(x[i]) + (c.bias ? b[j] : 0.0)) +
                         (c.residual ? res[i] : 0.0);
      ASSERT_NEAR(y[i], ref, 2e-6 * (1 + std::abs(ref))) << r << "," << j;
    }
  }
  // In place over the residual (the forward's h += ...) gives the same values.
  if (c.residual) {
    std::vector<float> h = res;
    p.residual = h.data();
    p.output = h.data();
    ASSERT_TRUE(BiasActivationCpu(p).ok());
    EXPECT_EQ(h, y);
  }
}

INSTANTIATE_TEST_SUITE_P(All, BiasActivationCpuTest,
                         ::testing::Values(Case{Activation::kIdentity, true, false},
                                           Case{Activation::kIdentity, false, true},
                                           Case{Activation::kIdentity, true, true},
                                           Case{Activation::kGeluTanh, true, false},
                                           Case{Activation::kGeluTanh, false, false},
                                           Case{Activation::kGeluErf, true, true}));

TEST(BiasActivationCpu, TanhAndErfGeluDiffer) {
  // The two GELUs differ by ~1e-4 around |x| ~ 2: a mix-up would be visible in logits.
  float x = 2.0f, yt = 0, ye = 0;
  BiasActivationParams p;
  p.input = &x;
  p.rows = p.cols = 1;
  p.output = &yt;
  p.activation = Activation::kGeluTanh;
  ASSERT_TRUE(BiasActivationCpu(p).ok());
  p.output = &ye;
  p.activation = Activation::kGeluErf;
  ASSERT_TRUE(BiasActivationCpu(p).ok());
  EXPECT_GT(std::abs(yt - ye), 1e-5f);
}

TEST(ParseActivation, KnownAndUnknownNames) {
  EXPECT_EQ(*ParseActivation("gelu_pytorch_tanh"), Activation::kGeluTanh);
  EXPECT_EQ(*ParseActivation("gelu_new"), Activation::kGeluTanh);
  EXPECT_EQ(*ParseActivation("gelu"), Activation::kGeluErf);
  EXPECT_EQ(ParseActivation("relu").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mqa
