// GEMMs of the CUDA backend: C = act(A B^T + bias) [+ C] in PyTorch's weight layout (kernels/gemm.h),
// fp16 / bf16 operands, fp32 accumulation.
//
// Two paths behind one call:
//   - cuBLASLt, with the bias / GELU-tanh epilogues fused and beta = 1 for the residual add; the
//     heuristic's first algorithm per shape is cached, or with Options::autotune the fastest of
//     the heuristic's first kAutotuneAlgos, timed with CUDA events on the real operands the first
//     time a shape is run outside a graph capture (while capturing, an untuned shape runs the
//     heuristic's choice and stays untuned);
//   - a skinny kernel for decode batches (m <= 8): each warp streams whole weight rows with 16-byte
//     loads and reduces with shuffles; the epilogue is fused the same way. Used when m <= 8, k and
//     the strides are multiples of 8 and the pointers 16-byte aligned (Options::skinny);
//   - for the same shapes, with Options::skinny_split_k, a split-K variant: the weight stream is
//     dealt out in equal contiguous pieces to one wave of warps (rows and k split alike), deeper
//     loads in flight, and the row groups that several warps share are summed and finished by the
//     last warp to arrive (an atomic counter in a workspace the kernel leaves zeroed). Same
//     epilogues, same PDL behaviour.
//
// Ownership: a CudaGemm owns its cuBLASLt handle and workspaces (RAII). One thread uses it (the
// model's), on one stream at a time: split-K runs share one workspace, so two of them must not
// run concurrently. Run may be captured into a CUDA graph (it allocates nothing once a shape was
// seen; the split-K workspace is allocated at Create or on the first eager split-K Run).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/activation.h"
#include "kernels/gemm.h"

namespace mqa {

struct GemmEpilogue {
  const void* bias = nullptr;  // [n], the dtype of C; null: none
  Activation activation = Activation::kIdentity;
  // C += result (beta = 1): the residual add. Only with kIdentity.
  bool accumulate = false;
  // Skinny kernel only (elsewhere Unimplemented: the caller runs LayerNormCuda / KvCacheWriteCuda
  // itself). A's rows are replaced by LayerNorm(A) (weight, bias [k], 16-byte aligned), computed
  // inside the GEMM: the separate layer-norm launch goes away. The skinny kernel folds the norm
  // into its epilogue and needs B's per-column sums against the norm's weight and bias ([n] fp32,
  // LayerNormFoldSumsCuda, once per weight): Unimplemented without them. The split-K kernel
  // normalises A first and does not read them.
  const void* ln_weight = nullptr;
  const void* ln_bias = nullptr;
  float ln_epsilon = 1e-5f;
  const float* ln_wsum = nullptr;  // [n]: sum_j B[col][j] ln_weight[j]
  const float* ln_bsum = nullptr;  // [n]: sum_j B[col][j] ln_bias[j]
  // Skinny kernel only: output columns [kv_col0, kv_col0 + kv_width) of row i are also written to
  // key_cache row slot_mapping[i] and [kv_col0 + kv_width, kv_col0 + 2 kv_width) to value_cache
  // (rows of kv_width elements, i.e. kv_heads * head_dim of a [blocks, block_size, kv_heads,
  // head_dim] cache; slot < 0: skipped): KvCacheWriteCuda folded into the QKV projection.
  void* key_cache = nullptr;
  void* value_cache = nullptr;
  const int32_t* slot_mapping = nullptr;
  int64_t kv_col0 = 0, kv_width = 0;
  // Skinny kernel only, m = 1 with the fused layer norm and KV write, head_dim 128, at most
  // kGemmTailMaxCtas heads x splits (kernels/gemm.h): the step's attention in the same launch.
  // Unimplemented where the kernel does not take it (nothing has run then).
  GemmTailAttention tail;
  // Skinny kernel with PDL (ignored elsewhere): each CTA releases the next kernel
  // (griddepcontrol.launch_dependents) as it starts rather than after its own PDL wait, so that
  // the next kernel's CTAs can launch and load their weights while this one still waits for its
  // input (the model's attn.c_proj behind the QKV GEMM's tail attention). Correctness does not
  // depend on it: the next kernel's wait is on this grid's end either way.
  bool release_dependents_early = false;
};

class CudaGemm {
 public:
  struct Options {
    size_t workspace_bytes = size_t{32} << 20;
    bool skinny = true;      // the decode kernel for m <= kSkinnyMaxM
    // ... but unfused calls (no layer norm / KV write in the epilogue) take it only up to this m:
    // gemm_bench on the H200 (2026-12-02 ~23:00 UTC) ran StarCoder's decode GEMMs at m = 1 in
    // 7.90 ms skinny vs 8.06 cuBLASLt, at m = 8 in 15.8 ms skinny vs 8.0 cuBLASLt.
    int skinny_max_m = 1;
    int skinny_rows_per_warp = 2;  // weight rows one warp streams at a time: 1, 2 or 4
    // m = 1 GEMMs with at most 16 warps per SM (two rows a warp: SantaCoder's QKV, c_proj and
    // mlp c_proj, not StarCoder's) keep 8 instead of 4 16-byte weight loads per row and lane in
    // flight, and load twice as many before the PDL wait (a 4 KiB row all of it).
    bool skinny_deep_unroll = false;
    // m = 1, fp16, two rows a warp, and k <= 4096 or a narrow (deep-unrolled) call: each 16-byte
    // chunk's eight products summed as HFMA2 pairs before the fp32 sum (one fp16 rounding on each
    // 4-product partial; as the decode chain's DecodeChainTuning::half_fold). Measured faster for
    // SantaCoder's layer GEMMs, slower for StarCoder's (kernels/gemm_skinny.cu).
    bool skinny_half_fold = false;
    // m = 1: bytes of each weight row, after the first unrolled group of loads, that the skinny
    // kernel copies into shared memory before its PDL wait, so that more of its weights are on chip
    // when its input arrives (at most the rest of the row, and at most the CTA's share of the SM's
    // shared memory when the grid's CTAs are resident together; 0: none). H200, 2026-12-04 ~21:40
    // UTC: SantaCoder b1 decode step 1.008 / 1.000 -> 0.933 / 0.932 ms at 16 KiB (4 and 8 KiB:
    // 0.95), StarCoder b1 8.144 / 8.112 -> 8.122 / 8.105 ms (its layers run in the decode chain).
    int skinny_stage_bytes = 16384;
    // m = 1, fp16, the half fold: instantiations built for more resident CTAs an SM, so that more
    // of a call's CTAs stage their rows before the PDL wait, beside the previous kernel's or in
    // one wave. Without the deep unroll 8 (64 registers; ptxas spills 32 bytes) instead of 4 (127
    // with the fused layer norm): SantaCoder's c_fc, 1024 CTAs, in one wave. With it 4 (128
    // registers, no spills) instead of 3 (168 with the fused layer norm): SantaCoder's QKV, 288
    // CTAs, two an SM beside mlp.c_proj's two instead of one. Off until measured (mqabench
    // --gemm skinnydo).
    bool skinny_occupancy = false;
    // The skinny kernel's storing lanes load their bias (and layer-norm sums) before the PDL wait
    // and their residual right after it, so that the fold's end is not followed by a round trip
    // to memory; off: after the fold. Not yet run on a GPU: off until measured (mqabench --gemm
    // skinnyde).
    bool skinny_early_epilogue = false;
    // The skinny kernel's weight loads (and its shared-memory staging) carry the L2 priority
    // evict_first, so that a call's once-read weights leave L2 before anything else does (off:
    // the same loads with evict_normal). H100, 2026-12-07 08:43 UTC, b1 128 / 128, decode step,
    // separate processes in rotation, three rounds: SantaCoder 0.974-0.975 ms against
    // 1.040-1.043 with evict_normal and 1.024-1.026 with the plain loads before (-4.9%);
    // StarCoder, whose layers run in the decode chain (already evict_first), 10.679-10.685
    // against 10.676-10.680 (benchmarks/mqabench/NOTES.md version 56).
    bool skinny_evict_first = true;
    // The skinny kernel launched as a programmatic dependent (forward_cuda_common.cuh): its
    // weight loads overlap the previous kernel's tail. cuBLASLt launches are never PDL.
    bool pdl = false;
    // cuBLASLt shapes: time up to kAutotuneAlgos heuristic algorithms once per shape and keep the
    // fastest (a one-off synchronisation of the stream per new shape). Results stay correct:
    // overwriting epilogues time on the real C (the real run rewrites it), accumulating ones on a
    // scratch copy of C.
    bool autotune = false;
    // With autotune: only shapes of at most this many rows are tuned (0: every shape). Decode
    // batches come in a few graph-bucket sizes; prefill sizes vary with every request, and each
    // new one would cost a tuning pass.
    int autotune_max_m = 0;
    // With autotune: shapes tuned so far keep their tuned algorithm, new shapes keep the
    // heuristic's (no timing pass on a live request). The server tunes its decode shapes while it
    // warms up the decode graphs, then freezes.
    bool autotune_frozen = false;
    // Tests: autotuning keeps the fastest split-K candidate wherever there is one (so that the
    // split-K path is checked against the CPU whatever the timings say).
    bool autotune_prefer_split_k = false;
    // The split-K decode kernel (SkinnySplitKGemmCuda) in place of the skinny kernel, for the same
    // shapes. Its workspace is allocated by Create when on, else by the first eager Run with it
    // on; a Run captured into a graph before then uses the skinny kernel (and the graph keeps it).
    bool skinny_split_k = false;
    int skinny_split_ctas_per_sm = 0;  // split-K grid: CTAs per SM; 0: as many as fit (<= 8)
    // Decode batches above kSkinnyMaxM (or any m with skinny off) up to kStreamTcMaxM rows: the
    // weight-streaming tensor-core kernel (kernels/gemm_stream_tc.h) in place of cuBLASLt, where it
    // supports the call. Workspace as for skinny_split_k (the first eager Run allocates it; a Run
    // captured before then uses cuBLASLt, and the graph keeps it).
    bool stream_tc = false;
    // With stream_tc: its Hopper form (StreamTcTuning::tma: TMA copies, wgmma, one CTA an SM) and
    // that form's knobs (StreamTcTuning::tma_boxes, tma_hints; 0 / -1: the kernel's defaults).
    bool stream_tc_tma = false;
    int stream_tc_tma_boxes = 0;
    int stream_tc_tma_hints = -1;
  };
  static constexpr int kSkinnyMaxM = 8;
  static constexpr int kAutotuneAlgos = 8;
  // Autotuning also times the split-K versions (these splits) of the first kAutotuneSplitKBase
  // candidates.
  static constexpr int kAutotuneSplitKBase = 2;
  static constexpr int32_t kAutotuneSplitK[] = {2, 3, 4};
  static constexpr int kMaxCandidates =
      kAutotuneAlgos + 1 + kAutotuneSplitKBase * static_cast<int>(std::size(kAutotuneSplitK));

  // What autotuning did so far (benchmarks print it).
  struct AutotuneStats {
    int shapes = 0;          // shapes tuned (timed, or left with the only candidate)
    int changed = 0;         // of which the fastest was not the heuristic's first choice
    int candidates = 0;      // algorithms timed in all
    int split_k = 0;         // shapes whose chosen algorithm cuts K (split-K number > 1)
    double seconds = 0;      // wall time spent tuning
    double first_ms = 0;     // sum over shapes of one run with the heuristic's first choice
    double best_ms = 0;      // ... and with the chosen algorithm
    // Decode shapes (m <= 64) whose choice changed: "m x n x k: first -> best us (split-K s)".
    std::string decode_changes;
  };

  static absl::StatusOr<std::unique_ptr<CudaGemm>> Create(const Options& options);
  ~CudaGemm();
  CudaGemm(const CudaGemm&) = delete;
  CudaGemm& operator=(const CudaGemm&) = delete;

  // fp16 / bf16 only (InvalidArgument otherwise); p.alpha and p.beta are ignored (1 and 0, or 1
  // and 1 with accumulate). kGeluErf is not fused: call BiasActivationCuda after an identity GEMM.
  absl::Status Run(const GemmParams& p, const GemmEpilogue& epilogue, cudaStream_t stream);

  void set_skinny(bool on) { options_.skinny = on; }
  void set_skinny_max_m(int m) { options_.skinny_max_m = m; }
  void set_skinny_rows_per_warp(int rows) { options_.skinny_rows_per_warp = rows; }
  void set_pdl(bool on) { options_.pdl = on; }
  bool pdl() const { return options_.pdl; }
  bool skinny() const { return options_.skinny; }
  void set_skinny_split_k(bool on) { options_.skinny_split_k = on; }
  bool skinny_split_k() const { return options_.skinny_split_k; }
  void set_skinny_split_ctas_per_sm(int ctas) { options_.skinny_split_ctas_per_sm = ctas; }
  void set_stream_tc(bool on) { options_.stream_tc = on; }
  void set_stream_tc_tma(bool on, int boxes = 0, int hints = -1) {
    options_.stream_tc_tma = on;
    options_.stream_tc_tma_boxes = boxes;
    options_.stream_tc_tma_hints = hints;
  }
  void set_skinny_deep_unroll(bool on) { options_.skinny_deep_unroll = on; }
  void set_skinny_half_fold(bool on) { options_.skinny_half_fold = on; }
  void set_skinny_stage_bytes(int bytes) { options_.skinny_stage_bytes = bytes; }
  void set_skinny_occupancy(bool on) { options_.skinny_occupancy = on; }
  void set_skinny_early_epilogue(bool on) { options_.skinny_early_epilogue = on; }
  void set_skinny_evict_first(bool on) { options_.skinny_evict_first = on; }
  bool stream_tc() const { return options_.stream_tc; }
  bool stream_tc_tma() const { return options_.stream_tc_tma; }
  // Turning autotune off goes back to the heuristic's first choice; tuned choices are kept for
  // when it is turned on again. max_m: Options::autotune_max_m (0, the default, tunes every shape).
  // Turning it on again (or to a new max_m) also unfreezes.
  void set_autotune(bool on, int max_m = 0) {
    options_.autotune = on;
    options_.autotune_max_m = max_m;
    options_.autotune_frozen = false;
  }
  void freeze_autotune() { options_.autotune_frozen = true; }
  bool autotune() const { return options_.autotune; }
  const AutotuneStats& autotune_stats() const { return stats_; }

 private:
  struct Plan;  // cuBLASLt descriptors and algorithm of one shape
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, bool>;
  CudaGemm() = default;
  absl::Status RunLt(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream);
  // Times the candidates of `plan` on p's operands and sets plan.tuned_algo (plan.tuned = true).
  // Leaves the plan untuned while `stream` is capturing.
  absl::Status Tune(Plan& plan, const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream);
  // Allocates and zeroes a kernel workspace (*ws, *bytes) of `need` bytes unless done; false
  // (nothing done) while `stream` is capturing.
  absl::StatusOr<bool> EnsureWorkspace(void** ws, size_t* bytes, size_t need, cudaStream_t stream);
  // SMs of the current device.
  static absl::StatusOr<int> DeviceSms();
  int sms_ = 0;  // of the device current at Create

  Options options_;
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  void* split_workspace_ = nullptr;  // SkinnySplitKWorkspaceBytes(SMs of the device)
  size_t split_workspace_bytes_ = 0;
  void* stream_tc_workspace_ = nullptr;  // StreamTcGemmWorkspaceBytes(SMs of the device)
  size_t stream_tc_workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  AutotuneStats stats_;
};

// What every CUDA GEMM path accepts: fp16 / bf16, sizes and strides that fit, pointers where there
// is work. InvalidArgument naming `who` otherwise.
absl::Status CheckGemmCuda(const GemmParams& p, const char* who);

// The skinny kernel alone (tests and benchmarks; gemm_skinny.cu): Unimplemented when its
// conditions do not hold.
struct SkinnyOptions {
  int rows_per_warp = 2;  // 1, 2 or 4 (Options::skinny_rows_per_warp)
  bool pdl = false;       // launched as a programmatic dependent (Options::pdl)
  // > 0: an m = 1 call of at most that many warps (two rows a warp) keeps twice the weight loads
  // in flight (CudaGemm passes 16 per SM when Options::skinny_deep_unroll is on).
  int64_t deep_max_warps = 0;
  bool half_fold = false;    // Options::skinny_half_fold (m = 1, fp16, two rows a warp)
  int stage_bytes = 0;       // Options::skinny_stage_bytes (m = 1)
  bool occupancy = false;    // Options::skinny_occupancy (m = 1 with half_fold)
  bool early_epilogue = false;  // Options::skinny_early_epilogue
  bool evict_first = true;      // Options::skinny_evict_first
};
absl::Status SkinnyGemmCuda(const GemmParams& p, const GemmEpilogue& epilogue, cudaStream_t stream,
                            const SkinnyOptions& options = {});

// The split-K decode kernel alone (tests and benchmarks; CudaGemm::Options::skinny_split_k): the
// same conditions, epilogues and errors as SkinnyGemmCuda. `workspace` (device memory of at least
// SkinnySplitKWorkspaceBytes(SMs of the current device) bytes, 16-byte aligned) starts with
// SkinnySplitKCounterBytes of counters that must be zero before the first call; every call leaves
// them zero. Calls sharing a workspace must not run concurrently (stream order or PDL is fine).
struct SkinnySplitKOptions {
  bool pdl = false;     // launched as a programmatic dependent (as SkinnyGemmCuda's pdl)
  int ctas_per_sm = 0;  // the grid is sized for this many CTAs per SM; 0: as many as fit (<= 8)
};
size_t SkinnySplitKWorkspaceBytes(int num_sms);
size_t SkinnySplitKCounterBytes(int num_sms);
absl::Status SkinnySplitKGemmCuda(const GemmParams& p, const GemmEpilogue& epilogue,
                                  cudaStream_t stream, void* workspace, size_t workspace_bytes,
                                  const SkinnySplitKOptions& options = {});

// The per-column sums GemmEpilogue::ln_wsum / ln_bsum of B ([n, k], row stride ldb, `dtype`)
// against a layer norm's weight and bias ([k]): wsum[col] = sum_j B[col][j] weight[j], bsum
// likewise, in fp32. Once per weight (they do not change while it does not).
absl::Status LayerNormFoldSumsCuda(const void* b, int64_t ldb, int64_t n, int64_t k, DType dtype,
                                   const void* ln_weight, const void* ln_bias, float* wsum,
                                   float* bsum, cudaStream_t stream);

}  // namespace mqa
