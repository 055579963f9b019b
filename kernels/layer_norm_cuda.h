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

// SliceSumLayerNormParams on the device: one CTA a row, each thread 16 bytes of the row (cols / 8
// threads for fp16 / bf16) held in registers, the weights loaded before the PDL wait. float16 and
// bfloat16; Unimplemented where cols is not a multiple of 8 or above kSliceSumLayerNormMaxCols or
// a pointer is not 16-byte aligned (the caller then sums and normalises separately);
// InvalidArgument as the CPU reference.
inline constexpr int64_t kSliceSumLayerNormMaxCols = 8192;
absl::Status SliceSumLayerNormCuda(const SliceSumLayerNormParams& p, cudaStream_t stream,
                                   bool pdl = false);

}  // namespace mqa
