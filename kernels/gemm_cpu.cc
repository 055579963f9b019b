// CPU GEMM. Choice: OpenBLAS's cblas_sgemm when available (the model forward is GEMM-bound and
// naive loops would make CPU CI slow at realistic widths); the plain loops remain as the fallback
// for builds without BLAS and are the same math (fp32 inputs, accumulation order aside).
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/gemm.h"

#ifdef MQA_WITH_CBLAS
#include <cblas.h>
#endif

// OpenBLAS's thread controls, weak: the cblas.h found may be another BLAS's, and a build without
// OpenBLAS leaves them null.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));
extern "C" int openblas_get_num_threads() __attribute__((weak));

namespace mqa {

int SetCpuGemmThreads(int threads) {
  if (openblas_set_num_threads == nullptr || openblas_get_num_threads == nullptr) return 1;
  openblas_set_num_threads(threads < 1 ? 1 : threads);
  return openblas_get_num_threads();
}

absl::Status GemmCpu(const GemmParams& p) {
  if (p.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemmCpu: dtype ", std::string(DTypeName(p.dtype)), " (only float32)"));
  }
  if (p.m < 0 || p.n < 0 || p.k < 0 || p.lda < p.k || p.ldb < p.k || p.ldc < p.n) {
    return absl::InvalidArgumentError(absl::StrCat("GemmCpu: m ", p.m, " n ", p.n, " k ", p.k,
                                                   " lda ", p.lda, " ldb ", p.ldb, " ldc ", p.ldc));
  }
  if (p.m == 0 || p.n == 0) return absl::OkStatus();
  if (!p.c || (p.k > 0 && (!p.a || !p.b))) {
    return absl::InvalidArgumentError("GemmCpu: null pointer");
  }
  const float* a = static_cast<const float*>(p.a);
  const float* b = static_cast<const float*>(p.b);
  float* c = static_cast<float*>(p.c);
#ifdef MQA_WITH_CBLAS
  if (p.k > 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(p.m),
                static_cast<int>(p.n), static_cast<int>(p.k), p.alpha, a, static_cast<int>(p.lda),
                b, static_cast<int>(p.ldb), p.beta, c, static_cast<int>(p.ldc));
    return absl::OkStatus();
  }
#endif
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      float acc = 0.0f;
      for (int64_t l = 0; l < p.k; ++l) acc += a[i * p.lda + l] * b[j * p.ldb + l];
      float& out = c[i * p.ldc + j];
      out = p.beta == 0.0f ? p.alpha * acc : p.alpha * acc + p.beta * out;
    }
  }
  return absl::OkStatus();
}

}  // namespace mqa
