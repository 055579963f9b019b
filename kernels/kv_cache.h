// Writes this step's keys and values into the paged cache at the given slots.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/dtype.h"

namespace mqa {

struct KvCacheWriteParams {
  const void* key = nullptr;    // token t, kv head g at key + t*key_stride + g*head_dim
  const void* value = nullptr;  // likewise with value_stride
  int64_t key_stride = 0;
  int64_t value_stride = 0;
  void* key_cache = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim]
  void* value_cache = nullptr;
  const int32_t* slot_mapping = nullptr;  // [num_tokens]: block * block_size + offset; < 0 skips
  int num_tokens = 0;
  int num_kv_heads = 1;
  int head_dim = 0;
  int block_size = 16;
  DType dtype = DType::kF32;
};

// The reference: float32 only; InvalidArgument for other dtypes, non-positive sizes, strides
// shorter than num_kv_heads*head_dim or null pointers. Slots are not bounds-checked (the caller
// owns the pool size).
absl::Status KvCacheWriteCpu(const KvCacheWriteParams& p);

// The checks shared by the CPU and CUDA paths (scalar fields and pointers only).
absl::Status ValidateKvCacheWriteShape(const KvCacheWriteParams& p);

}  // namespace mqa
