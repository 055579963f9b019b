// The CUDA layer norm (kernels/layer_norm.h): fp32 statistics, one CTA per row, 16-byte accesses
// when cols and pointers allow. float32, float16 and bfloat16. Include only from CUDA code.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/layer_norm.h"

namespace mqa {

// Which kernel LayerNormCuda runs (layer_norm.cu says how each works).
enum class LayerNormCudaKernel {
  kThreePass,  // one 256-thread CTA per row, three passes over the row in memory; any shape
  kRegisters,  // the row read once into registers, weight and bias loaded before the PDL wait;
               // rows wider than 32 KiB (16384 fp16 values), widths not a multiple of 16 bytes
               // and unaligned pointers fall back to kThreePass
};

// Device pointers; asynchronous on `stream`. InvalidArgument for null pointers, cols <= 0 or
// an integer dtype.
// pdl: launched as a programmatic dependent of the previous kernel in `stream`
// (kernels/forward_cuda_common.cuh).
absl::Status LayerNormCuda(const LayerNormParams& p, cudaStream_t stream, bool pdl = false,
                           LayerNormCudaKernel kernel = LayerNormCudaKernel::kThreePass);

}  // namespace mqa
