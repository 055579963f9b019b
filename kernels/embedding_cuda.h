// The CUDA row gather (kernels/embedding.h): token + position embeddings, and the gather of the
// hidden rows whose logits are needed. float32, float16 and bfloat16. Include only from CUDA code.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/embedding.h"

namespace mqa {

// Device pointers (ids and positions too); asynchronous on `stream`. The position bounds are not
// checked on the device (the caller validated the step): a position outside [0, position_rows)
// adds nothing. The sum is taken in fp32 and rounded once.
absl::Status EmbeddingCuda(const EmbeddingParams& p, cudaStream_t stream);

}  // namespace mqa
