// Block copy: grid (pairs, tensors), 16 bytes per thread per step.
#include "absl/strings/str_cat.h"
#include "kernels/block_copy.h"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

__global__ void __launch_bounds__(256) BlockCopyKernel(void* const* tensors, const int32_t* pairs,
                                                       int64_t words) {
  const int pair = blockIdx.x;
  char* base = static_cast<char*>(tensors[blockIdx.y]);
  const int64_t src = pairs[2 * pair], dst = pairs[2 * pair + 1];
  const uint4* from = reinterpret_cast<const uint4*>(base + src * words * 16);
  uint4* to = reinterpret_cast<uint4*>(base + dst * words * 16);
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x) to[i] = from[i];
}

}  // namespace

absl::Status BlockCopyCuda(const BlockCopyParams& p, cudaStream_t stream) {
  if (p.num_pairs < 0 || p.num_tensors < 0 || p.block_bytes <= 0 || p.block_bytes % 16 != 0 ||
      p.num_tensors > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("BlockCopyCuda: ", p.num_pairs, " pairs, ",
                                                   p.num_tensors, " tensors, block of ",
                                                   p.block_bytes, " bytes (a multiple of 16)"));
  }
  if (p.num_pairs == 0 || p.num_tensors == 0) return absl::OkStatus();
  if (!p.tensors || !p.pairs) return absl::InvalidArgumentError("BlockCopyCuda: null pointer");
  BlockCopyKernel<<<dim3(p.num_pairs, p.num_tensors), 256, 0, stream>>>(p.tensors, p.pairs,
                                                                         p.block_bytes / 16);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status BlockSwapCuda(const BlockSwapParams& p, cudaStream_t stream) {
  if (p.src_tensors.size() != p.dst_tensors.size() || p.pairs.size() % 2 != 0 ||
      p.block_bytes <= 0) {
    return absl::InvalidArgumentError("BlockSwapCuda: tensor counts differ or odd pair list");
  }
  for (size_t t = 0; t < p.src_tensors.size(); ++t) {
    for (size_t i = 0; i < p.pairs.size(); i += 2) {
      const char* from = static_cast<const char*>(p.src_tensors[t]) + p.pairs[i] * p.block_bytes;
      char* to = static_cast<char*>(p.dst_tensors[t]) + p.pairs[i + 1] * p.block_bytes;
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to, from, p.block_bytes, cudaMemcpyDefault, stream));
    }
  }
  return absl::OkStatus();
}

}  // namespace mqa
