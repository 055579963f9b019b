// SampleTokensCuda against SampleTokensCpu on fresh random logits: greedy, temperature, top-k,
// top-p and their combinations, each row with its own seed and offset. Floating-point sums differ
// between the two (fp32 on the GPU, double on the CPU), so a draw that lands within rounding of a
// boundary may differ: at most 1% of the rows, and every GPU token inside the kept set. Greedy is
// exact. SampleTokensCudaKernel::kGreedyCluster: greedy rows exactly as the CPU (ties to the
// first index, -inf), sampled rows in mixed batches exactly as kOneCtaPerRow, inside a CUDA graph.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "kernels/sampling_cuda.h"
#include "tests/kernels/forward_cuda_test_util.h"

namespace mqa {
namespace {

using testing::DeviceMem;

TEST(SamplingCuda, MatchesCpuReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng{std::random_device{}()};
  for (SampleTokensCudaKernel kernel :
       {SampleTokensCudaKernel::kOneCtaPerRow, SampleTokensCudaKernel::kGreedyCluster}) {
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
      ASSERT_TRUE(SampleTokensCuda(sp, nullptr, kernel).ok());
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
            const int above =
                std::count_if(row, row + vocab, [&](float x) { return x > row[got[r]]; });
            EXPECT_LT(above, params[r].top_k) << "row " << r;
          }
        }
      }
      EXPECT_LE(differ, rows / 100) << "vocab " << vocab << " kernel " << int(kernel);
    }
  }
}

// Greedy rows with planted ties (the largest value at several indices, across the cluster's
// slices too), rows of -inf with one finite value or none, and sampled rows in between.
std::vector<float> GreedyTestLogits(int rows, int64_t vocab, int64_t ld, std::mt19937& rng) {
  std::vector<float> logits(rows * ld, std::nanf(""));  // padding past vocab: never read
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int64_t> col(0, vocab - 1);
  for (int r = 0; r < rows; ++r) {
    float* row = logits.data() + r * ld;
    for (int64_t i = 0; i < vocab; ++i) row[i] = normal(rng);
    switch (r % 5) {
      case 0:
        break;
      case 1:  // a tie among up to four random indices
        for (int k = 0; k < 4; ++k) row[col(rng)] = 100.0f;
        break;
      case 2:  // a tie at the last index and one random index
        row[vocab - 1] = 100.0f;
        row[col(rng)] = 100.0f;
        break;
      case 3:  // all -inf except maybe one value
        for (int64_t i = 0; i < vocab; ++i) row[i] = -INFINITY;
        if (r % 2 == 1) row[col(rng)] = -5.0f;
        break;
      case 4:  // -inf sprinkled in, a tie at both ends
        for (int k = 0; k < 10; ++k) row[col(rng)] = -INFINITY;
        row[0] = row[vocab - 1] = 50.0f;
        break;
    }
  }
  return logits;
}

TEST(SamplingCuda, GreedyClusterMatchesCpuAndOneCtaPerRow) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng{std::random_device{}()};
  // (vocab, ld): float4 loads with and without a scalar tail; scalar loads (ld % 4 != 0); tiny.
  for (auto [vocab, ld] :
       {std::pair<int64_t, int64_t>{49152, 49152}, {1001, 1004}, {1001, 1001}, {50, 50}, {3, 3}}) {
    for (int rows : {1, 8, 33}) {
      for (bool mixed : {false, true}) {
        const std::string what = "vocab " + std::to_string(vocab) + " ld " + std::to_string(ld) +
                                 " rows " + std::to_string(rows) + " mixed " +
                                 std::to_string(mixed);
        const std::vector<float> logits = GreedyTestLogits(rows, vocab, ld, rng);
        std::vector<RowSamplingParams> params(rows);
        for (int r = 0; r < rows; ++r) {
          if (mixed && r % 3 == 1 && r % 5 != 3) {  // sampled (not on an all -inf row)
            params[r].temperature = 0.8f;
            params[r].top_k = r % 2 ? 40 : -1;
            params[r].top_p = r % 4 == 1 ? 0.9f : 1.0f;
            params[r].seed = rng();
            params[r].offset = r;
          }
        }
        std::vector<int32_t> want(rows);
        SampleTokensParams sp;
        sp.logits = logits.data();
        sp.rows = rows;
        sp.vocab = vocab;
        sp.ld = ld;
        sp.params = params.data();
        sp.tokens = want.data();
        ASSERT_TRUE(SampleTokensCpu(sp).ok());
        auto dl = DeviceMem::From(logits), dp = DeviceMem::From(params);
        DeviceMem old_tokens(rows * sizeof(int32_t)), new_tokens(rows * sizeof(int32_t));
        old_tokens.Poison();
        sp.logits = dl->get<float>();
        sp.params = dp->get<RowSamplingParams>();
        sp.tokens = old_tokens.get<int32_t>();
        ASSERT_TRUE(SampleTokensCuda(sp, nullptr, SampleTokensCudaKernel::kOneCtaPerRow).ok());
        const auto old_got = old_tokens.Download<int32_t>();
        // Eagerly, then twice as a graph on a real stream (tokens poisoned before each).
        cudaStream_t stream;
        ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
        sp.tokens = new_tokens.get<int32_t>();
        cudaGraphExec_t exec = nullptr;
        for (int run = 0; run < 3; ++run) {
          new_tokens.Poison();
          if (run == 0) {
            ASSERT_TRUE(SampleTokensCuda(sp, stream, SampleTokensCudaKernel::kGreedyCluster).ok());
          } else {
            if (exec == nullptr) {
              ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                        cudaSuccess);
              const bool ok =
                  SampleTokensCuda(sp, stream, SampleTokensCudaKernel::kGreedyCluster).ok();
              cudaGraph_t graph;
              ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
              ASSERT_TRUE(ok);
              ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
              cudaGraphDestroy(graph);
            }
            ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
          }
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          const auto got = new_tokens.Download<int32_t>();
          for (int r = 0; r < rows; ++r) {
            if (params[r].temperature <= 0) {
              EXPECT_EQ(got[r], want[r]) << what << " greedy row " << r << " run " << run;
              EXPECT_EQ(old_got[r], want[r]) << what << " greedy row " << r << " (one CTA)";
            } else {
              EXPECT_EQ(got[r], old_got[r]) << what << " sampled row " << r << " run " << run;
            }
          }
        }
        cudaGraphExecDestroy(exec);
        cudaStreamDestroy(stream);
      }
    }
  }
}

}  // namespace
}  // namespace mqa
