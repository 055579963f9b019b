// The CUDA KV-cache write (see kernels/kv_cache.h). Include only from CUDA-enabled code.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/kv_cache.h"

namespace mqa {

// Any dtype (a byte copy of each token row); device pointers; asynchronous on `stream`. `pdl`:
// launched as a programmatic dependent of the previous kernel (kernels/forward_cuda_common.cuh);
// slot_mapping is read before the wait.
absl::Status KvCacheWriteCuda(const KvCacheWriteParams& p, cudaStream_t stream, bool pdl = false);

}  // namespace mqa
