// The CUDA bias + activation + residual pass (kernels/activation.h): fp32 arithmetic, one rounding
// to the output dtype. float32, float16 and bfloat16. Include only from CUDA code.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/activation.h"

namespace mqa {

// Device pointers; asynchronous on `stream`; output may alias input or residual.
// pdl: launched as a programmatic dependent of the previous kernel (forward_cuda_common.cuh).
absl::Status BiasActivationCuda(const BiasActivationParams& p, cudaStream_t stream,
                                bool pdl = false);

}  // namespace mqa
