// The CPU reference of paged attention against dense causal attention in double precision, on
// random data, random block tables, mixed prefill chunks and decodes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/paged_attention.h"
#include "tests/kernels/attention_test_util.h"

namespace mqa {
namespace {

using testing::MakePagedBatch;
using testing::PagedBatch;
using testing::SeqSpec;

struct Shape {
  int num_heads, num_kv_heads, head_dim, block_size;
};

class PagedAttentionCpuTest : public ::testing::TestWithParam<Shape> {};

TEST_P(PagedAttentionCpuTest, MatchesDenseCausalOnMixedBatch) {
  const Shape sh = GetParam();
  std::mt19937 rng(1234 + sh.num_heads * 7 + sh.block_size);
  // Decodes (q_len 1), whole prompts (q_len = context), chunks starting mid-sequence, lengths
  // that are not multiples of the block size, a one-token context.
  std::vector<SeqSpec> seqs = {{1, 1},
                               {37, 1},
                               {20, 20},
                               {45, 13},
                               {sh.block_size, 1},
                               {2 * sh.block_size + 1, 2 * sh.block_size + 1},
                               {70, 1},
                               {9, 4}};
  PagedBatch b =
      MakePagedBatch(seqs, sh.num_heads, sh.num_kv_heads, sh.head_dim, sh.block_size, rng);
  std::vector<float> out(b.query.size(), std::nanf(""));
  PagedAttentionParams p = testing::HostParams(b, out);
  ASSERT_TRUE(PagedAttentionCpu(p).ok());
  const std::vector<double> ref = testing::DenseCausalReference(b, p.scale);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << "element " << i << " not written";
    ASSERT_NEAR(out[i], ref[i], 1e-4) << "element " << i;
  }
  EXPECT_LT(testing::RelativeError(out, ref), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionCpuTest,
                         ::testing::Values(Shape{8, 1, 16, 8}, Shape{6, 1, 32, 16},
                                           Shape{4, 4, 16, 32}, Shape{6, 2, 8, 16},
                                           Shape{3, 3, 64, 8}, Shape{12, 1, 64, 32}));

TEST(PagedAttentionCpu, QueryStrideLargerThanRowIsHonoured) {
  std::mt19937 rng(99);
  PagedBatch b = MakePagedBatch({{11, 3}, {5, 1}}, 4, 1, 8, 8, rng);
  // Embed the queries in a wider row (as the fused QKV projection output is laid out).
  const int64_t row = 4 * 8, stride = row + 2 * 8;
  std::vector<float> wide(b.num_tokens * stride, 1e6f);
  for (int t = 0; t < b.num_tokens; ++t) {
    std::copy(b.query.begin() + t * row, b.query.begin() + (t + 1) * row,
              wide.begin() + t * stride);
  }
  std::vector<float> out(b.query.size(), std::nanf(""));
  PagedAttentionParams p = testing::HostParams(b, out);
  p.query = wide.data();
  p.query_stride = stride;
  ASSERT_TRUE(PagedAttentionCpu(p).ok());
  EXPECT_LT(testing::RelativeError(out, testing::DenseCausalReference(b, p.scale)), 1e-5);
}

TEST(PagedAttentionCpu, RejectsBadParameters) {
  std::mt19937 rng(5);
  PagedBatch b = MakePagedBatch({{10, 2}, {4, 1}}, 4, 2, 8, 8, rng);
  std::vector<float> out(b.query.size());
  const PagedAttentionParams good = testing::HostParams(b, out);
  ASSERT_TRUE(PagedAttentionCpu(good).ok());

  auto expect_invalid = [](const PagedAttentionParams& p, const char* what) {
    absl::Status s = PagedAttentionCpu(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what << ": " << s;
  };
  PagedAttentionParams p = good;
  p.dtype = DType::kF16;
  expect_invalid(p, "fp16");
  p = good;
  p.num_kv_heads = 3;
  expect_invalid(p, "heads % kv heads");
  p = good;
  p.query_stride = 4 * 8 - 1;
  expect_invalid(p, "short query stride");
  p = good;
  p.head_dim = 0;
  expect_invalid(p, "zero head_dim");
  p = good;
  p.max_context_len = 9;
  expect_invalid(p, "context above max_context_len");

  std::vector<int32_t> ctx = b.context_lens;
  ctx[0] = 1;  // shorter than its 2 queries
  p = good;
  p.context_lens = ctx.data();
  expect_invalid(p, "context shorter than query");

  std::vector<int32_t> qs = b.query_start;
  qs[2] = 2;  // does not end at num_tokens
  p = good;
  p.query_start = qs.data();
  expect_invalid(p, "query_start end");

  std::vector<int32_t> tables = b.block_tables;
  tables[0] = -1;
  p = good;
  p.block_tables = tables.data();
  expect_invalid(p, "negative block");
}

TEST(PagedAttentionCpu, EmptyBatchIsOk) {
  PagedAttentionParams p;
  p.num_heads = 4;
  p.head_dim = 8;
  p.query_stride = 32;
  EXPECT_TRUE(PagedAttentionCpu(p).ok());
}

}  // namespace
}  // namespace mqa
