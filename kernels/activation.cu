// Bias + activation + residual: element-wise, 16 bytes per thread when cols and pointers allow.
#include "absl/strings/str_cat.h"
#include "kernels/activation_cuda.h"
#include "kernels/forward_cuda_common.cuh"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

static_assert(static_cast<int>(Activation::kIdentity) == 0 &&
              static_cast<int>(Activation::kGeluTanh) == 1 &&
              static_cast<int>(Activation::kGeluErf) == 2);

template <typename T, int kVec, int kAct>
__global__ void BiasActivationKernel(const T* in, const T* __restrict__ bias, const T* res, T* out,
                                     int64_t groups, int64_t col_groups) {
  using V = fwd::Vec16<T>;
  fwd::PdlWait();  // PDL: the inputs are the previous kernel's (forward_cuda_common.cuh)
  fwd::PdlTrigger();
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t cg = g % col_groups;
    float x[kVec], b[kVec], r[kVec];
    if constexpr (kVec == 1) {
      x[0] = fwd::ToFloat(in[g]);
      b[0] = bias ? fwd::ToFloat(bias[cg]) : 0.0f;
      r[0] = res ? fwd::ToFloat(res[g]) : 0.0f;
    } else {
      const V xv = reinterpret_cast<const V*>(in)[g];
      V bv, rv;
      if (bias) bv = reinterpret_cast<const V*>(bias)[cg];
      if (res) rv = reinterpret_cast<const V*>(res)[g];
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        x[i] = fwd::ToFloat(xv.v[i]);
        b[i] = bias ? fwd::ToFloat(bv.v[i]) : 0.0f;
        r[i] = res ? fwd::ToFloat(rv.v[i]) : 0.0f;
      }
    }
    if constexpr (kVec == 1) {
      out[g] = fwd::FromFloat<T>(fwd::Activate<kAct>(x[0] + b[0]) + r[0]);
    } else {
      V o;
#pragma unroll
      for (int i = 0; i < kVec; ++i) o.v[i] = fwd::FromFloat<T>(fwd::Activate<kAct>(x[i] + b[i]) + r[i]);
      reinterpret_cast<V*>(out)[g] = o;
    }
  }
}

template <typename T, int kVec>
absl::Status Launch(const BiasActivationParams& p, cudaStream_t stream, bool pdl) {
  const int64_t groups = p.rows * p.cols / kVec;
  const int64_t col_groups = p.cols / kVec;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((groups + kThreads - 1) / kThreads, 132 * 16);
  const T* in = static_cast<const T*>(p.input);
  const T* bias = static_cast<const T*>(p.bias);
  const T* res = static_cast<const T*>(p.residual);
  T* out = static_cast<T*>(p.output);
  const dim3 grid(static_cast<unsigned>(blocks)), block(kThreads);
  switch (p.activation) {
    case Activation::kIdentity:
      CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdl(pdl, BiasActivationKernel<T, kVec, 0>, grid, block,
                                                stream, in, bias, res, out, groups, col_groups));
      break;
    case Activation::kGeluTanh:
      CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdl(pdl, BiasActivationKernel<T, kVec, 1>, grid, block,
                                                stream, in, bias, res, out, groups, col_groups));
      break;
    case Activation::kGeluErf:
      CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdl(pdl, BiasActivationKernel<T, kVec, 2>, grid, block,
                                                stream, in, bias, res, out, groups, col_groups));
      break;
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace

absl::Status BiasActivationCuda(const BiasActivationParams& p, cudaStream_t stream, bool pdl) {
  if (p.rows < 0 || p.cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BiasActivationCuda: rows ", p.rows, ", cols ", p.cols));
  }
  if (p.rows == 0 || p.cols == 0) return absl::OkStatus();
  if (!p.input || !p.output) return absl::InvalidArgumentError("BiasActivationCuda: null pointer");
  return fwd::DispatchFloat(p.dtype, "BiasActivationCuda", [&]<typename T>() -> absl::Status {
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = p.cols % kVec == 0 && fwd::Aligned16(p.input) && fwd::Aligned16(p.output) &&
                     (!p.bias || fwd::Aligned16(p.bias)) &&
                     (!p.residual || fwd::Aligned16(p.residual));
    return vec ? Launch<T, kVec>(p, stream, pdl) : Launch<T, 1>(p, stream, pdl);
  });
}

}  // namespace mqa
