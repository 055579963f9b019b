// LayerNorm over the last dimension: out = (x - mean) / sqrt(var + eps) * weight + bias, with the
// biased variance (as torch.nn.LayerNorm). One launcher per backend, same params struct:
//   LayerNormCpu (layer_norm_cpu.cc): the fp32 reference;
//   LayerNormCuda (layer_norm.cu, with the CUDA backend): same params plus a cudaStream_t.
// Callers normally go through kernels/ops.h, which dispatches on the device.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/dtype.h"

namespace mqa {

struct LayerNormParams {
  const void* input = nullptr;   // [rows, cols], contiguous
  void* output = nullptr;        // [rows, cols], contiguous; may equal input
  const void* weight = nullptr;  // [cols]
  const void* bias = nullptr;    // [cols]
  int64_t rows = 0;
  int64_t cols = 0;
  float epsilon = 1e-5f;
  DType dtype = DType::kF32;  // of all four arrays
};

// fp32 only; statistics accumulated in double. InvalidArgument for other dtypes, null pointers
// or non-positive cols.
absl::Status LayerNormCpu(const LayerNormParams& p);

}  // namespace mqa
