// Row gather with an optional second table added: the token + position embedding of
// GPT-BigCode, and (with no position table) the gather of the hidden rows whose logits are needed.
//   out[t] = table_row(ids[t]) + (position_table ? position_table[positions[t]] : 0)
// where table_row(i) = table[i - table_start] if table_start <= i < table_start + table_rows,
// else zeros. The zero rows make a vocab-parallel lookup work: each rank looks up its shard of wte
// and an all-reduce sums the shards (exactly one rank holds each token's row).
//   EmbeddingCpu (embedding_cpu.cc): the fp32 reference;
//   EmbeddingCuda (embedding.cu, with the CUDA backend): same params plus a cudaStream_t.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/dtype.h"

namespace mqa {

struct EmbeddingParams {
  const int32_t* ids = nullptr;        // [num_tokens], on the same device as the tables
  const int32_t* positions = nullptr;  // [num_tokens]; needed only with a position table
  const void* table = nullptr;         // [table_rows, hidden]
  int64_t table_start = 0;             // global id of table row 0 (vocab shard offset)
  int64_t table_rows = 0;
  const void* position_table = nullptr;  // [position_rows, hidden] or null
  int64_t position_rows = 0;
  void* output = nullptr;  // [num_tokens, hidden], contiguous; must not overlap the tables
  int64_t num_tokens = 0;
  int64_t hidden = 0;
  DType dtype = DType::kF32;  // of table, position_table and output
};

// fp32 only. InvalidArgument for other dtypes, null pointers, a position outside
// [0, position_rows).
absl::Status EmbeddingCpu(const EmbeddingParams& p);

}  // namespace mqa
