// A CTA's whole MQA decode attention (kernels/mqa_block_attention.cuh) as a kernel of its own, for
// its test and its benchmark: every CTA of the grid loads the same query row and one KV head's
// paged K / V, computes every head's output and writes its own copy. CUDA only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/dtype.h"

namespace mqa {

struct MqaBlockAttentionParams {
  DType dtype = DType::kF16;             // float16 or bfloat16
  const void* query = nullptr;           // [heads][128]
  const void* key_cache = nullptr;       // [slots][128] (one KV head)
  const void* value_cache = nullptr;     // [slots][128]
  const int32_t* block_table = nullptr;  // device: the sequence's blocks
  int block_size = 16;
  int context = 0;  // positions 0 .. context - 1, at most 256
  int heads = 0;    // at most 48
  float scale = 1.0f;
  void* output = nullptr;  // [grid][heads][128]: CTA c's copy at c x heads x 128
  int grid = 1;
  // Optional, device, 2 x grid: CTA c's SM clocks for its loads (cp.async issue to all landed and
  // visible) at 2 c and for the attention itself at 2 c + 1.
  long long* clocks = nullptr;
};

// InvalidArgument for shapes it does not take (above), else the launch's status.
absl::Status MqaBlockAttentionCuda(const MqaBlockAttentionParams& p, cudaStream_t stream);

}  // namespace mqa
