// Shared by the attention / KV-cache tests: a random paged batch and a dense causal reference
// computed in double precision from the same K/V, laid out contiguously per sequence.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/paged_attention.h"

namespace mqa::testing {

struct SeqSpec {
  int context_len = 0;  // tokens in the cache after this step
  int query_len = 0;    // queries this step (the last query_len positions)
};

// A paged batch on the host: fp32 data, a random physical block for every logical block.
struct PagedBatch {
  int num_heads = 0, num_kv_heads = 0, head_dim = 0, block_size = 0;
  int num_blocks = 0, max_blocks_per_seq = 0, max_context_len = 0, num_tokens = 0;
  std::vector<SeqSpec> seqs;
  std::vector<float> query;      // [num_tokens, num_heads, head_dim]
  std::vector<float> key_cache;  // [num_blocks, block_size, num_kv_heads, head_dim]
  std::vector<float> value_cache;
  std::vector<int32_t> block_tables, query_start, context_lens;
  // Dense per-sequence K/V: dense_k[s][(t * num_kv_heads + g) * head_dim + d].
  std::vector<std::vector<float>> dense_k, dense_v;
};

inline PagedBatch MakePagedBatch(const std::vector<SeqSpec>& seqs, int num_heads, int num_kv_heads,
                                 int head_dim, int block_size, std::mt19937& rng) {
  PagedBatch b;
  b.num_heads = num_heads;
  b.num_kv_heads = num_kv_heads;
  b.head_dim = head_dim;
  b.block_size = block_size;
  b.seqs = seqs;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int total_blocks = 0;
  for (const SeqSpec& s : seqs) {
    const int nb = (s.context_len + block_size - 1) / block_size;
    total_blocks += nb;
    b.max_blocks_per_seq = std::max(b.max_blocks_per_seq, nb);
    b.max_context_len = std::max(b.max_context_len, s.context_len);
    b.num_tokens += s.query_len;
  }
  b.max_blocks_per_seq += 1;        // slack: tables are wider than needed
  b.num_blocks = total_blocks + 3;  // some blocks belong to nobody
  std::vector<int32_t> physical(b.num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);

  const int64_t row = static_cast<int64_t>(num_kv_heads) * head_dim;
  b.key_cache.resize(static_cast<size_t>(b.num_blocks) * block_size * row);
  b.value_cache.resize(b.key_cache.size());
  // Unused slots hold large garbage: reading one ruins the result.
  std::fill(b.key_cache.begin(), b.key_cache.end(), 1e4f);
  std::fill(b.value_cache.begin(), b.value_cache.end(), -1e4f);
  b.block_tables.assign(static_cast<size_t>(seqs.size()) * b.max_blocks_per_seq, -7);
  b.query_start.push_back(0);
  int next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int ctx = seqs[s].context_len;
    const int nb = (ctx + block_size - 1) / block_size;
    for (int i = 0; i < nb; ++i) b.block_tables[s * b.max_blocks_per_seq + i] = physical[next++];
    std::vector<float> k(ctx * row), v(ctx * row);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    for (int t = 0; t < ctx; ++t) {
      const int64_t blk = b.block_tables[s * b.max_blocks_per_seq + t / block_size];
      const int64_t dst = (blk * block_size + t % block_size) * row;
      std::copy(k.begin() + t * row, k.begin() + (t + 1) * row, b.key_cache.begin() + dst);
      std::copy(v.begin() + t * row, v.begin() + (t + 1) * row, b.value_cache.begin() + dst);
    }
    b.dense_k.push_back(std::move(k));
    b.dense_v.push_back(std::move(v));
    b.query_start.push_back(b.query_start.back() + seqs[s].query_len);
    b.context_lens.push_back(ctx);
  }
  b.query.resize(static_cast<size_t>(b.num_tokens) * num_heads * head_dim);
  for (float& x : b.query) x = normal(rng);
  return b;
}

// Attention over the batch as the CPU reference reads it: fp32, every pointer into `b`, the output
// into `out` (num_tokens x num_heads x head_dim), scale 1 / sqrt(head_dim).
inline PagedAttentionParams HostParams(PagedBatch& b, std::vector<float>& out) {
  PagedAttentionParams p;
  p.query = b.query.data();
  p.query_stride = static_cast<int64_t>(b.num_heads) * b.head_dim;
  p.output = out.data();
  p.key_cache = b.key_cache.data();
  p.value_cache = b.value_cache.data();
  p.block_tables = b.block_tables.data();
  p.query_start = b.query_start.data();
  p.context_lens = b.context_lens.data();
  p.num_seqs = static_cast<int>(b.seqs.size());
  p.num_tokens = b.num_tokens;
  p.num_heads = b.num_heads;
  p.num_kv_heads = b.num_kv_heads;
  p.head_dim = b.head_dim;
  p.block_size = b.block_size;
  p.max_blocks_per_seq = b.max_blocks_per_seq;
  p.max_context_len = b.max_context_len;
  p.scale = 1.0f / std::sqrt(static_cast<float>(b.head_dim));
  p.dtype = DType::kF32;
  return p;
}

// Dense causal attention in double: out[t, h, d], query row j of sequence s at position
// context_len - query_len + j attending to [0, position].
inline std::vector<double> DenseCausalReference(const PagedBatch& b, float scale) {
  std::vector<double> out(static_cast<size_t>(b.num_tokens) * b.num_heads * b.head_dim);
  const int group = b.num_heads / b.num_kv_heads;
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const int ctx = b.seqs[s].context_len, q_len = b.seqs[s].query_len;
    for (int j = 0; j < q_len; ++j) {
      const int row = b.query_start[s] + j;
      const int pos = ctx - q_len + j;
      for (int h = 0; h < b.num_heads; ++h) {
        const int g = h / group;
        const float* q = &b.query[(static_cast<size_t>(row) * b.num_heads + h) * b.head_dim];
        std::vector<double> w(pos + 1);
        double m = -1e300;
        for (int t = 0; t <= pos; ++t) {
          const float* k =
              &b.dense_k[s][(static_cast<size_t>(t) * b.num_kv_heads + g) * b.head_dim];
          double dot = 0;
          for (int d = 0; d < b.head_dim; ++d) dot += static_cast<double>(q[d]) * k[d];
          w[t] = dot * scale;
          m = std::max(m, w[t]);
        }
        double sum = 0;
        for (double& x : w) sum += (x = std::exp(x - m));
        double* o = &out[(static_cast<size_t>(row) * b.num_heads + h) * b.head_dim];
        for (int t = 0; t <= pos; ++t) {
          const float* v =
              &b.dense_v[s][(static_cast<size_t>(t) * b.num_kv_heads + g) * b.head_dim];
          for (int d = 0; d < b.head_dim; ++d) o[d] += w[t] / sum * v[d];
        }
      }
    }
  }
  return out;
}

// ||a - ref|| / ||ref||.
template <typename A>
double RelativeError(const std::vector<A>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

}  // namespace mqa::testing
