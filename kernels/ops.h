// The device-dispatching op layer the model forward calls: one function per kernel, taking that
// kernel's params struct and an OpContext that says where the data lives. On Device::kCpu it calls
// the ...Cpu reference; on Device::kCuda the ...Cuda launcher with ctx.stream (ops.cc: one switch
// per op). Stateless and thread-compatible: concurrent calls on disjoint data are fine (the CUDA
// GEMM object in the context is not: one thread per context).
#pragma once

#include "absl/status/status.h"
#include "kernels/activation.h"
#include "kernels/decode_chain.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/kv_cache.h"
#include "kernels/layer_norm.h"
#include "kernels/paged_attention.h"
#include "runtime/tensor.h"

namespace mqa {

struct OpContext {
  Device device = Device::kCpu;
  // cudaStream_t of the CUDA backend (null: the default stream); unused on the CPU.
  void* stream = nullptr;
  // The CUDA backend's CudaGemm (kernels/gemm_cuda.h), owned by the caller; needed by Gemm and
  // Linear on Device::kCuda.
  void* gemm = nullptr;
  // Device scratch for PagedAttentionCuda's split-KV partials (may be null: fewer splits).
  void* attention_workspace = nullptr;
  size_t attention_workspace_bytes = 0;
  // CUDA: launch the small kernels (layer norm, bias / activation) as programmatic dependents of
  // the previous kernel (kernels/forward_cuda_common.cuh). The GEMM's own switch is
  // CudaGemm::set_pdl.
  bool pdl = false;
  // CUDA: LayerNormCudaKernel::kRegisters (the row held in registers, weights loaded before the
  // PDL wait) instead of kThreePass.
  bool ln_registers = false;
  // CUDA: PagedAttentionTuning::variant (kernels/paged_attention_cuda.h). Variants 2, 4 and 5
  // keep counters in attention_workspace: it must be zeroed once before their first use.
  int attention_variant = 18;
  // CUDA: PagedAttentionTuning::warps_m (0: the launcher's automatic layout).
  int attention_warps_m = 0;
  // CUDA: PagedAttentionTuning::num_splits (0: automatic).
  int attention_splits = 0;
  // CUDA: PagedAttentionTuning::hopper_tile_tokens (0: automatic).
  int attention_tile_tokens = 0;
  // CUDA: GemmTailAttention's workspace (GemmTailAttentionWorkspaceBytes, zeroed once); null:
  // the model does not ask for the QKV GEMM's tail attention.
  void* tail_workspace = nullptr;
  size_t tail_workspace_bytes = 0;
  // Benchmarks (mqabench --tail-timeline): layer tail_stamps_layer's tail launch writes
  // GemmTailAttention::stamps here; null: none.
  unsigned long long* tail_stamps = nullptr;
  int tail_stamps_layer = -1;
  // CUDA: DecodeChainCuda's counters (kernels/decode_chain_cuda.h: DecodeChainWorkspaceBytes of
  // chain_slots, zeroed once); null: DecodeChain is Unimplemented.
  void* chain_workspace = nullptr;
  int chain_slots = 0;
  int chain_spare_sms = 0;  // DecodeChainTuning::spare_sms
  int chain_max_inflight = 0;  // DecodeChainTuning::max_inflight
  int chain_stage_bytes = 0;   // DecodeChainTuning::stage_bytes (0: automatic)
  int chain_ll_inputs = -1;    // DecodeChainTuning::ll_inputs
  int chain_head_hold = -1;    // DecodeChainTuning::head_hold
  int chain_mma_fold = -1;     // DecodeChainTuning::mma_fold
  int chain_half_fold = -1;    // DecodeChainTuning::half_fold
  int chain_fused_mlp = -1;    // DecodeChainTuning::fused_mlp
  int chain_fused_pool = -1;   // DecodeChainTuning::fused_pool
  int chain_steal_chunks = -1;  // DecodeChainTuning::steal_chunks
  const DecodeChainSmShares* chain_sm_shares = nullptr;  // DecodeChainTuning::sm_shares
  // Benchmarks (mqabench --chain-timeline): the chain launched with timeline index i <
  // chain_timelines records DecodeChainTuning::timeline at chain_timeline + i *
  // chain_timeline_stride (words); null: no timeline.
  unsigned long long* chain_timeline = nullptr;
  size_t chain_timeline_stride = 0;
  int chain_timelines = 0;
  // Benchmarks only (mqabench --skip): the ops whose OpSkip bit is set return at once without
  // launching anything, so their outputs are garbage. A step timed with and without an op gives
  // that op's share of the step as the GPU really runs it (overlaps and launch gaps included),
  // which isolated kernel timings cannot.
  uint32_t skip = 0;
};

enum OpSkip : uint32_t {
  kSkipLayerNorm = 1u << 0,   // LayerNorm
  kSkipKvWrite = 1u << 1,     // KvCacheWrite (a KV write fused into a GEMM is skipped with it)
  kSkipAttention = 1u << 2,   // PagedAttention
  kSkipGemm = 1u << 3,        // Gemm, Linear, FusedLinear (with what they fuse)
  kSkipActivation = 1u << 4,  // BiasActivation, Embedding
};

// A Linear layer: gemm (C = A B^T), then C = act(C + bias), or, with `residual`, residual +=
// act(C + bias) (the residual stream; gemm.c is then scratch). The CPU runs GemmCpu and
// BiasActivationCpu in that order; CUDA fuses bias, GELU-tanh and the residual add into the
// GEMM's epilogue where it can (kernels/gemm_cuda.h). residual has gemm.ldc as its row stride.
struct LinearParams {
  GemmParams gemm;
  const void* bias = nullptr;
  Activation activation = Activation::kIdentity;
  void* residual = nullptr;
  // CUDA: GemmEpilogue::release_dependents_early (Linear, FusedLinear; the CPU ignores it).
  bool release_dependents_early = false;
};

// What FusedLinear folds into the GEMM: A's rows through a layer norm first (ln_weight non-null),
// and the output columns [kv_col0, kv_col0 + kv_width) / [kv_col0 + kv_width, + kv_width) of
// token i written to key_cache / value_cache at slot_mapping[i] too (key_cache non-null; caches
// [blocks, block_size, kv_heads, head_dim] with kv_width = kv_heads * head_dim; slot < 0 skips).
struct LinearFusion {
  const void* ln_weight = nullptr;
  const void* ln_bias = nullptr;
  float ln_epsilon = 1e-5f;
  const float* ln_wsum = nullptr;  // GemmEpilogue::ln_wsum / ln_bsum
  const float* ln_bsum = nullptr;
  void* key_cache = nullptr;
  void* value_cache = nullptr;
  const int32_t* slot_mapping = nullptr;
  int64_t kv_col0 = 0, kv_width = 0;
  GemmTailAttention tail;  // GemmEpilogue::tail (output null: none)
};

// Linear (no residual) with LinearFusion's extra work done inside the GEMM: launches removed on
// the CUDA decode path (the skinny GEMM, m <= 8). Unimplemented where that is not available (the
// CPU, larger m, cuBLASLt only, GELU-erf): the caller then runs LayerNorm, Linear and
// KvCacheWrite itself. Same results as that sequence up to fp32 summation order.
absl::Status FusedLinear(const OpContext& ctx, const LinearParams& p, const LinearFusion& f);

absl::Status LayerNorm(const OpContext& ctx, const LayerNormParams& p);
absl::Status BiasActivation(const OpContext& ctx, const BiasActivationParams& p);
absl::Status Embedding(const OpContext& ctx, const EmbeddingParams& p);
absl::Status Gemm(const OpContext& ctx, const GemmParams& p);
absl::Status Linear(const OpContext& ctx, const LinearParams& p);
absl::Status KvCacheWrite(const OpContext& ctx, const KvCacheWriteParams& p);
// kv_write (optional): the step's new K / V rows for p's caches, written before they are attended
// to (as KvCacheWrite; on the CUDA path PagedAttentionCuda may fuse it into the attention kernel).
// kSkipKvWrite leaves it out, kSkipAttention the attention.
absl::Status PagedAttention(const OpContext& ctx, const PagedAttentionParams& p,
                            const KvCacheWriteParams* kv_write = nullptr);
// A batch-1 decode chain (kernels/decode_chain.h): DecodeChainCpu on the CPU (float32),
// DecodeChainCuda on the GPU with ctx.chain_workspace's counter `slot` (Unimplemented without a
// workspace or where the device cannot hold the grid: nothing has run then). kSkipGemm skips it.
// timeline_index: where it records its timeline (OpContext::chain_timeline), if anywhere.
absl::Status DecodeChain(const OpContext& ctx, const DecodeChainParams& p, int slot,
                         int timeline_index = -1);

}  // namespace mqa
