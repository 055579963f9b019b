// The one place that turns run-time attention shapes into template parameters (STYLE.md 5):
// element type, head size and the CTA's warp layout. Its error lists what is compiled.
// Include only from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/dtype.h"

namespace mqa::attention {

// How a CTA's warps split its work: kWarpsM warps along the query rows (16 rows each) times
// kWarpsN warps along each KV tile's tokens (merged at the end).
enum class WarpLayout { k8x1, k4x2, k3x2, k2x2, k1x4 };

inline const char* WarpLayoutName(WarpLayout w) {
  switch (w) {
    case WarpLayout::k8x1:
      return "8x1";
    case WarpLayout::k4x2:
      return "4x2";
    case WarpLayout::k3x2:
      return "3x2";
    case WarpLayout::k2x2:
      return "2x2";
    case WarpLayout::k1x4:
      return "1x4";
  }
  return "?";
}

inline int WarpsM(WarpLayout w) {
  switch (w) {
    case WarpLayout::k8x1:
      return 8;
    case WarpLayout::k4x2:
      return 4;
    case WarpLayout::k3x2:
      return 3;
    case WarpLayout::k2x2:
      return 2;
    case WarpLayout::k1x4:
      return 1;
  }
  return 0;
}

// Calls f.template operator()<T, kHeadDim>() for the compiled element type and head size.
template <typename F>
absl::Status DispatchTypeAndDim(DType dtype, int head_dim, F&& f) {
  auto with_dim = [&]<typename T>() -> absl::Status {
    switch (head_dim) {
      case 64:
        return f.template operator()<T, 64>();
      case 128:
        return f.template operator()<T, 128>();
    }
    return absl::InvalidArgumentError(absl::StrCat("CUDA attention: head_dim ", head_dim,
                                                   " is not compiled (supported: 64, 128)"));
  };
  switch (dtype) {
    case DType::kF16:
      return with_dim.template operator()<__half>();
    case DType::kBF16:
      return with_dim.template operator()<__nv_bfloat16>();
    case DType::kF32:
    case DType::kI32:
    case DType::kI64:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("CUDA attention: dtype ", std::string(DTypeName(dtype)),
                   " is not supported (supported: float16, bfloat16)"));
}

// Calls f.template operator()<T, kHeadDim, kWarpsM, kWarpsN>() for the compiled combination.
template <typename F>
absl::Status DispatchAttention(DType dtype, int head_dim, WarpLayout layout, F&& f) {
  return DispatchTypeAndDim(dtype, head_dim, [&]<typename T, int D>() -> absl::Status {
    switch (layout) {
      case WarpLayout::k8x1:
        return f.template operator()<T, D, 8, 1>();
      case WarpLayout::k4x2:
        return f.template operator()<T, D, 4, 2>();
      case WarpLayout::k3x2:
        return f.template operator()<T, D, 3, 2>();
      case WarpLayout::k2x2:
        return f.template operator()<T, D, 2, 2>();
      case WarpLayout::k1x4:
        return f.template operator()<T, D, 1, 4>();
    }
    return absl::InternalError("bad warp layout");
  });
}

}  // namespace mqa::attention
