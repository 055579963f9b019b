// The device-dispatching op layer the model forward calls: one function per kernel, taking that
// kernel's params struct and an OpContext that says where the data lives. On Device::kCpu it calls
// the ...Cpu reference; on Device::kCuda it will call the ...Cuda launcher with ctx.stream (see
// ops.cc: one switch per op, the CUDA branch returns Unimplemented until those launchers land).
// Stateless and thread-compatible: concurrent calls on disjoint data are fine.
#pragma once

#include "absl/status/status.h"
#include "kernels/activation.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/kv_cache.h"
#include "kernels/layer_norm.h"
#include "kernels/paged_attention.h"
#include "runtime/tensor.h"

namespace mqa {

struct OpContext {
  Device device = Device::kCpu;
  // cudaStream_t of the CUDA backend (null: the default stream); unused on the CPU. A cuBLAS
  // handle joins it when GemmCuda lands.
  void* stream = nullptr;
};

absl::Status LayerNorm(const OpContext& ctx, const LayerNormParams& p);
absl::Status BiasActivation(const OpContext& ctx, const BiasActivationParams& p);
absl::Status Embedding(const OpContext& ctx, const EmbeddingParams& p);
absl::Status Gemm(const OpContext& ctx, const GemmParams& p);
absl::Status KvCacheWrite(const OpContext& ctx, const KvCacheWriteParams& p);
absl::Status PagedAttention(const OpContext& ctx, const PagedAttentionParams& p);

}  // namespace mqa
