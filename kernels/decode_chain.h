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
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
// a CTA for every head, D 64 or 128 and max_context <= DecodeChainShortAttentionMaxContext(D)
// (256 at D = 128), the short form runs: the context length, the block table and the slot are
// requested before the PDL wait (the K rows after it, behind q's request), and a CTA without a
// head writes the new K / V row. Longer contexts run the loop form, which walks a
// head's context in chunks.
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

// The longest context the attention phase's short form takes at head_dim D (its 512 consumer
// threads hold 64 elements of K each: 512 x 64 / D positions), 0 where D is neither 64 nor 128.
constexpr int DecodeChainShortAttentionMaxContext(int head_dim) {
  return head_dim == 64 || head_dim == 128 ? 512 * 64 / head_dim : 0;
}

struct DecodeChainParams {
  DecodeChainPhase phases[kMaxDecodeChainPhases];
  int num_phases = 0;
  DType dtype = DType::kF16;
  // With has_attention, `attention` runs first, a grid barrier before phases[0] (which typically
  // reads attention.output).
  bool has_attention = false;
  DecodeChainAttention attention;
};

// The timeline: kDecodeChainTimelineWords words a CTA (CTA c's at c * kDecodeChainTimelineWords).
// Words kChainGlobalStart / kChainGlobalEnd are %globaltimer (ns), every other one clock64 of the
// CTA's SM: kChainClockStart beside kChainGlobalStart (after the set-up barrier), kChainClockEnd
// beside kChainGlobalEnd (the consumers' last instruction). Phase g (counting an attention phase as
// 0) has consumer events at kChainPhaseEvents + g * kChainPhaseEventCount + DecodeChainPhaseEvent
// and the producer's first and last ring load at kChainProducerEvents + 2 g (+ 1);
// kChainProducerDone once it has issued everything; kChainPdlDone after the consumers' PDL wait,
// kChainLoopStart + g before phase g's stage loop.
inline constexpr int kDecodeChainTimelineWords = 64;
enum DecodeChainEvent : int {
  kChainGlobalStart = 0,
  kChainClockStart = 1,
  kChainGlobalEnd = 2,
  kChainClockEnd = 3,
  kChainPhaseEvents = 4,
  kChainProducerEvents = 4 + 6 * (kMaxDecodeChainPhases + 1),
  kChainProducerDone = kChainProducerEvents + 2 * (kMaxDecodeChainPhases + 1),
  kChainPdlDone,    // the consumers' griddepcontrol.wait has returned
  kChainLoopStart,  // + g: phase g's consumers start waiting on its first ring stage
  kChainSmId = kDecodeChainTimelineWords - 1,  // the SM the CTA ran on (%smid), not a time
};
enum DecodeChainPhaseEvent : int {
  kChainBarrierEnter = 0,  // the grid barrier before the phase (none before the first)
  kChainBarrierExit,
  kChainInputReady,    // the phase's input vector (normalised) in shared memory
  kChainFirstFull,     // the phase's first ring stage has arrived
  kChainLastRelease,   // its last stage folded and released
  kChainEpilogueDone,  // its outputs written
  kChainPhaseEventCount,
};
static_assert(kChainLoopStart + kMaxDecodeChainPhases < kChainSmId);
inline size_t DecodeChainTimelineWords(int grid) {
  return static_cast<size_t>(grid) * kDecodeChainTimelineWords;
}

// Per-SM shares of a chain's rows (DecodeChainTuning::sm_shares). The memory system does not
// serve the SMs equally: on some machines the same SMs stream a long phase 2-4% slower than the
// median from call to call (benchmarks/mqabench/NOTES.md versions 9, 10 and 13), and every grid
// barrier waits for the slowest. With shares, the CTA on SM s (%smid) takes rows
// [n lo_s / kDecodeChainShareOne, n hi_s / kDecodeChainShareOne) of every phase with static rows
// instead of an equal share; the SMs' ranges follow each other in %smid order, so they partition
// every phase exactly whatever n is. The chain's grid must put one CTA on each SM of the table
// (grid == sms: no spare SMs); a CTA on an SM without a share stops the kernel (__trap).
inline constexpr int kDecodeChainMaxSmIds = 256;
inline constexpr uint32_t kDecodeChainShareOne = 32768;
inline constexpr uint32_t kDecodeChainNoShare = 0xffffffffu;
struct DecodeChainSmShares {
  // bounds[s] = lo_s | hi_s << 16, or kDecodeChainNoShare.
  uint32_t bounds[kDecodeChainMaxSmIds];
  int sms = 0;  // SMs with a share
};
// The first row of a phase of n rows that the SM with share word `bounds` takes (`end`: one past
// its last). The kernel, the launch's sizing and the tests all read a share through this.
constexpr int64_t DecodeChainShareRow(uint32_t bounds, int64_t n, bool end) {
  return n * (end ? bounds >> 16 : bounds & 0xffffu) / kDecodeChainShareOne;
}

// Shares proportional to `rates` (SM id -> relative streaming rate, each > 0; ids distinct and
// below kDecodeChainMaxSmIds). InvalidArgument otherwise.
absl::StatusOr<DecodeChainSmShares> DecodeChainSharesFromRates(
    const std::vector<std::pair<int, double>>& rates);

// What a calibration found (DecodeChainShareCalibrator::Finish).
struct DecodeChainShareCalibration {
  DecodeChainSmShares shares;
  int launches = 0;  // timelines added
  int samples = 0;   // (launch, phase) pairs used
  // The per-SM rate estimates of the even and the odd samples, correlated over the SMs, and the
  // reliability of their mean (Spearman-Brown: 2 r / (1 + r), 0 where r <= 0): each SM's
  // estimate is shrunk toward the mean by it, so that noise alone gives equal shares.
  double half_correlation = 0.0;
  double reliability = 0.0;
  double min_share = 1.0, max_share = 1.0;  // the shares relative to an equal one
  std::string Summary() const;
};

// Per-SM shares from chain timelines (DecodeChainTuning::timeline) recorded with equal shares:
// in every phase each CTA's streaming time (first ring stage to last release) for its rows gives
// the SM's rate relative to the launch's other CTAs; phases weigh by their length.
class DecodeChainShareCalibrator {
 public:
  // `grid` CTAs a launch; `phase_rows` the n of each phase g of the timelines (counting an
  // attention phase as 0, with 0 rows: not used).
  DecodeChainShareCalibrator(int grid, std::vector<int64_t> phase_rows);
  // One launch's timeline (grid x kDecodeChainTimelineWords words). InvalidArgument where two
  // CTAs share an SM or an SM id is out of range; a launch without stamps (all zero) is skipped.
  absl::Status AddLaunch(const unsigned long long* words);
  // FailedPrecondition before enough samples (two launches with every SM in both halves).
  absl::StatusOr<DecodeChainShareCalibration> Finish() const;

 private:
  int grid_;
  std::vector<int64_t> phase_rows_;
  int launches_ = 0, samples_ = 0;
  // Per SM id: weighted sums of log relative rate and of weight, for the even and odd samples.
  std::vector<double> sum_[2], weight_[2];
};

// The CPU reference (float32 only): each phase as LayerNormCpu, GemmCpu and BiasActivationCpu in
// turn, into scratch it allocates. InvalidArgument as DecodeChainSupported (k need not be a
// multiple of 256 here) or for another dtype; Unimplemented with an attention phase.
absl::Status DecodeChainCpu(const DecodeChainParams& p);

}  // namespace mqa
