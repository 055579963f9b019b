// MqaBlockAttentionCuda (kernels/mqa_block_attention.h): one CTA's whole MQA decode attention on
// tensor cores, every CTA of a grid as wide as the GPU computing its own copy, against a host
// fp64 reference on fresh random fp16 / bf16 inputs: 1, 16, 24, 40 and 48 heads (one and three
// 16-row tiles, padding rows in three of them), contexts 1 .. 256 (partial 16-position tiles, whole
// warps past the context), a shuffled paged block table; the outputs poisoned first (every element
// of every copy must be written); what it refuses. Skips without a GPU.
#include "kernels/mqa_block_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/kernels/forward_cuda_test_util.h"

namespace mqa {
namespace {

using testing::DeviceMem;
using testing::RandomRounded;
using testing::RelError;
using testing::Widen;

class MqaBlockAttentionTest : public testing::CudaStreamTest<DType> {};

TEST_P(MqaBlockAttentionTest, EveryCtaMatchesHost) {
  const DType t = GetParam();
  constexpr int D = 128, kBlock = 16, kBlocks = 16;
  for (const int heads : {1, 16, 24, 40, 48}) {
    for (const int ctx : {1, 7, 17, 128, 200, 256}) {
      SCOPED_TRACE(::testing::Message() << "heads " << heads << " context " << ctx);
      std::vector<float> q, kc, vc;
      auto qd = DeviceMem::From(RandomRounded(q, heads * D, t, rng_));
      auto kd = DeviceMem::From(RandomRounded(kc, kBlocks * kBlock * D, t, rng_));
      auto vd = DeviceMem::From(RandomRounded(vc, kBlocks * kBlock * D, t, rng_));
      std::vector<int32_t> table(kBlocks);
      for (int i = 0; i < kBlocks; ++i) table[i] = (i * 7 + 3) % kBlocks;
      auto td = DeviceMem::From(table);
      const int grid = sms_;
      DeviceMem out(static_cast<size_t>(grid) * heads * D * 2);
      out.Poison();
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      MqaBlockAttentionParams p;
      p.dtype = t;
      p.query = qd->get();
      p.key_cache = kd->get();
      p.value_cache = vd->get();
      p.block_table = td->get<int32_t>();
      p.block_size = kBlock;
      p.context = ctx;
      p.heads = heads;
      p.scale = scale;
      p.output = out.get();
      p.grid = grid;
      const absl::Status st = MqaBlockAttentionCuda(p, stream_);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);

      std::vector<float> want(heads * D);
      for (int h = 0; h < heads; ++h) {
        auto row = [&](const std::vector<float>& cache, int pos, int d) {
          return cache[(static_cast<int64_t>(table[pos / kBlock]) * kBlock + pos % kBlock) * D + d];
        };
        std::vector<double> w(ctx);
        double m = -1e300, sum = 0;
        for (int pos = 0; pos < ctx; ++pos) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(q[h * D + d]) * row(kc, pos, d);
          w[pos] = dot * scale;
          m = std::max(m, w[pos]);
        }
        for (double& x : w) sum += (x = std::exp(x - m));
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (int pos = 0; pos < ctx; ++pos) o += w[pos] * row(vc, pos, d);
          want[h * D + d] = static_cast<float>(o / sum);
        }
      }
      const std::vector<float> got = Widen(out.Download<uint16_t>(), t);
      const double tol = t == DType::kF16 ? 3e-3 : 2e-2;
      for (int c = 0; c < grid; ++c) {
        const std::vector<float> copy(got.begin() + static_cast<int64_t>(c) * heads * D,
                                      got.begin() + static_cast<int64_t>(c + 1) * heads * D);
        ASSERT_LT(RelError(copy, want), tol) << "CTA " << c;
      }
    }
  }
}

TEST_P(MqaBlockAttentionTest, RefusesWhatItCannotRun) {
  DeviceMem buf(1 << 16);
  MqaBlockAttentionParams p;
  p.dtype = GetParam();
  p.query = p.key_cache = p.value_cache = p.output = buf.get();
  p.block_table = buf.get<int32_t>();
  p.heads = 48;
  p.context = 257;
  EXPECT_TRUE(absl::IsInvalidArgument(MqaBlockAttentionCuda(p, stream_)));
  p.context = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(MqaBlockAttentionCuda(p, stream_)));
  p.context = 16;
  p.heads = 49;
  EXPECT_TRUE(absl::IsInvalidArgument(MqaBlockAttentionCuda(p, stream_)));
  p.heads = 48;
  p.dtype = DType::kF32;
  EXPECT_TRUE(absl::IsInvalidArgument(MqaBlockAttentionCuda(p, stream_)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MqaBlockAttentionTest,
                         ::testing::Values(DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace mqa
