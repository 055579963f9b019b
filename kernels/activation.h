// Bias, activation and residual in one elementwise pass:
//   out[r, c] = act(input[r, c] + bias[c]) + residual[r, c]
// bias and residual are optional. Covers Linear biases (identity), the MLP's bias + GELU, and the
// residual adds after attention / MLP (after the tensor-parallel all-reduce).
//   BiasActivationCpu (activation_cpu.cc): the fp32 reference;
//   BiasActivationCuda (activation.cu, with the CUDA backend): same params plus a cudaStream_t.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/dtype.h"

namespace mqa {

enum class Activation : uint8_t {
  kIdentity,
  kGeluTanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): HF gelu_pytorch_tanh / gelu_new
  kGeluErf,   // 0.5 x (1 + erf(x / sqrt(2))): HF "gelu"
};

// HF config.json activation_function -> Activation; InvalidArgument names the supported ones.
absl::StatusOr<Activation> ParseActivation(std::string_view name);

struct BiasActivationParams {
  const void* input = nullptr;     // [rows, cols], contiguous
  const void* bias = nullptr;      // [cols] or null
  const void* residual = nullptr;  // [rows, cols] or null; added after the activation
  void* output = nullptr;          // [rows, cols]; may equal input or residual
  int64_t rows = 0;
  int64_t cols = 0;
  Activation activation = Activation::kIdentity;
  DType dtype = DType::kF32;
};

// fp32 only. InvalidArgument for other dtypes, null input/output, negative sizes.
absl::Status BiasActivationCpu(const BiasActivationParams& p);

}  // namespace mqa
