// CUDA / cuBLAS / NCCL variants of the check macros: a foreign error code becomes a Status that
// carries the failing expression and file:line. Include only from CUDA-enabled code.
#pragma once

#include <cuda_runtime.h>

#include "runtime/status.h"

#define CUDA_RETURN_IF_ERROR(expr)                                                              \
  do {                                                                                          \
    cudaError_t mqa_cuda_rc_ = (expr);                                                          \
    if (mqa_cuda_rc_ != cudaSuccess) {                                                          \
      return ::absl::InternalError(::absl::StrCat(#expr, ": ", cudaGetErrorString(mqa_cuda_rc_), \
                                                  " at ", __FILE__, ":", __LINE__));            \
    }                                                                                           \
  } while (0)

// After a kernel launch: the launch error (bad configuration) as a Status.
#define CUDA_RETURN_IF_LAUNCH_ERROR() CUDA_RETURN_IF_ERROR(cudaGetLastError())

#define CUBLAS_RETURN_IF_ERROR(expr)                                                      \
  do {                                                                                    \
    int mqa_cublas_rc_ = static_cast<int>(expr);                                          \
    if (mqa_cublas_rc_ != 0) {                                                            \
      return ::absl::InternalError(::absl::StrCat(#expr, ": cuBLAS status ", mqa_cublas_rc_, \
                                                  " at ", __FILE__, ":", __LINE__));      \
    }                                                                                     \
  } while (0)

#define NCCL_RETURN_IF_ERROR(expr)                                                             \
  do {                                                                                         \
    ncclResult_t mqa_nccl_rc_ = (expr);                                                        \
    if (mqa_nccl_rc_ != ncclSuccess) {                                                         \
      return ::absl::InternalError(::absl::StrCat(#expr, ": ", ncclGetErrorString(mqa_nccl_rc_), \
                                                  " at ", __FILE__, ":", __LINE__));           \
    }                                                                                          \
  } while (0)

// For invariants inside CUDA code paths (e.g. destructors) where no Status can be returned.
#define CUDA_CHECK(expr)                                                                   \
  do {                                                                                     \
    cudaError_t mqa_cuda_rc_ = (expr);                                                     \
    if (mqa_cuda_rc_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                   \
                   cudaGetErrorString(mqa_cuda_rc_));                                      \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)
