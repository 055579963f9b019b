#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/embedding.h"

namespace mqa {
namespace {

TEST(EmbeddingCpu, TokenPlusPositionAndShardZeros) {
  const int64_t vocab = 23, hidden = 9, n_pos = 13, n = 11;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> wte(vocab * hidden), wpe(n_pos * hidden);
  for (auto& v : wte) v = normal(rng);
  for (auto& v : wpe) v = normal(rng);
  std::vector<int32_t> ids(n), pos(n);
  for (int64_t t = 0; t < n; ++t) {
    ids[t] = static_cast<int32_t>(rng() % vocab);
    pos[t] = static_cast<int32_t>(rng() % n_pos);
  }
  // The full table, then two vocab shards [0, 12) and [12, 24) whose sum must equal it.
  const int64_t shard = 12;
  std::vector<float> full(n * hidden, NAN), sum(n * hidden, 0.0f);
  EmbeddingParams p;
  p.ids = ids.data();
  p.positions = pos.data();
  p.table = wte.data();
  p.table_rows = vocab;
  p.position_table = wpe.data();
  p.position_rows = n_pos;
  p.output = full.data();
  p.num_tokens = n;
  p.hidden = hidden;
  ASSERT_TRUE(EmbeddingCpu(p).ok());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < hidden; ++c) {
      ASSERT_FLOAT_EQ(full[t * hidden + c], wte[ids[t] * hidden + c] + wpe[pos[t] * hidden + c]);
    }
  }
  for (int r = 0; r < 2; ++r) {
    std::vector<float> part(n * hidden, NAN);
    EmbeddingParams q = p;
    q.table = wte.data() + r * shard * hidden;
    q.table_start = r * shard;
    q.table_rows = std::min(shard, vocab - r * shard);
    q.position_table = r == 0 ? wpe.data() : nullptr;  // positions added once, by rank 0
    q.output = part.data();
    ASSERT_TRUE(EmbeddingCpu(q).ok());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  for (size_t i = 0; i < sum.size(); ++i) ASSERT_FLOAT_EQ(sum[i], full[i]) << i;
}

TEST(EmbeddingCpu, GathersRowsWithoutPositions) {
  std::vector<float> table = {1, 2, 3, 4, 5, 6};  // 3 rows of 2
  std::vector<int32_t> rows = {2, 0, 2};
  std::vector<float> out(6, NAN);
  EmbeddingParams p;
  p.ids = rows.data();
  p.table = table.data();
  p.table_rows = 3;
  p.output = out.data();
  p.num_tokens = 3;
  p.hidden = 2;
  ASSERT_TRUE(EmbeddingCpu(p).ok());
  EXPECT_EQ(out, (std::vector<float>{5, 6, 1, 2, 5, 6}));
}

TEST(EmbeddingCpu, RejectsPositionOutOfRange) {
  std::vector<float> table(4, 1.0f), wpe(4, 1.0f), out(2);
  std::vector<int32_t> ids = {0}, pos = {2};
  EmbeddingParams p;
  p.ids = ids.data();
  p.positions = pos.data();
  p.table = table.data();
  p.table_rows = 2;
  p.position_table = wpe.data();
  p.position_rows = 2;
  p.output = out.data();
  p.num_tokens = 1;
  p.hidden = 2;
  EXPECT_EQ(EmbeddingCpu(p).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mqa
