#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/forward_cuda_common.cuh"
#include "kernels/mqa_block_attention.cuh"
#include "kernels/mqa_block_attention.h"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

using namespace mqa_block;  // NOLINT: the kernel's constants

template <typename T, int kMt>
__global__ void __launch_bounds__(kThreads, 1) MqaBlockAttentionKernel(MqaBlockAttentionParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t v_s = fwd::SmemAddr(smem);
  const uint32_t q_s = v_s + VBytes();
  float* red = reinterpret_cast<float*>(smem + VBytes() + QBytes(kMt));
  const long long c0 = clock64();
  const T* q = static_cast<const T*>(p.query);
  const T* kc = static_cast<const T*>(p.key_cache);
  const T* vc = static_cast<const T*>(p.value_cache);
  auto row = [&](const T* cache) {
    return [=](int pos) {
      return cache + (static_cast<int64_t>(p.block_table[pos / p.block_size]) * p.block_size +
                      pos % p.block_size) *
                         kD;
    };
  };
  KFragments kf;
  LoadKFragments<T>(kf, row(kc), 0, p.context);
  IssueVRows<T>(v_s, row(vc), 0, (p.context + 15) / 16 * 16, p.context, vc);
  fwd::CpAsyncCommit();
  LoadQ<T, kMt>(q_s, q, p.heads);
  fwd::CpAsyncWait<0>();
  __syncthreads();
  const long long c1 = clock64();
  T* out = static_cast<T*>(p.output) + static_cast<int64_t>(blockIdx.x) * p.heads * kD;
  BlockMqaAttention<T, kMt>(kf, v_s, q_s, red, p.heads, p.context, p.scale * 1.4426950408889634f,
                            out, 1);
  __syncthreads();
  if (threadIdx.x == 0 && p.clocks != nullptr) {
    p.clocks[2 * blockIdx.x] = c1 - c0;
    p.clocks[2 * blockIdx.x + 1] = clock64() - c1;
  }
}

// The largest instantiation's heads (three 16-row tiles: StarCoder's 48).
constexpr int kMaxHeads = 3 * 16;

template <typename T, int kMt>
absl::Status Launch(const MqaBlockAttentionParams& p, cudaStream_t stream) {
  const int smem = BlockSmemBytes(kMt);
  // Once an instantiation, not at every launch.
  static const cudaError_t configured = cudaFuncSetAttribute(
      MqaBlockAttentionKernel<T, kMt>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  CUDA_RETURN_IF_ERROR(configured);
  MqaBlockAttentionKernel<T, kMt><<<p.grid, kThreads, smem, stream>>>(p);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status MqaBlockAttentionCuda(const MqaBlockAttentionParams& p, cudaStream_t stream) {
  if ((p.dtype != DType::kF16 && p.dtype != DType::kBF16) || p.query == nullptr ||
      p.key_cache == nullptr || p.value_cache == nullptr || p.block_table == nullptr ||
      p.output == nullptr || p.context < 1 || p.context > kMaxContext || p.heads < 1 ||
      p.heads > kMaxHeads || p.block_size < 1 || p.grid < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MqaBlockAttention: dtype ", std::string(DTypeName(p.dtype)), ", heads ",
                     p.heads, " (1..", kMaxHeads, "), context ", p.context, " (1..", kMaxContext,
                     "), block size ", p.block_size, ", grid ", p.grid, ", or a null pointer"));
  }
  // (Two row-tile counts: SantaCoder's 16 heads, and up to StarCoder's 48.)
  const bool one = p.heads <= 16;
  if (p.dtype == DType::kF16) {
    return one ? Launch<__half, 1>(p, stream) : Launch<__half, 3>(p, stream);
  }
  return one ? Launch<__nv_bfloat16, 1>(p, stream) : Launch<__nv_bfloat16, 3>(p, stream);
}

}  // namespace mqa
