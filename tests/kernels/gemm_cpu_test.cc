#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm.h"

namespace mqa {
namespace {

struct Shape {
  int64_t m, n, k;
};

class GemmCpuTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GemmCpuTest, MatchesDoubleReferenceWithStridesAlphaBeta) {
  const Shape s = GetParam();
  const int64_t lda = s.k + 3, ldb = s.k + 1, ldc = s.n + 2;
  std::mt19937 rng(static_cast<uint32_t>(s.m * 1000 + s.n * 10 + s.k));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(s.m * lda), b(s.n * ldb), c(s.m * ldc);
  for (auto& v : a) v = normal(rng);
  for (auto& v : b) v = normal(rng);
  for (auto& v : c) v = normal(rng);
  const std::vector<float> c0 = c;
  for (float beta : {0.0f, 1.0f}) {
    c = c0;
    const float alpha = 0.75f;
    GemmParams p;
    p.a = a.data();
    p.b = b.data();
    p.c = c.data();
    p.lda = lda;
    p.ldb = ldb;
    p.ldc = ldc;
    p.m = s.m;
    p.n = s.n;
    p.k = s.k;
    p.alpha = alpha;
    p.beta = beta;
    ASSERT_TRUE(GemmCpu(p).ok());
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        if (j >= s.n) {  // padding between rows is untouched
          ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]);
          continue;
        }
        double acc = 0, mag = 0;
        for (int64_t l = 0; l < s.k; ++l) {
          acc += static_cast<double>(a[i * lda + l]) * b[j * ldb + l];
          mag += std::abs(static_cast<double>(a[i * lda + l]) * b[j * ldb + l]);
        }
        const double ref = alpha * acc + beta * c0[i * ldc + j];
        ASSERT_NEAR(c[i * ldc + j], ref, 1e-6 * (mag + 1)) << i << "," << j << " beta " << beta;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmCpuTest,
                         ::testing::Values(Shape{1, 1, 1}, Shape{1, 67, 48}, Shape{17, 5, 129},
                                           Shape{33, 96, 64}));

TEST(GemmCpuErrors, RejectsShortStride) {
  std::vector<float> x(16, 1.0f);
  GemmParams p;
  p.a = p.b = x.data();
  p.c = x.data() + 8;
  p.m = p.n = p.k = 2;
  p.lda = 1;
  p.ldb = p.ldc = 2;
  EXPECT_EQ(GemmCpu(p).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mqa
