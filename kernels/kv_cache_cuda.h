// The CUDA KV-cache write (see kernels/kv_cache.h). Include only from CUDA-enabled code.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/kv_cache.h"

namespace mqa {

// Any dtype (a byte copy of each token row); device pointers; asynchronous on `stream`.
absl::Status KvCacheWriteCuda(const KvCacheWriteParams& p, cudaStream_t stream);

}  // namespace mqa
