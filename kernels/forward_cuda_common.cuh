// Device helpers shared by the forward kernels (cudafwd): element conversions and the one place
// that turns a run-time float dtype into a template parameter. Include only from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/dtype.h"

namespace mqa::fwd {

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// 16 bytes of T: the unit of the vectorised paths.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls f.template operator()<T>() with T = float, __half or __nv_bfloat16.
template <typename F>
absl::Status DispatchFloat(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f.template operator()<float>();
    case DType::kF16:
      return f.template operator()<__half>();
    case DType::kBF16:
      return f.template operator()<__nv_bfloat16>();
    case DType::kI32:
    case DType::kI64:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(op, ": dtype ", std::string(DTypeName(dtype)),
                                                 " unsupported (float32, float16, bfloat16)"));
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float BlockSum(float v, float* scratch /* [33] shared */) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) scratch[32] = s;
  }
  __syncthreads();
  return scratch[32];
}

}  // namespace mqa::fwd

namespace mqa::fwd {

// The dot product of 8 fp16 weights with 8 fp16 inputs (16 bytes each), summed as HFMA2 pairs
// (four products a half of the pair, rounded to fp16 on the way) before one fp32 add: the decode
// chain's DecodeChainTuning::half_fold and the skinny GEMM's CudaGemm::Options::skinny_half_fold.
__device__ __forceinline__ float HalfPairDot8(const void* w, const void* x) {
  const __half2* h = static_cast<const __half2*>(w);
  const __half2* g = static_cast<const __half2*>(x);
  __half2 acc = __hmul2(h[0], g[0]);
  acc = __hfma2(h[1], g[1], acc);
  acc = __hfma2(h[2], g[2], acc);
  acc = __hfma2(h[3], g[3], acc);
  const float2 f = __half22float2(acc);
  return f.x + f.y;
}

// Programmatic dependent launch (PDL). A kernel launched with LaunchMaybePdl(pdl = true) may start
// while the previous kernel in the stream is still running (once every CTA of that one has
// called PdlTrigger or exited); it must call PdlWait before it reads the previous kernel's output
// or writes anything (PdlWait returns once the previous grid has completed and its writes are
// visible). Without the launch attribute both are no-ops, so the kernels call them always.
// Every PDL-launched kernel calls PdlWait in at least one thread, so its completion still
// implies the completion of everything before it (the chain stays transitive).
__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void PdlTrigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

// A GPU-scope acquire load of a 32-bit counter or flag (what a waiter polls: the writes released
// before the matching release / fence + atomic are visible after it).
__device__ __forceinline__ unsigned LoadAcquireGpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int LoadAcquireGpu(const int* p) {
  return static_cast<int>(LoadAcquireGpu(reinterpret_cast<const unsigned*>(p)));
}

// The last-arriver pattern: after the threads taking part stored their share, each fences, they
// meet (`barrier`), the leader counts the group in at counters[index], and every one of them
// learns (through `s_last`, a shared flag) whether it was arrival number `others` + 1, i.e. the
// last, which then fences again before reading the others' shares.
template <typename Barrier>
__device__ __forceinline__ bool ArrivedLast(int* counters, int index, int others, bool leader,
                                            int* s_last, Barrier barrier) {
  __threadfence();
  barrier();
  if (leader) *s_last = atomicAdd(&counters[index], 1) == others;
  barrier();
  if (!*s_last) return false;
  __threadfence();
  return true;
}

// 2^x by the SFU (ex2.approx: flush-to-zero, ~2 ulp): the softmaxes' exponentials in the log2
// domain.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats rounded to T (fp16 or bf16) in one 32-bit word, x in the low half (an MMA fragment's
// or a row's element pair).
template <typename T>
__device__ __forceinline__ uint32_t Pack2(float x, float y) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// Asynchronous global -> shared copies (cp.async, sm_80+), completed in commit groups.
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared; zero-filled when !valid (src is then not read).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(size)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The cudaLaunchKernelEx configuration LaunchMaybePdlCluster launches with (also what the
// occupancy API asks about a clustered launch): `attr` holds its attributes and must outlive it.
inline cudaLaunchConfig_t PdlClusterConfig(bool pdl, unsigned cluster_x, dim3 grid, dim3 block,
                                           size_t smem, cudaStream_t stream,
                                           cudaLaunchAttribute (&attr)[2]) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cfg;
}

// cudaLaunchKernelEx with the programmatic-stream-serialization attribute when `pdl` (works
// inside CUDA graph capture: the edge becomes a programmatic one), with `smem` bytes of dynamic
// shared memory, as a grid of thread-block clusters of cluster_x CTAs along x where cluster_x > 1
// (grid.x a multiple of it).
template <typename... KArgs, typename... Args>
cudaError_t LaunchMaybePdlCluster(bool pdl, unsigned cluster_x, void (*kernel)(KArgs...), dim3 grid,
                                  dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = PdlClusterConfig(pdl, cluster_x, grid, block, smem, stream, attr);
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// The same without clusters.
template <typename... KArgs, typename... Args>
cudaError_t LaunchMaybePdlSmem(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                               size_t smem, cudaStream_t stream, Args&&... args) {
  return LaunchMaybePdlCluster(pdl, 1, kernel, grid, block, smem, stream,
                               std::forward<Args>(args)...);
}

// The same without dynamic shared memory.
template <typename... KArgs, typename... Args>
cudaError_t LaunchMaybePdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                           cudaStream_t stream, Args&&... args) {
  return LaunchMaybePdlSmem(pdl, kernel, grid, block, 0, stream, std::forward<Args>(args)...);
}

// GELU and friends in fp32 (kernels/activation.h gives the formulas).
template <int kAct>
__device__ __forceinline__ float Activate(float x) {
  if constexpr (kAct == 1) {  // Activation::kGeluTanh
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  } else if constexpr (kAct == 2) {  // Activation::kGeluErf
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
  } else {
    return x;
  }
}

}  // namespace mqa::fwd
