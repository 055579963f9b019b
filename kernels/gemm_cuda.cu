// cuBLASLt GEMMs with fused epilogues, and the skinny decode kernel (see gemm_cuda.h).
//
// Layout: row-major C[m, n] = A[m, k] B[n, k]^T is, in cuBLAS's column-major terms,
// C^T[n, m] = op_T(B^T as k x n) * A^T (k x m): the weight is cuBLASLt's "A" with TRANSA = T, the
// activations its "B", and the bias (one value per output feature) runs along C^T's rows, which is
// what cuBLASLt's bias epilogue adds.
#include <cublasLt.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/forward_cuda_common.cuh"
#include "kernels/gemm_cuda.h"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

absl::Status CheckGemm(const GemmParams& p, const char* who) {
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": dtype ", std::string(DTypeName(p.dtype)), " unsupported (float16, bfloat16)"));
  }
  if (p.m < 0 || p.n < 0 || p.k < 0 || p.lda < p.k || p.ldb < p.k || p.ldc < p.n) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": m ", p.m, " n ", p.n, " k ", p.k,
                                                   " lda ", p.lda, " ldb ", p.ldb, " ldc ", p.ldc));
  }
  if (p.m > 0 && p.n > 0 && (!p.a || !p.b || !p.c)) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": null pointer"));
  }
  if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": dimension over 2^31"));
  }
  return absl::OkStatus();
}

// --- Skinny kernel ---------------------------------------------------------------------------

constexpr int kSkinnyWarps = 4;
constexpr int kSkinnyUnroll = 4;  // 16-byte weight loads in flight per row and lane

// R: weight rows (output columns) per warp.
template <typename T, int M, int kAct, int R>
__global__ void __launch_bounds__(kSkinnyWarps * 32)
    SkinnyGemmKernel(const T* __restrict__ a, int64_t lda, const T* __restrict__ b, int64_t ldb,
                     T* c, int64_t ldc, const T* __restrict__ bias, int m, int n, int k,
                     bool accumulate) {
  using V = fwd::Vec16<T>;
  constexpr int U = kSkinnyUnroll, kV = V::kN;
  const int lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * kSkinnyWarps + (threadIdx.x >> 5)) * R;
  if (n0 >= n) return;
  const T* brow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) brow[r] = b + static_cast<int64_t>(min(n0 + r, n - 1)) * ldb;
  const T* arow[M];
#pragma unroll
  for (int i = 0; i < M; ++i) arow[i] = a + static_cast<int64_t>(min(i, m - 1)) * lda;
  float acc[M][R];
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;

  auto fma_group = [&](const V (&bv)[R], int kk) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const V av = *reinterpret_cast<const V*>(arow[i] + kk);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const float x = fwd::ToFloat(av.v[e]);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[i][r] = fmaf(x, fwd::ToFloat(bv[r].v[e]), acc[i][r]);
      }
    }
  };
  int kk = lane * kV;
  for (; kk + (U - 1) * 32 * kV < k; kk += U * 32 * kV) {
    V bv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) bv[u][r] = *reinterpret_cast<const V*>(brow[r] + kk + u * 32 * kV);
#pragma unroll
    for (int u = 0; u < U; ++u) fma_group(bv[u], kk + u * 32 * kV);
  }
  for (; kk < k; kk += 32 * kV) {
    V bv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) bv[r] = *reinterpret_cast<const V*>(brow[r] + kk);
    fma_group(bv, kk);
  }
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[i][r] += __shfl_xor_sync(0xffffffffu, acc[i][r], o);
  // Lane i*R + r writes output (i, n0 + r).
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (lane == i * R + r && i < m && n0 + r < n) {
        float v = acc[i][r];
        if (bias != nullptr) v += fwd::ToFloat(bias[n0 + r]);
        v = fwd::Activate<kAct>(v);
        T* out = c + static_cast<int64_t>(i) * ldc + n0 + r;
        if (accumulate) v += fwd::ToFloat(*out);
        *out = fwd::FromFloat<T>(v);
      }
    }
  }
}

template <typename T, int M, int R>
absl::Status LaunchSkinny(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream) {
  const int per_block = kSkinnyWarps * R;
  const int64_t blocks = (p.n + per_block - 1) / per_block;
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  T* c = static_cast<T*>(p.c);
  const T* bias = static_cast<const T*>(e.bias);
  const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  switch (e.activation) {
    case Activation::kIdentity:
      SkinnyGemmKernel<T, M, 0, R><<<blocks, kSkinnyWarps * 32, 0, stream>>>(
          a, p.lda, b, p.ldb, c, p.ldc, bias, m, n, k, e.accumulate);
      break;
    case Activation::kGeluTanh:
      SkinnyGemmKernel<T, M, 1, R><<<blocks, kSkinnyWarps * 32, 0, stream>>>(
          a, p.lda, b, p.ldb, c, p.ldc, bias, m, n, k, e.accumulate);
      break;
    case Activation::kGeluErf:
      return absl::UnimplementedError("SkinnyGemmCuda: GELU (erf) is not fused");
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

// A plain fallback for shapes cuBLASLt's heuristic refuses (odd strides): one thread per output.
template <typename T, int kAct>
__global__ void SimpleGemmKernel(const T* __restrict__ a, int64_t lda, const T* __restrict__ b,
                                 int64_t ldb, T* c, int64_t ldc, const T* __restrict__ bias, int m,
                                 int n, int k, bool accumulate) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<int64_t>(m) * n) return;
  const int i = static_cast<int>(idx / n), j = static_cast<int>(idx % n);
  float acc = 0;
  for (int kk = 0; kk < k; ++kk) {
    acc = fmaf(fwd::ToFloat(a[i * lda + kk]), fwd::ToFloat(b[j * ldb + kk]), acc);
  }
  if (bias != nullptr) acc += fwd::ToFloat(bias[j]);
  acc = fwd::Activate<kAct>(acc);
  T* out = c + i * ldc + j;
  if (accumulate) acc += fwd::ToFloat(*out);
  *out = fwd::FromFloat<T>(acc);
}

template <typename T>
absl::Status LaunchSimple(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream) {
  const int64_t total = p.m * p.n;
  const int64_t blocks = (total + 255) / 256;
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  T* c = static_cast<T*>(p.c);
  const T* bias = static_cast<const T*>(e.bias);
  const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  if (e.activation == Activation::kGeluTanh) {
    SimpleGemmKernel<T, 1><<<blocks, 256, 0, stream>>>(a, p.lda, b, p.ldb, c, p.ldc, bias, m, n, k,
                                                       e.accumulate);
  } else {
    SimpleGemmKernel<T, 0><<<blocks, 256, 0, stream>>>(a, p.lda, b, p.ldb, c, p.ldc, bias, m, n, k,
                                                       e.accumulate);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

// --- cuBLASLt --------------------------------------------------------------------------------

#define LT_RETURN_IF_ERROR(expr)                                                              \
  do {                                                                                        \
    cublasStatus_t mqa_lt_rc_ = (expr);                                                       \
    if (mqa_lt_rc_ != CUBLAS_STATUS_SUCCESS) {                                                \
      return absl::InternalError(absl::StrCat(#expr, ": ", cublasLtGetStatusString(mqa_lt_rc_), \
                                              " at ", __FILE__, ":", __LINE__));              \
    }                                                                                         \
  } while (0)

}  // namespace

absl::Status SkinnyGemmCuda(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream,
                            int rows_per_warp) {
  RETURN_IF_ERROR(CheckGemm(p, "SkinnyGemmCuda"));
  if (e.accumulate && e.activation != Activation::kIdentity) {
    return absl::InvalidArgumentError("GEMM: accumulate needs the identity activation");
  }
  if (p.m == 0 || p.n == 0) return absl::OkStatus();
  if (p.m > CudaGemm::kSkinnyMaxM || p.k % 8 != 0 || p.lda % 8 != 0 || p.ldb % 8 != 0 ||
      !fwd::Aligned16(p.a) || !fwd::Aligned16(p.b) || e.activation == Activation::kGeluErf) {
    return absl::UnimplementedError("SkinnyGemmCuda: shape or alignment not supported");
  }
  auto with_rows = [&]<typename T, int R>() -> absl::Status {
    if (p.m == 1) return LaunchSkinny<T, 1, R>(p, e, stream);
    if (p.m == 2) return LaunchSkinny<T, 2, R>(p, e, stream);
    if (p.m <= 4) return LaunchSkinny<T, 4, R>(p, e, stream);
    return LaunchSkinny<T, 8, R>(p, e, stream);
  };
  auto with_type = [&]<typename T>() -> absl::Status {
    switch (rows_per_warp) {
      case 1:
        return with_rows.template operator()<T, 1>();
      case 4:
        return with_rows.template operator()<T, 4>();
      default:
        return with_rows.template operator()<T, 2>();
    }
  };
  return p.dtype == DType::kF16 ? with_type.template operator()<__half>()
                                : with_type.template operator()<__nv_bfloat16>();
}

struct CudaGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool fallback = false;  // no cuBLASLt algorithm: the plain kernel
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

absl::StatusOr<std::unique_ptr<CudaGemm>> CudaGemm::Create(const Options& options) {
  auto g = std::unique_ptr<CudaGemm>(new CudaGemm());
  g->options_ = options;
  cublasLtHandle_t h = nullptr;
  LT_RETURN_IF_ERROR(cublasLtCreate(&h));
  g->handle_ = h;
  if (options.workspace_bytes > 0) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&g->workspace_, options.workspace_bytes));
  }
  return g;
}

CudaGemm::~CudaGemm() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

absl::Status CudaGemm::Run(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckGemm(p, "CudaGemm"));
  if (e.accumulate && e.activation != Activation::kIdentity) {
    return absl::InvalidArgumentError("CudaGemm: accumulate needs the identity activation");
  }
  if (e.activation == Activation::kGeluErf) {
    return absl::UnimplementedError("CudaGemm: GELU (erf) is not fused; use BiasActivationCuda");
  }
  if (p.m == 0 || p.n == 0) return absl::OkStatus();
  if (options_.skinny) {
    const absl::Status s = SkinnyGemmCuda(p, e, stream, options_.skinny_rows_per_warp);
    if (!absl::IsUnimplemented(s)) return s;
  }
  return RunLt(p, e, stream);
}

absl::Status CudaGemm::RunLt(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream) {
  const cudaDataType_t type = p.dtype == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (e.activation == Activation::kGeluTanh) {
    epi = e.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  } else if (e.bias) {
    epi = CUBLASLT_EPILOGUE_BIAS;
  }
  const Key key{p.m, p.n, p.k, p.lda, p.ldb, p.ldc, static_cast<int>(p.dtype),
                static_cast<int>(epi), e.accumulate};
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    auto plan = std::make_unique<Plan>();
    LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                      sizeof(ta)));
    LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                      sizeof(tb)));
    LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                      &epi, sizeof(epi)));
    if (e.bias) {
      LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type)));
    }
    LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, type, p.k, p.n, p.ldb));
    LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, type, p.k, p.m, p.lda));
    LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->c, type, p.n, p.m, p.ldc));
    cublasLtMatmulPreference_t pref = nullptr;
    LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = options_.workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
        static_cast<cublasLtHandle_t>(handle_), plan->desc, plan->a, plan->b, plan->c, plan->c,
        pref, 1, &result, &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || returned == 0) {
      plan->fallback = true;
    } else {
      plan->algo = result.algo;
    }
    it = plans_.emplace(key, std::move(plan)).first;
  }
  Plan& plan = *it->second;
  if (plan.fallback) {
    return p.dtype == DType::kF16 ? LaunchSimple<__half>(p, e, stream)
                                  : LaunchSimple<__nv_bfloat16>(p, e, stream);
  }
  if (e.bias) {
    LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias, sizeof(e.bias)));
  }
  const float alpha = 1.0f, beta = e.accumulate ? 1.0f : 0.0f;
  LT_RETURN_IF_ERROR(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan.desc, &alpha, p.b,
                                    plan.a, p.a, plan.b, &beta, p.c, plan.c, p.c, plan.c,
                                    &plan.algo, workspace_, options_.workspace_bytes, stream));
  return absl::OkStatus();
}

}  // namespace mqa
