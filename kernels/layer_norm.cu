// Layer norm, two kernels (LayerNormCudaKernel in layer_norm_cuda.h):
//   kThreePass: one 256-thread CTA per row; mean, then the centred variance (two passes over the
//     row, which stays in L1/L2), then the normalised write; any width and alignment.
//   kRegisters: one CTA per row holding the row in registers after a single load pass (up to
//     kMaxVecsPerThread 16-byte vectors per thread, up to kMaxRegThreads threads); weight and bias
//     are loaded before the PDL wait; both statistics come from registers with one shared-memory
//     exchange. Rows it does not cover (width not a multiple of 16 bytes, unaligned pointers,
//     wider than kMaxRegThreads * kMaxVecsPerThread vectors) run kThreePass.
// In place (output == input) is safe in both: each element is read and written by the same thread.
#include "absl/strings/str_cat.h"
#include "kernels/forward_cuda_common.cuh"
#include "kernels/layer_norm_cuda.h"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

constexpr int kThreads = 256;

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) LayerNormKernel(const T* __restrict__ in, T* out,
                                                            const T* __restrict__ weight,
                                                            const T* __restrict__ bias, int cols,
                                                            float epsilon) {
  __shared__ float scratch[33];
  using V = fwd::Vec16<T>;
  const int64_t row = blockIdx.x;
  const T* x = in + row * cols;
  T* y = out + row * cols;
  const int groups = cols / kVec;
  // PDL: nothing before this reads the previous kernel's output (kernels/forward_cuda_common.cuh).
  fwd::PdlWait();
  fwd::PdlTrigger();
  auto load = [&](const T* p, int g, float* f) {
    if constexpr (kVec == 1) {
      f[0] = fwd::ToFloat(p[g]);
    } else {
      const V v = reinterpret_cast<const V*>(p)[g];
#pragma unroll
      for (int i = 0; i < kVec; ++i) f[i] = fwd::ToFloat(v.v[i]);
    }
  };
  float sum = 0.0f;
  for (int g = threadIdx.x; g < groups; g += kThreads) {
    float f[kVec];
    load(x, g, f);
#pragma unroll
    for (int i = 0; i < kVec; ++i) sum += f[i];
  }
  const float mean = fwd::BlockSum(sum, scratch) / cols;
  float sq = 0.0f;
  for (int g = threadIdx.x; g < groups; g += kThreads) {
    float f[kVec];
    load(x, g, f);
#pragma unroll
    for (int i = 0; i < kVec; ++i) sq += (f[i] - mean) * (f[i] - mean);
  }
  const float rstd = rsqrtf(fwd::BlockSum(sq, scratch) / cols + epsilon);
  for (int g = threadIdx.x; g < groups; g += kThreads) {
    float f[kVec], w[kVec], b[kVec];
    load(x, g, f);
    load(weight, g, w);
    load(bias, g, b);
    if constexpr (kVec == 1) {
      y[g] = fwd::FromFloat<T>((f[0] - mean) * rstd * w[0] + b[0]);
    } else {
      V o;
#pragma unroll
      for (int i = 0; i < kVec; ++i) o.v[i] = fwd::FromFloat<T>((f[i] - mean) * rstd * w[i] + b[i]);
      reinterpret_cast<V*>(y)[g] = o;
    }
  }
}

constexpr int kMaxRegThreads = 512;
constexpr int kMaxVecsPerThread = 4;

// Thread t holds the row's 16-byte vectors t, t + blockDim.x, ... (kN of them, coalesced loads).
// Statistics: each warp centres its values on its own mean (exact: a shuffle sum, then the
// centred squares from registers); the warps' (sum, centred sum of squares, count) then combine
// with Chan et al.'s formula M2 = sum_w [M2_w + n_w (mean_w - mean)^2], which keeps rows with a
// large mean free of cancellation. One __syncthreads in all: every warp reads every warp's
// triple and reduces it itself.
template <typename T, int kN>
__global__ void __launch_bounds__(kMaxRegThreads)
    LayerNormRegistersKernel(const T* in, T* out, const T* __restrict__ weight,
                             const T* __restrict__ bias, int groups, float epsilon) {
  using V = fwd::Vec16<T>;
  constexpr int kVec = V::kN;
  __shared__ float warp_sum[32], warp_m2[32], warp_count[32];
  const int tid = threadIdx.x, threads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5;
  const V* x = reinterpret_cast<const V*>(in) + static_cast<int64_t>(blockIdx.x) * groups;
  V* y = reinterpret_cast<V*>(out) + static_cast<int64_t>(blockIdx.x) * groups;
  // Weight and bias do not depend on the previous kernel: their loads overlap the PDL wait.
  V w[kN], b[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int g = tid + i * threads;
    if (g < groups) {
      w[i] = reinterpret_cast<const V*>(weight)[g];
      b[i] = reinterpret_cast<const V*>(bias)[g];
    }
  }
  // PDL: nothing before this reads the previous kernel's output (kernels/forward_cuda_common.cuh).
  fwd::PdlWait();
  fwd::PdlTrigger();
  float f[kN][kVec];
  float sum = 0.0f, count = 0.0f;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int g = tid + i * threads;
    if (g < groups) {
      const V v = x[g];
#pragma unroll
      for (int j = 0; j < kVec; ++j) f[i][j] = fwd::ToFloat(v.v[j]);
      count += kVec;
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) f[i][j] = 0.0f;
    }
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum += f[i][j];
  }
  for (int o = 16; o > 0; o >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
    count += __shfl_xor_sync(0xffffffffu, count, o);
  }
  const float warp_mean = count > 0.0f ? sum / count : 0.0f;
  float m2 = 0.0f;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    if (tid + i * threads < groups) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) m2 += (f[i][j] - warp_mean) * (f[i][j] - warp_mean);
    }
  }
  for (int o = 16; o > 0; o >>= 1) m2 += __shfl_xor_sync(0xffffffffu, m2, o);
  if (lane == 0) {
    warp_sum[warp] = sum;
    warp_m2[warp] = m2;
    warp_count[warp] = count;
  }
  __syncthreads();
  const bool have = lane < (threads >> 5);
  const float ws = have ? warp_sum[lane] : 0.0f;
  const float wm2 = have ? warp_m2[lane] : 0.0f;
  const float wn = have ? warp_count[lane] : 0.0f;
  const float cols = static_cast<float>(groups) * kVec;
  float total = ws;
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
  const float mean = total / cols;
  const float d = wn > 0.0f ? ws / wn - mean : 0.0f;
  float m2_total = wm2 + wn * d * d;
  for (int o = 16; o > 0; o >>= 1) m2_total += __shfl_xor_sync(0xffffffffu, m2_total, o);
  const float rstd = rsqrtf(m2_total / cols + epsilon);
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int g = tid + i * threads;
    if (g < groups) {
      V o;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        o.v[j] = fwd::FromFloat<T>((f[i][j] - mean) * rstd * fwd::ToFloat(w[i].v[j]) +
                                   fwd::ToFloat(b[i].v[j]));
      }
      y[g] = o;
    }
  }
}

// The fewest vectors per thread (1, 2 or 4) that cover `groups` vectors with at most
// kMaxRegThreads threads, and the threads (a multiple of 32); {0, 0} when none does.
struct RegistersShape {
  int vecs_per_thread = 0;
  int threads = 0;
};
RegistersShape ChooseRegistersShape(int64_t groups) {
  for (int n = 1; n <= kMaxVecsPerThread; n *= 2) {
    if (groups <= static_cast<int64_t>(kMaxRegThreads) * n) {
      const int per_thread = static_cast<int>((groups + n - 1) / n);
      return {n, (per_thread + 31) / 32 * 32};
    }
  }
  return {};
}

}  // namespace

absl::Status LayerNormCuda(const LayerNormParams& p, cudaStream_t stream, bool pdl,
                           LayerNormCudaKernel kernel) {
  if (p.input == nullptr || p.output == nullptr || p.weight == nullptr || p.bias == nullptr ||
      p.cols <= 0 || p.rows < 0 || p.cols > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("LayerNormCuda: bad params (rows ", p.rows, ", cols ", p.cols, ")"));
  }
  if (p.rows == 0) return absl::OkStatus();
  if (p.rows > INT32_MAX) return absl::InvalidArgumentError("LayerNormCuda: too many rows");
  return fwd::DispatchFloat(p.dtype, "LayerNormCuda", [&]<typename T>() -> absl::Status {
    const T* in = static_cast<const T*>(p.input);
    T* out = static_cast<T*>(p.output);
    const T* w = static_cast<const T*>(p.weight);
    const T* b = static_cast<const T*>(p.bias);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = p.cols % kVec == 0 && fwd::Aligned16(in) && fwd::Aligned16(out) &&
                     fwd::Aligned16(w) && fwd::Aligned16(b);
    const int cols = static_cast<int>(p.cols);
    const dim3 grid(static_cast<unsigned>(p.rows));
    const RegistersShape shape = ChooseRegistersShape(cols / kVec);
    if (kernel == LayerNormCudaKernel::kRegisters && vec && shape.vecs_per_thread > 0) {
      auto* registers_kernel = shape.vecs_per_thread == 1   ? LayerNormRegistersKernel<T, 1>
                               : shape.vecs_per_thread == 2 ? LayerNormRegistersKernel<T, 2>
                                                            : LayerNormRegistersKernel<T, 4>;
      CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdl(pdl, registers_kernel, grid, dim3(shape.threads),
                                               stream, in, out, w, b, cols / kVec, p.epsilon));
      return absl::OkStatus();
    }
    CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdl(
        pdl, vec ? LayerNormKernel<T, kVec> : LayerNormKernel<T, 1>, grid, dim3(kThreads), stream,
        in, out, w, b, cols, p.epsilon));
    return absl::OkStatus();
  });
}

}  // namespace mqa
