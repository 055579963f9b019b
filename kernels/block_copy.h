// Block copy and swap of the paged KV cache (CUDA backend).
//
// Copy: for every pair (src, dst) and every cache tensor (each layer's K and V, all laid out as
// [num_blocks, block_bytes]), block dst becomes block src: copy-on-write of a shared block. One
// launch for all tensors and pairs. Swap: the same per-block copies between a device pool and a
// host (pinned) pool, for preemption by swapping.
// Include only from CUDA-enabled code. Thread-compatible; asynchronous on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace mqa {

struct BlockCopyParams {
  void* const* tensors = nullptr;  // device array [num_tensors] of device pointers
  int num_tensors = 0;
  const int32_t* pairs = nullptr;  // device array [num_pairs][2]: (src, dst)
  int num_pairs = 0;
  int64_t block_bytes = 0;  // bytes of one block in one tensor (a multiple of 16)
};

// Pairs must not chain (no dst is another pair's src) for the result to be order-free.
absl::Status BlockCopyCuda(const BlockCopyParams& p, cudaStream_t stream);

struct BlockSwapParams {
  absl::Span<void* const> src_tensors;  // host-visible array of pointers (device or pinned host)
  absl::Span<void* const> dst_tensors;  // same count as src_tensors
  absl::Span<const int32_t> pairs;      // host array [num_pairs * 2]: (src block, dst block)
  int64_t block_bytes = 0;
};

// cudaMemcpyAsync per (tensor, pair), direction inferred (cudaMemcpyDefault).
absl::Status BlockSwapCuda(const BlockSwapParams& p, cudaStream_t stream);

}  // namespace mqa
