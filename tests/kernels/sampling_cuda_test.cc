// SampleTokensCuda against SampleTokensCpu on fresh random logits: greedy, temperature, top-k,
// top-p and their combinations, each row with its own seed and offset. Floating-point sums differ
// between the two (fp32 on the GPU, double on the CPU), so a draw that lands within rounding of a
// boundary may differ: at most 1% of the rows, and every GPU token inside the kept set. Greedy is
// exact. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "kernels/sampling_cuda.h"
#include "tests/kernels/forward_cuda_test_util.h"

namespace mqa {
namespace {

using testing::DeviceMem;

TEST(SamplingCuda, MatchesCpuReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng{std::random_device{}()};
  for (int64_t vocab : {49152, 1001, 50}) {
    const int rows = 256;
    std::vector<float> logits(rows * vocab);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& x : logits) x = normal(rng);
    std::vector<RowSamplingParams> params(rows);
    for (int r = 0; r < rows; ++r) {
      RowSamplingParams& p = params[r];
      const int kind = r % 6;
      p.temperature = kind == 0 ? 0.0f : std::uniform_real_distribution<float>(0.3f, 1.5f)(rng);
      p.top_k = (kind == 2 || kind == 4) ? std::uniform_int_distribution<int>(1, 60)(rng) : -1;
      p.top_p = (kind == 3 || kind == 4) ? std::uniform_real_distribution<float>(0.1f, 0.99f)(rng)
                                         : 1.0f;
      p.seed = rng();
      p.offset = r * 7;
    }
    auto dl = DeviceMem::From(logits), dp = DeviceMem::From(params);
    DeviceMem dt(rows * sizeof(int32_t));
    dt.Poison();
    SampleTokensParams sp;
    sp.logits = dl->get<float>();
    sp.rows = rows;
    sp.vocab = vocab;
    sp.ld = vocab;
    sp.params = dp->get<RowSamplingParams>();
    sp.tokens = dt.get<int32_t>();
    ASSERT_TRUE(SampleTokensCuda(sp, nullptr).ok());
    const auto got = dt.Download<int32_t>();
    std::vector<int32_t> want(rows);
    sp.logits = logits.data();
    sp.params = params.data();
    sp.tokens = want.data();
    ASSERT_TRUE(SampleTokensCpu(sp).ok());
    int differ = 0;
    for (int r = 0; r < rows; ++r) {
      ASSERT_GE(got[r], 0);
      ASSERT_LT(got[r], vocab);
      if (params[r].temperature <= 0) {
        EXPECT_EQ(got[r], want[r]) << "greedy row " << r;
      } else if (got[r] != want[r]) {
        ++differ;
        // The GPU's token must still be inside top-k.
        if (params[r].top_k > 0) {
          const float* row = logits.data() + r * vocab;
          const int above = std::count_if(row, row + vocab, [&](float x) { return x > row[got[r]]; });
          EXPECT_LT(above, params[r].top_k) << "row " << r;
        }
      }
    }
    EXPECT_LE(differ, rows / 100) << "vocab " << vocab;
  }
}

}  // namespace
}  // namespace mqa
