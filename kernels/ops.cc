#include "kernels/ops.h"

#include "absl/strings/str_cat.h"

namespace mqa {
namespace {

// The CUDA launchers (LayerNormCuda(p, stream), ...) replace this one by one.
absl::Status NoCudaKernel(const char* op) {
  return absl::UnimplementedError(absl::StrCat(op, ": no CUDA kernel yet"));
}

}  // namespace

absl::Status LayerNorm(const OpContext& ctx, const LayerNormParams& p) {
  switch (ctx.device) {
    case Device::kCpu:
      return LayerNormCpu(p);
    case Device::kCuda:
      return NoCudaKernel("LayerNorm");
  }
  return absl::InternalError("LayerNorm: unknown device");
}

absl::Status BiasActivation(const OpContext& ctx, const BiasActivationParams& p) {
  switch (ctx.device) {
    case Device::kCpu:
      return BiasActivationCpu(p);
    case Device::kCuda:
      return NoCudaKernel("BiasActivation");
  }
  return absl::InternalError("BiasActivation: unknown device");
}

absl::Status Embedding(const OpContext& ctx, const EmbeddingParams& p) {
  switch (ctx.device) {
    case Device::kCpu:
      return EmbeddingCpu(p);
    case Device::kCuda:
      return NoCudaKernel("Embedding");
  }
  return absl::InternalError("Embedding: unknown device");
}

absl::Status Gemm(const OpContext& ctx, const GemmParams& p) {
  switch (ctx.device) {
    case Device::kCpu:
      return GemmCpu(p);
    case Device::kCuda:
      return NoCudaKernel("Gemm");
  }
  return absl::InternalError("Gemm: unknown device");
}

absl::Status KvCacheWrite(const OpContext& ctx, const KvCacheWriteParams& p) {
  switch (ctx.device) {
    case Device::kCpu:
      return KvCacheWriteCpu(p);
    case Device::kCuda:
      return NoCudaKernel("KvCacheWrite");
  }
  return absl::InternalError("KvCacheWrite: unknown device");
}

absl::Status PagedAttention(const OpContext& ctx, const PagedAttentionParams& p) {
  switch (ctx.device) {
    case Device::kCpu:
      return PagedAttentionCpu(p);
    case Device::kCuda:
      return NoCudaKernel("PagedAttention");
  }
  return absl::InternalError("PagedAttention: unknown device");
}

}  // namespace mqa
