// cuBLASLt GEMMs with fused epilogues, and the skinny decode kernel (see gemm_cuda.h).
//
// Layout: row-major C[m, n] = A[m, k] B[n, k]^T is, in cuBLAS's column-major terms,
// C^T[n, m] = op_T(B^T as k x n) * A^T (k x m): the weight is cuBLASLt's "A" with TRANSA = T, the
// activations its "B", and the bias (one value per output feature) runs along C^T's rows, which is
// what cuBLASLt's bias epilogue adds.
#include <cublasLt.h>

#include <algorithm>
#include <chrono>
#include <cstring>

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

template <typename T>
struct SkinnyArgs {
  const T* a = nullptr;
  int64_t lda = 0;
  const T* b = nullptr;
  int64_t ldb = 0;
  T* c = nullptr;
  int64_t ldc = 0;
  const T* bias = nullptr;
  int m = 0, n = 0, k = 0;
  bool accumulate = false;
  // Fused layer norm of A's rows (kLn): weight and bias [k].
  const T* ln_w = nullptr;
  const T* ln_b = nullptr;
  float ln_eps = 1e-5f;
  // Fused KV-cache write (key_cache non-null): columns [kv_col0, kv_col0 + 2 kv_width).
  T* key_cache = nullptr;
  T* value_cache = nullptr;
  const int32_t* slots = nullptr;
  int kv_col0 = 0, kv_width = 0;
};

__device__ __forceinline__ void PrefetchL2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// R: weight rows (output columns) per warp. kLn: A's rows go through a layer norm first (each
// warp computes the row statistics itself: A is m <= 8 rows, in L1/L2), rounded to T as the
// separate LayerNormCuda would write them.
//
// PDL (forward_cuda_common.cuh): the first unrolled group of weight loads and an L2 prefetch of
// the next 4 KiB of each weight row are issued before PdlWait; weights never depend on the
// previous kernel.
template <typename T, int M, int kAct, int R, bool kLn>
__global__ void __launch_bounds__(kSkinnyWarps * 32) SkinnyGemmKernel(const SkinnyArgs<T> p) {
  using V = fwd::Vec16<T>;
  constexpr int U = kSkinnyUnroll, kV = V::kN, kStep = U * 32 * kV;
  const int lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * kSkinnyWarps + (threadIdx.x >> 5)) * R;
  const int m = p.m, n = p.n, k = p.k;
  const T* brow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) brow[r] = p.b + static_cast<int64_t>(min(n0 + r, n - 1)) * p.ldb;
  int kk = lane * kV;
  const bool live = n0 < n;
  const bool have_first = live && kk + (U - 1) * 32 * kV < k;
  V first[U][R];
  if (have_first) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) first[u][r] = *reinterpret_cast<const V*>(brow[r] + kk + u * 32 * kV);
  }
  if (live) {
    constexpr int kLine = 128 / sizeof(T);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int off = kStep + lane * kLine;
      if (off < k) PrefetchL2(brow[r] + off);
    }
  }
  fwd::PdlWait();
  fwd::PdlTrigger();
  if (!live) return;

  const T* arow[M];
#pragma unroll
  for (int i = 0; i < M; ++i) arow[i] = p.a + static_cast<int64_t>(min(i, m - 1)) * p.lda;
  float mean[M], rstd[M];
  if constexpr (kLn) {
    // All M rows per pass (their loads in flight together): sum, then the centred squares.
    float sum[M], sq[M];
#pragma unroll
    for (int i = 0; i < M; ++i) sum[i] = sq[i] = 0.0f;
    for (int j = lane * kV; j < k; j += 32 * kV) {
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const V av = *reinterpret_cast<const V*>(arow[i] + j);
#pragma unroll
        for (int e = 0; e < kV; ++e) sum[i] += fwd::ToFloat(av.v[e]);
      }
    }
#pragma unroll
    for (int i = 0; i < M; ++i) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], o);
      mean[i] = sum[i] / k;
    }
    for (int j = lane * kV; j < k; j += 32 * kV) {
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const V av = *reinterpret_cast<const V*>(arow[i] + j);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          const float d = fwd::ToFloat(av.v[e]) - mean[i];
          sq[i] += d * d;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < M; ++i) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sq[i] += __shfl_xor_sync(0xffffffffu, sq[i], o);
      rstd[i] = rsqrtf(sq[i] / k + p.ln_eps);
    }
  }
  float acc[M][R];
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;

  auto fma_group = [&](const V (&bv)[R], int kk) {
    float lw[kV], lb[kV];
    if constexpr (kLn) {
      const V wv = *reinterpret_cast<const V*>(p.ln_w + kk);
      const V bv2 = *reinterpret_cast<const V*>(p.ln_b + kk);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        lw[e] = fwd::ToFloat(wv.v[e]);
        lb[e] = fwd::ToFloat(bv2.v[e]);
      }
    }
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const V av = *reinterpret_cast<const V*>(arow[i] + kk);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        float x = fwd::ToFloat(av.v[e]);
        if constexpr (kLn) {
          x = fwd::ToFloat(fwd::FromFloat<T>((x - mean[i]) * rstd[i] * lw[e] + lb[e]));
        }
#pragma unroll
        for (int r = 0; r < R; ++r) acc[i][r] = fmaf(x, fwd::ToFloat(bv[r].v[e]), acc[i][r]);
      }
    }
  };
  if (have_first) {
#pragma unroll
    for (int u = 0; u < U; ++u) fma_group(first[u], kk + u * 32 * kV);
    kk += kStep;
  }
  for (; kk + (U - 1) * 32 * kV < k; kk += kStep) {
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
        const int col = n0 + r;
        float v = acc[i][r];
        if (p.bias != nullptr) v += fwd::ToFloat(p.bias[col]);
        v = fwd::Activate<kAct>(v);
        T* out = p.c + static_cast<int64_t>(i) * p.ldc + col;
        if (p.accumulate) v += fwd::ToFloat(*out);
        const T o = fwd::FromFloat<T>(v);
        *out = o;
        const int j = col - p.kv_col0;
        if (p.key_cache != nullptr && j >= 0 && j < 2 * p.kv_width) {
          const int64_t slot = p.slots[i];
          if (slot >= 0) {
            if (j < p.kv_width) {
              p.key_cache[slot * p.kv_width + j] = o;
            } else {
              p.value_cache[slot * p.kv_width + (j - p.kv_width)] = o;
            }
          }
        }
      }
    }
  }
}

template <typename T, int M, int R>
absl::Status LaunchSkinny(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream,
                          bool pdl) {
  const int per_block = kSkinnyWarps * R;
  const int64_t blocks = (p.n + per_block - 1) / per_block;
  SkinnyArgs<T> a;
  a.a = static_cast<const T*>(p.a);
  a.lda = p.lda;
  a.b = static_cast<const T*>(p.b);
  a.ldb = p.ldb;
  a.c = static_cast<T*>(p.c);
  a.ldc = p.ldc;
  a.bias = static_cast<const T*>(e.bias);
  a.m = static_cast<int>(p.m);
  a.n = static_cast<int>(p.n);
  a.k = static_cast<int>(p.k);
  a.accumulate = e.accumulate;
  a.ln_w = static_cast<const T*>(e.ln_weight);
  a.ln_b = static_cast<const T*>(e.ln_bias);
  a.ln_eps = e.ln_epsilon;
  a.key_cache = static_cast<T*>(e.key_cache);
  a.value_cache = static_cast<T*>(e.value_cache);
  a.slots = e.slot_mapping;
  a.kv_col0 = static_cast<int>(e.kv_col0);
  a.kv_width = static_cast<int>(e.kv_width);
  const bool ln = e.ln_weight != nullptr;
  const dim3 grid(static_cast<unsigned>(blocks)), block(kSkinnyWarps * 32);
  switch (e.activation) {
    case Activation::kIdentity:
      CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdl(pdl,
                                               ln ? SkinnyGemmKernel<T, M, 0, R, true>
                                                  : SkinnyGemmKernel<T, M, 0, R, false>,
                                               grid, block, stream, a));
      break;
    case Activation::kGeluTanh:
      CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdl(pdl,
                                               ln ? SkinnyGemmKernel<T, M, 1, R, true>
                                                  : SkinnyGemmKernel<T, M, 1, R, false>,
                                               grid, block, stream, a));
      break;
    case Activation::kGeluErf:
      return absl::UnimplementedError("SkinnyGemmCuda: GELU (erf) is not fused");
  }
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
                            int rows_per_warp, bool pdl) {
  RETURN_IF_ERROR(CheckGemm(p, "SkinnyGemmCuda"));
  if (e.accumulate && e.activation != Activation::kIdentity) {
    return absl::InvalidArgumentError("GEMM: accumulate needs the identity activation");
  }
  if (p.m == 0 || p.n == 0) return absl::OkStatus();
  if (p.m > CudaGemm::kSkinnyMaxM || p.k % 8 != 0 || p.lda % 8 != 0 || p.ldb % 8 != 0 ||
      !fwd::Aligned16(p.a) || !fwd::Aligned16(p.b) || e.activation == Activation::kGeluErf) {
    return absl::UnimplementedError("SkinnyGemmCuda: shape or alignment not supported");
  }
  if ((e.ln_weight != nullptr) != (e.ln_bias != nullptr) ||
      (e.ln_weight && (!fwd::Aligned16(e.ln_weight) || !fwd::Aligned16(e.ln_bias)))) {
    return absl::UnimplementedError("SkinnyGemmCuda: layer norm needs aligned weight and bias");
  }
  if (e.key_cache != nullptr) {
    if (!e.value_cache || !e.slot_mapping || e.kv_col0 < 0 || e.kv_width <= 0 ||
        e.kv_col0 + 2 * e.kv_width > p.n || e.accumulate) {
      return absl::InvalidArgumentError("SkinnyGemmCuda: bad fused KV-cache write");
    }
  }
  auto with_rows = [&]<typename T, int R>() -> absl::Status {
    if (p.m == 1) return LaunchSkinny<T, 1, R>(p, e, stream, pdl);
    if (p.m == 2) return LaunchSkinny<T, 2, R>(p, e, stream, pdl);
    if (p.m <= 4) return LaunchSkinny<T, 4, R>(p, e, stream, pdl);
    return LaunchSkinny<T, 8, R>(p, e, stream, pdl);
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
  cublasLtMatmulAlgo_t algo{};  // the heuristic's first choice
  bool fallback = false;  // no cuBLASLt algorithm: the plain kernel
  bool tuned = false;     // tuned_algo holds the fastest timed algorithm (Options::autotune)
  cublasLtMatmulAlgo_t tuned_algo{};
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
  const bool fused = e.ln_weight != nullptr || e.key_cache != nullptr;
  if (options_.skinny) {
    const absl::Status s =
        SkinnyGemmCuda(p, e, stream, options_.skinny_rows_per_warp, options_.pdl);
    if (!absl::IsUnimplemented(s) || fused) return s;
  } else if (fused) {
    return absl::UnimplementedError("CudaGemm: fused layer norm / KV write need the skinny kernel");
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
  const cublasLtMatmulAlgo_t* algo = &plan.algo;
  if (options_.autotune) {
    if (!plan.tuned) RETURN_IF_ERROR(Tune(plan, p, e, stream));
    if (plan.tuned) algo = &plan.tuned_algo;
  }
  const float alpha = 1.0f, beta = e.accumulate ? 1.0f : 0.0f;
  LT_RETURN_IF_ERROR(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan.desc, &alpha, p.b,
                                    plan.a, p.a, plan.b, &beta, p.c, plan.c, p.c, plan.c, algo,
                                    workspace_, options_.workspace_bytes, stream));
  return absl::OkStatus();
}

namespace {

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  ~EventPair() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

struct DeviceScratch {
  void* ptr = nullptr;
  ~DeviceScratch() {
    if (ptr) cudaFree(ptr);
  }
};

}  // namespace

absl::Status CudaGemm::Tune(Plan& plan, const GemmParams& p, const GemmEpilogue& e,
                            cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return absl::OkStatus();  // untuned: next time
  const auto t0 = std::chrono::steady_clock::now();
  // Any early exit below keeps the heuristic's choice for good (tuning is not retried).
  plan.tuned = true;
  plan.tuned_algo = plan.algo;
  ++stats_.shapes;

  const auto handle = static_cast<cublasLtHandle_t>(handle_);
  const size_t ws = options_.workspace_bytes;
  cublasLtMatmulPreference_t pref = nullptr;
  LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulHeuristicResult_t results[kAutotuneAlgos] = {};
  int returned = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
      handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref, kAutotuneAlgos, results, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  // Candidate 0 is the heuristic's first choice (the untuned path's algorithm); the others are
  // kept only if they fit the workspace.
  // (A plain array: nvcc's front end fails on a std::vector of the unnamed algo struct.)
  cublasLtMatmulAlgo_t candidates[kAutotuneAlgos + 1];
  candidates[0] = plan.algo;
  int num_candidates = 1;
  for (int i = 0; i < returned; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > ws) continue;
    if (std::memcmp(&results[i].algo, &plan.algo, sizeof(plan.algo)) == 0) continue;
    candidates[num_candidates++] = results[i].algo;
  }
  if (num_candidates < 2) return absl::OkStatus();

  // With accumulate (beta = 1) every timing run would add into C again: time on a copy.
  void* c = p.c;
  DeviceScratch scratch;
  if (e.accumulate) {
    const size_t bytes = static_cast<size_t>((p.m - 1) * p.ldc + p.n) * DTypeSize(p.dtype);
    if (cudaMalloc(&scratch.ptr, bytes) != cudaSuccess) {
      cudaGetLastError();  // out of memory: not sticky; keep the heuristic's choice
      scratch.ptr = nullptr;
      return absl::OkStatus();
    }
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scratch.ptr, p.c, bytes, cudaMemcpyDeviceToDevice, stream));
    c = scratch.ptr;
  }
  EventPair ev;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&ev.start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&ev.stop));
  const float alpha = 1.0f, beta = e.accumulate ? 1.0f : 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle, plan.desc, &alpha, p.b, plan.a, p.a, plan.b, &beta, c, plan.c,
                          c, plan.c, &algo, workspace_, ws, stream) == CUBLAS_STATUS_SUCCESS;
  };
  // Milliseconds per run over `reps` back-to-back runs; < 0 if a launch failed.
  auto time = [&](const cublasLtMatmulAlgo_t& algo, int reps, double* out) -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.start, stream));
    bool ok = true;
    for (int r = 0; r < reps && ok; ++r) ok = run(algo);
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.stop, stream));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev.stop));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev.start, ev.stop));
    *out = ok ? static_cast<double>(ms) / reps : -1.0;
    return absl::OkStatus();
  };
  int reps = 0;  // sized so one candidate takes about a millisecond (2..20 runs)
  int best = -1;
  double best_score = 0, best_ms = 0, first_ms = -1;
  int timed = 0;
  for (int i = 0; i < num_candidates; ++i) {
    if (!run(candidates[i])) continue;  // warm-up; an algorithm that fails to launch is dropped
    if (reps == 0) {
      double once = 0;
      RETURN_IF_ERROR(time(candidates[i], 1, &once));
      if (once < 0) continue;
      reps = std::clamp(static_cast<int>(1.0 / std::max(once, 1e-3)) + 1, 2, 20);
    }
    double ms = 0;
    RETURN_IF_ERROR(time(candidates[i], reps, &ms));
    if (ms < 0) continue;
    ++timed;
    if (i == 0) first_ms = ms;
    // A 1% edge for the heuristic's choice: noise alone does not switch algorithms.
    const double score = i == 0 ? ms * 0.99 : ms;
    if (best < 0 || score < best_score) {
      best = i;
      best_score = score;
      best_ms = ms;
    }
  }
  if (best >= 0) plan.tuned_algo = candidates[best];
  stats_.candidates += timed;
  if (best > 0) ++stats_.changed;
  if (first_ms >= 0) {
    stats_.first_ms += first_ms;
    stats_.best_ms += best_ms;
  }
  stats_.seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return absl::OkStatus();
}

}  // namespace mqa
