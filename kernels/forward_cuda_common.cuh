// Device helpers shared by the forward kernels (cudafwd): element conversions and the one place
// that turns a run-time float dtype into a template parameter. Include only from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

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
