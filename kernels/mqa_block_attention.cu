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
  const uint32_t q_s = fwd::SmemAddr(smem);
  const uint32_t k_s = q_s + QBytes(kMt);
  const uint32_t v_s = k_s + KvBytes();
  const uint32_t p_s = v_s + KvBytes();
  float* red = reinterpret_cast<float*>(smem + QBytes(kMt) + 2 * KvBytes() + PBytes(kMt));
  const long long c0 = clock64();
  constexpr int kChunks = kD / 8;  // 16-byte chunks a row
  const T* q = static_cast<const T*>(p.query);
  for (int i = threadIdx.x; i < kMt * 16 * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    fwd::CpAsync16(q_s + Swz(r, c, kQRowBytes), q + r * kD + 8 * c, r < p.heads);
  }
  const T* kc = static_cast<const T*>(p.key_cache);
  const T* vc = static_cast<const T*>(p.value_cache);
  for (int i = threadIdx.x; i < kMaxContext * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = r < p.context;
    const int64_t slot =
        valid ? static_cast<int64_t>(p.block_table[r / p.block_size]) * p.block_size +
                    r % p.block_size
              : 0;
    fwd::CpAsync16(k_s + Swz(r, c, kQRowBytes), kc + slot * kD + 8 * c, valid);
    fwd::CpAsync16(v_s + Swz(r, c, kQRowBytes), vc + slot * kD + 8 * c, valid);
  }
  fwd::CpAsyncCommit();
  fwd::CpAsyncWait<0>();
  __syncthreads();
  const long long c1 = clock64();
  T* out = static_cast<T*>(p.output) + static_cast<int64_t>(blockIdx.x) * p.heads * kD;
  BlockMqaAttention<T, kMt>(q_s, k_s, v_s, p_s, red, p.heads, p.context,
                            p.scale * 1.4426950408889634f, out, 1);
  __syncthreads();
  if (threadIdx.x == 0 && p.clocks != nullptr) {
    p.clocks[2 * blockIdx.x] = c1 - c0;
    p.clocks[2 * blockIdx.x + 1] = clock64() - c1;
  }
}

template <typename T, int kMt>
absl::Status Launch(const MqaBlockAttentionParams& p, cudaStream_t stream) {
  const int smem = QBytes(kMt) + 2 * KvBytes() + PBytes(kMt) + RedBytes(kMt);
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(MqaBlockAttentionKernel<T, kMt>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  MqaBlockAttentionKernel<T, kMt><<<p.grid, kThreads, smem, stream>>>(p);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status MqaBlockAttentionCuda(const MqaBlockAttentionParams& p, cudaStream_t stream) {
  if ((p.dtype != DType::kF16 && p.dtype != DType::kBF16) || p.query == nullptr ||
      p.key_cache == nullptr || p.value_cache == nullptr || p.block_table == nullptr ||
      p.output == nullptr || p.context < 1 || p.context > kMaxContext || p.heads < 1 ||
      p.heads > 48 || p.block_size < 1 || p.grid < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MqaBlockAttention: dtype ", std::string(DTypeName(p.dtype)), ", heads ",
                     p.heads, " (1..48), context ", p.context, " (1..", kMaxContext,
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
