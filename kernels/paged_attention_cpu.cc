// The CPU reference of paged attention: fp32, one thread, straightforward loops. Its job is to be
// obviously right; the CUDA kernels are checked against it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/paged_attention.h"

namespace mqa {

absl::Status ValidatePagedAttentionShape(const PagedAttentionParams& p) {
  if (p.num_seqs < 0 || p.num_tokens < 0) {
    return absl::InvalidArgumentError("paged attention: negative num_seqs or num_tokens");
  }
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.head_dim <= 0 || p.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "paged attention: num_heads (", p.num_heads, "), num_kv_heads (", p.num_kv_heads,
        "), head_dim (", p.head_dim, ") and block_size (", p.block_size, ") must be positive"));
  }
  if (p.num_heads % p.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("paged attention: num_heads ", p.num_heads,
                                                   " is not a multiple of num_kv_heads ",
                                                   p.num_kv_heads));
  }
  if (p.query_stride < static_cast<int64_t>(p.num_heads) * p.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("paged attention: query_stride ", p.query_stride,
                                                   " < num_heads*head_dim ",
                                                   static_cast<int64_t>(p.num_heads) * p.head_dim));
  }
  if (p.max_blocks_per_seq < 0 || p.max_context_len < 0) {
    return absl::InvalidArgumentError(
        "paged attention: negative max_blocks_per_seq or max_context_len");
  }
  if (p.num_tokens > 0 && (p.query == nullptr || p.output == nullptr || p.key_cache == nullptr ||
                           p.value_cache == nullptr || p.block_tables == nullptr)) {
    return absl::InvalidArgumentError("paged attention: null tensor pointer");
  }
  if (p.num_seqs > 0 && (p.query_start == nullptr || p.context_lens == nullptr)) {
    return absl::InvalidArgumentError("paged attention: null query_start or context_lens");
  }
  return absl::OkStatus();
}

// Checks the host-visible per-sequence metadata (the CPU path reads it directly).
static absl::Status ValidateHostMetadata(const PagedAttentionParams& p) {
  if (p.num_seqs > 0 && p.query_start[0] != 0) {
    return absl::InvalidArgumentError("paged attention: query_start[0] must be 0");
  }
  for (int s = 0; s < p.num_seqs; ++s) {
    const int q_len = p.query_start[s + 1] - p.query_start[s];
    const int ctx = p.context_lens[s];
    if (q_len < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("paged attention: query_start decreases at sequence ", s));
    }
    if (ctx < q_len) {
      return absl::InvalidArgumentError(absl::StrCat("paged attention: sequence ", s,
                                                     " has context length ", ctx,
                                                     " shorter than its query length ", q_len));
    }
    if (ctx > p.max_context_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("paged attention: sequence ", s, " context length ", ctx,
                       " exceeds max_context_len ", p.max_context_len));
    }
    if (ctx > static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("paged attention: sequence ", s, " context length ", ctx,
                       " needs more than ", p.max_blocks_per_seq, " blocks of ", p.block_size));
    }
    const int32_t* table = p.block_tables + static_cast<int64_t>(s) * p.max_blocks_per_seq;
    for (int b = 0; b < (ctx + p.block_size - 1) / p.block_size; ++b) {
      if (table[b] < 0) {
        return absl::InvalidArgumentError(absl::StrCat("paged attention: sequence ", s, " block ",
                                                       b, " has physical block ", table[b]));
      }
    }
  }
  if (p.num_seqs > 0 && p.query_start[p.num_seqs] != p.num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged attention: query_start[num_seqs] = ", p.query_start[p.num_seqs],
                     " but num_tokens = ", p.num_tokens));
  }
  if (p.num_seqs == 0 && p.num_tokens != 0) {
    return absl::InvalidArgumentError("paged attention: tokens without sequences");
  }
  return absl::OkStatus();
}

absl::Status PagedAttentionCpu(const PagedAttentionParams& p) {
  if (p.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttentionCpu supports float32 only, got ",
                                                   std::string(DTypeName(p.dtype))));
  }
  if (absl::Status s = ValidatePagedAttentionShape(p); !s.ok()) return s;
  if (absl::Status s = ValidateHostMetadata(p); !s.ok()) return s;

  const auto* query = static_cast<const float*>(p.query);
  auto* output = static_cast<float*>(p.output);
  const auto* key_cache = static_cast<const float*>(p.key_cache);
  const auto* value_cache = static_cast<const float*>(p.value_cache);
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t token_stride = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  const int64_t block_stride = token_stride * p.block_size;
  std::vector<float> scores;
  std::vector<float> acc(p.head_dim);

  for (int s = 0; s < p.num_seqs; ++s) {
    const int q_begin = p.query_start[s];
    const int q_len = p.query_start[s + 1] - q_begin;
    const int ctx = p.context_lens[s];
    const int32_t* table = p.block_tables + static_cast<int64_t>(s) * p.max_blocks_per_seq;
    // Offset of (cache position t, kv head g) in either cache.
    auto cache_offset = [&](int t, int g) {
      return table[t / p.block_size] * block_stride + (t % p.block_size) * token_stride +
             static_cast<int64_t>(g) * p.head_dim;
    };
    for (int j = 0; j < q_len; ++j) {
      const int pos = ctx - q_len + j;  // this query's position; it sees [0, pos]
      for (int h = 0; h < p.num_heads; ++h) {
        const int g = h / group;
        const float* q = query + static_cast<int64_t>(q_begin + j) * p.query_stride +
                         static_cast<int64_t>(h) * p.head_dim;
        scores.assign(pos + 1, 0.0f);
        float max_score = -std::numeric_limits<float>::infinity();
        for (int t = 0; t <= pos; ++t) {
          const float* k = key_cache + cache_offset(t, g);
          float dot = 0.0f;
          for (int d = 0; d < p.head_dim; ++d) dot += q[d] * k[d];
          scores[t] = dot * p.scale;
          max_score = std::max(max_score, scores[t]);
        }
        float sum = 0.0f;
        for (int t = 0; t <= pos; ++t) {
          scores[t] = std::exp(scores[t] - max_score);
          sum += scores[t];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int t = 0; t <= pos; ++t) {
          const float* v = value_cache + cache_offset(t, g);
          for (int d = 0; d < p.head_dim; ++d) acc[d] += scores[t] * v[d];
        }
        float* out = output + (static_cast<int64_t>(q_begin + j) * p.num_heads + h) * p.head_dim;
        for (int d = 0; d < p.head_dim; ++d) out[d] = acc[d] / sum;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace mqa
