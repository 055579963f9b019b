// Attention over the paged KV cache, for a batch that mixes prefill chunks and decode steps.
//
// Query tokens are grouped by sequence (varlen): sequence s owns query rows
// [query_start[s], query_start[s+1]). After this step its context holds context_lens[s] tokens
// (their K/V already written to the cache), so query row j of sequence s, with
// q_len = query_start[s+1] - query_start[s], sits at position context_lens[s] - q_len + j and
// attends causally to cache positions [0, that position]. Decode is q_len = 1 for every sequence.
//
// Cache layout, per layer: key_cache and value_cache are [num_blocks, block_size, num_kv_heads,
// head_dim]; block_tables[s * max_blocks_per_seq + i] is the physical block of logical block i.
// Query head h reads KV head h / (num_heads / num_kv_heads) (MQA: num_kv_heads = 1).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/dtype.h"

namespace mqa {

struct PagedAttentionParams {
  const void* query = nullptr;  // row t, head h at query + t*query_stride + h*head_dim
  int64_t query_stride = 0;     // elements between query rows (>= num_heads*head_dim)
  void* output = nullptr;       // [num_tokens, num_heads, head_dim], contiguous
  const void* key_cache = nullptr;
  const void* value_cache = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  const int32_t* query_start = nullptr;   // [num_seqs + 1]
  const int32_t* context_lens = nullptr;  // [num_seqs]
  int num_seqs = 0;
  int num_tokens = 0;
  int num_heads = 0;
  int num_kv_heads = 1;
  int head_dim = 0;
  int block_size = 16;
  int max_blocks_per_seq = 0;
  int max_context_len = 0;  // an upper bound of context_lens (sizes split-KV work on the GPU)
  // An upper bound of any sequence's query length (1 for a decode-only batch). 0: unknown, and the
  // CUDA path then assumes every sequence has at least one query (bound num_tokens-num_seqs+1).
  int max_query_len = 0;
  float scale = 1.0f;
  DType dtype = DType::kF32;  // of query, output and caches
  // CUDA: the split-KV merge kernel releases its programmatic dependent before it waits for the
  // attention (the dependent waits for the merge itself): for a decode chain after it, whose CTAs
  // then stream their first weights while the attention runs. Off: released after the wait (a
  // skinny GEMM after it measured slower released early).
  bool release_dependents_early = false;
};

// The reference: fp32 only, one thread, straightforward loops. InvalidArgument for bad
// parameters: a dtype other than float32, num_heads not a multiple of num_kv_heads, a context
// shorter than its query length or longer than max_context_len or max_blocks_per_seq blocks,
// query_start not starting at 0 / decreasing / not ending at num_tokens, a negative block.
absl::Status PagedAttentionCpu(const PagedAttentionParams& p);

// The checks of the scalar fields and pointers that need no access to the (possibly device-side)
// metadata arrays; shared by the CPU and CUDA paths.
absl::Status ValidatePagedAttentionShape(const PagedAttentionParams& p);

}  // namespace mqa
