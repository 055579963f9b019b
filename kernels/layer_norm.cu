// Layer norm: one CTA per row; mean, then the centred variance (two passes over the row, which
// stays in L1/L2), then the normalised write. In place (output == input) is safe: each element
// is read and written by the same thread.
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

}  // namespace

absl::Status LayerNormCuda(const LayerNormParams& p, cudaStream_t stream, bool pdl) {
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
    CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdl(
        pdl, vec ? LayerNormKernel<T, kVec> : LayerNormKernel<T, 1>, grid, dim3(kThreads), stream,
        in, out, w, b, cols, p.epsilon));
    return absl::OkStatus();
  });
}

}  // namespace mqa
