// LayerNorm over the last dimension: out = (x - mean) / sqrt(var + eps) * weight + bias, with the
// biased variance (as torch.nn.LayerNorm). One launcher per backend, same params struct:
//   LayerNormCpu (layer_norm_cpu.cc): the fp32 reference;
//   LayerNormCuda (layer_norm.cu, with the CUDA backend): same params plus a cudaStream_t.
// Callers normally go through kernels/ops.h, which dispatches on the device.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/dtype.h"

namespace mqa {

struct LayerNormParams {
  const void* input = nullptr;   // [rows, cols], contiguous
  void* output = nullptr;        // [rows, cols], contiguous; may equal input
  const void* weight = nullptr;  // [cols]
  const void* bias = nullptr;    // [cols]
  int64_t rows = 0;
  int64_t cols = 0;
  float epsilon = 1e-5f;
  DType dtype = DType::kF32;  // of all four arrays
};

// fp32 only; statistics accumulated in double. InvalidArgument for other dtypes, null pointers
// or non-positive cols.
absl::Status LayerNormCpu(const LayerNormParams& p);

// A k-sliced GEMM's fp32 partial products (GemmEpilogue::k_slices) summed with a bias into the
// residual stream, then that row's layer norm: the residual update of one projection and the
// next GEMM's input in one pass,
//   residual[r] = round(residual[r] + bias + sum_s partials[s][r])     (dtype)
//   output[r] = (residual[r] - mean) / sqrt(var + eps) * weight + ln_bias
// with the statistics of the rounded residual row (as LayerNorm of it would see them).
struct SliceSumLayerNormParams {
  const float* partials = nullptr;  // [slices][rows][cols] float32
  int slices = 1;
  const void* bias = nullptr;     // [cols], or null
  void* residual = nullptr;       // [rows, cols], read and written
  void* output = nullptr;         // [rows, cols]; not residual
  const void* weight = nullptr;   // [cols]
  const void* ln_bias = nullptr;  // [cols]
  int64_t rows = 0;
  int64_t cols = 0;
  float epsilon = 1e-5f;
  DType dtype = DType::kF32;  // of every array but partials
};

// The reference: fp32 only (as LayerNormCpu). InvalidArgument for other dtypes, null pointers
// (bias may be null), slices < 1 or non-positive cols.
absl::Status SliceSumLayerNormCpu(const SliceSumLayerNormParams& p);

}  // namespace mqa
