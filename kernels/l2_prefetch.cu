#include "kernels/l2_prefetch.h"

#include <algorithm>
#include <cstdint>

#include "runtime/cuda_check.h"

namespace mqa {
namespace {

constexpr int kLineBytes = 128;
constexpr int kThreads = 256;

// Thread i of the grid prefetches lines i, i + grid threads, ... of r0, then of r1.
__global__ void __launch_bounds__(kThreads) L2PrefetchKernel(const char* p0, size_t lines0,
                                                             const char* p1, size_t lines1) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t first = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (size_t i = first; i < lines0; i += stride) {
    asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(p0 + i * kLineBytes));
  }
  for (size_t i = first; i < lines1; i += stride) {
    asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(p1 + i * kLineBytes));
  }
}

}  // namespace

absl::Status L2PrefetchForkCuda(L2PrefetchRange r0, L2PrefetchRange r1, int ctas,
                                cudaStream_t main, cudaStream_t side, cudaEvent_t fork,
                                cudaEvent_t done) {
  const size_t lines0 = r0.ptr == nullptr ? 0 : r0.bytes / kLineBytes;
  const size_t lines1 = r1.ptr == nullptr ? 0 : r1.bytes / kLineBytes;
  if (lines0 + lines1 == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaEventRecord(fork, main));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side, fork, 0));
  const size_t most = std::max(lines0, lines1);
  const int grid = static_cast<int>(
      std::clamp<size_t>((most + kThreads - 1) / kThreads, 1, static_cast<size_t>(std::max(1, ctas))));
  L2PrefetchKernel<<<grid, kThreads, 0, side>>>(static_cast<const char*>(r0.ptr), lines0,
                                                static_cast<const char*>(r1.ptr), lines1);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  CUDA_RETURN_IF_ERROR(cudaEventRecord(done, side));
  return absl::OkStatus();
}

absl::Status L2PrefetchJoinCuda(cudaStream_t main, cudaEvent_t done) {
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(main, done, 0));
  return absl::OkStatus();
}

}  // namespace mqa
