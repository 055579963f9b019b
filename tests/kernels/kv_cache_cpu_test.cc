// The CPU KV-cache write: rows land at their slots, skipped slots and other rows stay untouched,
// and a write followed by paged attention equals dense causal attention.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "kernels/kv_cache.h"
#include "kernels/paged_attention.h"
#include "tests/kernels/attention_test_util.h"

namespace mqa {
namespace {

TEST(KvCacheWriteCpu, WritesRowsAtSlotsAndSkipsNegative) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const int kv_heads = 2, head_dim = 16, block_size = 8, num_blocks = 5, tokens = 13;
  const int64_t row = kv_heads * head_dim, key_stride = row + 5, value_stride = row + 9;
  std::vector<float> key(tokens * key_stride), value(tokens * value_stride);
  for (float& x : key) x = normal(rng);
  for (float& x : value) x = normal(rng);
  std::vector<int32_t> slots(num_blocks * block_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(tokens);
  slots[3] = -1;
  const float poison = -12345.0f;
  std::vector<float> kc(num_blocks * block_size * row, poison), vc(kc.size(), poison);

  KvCacheWriteParams p;
  p.key = key.data();
  p.value = value.data();
  p.key_stride = key_stride;
  p.value_stride = value_stride;
  p.key_cache = kc.data();
  p.value_cache = vc.data();
  p.slot_mapping = slots.data();
  p.num_tokens = tokens;
  p.num_kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.block_size = block_size;
  ASSERT_TRUE(KvCacheWriteCpu(p).ok());

  std::vector<bool> written(num_blocks * block_size, false);
  for (int t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    written[slots[t]] = true;
    for (int i = 0; i < row; ++i) {
      ASSERT_EQ(kc[slots[t] * row + i], key[t * key_stride + i]);
      ASSERT_EQ(vc[slots[t] * row + i], value[t * value_stride + i]);
    }
  }
  for (int slot = 0; slot < num_blocks * block_size; ++slot) {
    if (written[slot]) continue;
    for (int i = 0; i < row; ++i) {
      ASSERT_EQ(kc[slot * row + i], poison);
      ASSERT_EQ(vc[slot * row + i], poison);
    }
  }
}

TEST(KvCacheWriteCpu, RejectsBadParameters) {
  std::vector<float> buf(64);
  std::vector<int32_t> slots = {0};
  KvCacheWriteParams p;
  p.key = p.value = buf.data();
  p.key_cache = p.value_cache = buf.data();
  p.slot_mapping = slots.data();
  p.num_tokens = 1;
  p.head_dim = 8;
  p.key_stride = p.value_stride = 8;
  ASSERT_TRUE(KvCacheWriteCpu(p).ok());
  KvCacheWriteParams q = p;
  q.dtype = DType::kBF16;
  EXPECT_EQ(KvCacheWriteCpu(q).code(), absl::StatusCode::kInvalidArgument);
  q = p;
  q.key_stride = 7;
  EXPECT_EQ(KvCacheWriteCpu(q).code(), absl::StatusCode::kInvalidArgument);
  q = p;
  q.num_kv_heads = 0;
  EXPECT_EQ(KvCacheWriteCpu(q).code(), absl::StatusCode::kInvalidArgument);
  q = p;
  q.slot_mapping = nullptr;
  EXPECT_EQ(KvCacheWriteCpu(q).code(), absl::StatusCode::kInvalidArgument);
}

// The forward pass's order: write this step's K/V (prefill chunk then decode), then attend.
TEST(KvCacheWriteCpu, WriteThenAttendMatchesDense) {
  std::mt19937 rng(21);
  const int heads = 6, kv_heads = 1, head_dim = 16, block_size = 16;
  std::vector<testing::SeqSpec> seqs = {{40, 40}, {33, 1}, {50, 17}};
  testing::PagedBatch b = testing::MakePagedBatch(seqs, heads, kv_heads, head_dim, block_size, rng);
  // Wipe the slots of this step's tokens, then let the write restore them from the dense K/V.
  const int64_t row = kv_heads * head_dim;
  std::vector<float> step_k(b.num_tokens * row), step_v(b.num_tokens * row);
  std::vector<int32_t> slots(b.num_tokens);
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int j = 0; j < seqs[s].query_len; ++j) {
      const int t = b.query_start[s] + j;
      const int pos = seqs[s].context_len - seqs[s].query_len + j;
      slots[t] = b.block_tables[s * b.max_blocks_per_seq + pos / block_size] * block_size +
                 pos % block_size;
      std::copy_n(&b.dense_k[s][pos * row], row, &step_k[t * row]);
      std::copy_n(&b.dense_v[s][pos * row], row, &step_v[t * row]);
      std::fill_n(&b.key_cache[slots[t] * row], row, 1e4f);
      std::fill_n(&b.value_cache[slots[t] * row], row, 1e4f);
    }
  }
  KvCacheWriteParams w;
  w.key = step_k.data();
  w.value = step_v.data();
  w.key_stride = w.value_stride = row;
  w.key_cache = b.key_cache.data();
  w.value_cache = b.value_cache.data();
  w.slot_mapping = slots.data();
  w.num_tokens = b.num_tokens;
  w.num_kv_heads = kv_heads;
  w.head_dim = head_dim;
  w.block_size = block_size;
  ASSERT_TRUE(KvCacheWriteCpu(w).ok());

  std::vector<float> out(b.query.size(), std::nanf(""));
  PagedAttentionParams p = testing::HostParams(b, out);
  p.scale = 0.25f;
  ASSERT_TRUE(PagedAttentionCpu(p).ok());
  EXPECT_LT(testing::RelativeError(out, testing::DenseCausalReference(b, p.scale)), 1e-5);
}

}  // namespace
}  // namespace mqa
