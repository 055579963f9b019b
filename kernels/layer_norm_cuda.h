// The CUDA layer norm (kernels/layer_norm.h): fp32 statistics, one CTA per row, 16-byte accesses
// when cols and pointers allow. float32, float16 and bfloat16. Include only from CUDA code.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/layer_norm.h"

namespace mqa {

// Device pointers; asynchronous on `stream`. InvalidArgument for null pointers, cols <= 0 or
// an integer dtype.
// pdl: launched as a programmatic dependent of the previous kernel in `stream`
// (kernels/forward_cuda_common.cuh).
absl::Status LayerNormCuda(const LayerNormParams& p, cudaStream_t stream, bool pdl = false);

}  // namespace mqa
