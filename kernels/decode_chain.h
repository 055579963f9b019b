// The batch-1 decode chain: several m = 1 linear layers (with their layer norms, bias, GELU and
// residual adds) in one persistent kernel, so that HBM keeps streaming weights across the
// boundaries where separate kernels leave it idle (launch, ramp, tail, the small kernels between
// GEMMs).
//
// A chain is a list of phases; phase i computes
//   output = act(W_i x_i + bias_i) (+ output, with `accumulate`: the residual stream in place),
//   x_i = input_i, or LayerNorm(input_i) rounded to the dtype as LayerNormCuda writes it,
// where input_i may be an earlier phase's output (or anything written before the launch). One CTA
// an SM; phase i's output rows are dealt out in equal contiguous ranges, so each CTA's weight rows
// of a phase are one contiguous run of memory (with DecodeChainTuning::steal_chunks, off by
// default, all but the last few stage-sized chunks of each range, the rest dealt at run time). A
// producer warp streams those runs, phase after phase, through a ring of shared-memory stages
// (cp.async.bulk with mbarrier completion): weights depend on nothing, so the ring fills ahead of
// every phase boundary, and before the programmatic-dependent wait too (the previous kernel's tail
// and the attention between chains). Consumer warps wait on a grid-wide barrier between phases (a
// counter in `workspace`), read the phase's input vector from L2 into shared memory (in the dtype,
// normalised there where asked) and fold the staged weights into per-row fp32 sums.
//
// The model runs, per layer l of a batch-1 decode step: [attention l] then one chain
// {c_proj_l (+ residual), ln_2 + c_fc_l + GELU, mlp c_proj_l (+ residual), ln_1 + QKV_{l+1}}
// (GptBigCodeOptions::decode_chain, by default on layers of >= 256 MiB of weights): two launches a
// layer instead of seven; optionally the attention as the chain's first phase
// (DecodeChainAttention, decode_chain_attention): one launch.
//
// The CUDA kernel is in kernels/decode_chain_cuda.h. Constraints (DecodeChainSupported): fp16 /
// bf16; 1..kMaxDecodeChainPhases phases; k a positive multiple of 256 and at most kDecodeChainMaxK;
// weights, inputs and LN params 16-byte aligned; a phase's input must not be its own output. A
// chain whose grid cannot be co-resident (it needs one CTA on every SM) is refused as
// Unimplemented, as are the shapes above (the caller falls back to the separate kernels).
//
// PDL: launched as a programmatic dependent with `pdl`; the producer streams weights before
// griddepcontrol.wait; nothing else is read or written before it. Dependents are released once
// every CTA is running (they cannot start before the chain's last CTA is resident, so the grid
// barrier cannot deadlock on them).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/activation.h"
#include "runtime/dtype.h"

namespace mqa {

inline constexpr int kMaxDecodeChainPhases = 4;
inline constexpr int64_t kDecodeChainMaxK = 24576;

struct DecodeChainPhase {
  const void* weight = nullptr;     // [n, k], row-major (PyTorch's Linear layout)
  const void* bias = nullptr;       // [n], or null
  const void* input = nullptr;      // [k]
  const void* ln_weight = nullptr;  // [k]: x = LayerNorm(input) first; null: x = input
  const void* ln_bias = nullptr;    // [k]
  float ln_epsilon = 1e-5f;
  void* output = nullptr;                         // [n]
  bool accumulate = false;                        // output += act(W x + bias) (the residual stream)
  Activation activation = Activation::kIdentity;  // identity or GELU-tanh
  int64_t n = 0, k = 0;
  // Optional: the same weight transposed ([k, n], row-major; 16-byte aligned). With it, where
  // this phase is an MLP's down projection (its input the previous phase's GELU output, which
  // nothing else reads; it accumulates into the residual stream the previous phase normalises;
  // the next phase reads that stream), the CUDA kernel may fuse the two projections
  // (DecodeChainTuning::fused_mlp): no grid barrier between them, the previous phase's output
  // never leaves the CTA. The math is the same (weight is what the CPU reference uses); the
  // fused form rounds residual + bias + W x to the dtype once, the separate one twice.
  const void* weight_t = nullptr;
};

// An attention phase ahead of the linear phases (batch-1 decode: one sequence, one query token):
// for every query head h, output[h] = softmax(scale q_h K^T) V over the sequence's context, q and
// the new token's K / V (its last position) from the QKV row `qkv` = [heads x D | kv_heads x D |
// kv_heads x D], the older positions from the paged caches [blocks, block_size, kv_heads, D]
// through `block_table`. The new K / V row is also written to the caches at *slot (< 0: not).
// Each CTA takes whole heads (a head per CTA while heads <= CTAs): meant for short contexts. With
// a CTA for every head, D 64 or 128 and max_context <= 512 x 64 / D (256 at D = 128), the short
// form runs: everything that does not depend on the previous kernel (context length, block table,
// cached K rows, the slot) is requested before the PDL wait, and a CTA without a head writes the
// new K / V row.
struct DecodeChainAttention {
  const void* qkv = nullptr;
  void* key_cache = nullptr;
  void* value_cache = nullptr;
  // The sequence's row of the block table (device), at least ceil(max_context / block_size)
  // entries long (they are read before the context length is known).
  const int32_t* block_table = nullptr;
  const int32_t* context_len = nullptr;  // device scalar: context tokens, the new one included
  const int32_t* slot = nullptr;         // device scalar: the new token's cache slot
  void* output = nullptr;                // [heads x D]
  int heads = 0, kv_heads = 0, head_dim = 0, block_size = 0;
  int max_context = 0;  // an upper bound of *context_len (sizes the score buffer)
  float scale = 1.0f;
};

struct DecodeChainParams {
  DecodeChainPhase phases[kMaxDecodeChainPhases];
  int num_phases = 0;
  DType dtype = DType::kF16;
  // With has_attention, `attention` runs first, a grid barrier before phases[0] (which typically
  // reads attention.output).
  bool has_attention = false;
  DecodeChainAttention attention;
};

// The CPU reference (float32 only): each phase as LayerNormCpu, GemmCpu and BiasActivationCpu in
// turn, into scratch it allocates. InvalidArgument as DecodeChainSupported (k need not be a
// multiple of 256 here) or for another dtype; Unimplemented with an attention phase.
absl::Status DecodeChainCpu(const DecodeChainParams& p);

}  // namespace mqa
