#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/activation.h"

namespace mqa {

absl::StatusOr<Activation> ParseActivation(std::string_view name) {
  // gelu_new and gelu_fast are the same tanh approximation written differently.
  if (name == "gelu_pytorch_tanh" || name == "gelu_new" || name == "gelu_fast") {
    return Activation::kGeluTanh;
  }
  if (name == "gelu") return Activation::kGeluErf;
  return absl::InvalidArgumentError(
      absl::StrCat("activation_function \"", std::string(name),
                   "\" is not supported (gelu_pytorch_tanh, gelu_new, gelu_fast, gelu)"));
}

namespace {

template <Activation kAct>
void Apply(const BiasActivationParams& p) {
  const float* in = static_cast<const float*>(p.input);
  const float* bias = static_cast<const float*>(p.bias);
  const float* res = static_cast<const float*>(p.residual);
  float* out = static_cast<float*>(p.output);
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kInvSqrt2 = 0.7071067811865476f;
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < p.cols; ++c) {
      const int64_t i = r * p.cols + c;
      float x = in[i] + (bias ? bias[c] : 0.0f);
      if constexpr (kAct == Activation::kGeluTanh) {
        x = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
      } else if constexpr (kAct == Activation::kGeluErf) {
        x = 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
      }
      out[i] = res ? x + res[i] : x;
    }
  }
}

}  // namespace

absl::Status BiasActivationCpu(const BiasActivationParams& p) {
  if (p.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BiasActivationCpu: dtype ", std::string(DTypeName(p.dtype)), " (only float32)"));
  }
  if (p.rows < 0 || p.cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BiasActivationCpu: rows ", p.rows, ", cols ", p.cols));
  }
  if (p.rows == 0 || p.cols == 0) return absl::OkStatus();
  if (!p.input || !p.output) return absl::InvalidArgumentError("BiasActivationCpu: null pointer");
  switch (p.activation) {
    case Activation::kIdentity:
      Apply<Activation::kIdentity>(p);
      return absl::OkStatus();
    case Activation::kGeluTanh:
      Apply<Activation::kGeluTanh>(p);
      return absl::OkStatus();
    case Activation::kGeluErf:
      Apply<Activation::kGeluErf>(p);
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("BiasActivationCpu: unknown activation");
}

}  // namespace mqa
