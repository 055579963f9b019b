// The GEMM of every Linear layer, in PyTorch's weight layout (row-major, B is [out, in]):
//   C[m, n] = alpha * sum_k A[m, k] * B[n, k] + beta * C[m, n]
//   GemmCpu (gemm_cpu.cc): OpenBLAS cblas_sgemm where CMake found it (MQA_WITH_CBLAS), plain
//     loops otherwise;
//   CudaGemm (gemm_cuda.h, with the CUDA backend): cuBLASLt and the skinny decode kernels
//     behind the same params, plus a stream.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/dtype.h"

namespace mqa {

struct GemmParams {
  const void* a = nullptr;  // [m, k], row stride lda (elements)
  const void* b = nullptr;  // [n, k], row stride ldb
  void* c = nullptr;        // [m, n], row stride ldc; must not overlap a or b
  int64_t lda = 0;
  int64_t ldb = 0;
  int64_t ldc = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: C is write-only (its old contents, even NaN, are ignored)
  DType dtype = DType::kF32;
};

// fp32 only. InvalidArgument for other dtypes, negative sizes, strides shorter than a row.
absl::Status GemmCpu(const GemmParams& p);

// The threads GemmCpu's OpenBLAS uses (process-wide); returns the count in effect, 1 without
// OpenBLAS. Ranks sharing a node each take their share of its cores: OpenBLAS's default, every
// core for every rank, has their spinning threads fight over the same cores.
int SetCpuGemmThreads(int threads);

}  // namespace mqa
