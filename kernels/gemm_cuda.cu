// CudaGemm: cuBLASLt GEMMs with fused epilogues (and their autotuning), routing decode shapes to
// the skinny kernels (gemm_skinny.cu) and the tensor-core streaming kernel (gemm_stream_tc.cu);
// see gemm_cuda.h.
//
// Layout: row-major C[m, n] = A[m, k] B[n, k]^T is, in cuBLAS's column-major terms,
// C^T[n, m] = op_T(B^T as k x n) * A^T (k x m): the weight is cuBLASLt's "A" with TRANSA = T, the
// activations its "B", and the bias (one value per output feature) runs along C^T's rows, which is
// what cuBLASLt's bias epilogue adds.
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/device_info.h"
#include "kernels/forward_cuda_common.cuh"
#include "kernels/gemm_cuda.h"
#include "kernels/gemm_stream_tc.h"
#include "runtime/cuda_check.h"

namespace mqa {

absl::Status CheckGemmCuda(const GemmParams& p, const char* who) {
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

namespace {

// CudaGemm::Options::skinny_deep_unroll: m = 1 calls of at most this many warps an SM take the
// deep unroll (SkinnyOptions::deep_max_warps).
constexpr int kSkinnyDeepMaxWarpsPerSm = 16;

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
  ASSIGN_OR_RETURN(g->sms_, DeviceSms());
  if (options.skinny_split_k || options.stream_tc) {
    // The legacy stream is never capturing here: these allocate.
    if (options.skinny_split_k) {
      ASSIGN_OR_RETURN(const bool ready,
                       g->EnsureWorkspace(&g->split_workspace_, &g->split_workspace_bytes_,
                                          SkinnySplitKWorkspaceBytes(g->sms_), nullptr));
      (void)ready;
    }
    if (options.stream_tc) {
      ASSIGN_OR_RETURN(const bool ready,
                       g->EnsureWorkspace(&g->stream_tc_workspace_, &g->stream_tc_workspace_bytes_,
                                          StreamTcGemmWorkspaceBytes(g->sms_), nullptr));
      (void)ready;
    }
  }
  return g;
}

CudaGemm::~CudaGemm() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (split_workspace_) cudaFree(split_workspace_);
  if (stream_tc_workspace_) cudaFree(stream_tc_workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

absl::Status CudaGemm::Run(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckGemmCuda(p, "CudaGemm"));
  if (e.accumulate && e.activation != Activation::kIdentity) {
    return absl::InvalidArgumentError("CudaGemm: accumulate needs the identity activation");
  }
  if (e.activation == Activation::kGeluErf) {
    return absl::UnimplementedError("CudaGemm: GELU (erf) is not fused; use BiasActivationCuda");
  }
  if (p.m == 0 || p.n == 0) return absl::OkStatus();
  const bool fused = e.ln_weight != nullptr || e.key_cache != nullptr;
  if (options_.skinny && (fused || p.m <= options_.skinny_max_m)) {
    bool split = false;
    if (options_.skinny_split_k && p.m <= kSkinnyMaxM) {
      ASSIGN_OR_RETURN(split, EnsureWorkspace(&split_workspace_, &split_workspace_bytes_,
                                              SkinnySplitKWorkspaceBytes(sms_), stream));
    }
    const absl::Status s = [&] {
      if (split) {
        SkinnySplitKOptions o;
        o.pdl = options_.pdl;
        o.ctas_per_sm = options_.skinny_split_ctas_per_sm;
        absl::Status st =
            SkinnySplitKGemmCuda(p, e, stream, split_workspace_, split_workspace_bytes_, o);
        if (!absl::IsUnimplemented(st)) return st;
      }
      SkinnyOptions o;
      o.rows_per_warp = options_.skinny_rows_per_warp;
      o.pdl = options_.pdl;
      o.deep_max_warps = options_.skinny_deep_unroll ? int64_t{sms_} * kSkinnyDeepMaxWarpsPerSm : 0;
      o.half_fold = options_.skinny_half_fold;
      o.stage_bytes = options_.skinny_stage_bytes;
      o.occupancy = options_.skinny_occupancy;
      o.early_epilogue = options_.skinny_early_epilogue;
      o.evict_first = options_.skinny_evict_first;
      return SkinnyGemmCuda(p, e, stream, o);
    }();
    if (!absl::IsUnimplemented(s) || fused) return s;
  } else if (fused) {
    return absl::UnimplementedError("CudaGemm: fused layer norm / KV write need the skinny kernel");
  }
  if (options_.stream_tc && p.m <= kStreamTcMaxM && StreamTcGemmSupported(p, e)) {
    ASSIGN_OR_RETURN(const bool ready,
                     EnsureWorkspace(&stream_tc_workspace_, &stream_tc_workspace_bytes_,
                                     StreamTcGemmWorkspaceBytes(sms_), stream));
    if (ready) {
      const absl::Status s = StreamTcGemmCuda(
          p, e, stream, options_.pdl, stream_tc_workspace_, stream_tc_workspace_bytes_,
          StreamTcTuning{.tma = options_.stream_tc_tma,
                         .tma_boxes = options_.stream_tc_tma_boxes,
                         .tma_hints = options_.stream_tc_tma_hints});
      if (!absl::IsUnimplemented(s)) return s;
    }
  }
  return RunLt(p, e, stream);
}

absl::StatusOr<int> CudaGemm::DeviceSms() { return CurrentDeviceSms(); }

absl::StatusOr<bool> CudaGemm::EnsureWorkspace(void** ws, size_t* bytes, size_t need,
                                               cudaStream_t stream) {
  if (*ws != nullptr) return true;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return false;
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&p, need));
  // Zeroed before any kernel can use it, whatever stream or graph launches that one.
  cudaError_t rc = cudaMemset(p, 0, need);
  if (rc == cudaSuccess) rc = cudaDeviceSynchronize();
  if (rc != cudaSuccess) {
    cudaFree(p);
    CUDA_RETURN_IF_ERROR(rc);
  }
  *ws = p;
  *bytes = need;
  return true;
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
  if (options_.autotune && (options_.autotune_max_m <= 0 || p.m <= options_.autotune_max_m)) {
    if (!plan.tuned && !options_.autotune_frozen) RETURN_IF_ERROR(Tune(plan, p, e, stream));
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

int SplitKNum(const cublasLtMatmulAlgo_t& algo) {
  int32_t splits = 1;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                           sizeof(splits), &written) != CUBLAS_STATUS_SUCCESS) {
    return 1;
  }
  return std::max(splits, int32_t{1});
}

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
  cublasLtMatmulAlgo_t candidates[kMaxCandidates];
  candidates[0] = plan.algo;
  int num_candidates = 1;
  for (int i = 0; i < returned; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > ws) continue;
    if (std::memcmp(&results[i].algo, &plan.algo, sizeof(plan.algo)) == 0) continue;
    candidates[num_candidates++] = results[i].algo;
  }
  // Split-K versions of the heuristic's first kAutotuneSplitKBase choices: a decode GEMM whose
  // output tiles are fewer than the SMs (StarCoder's QKV and attention projection at m = 32: ~100
  // tiles on 132 SMs, 3.5 TB/s against 4.2 for the MLP's) streams its weights on more SMs when K is
  // cut. Each is checked by cuBLASLt (cublasLtMatmulAlgoCheck) and kept only within the workspace.
  const int num_base = std::min(num_candidates, kAutotuneSplitKBase);
  for (int i = 0; i < num_base; ++i) {
    int32_t splitk_support = 0;
    uint32_t schemes = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&candidates[i], CUBLASLT_ALGO_CAP_SPLITK_SUPPORT,
                                          &splitk_support, sizeof(splitk_support),
                                          &written) != CUBLAS_STATUS_SUCCESS ||
        splitk_support == 0) {
      continue;
    }
    cublasLtMatmulAlgoCapGetAttribute(&candidates[i], CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK,
                                      &schemes, sizeof(schemes), &written);
    // In-place reduction needs no workspace; else a compute-type (fp32) one.
    const uint32_t scheme = (schemes & CUBLASLT_REDUCTION_SCHEME_INPLACE)
                                ? CUBLASLT_REDUCTION_SCHEME_INPLACE
                                : (schemes & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
                                      ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                                      : CUBLASLT_REDUCTION_SCHEME_NONE;
    if (scheme == CUBLASLT_REDUCTION_SCHEME_NONE) continue;
    for (const int32_t splits : kAutotuneSplitK) {
      if (num_candidates == kMaxCandidates) break;
      cublasLtMatmulAlgo_t algo = candidates[i];
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                               sizeof(splits)) != CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                               &scheme, sizeof(scheme)) != CUBLAS_STATUS_SUCCESS) {
        continue;
      }
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoCheck(handle, plan.desc, plan.a, plan.b, plan.c, plan.c, &algo,
                                  &check) != CUBLAS_STATUS_SUCCESS ||
          check.state != CUBLAS_STATUS_SUCCESS || check.workspaceSize > ws) {
        continue;
      }
      bool seen = false;
      for (int j = 0; j < num_candidates && !seen; ++j) {
        seen = std::memcmp(&candidates[j], &algo, sizeof(algo)) == 0;
      }
      if (!seen) candidates[num_candidates++] = algo;
    }
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
    double score = i == 0 ? ms * 0.99 : ms;
    if (options_.autotune_prefer_split_k && SplitKNum(candidates[i]) == 1) score += 1e6;
    if (best < 0 || score < best_score) {
      best = i;
      best_score = score;
      best_ms = ms;
    }
  }
  if (best >= 0) plan.tuned_algo = candidates[best];
  stats_.candidates += timed;
  const int splits = best >= 0 ? SplitKNum(candidates[best]) : 1;
  if (splits > 1) ++stats_.split_k;
  if (best > 0) {
    ++stats_.changed;
    if (p.m <= 64 && first_ms >= 0) {
      absl::StrAppend(&stats_.decode_changes, stats_.decode_changes.empty() ? "" : "; ", p.m,
                      "x", p.n, "x", p.k, ": ", static_cast<int>(first_ms * 1000 + 0.5), " -> ",
                      static_cast<int>(best_ms * 1000 + 0.5), " us (split-K ", splits, ")");
    }
  }
  if (first_ms >= 0) {
    stats_.first_ms += first_ms;
    stats_.best_ms += best_ms;
  }
  stats_.seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return absl::OkStatus();
}

}  // namespace mqa
