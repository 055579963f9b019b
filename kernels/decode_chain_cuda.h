// The CUDA side of kernels/decode_chain.h: the persistent batch-1 decode chain kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/decode_chain.h"

namespace mqa {

// Device bytes of the workspace of `slots` independent chains (a grid-barrier counter and a
// work-stealing counter a phase each, a launch epoch and the LL boundaries' words). Zero it once
// (cudaMemset); every launch leaves its counters at zero (the epoch advances).
size_t DecodeChainWorkspaceBytes(int slots);
// Byte offsets in that workspace of every counter a launch leaves at zero (tests).
std::vector<size_t> DecodeChainCounterOffsets(int slots);

// OK when DecodeChainCuda takes `p`; InvalidArgument naming the first thing it does not.
absl::Status DecodeChainSupported(const DecodeChainParams& p);

// Benchmark knobs; the defaults are the measured choice.
struct DecodeChainTuning {
  // Bytes a ring stage (a multiple of 8192) and at most this many stages; 0, 0: automatic (48 KiB
  // stages, as many as fit, where a CTA streams >= 2 MiB over the chain; else at most three of
  // 32 KiB).
  int stage_bytes = 0;
  int max_stages = 0;
  // Diagnostic: the consumers release each stage without reading it (outputs are garbage): the
  // rate at which the producer alone streams the weights.
  bool stream_only = false;
  // SMs left without a chain CTA (the grid is SMs - spare_sms CTAs): room for the attention
  // kernel that runs between two chains, so that the next chain's CTAs can all be resident (and
  // stream their first weights) while it runs.
  int spare_sms = 0;
  // Ring stages the producer keeps requested but not yet arrived (0: as many as the ring holds).
  // A CTA's consumers read their input vector, poll the grid barrier and load residuals through
  // the same SM memory queue as the producer's bulk loads; a full ring of requests ahead of them
  // (192 KiB) delayed each such load by several microseconds on the H200 (the timeline).
  int max_inflight = 0;
  // Work stealing: each CTA keeps all but about this many ring-stage-sized chunks of its equal
  // share of a phase's rows, and the rest are dealt at run time (an atomic counter a phase) to the
  // CTAs that ask first, so that the CTAs the memory system serves more slowly do not hold up the
  // grid barrier after the phase. 0: off (equal contiguous shares); -1: the measured default (off:
  // in phases of at least steal_min_chunks chunks a CTA, 2 chunks made StarCoder b1 0.7% faster
  // on one H200 machine and 0.6% slower on another; in every phase, 0.5-2.6% slower). A stolen
  // row's residual is added into the output in place (red.add: one rounding more than a static
  // row's); a phase with a bias steals only where the bias is 16-byte aligned and n a multiple
  // of 8.
  int steal_chunks = -1;
  // Work stealing only in phases of at least this many stage-sized chunks a CTA (-1: the measured
  // default): short phases lose more to the tickets than their CTAs' spread costs.
  int steal_min_chunks = -1;
  // Diagnostic: DecodeChainTimelineWords(grid) words of device memory (grid: DecodeChainGrid);
  // every CTA records its events there (DecodeChainEvent) from a separate instantiation of the
  // kernel. Null: none.
  unsigned long long* timeline = nullptr;
  // Diagnostic: the producer loads nothing and completes each stage at once (outputs are
  // garbage): the rate at which the consumers alone fold stages, boundaries included.
  bool consume_only = false;
  // LL boundaries (kernels/decode_chain.cu, kLlMaxN): a phase whose input is the previous
  // phase's output (at most 8192 elements, no work stealing, no in-place residual) polls that
  // output's flagged words instead of a grid barrier and a load. -1: the measured default; 0: off;
  // 1: on. Measured equal to the barriers end to end (kernels/decode_chain.cu: off by default).
  int ll_inputs = -1;
  // With the attention's short form (DecodeChainParams::attention, every head its CTA): each head
  // CTA's producer requests none of the next phase's weights until the head's K rows, which the
  // short form copies into that CTA's ring, have been read (1), or until the head is written (2)
  // (the other CTAs' fills go on). 0 is accepted and runs as 1 (before the K rows moved into the
  // ring it meant not held); -1: the measured default (kernels/decode_chain.cu, kDefaultHeadHold:
  // 1). InvalidArgument for any other value.
  int head_hold = -1;
  // The fold: 1, the tiled layout on tensor cores (kernels/decode_chain.cu, kTileMaxRows: a stage
  // is a tile of up to 32 rows x C columns, one MMA folds 256 weights, each row's sum stays in
  // the MMA accumulators for the whole tile); 0, the row-run layout folded in fp32 on the CUDA
  // cores (a stage is the next stage_bytes of the CTA's contiguous rows, each warp's row sums
  // flushed a stage at a time); 8, 16, 24 or 32: tiles of exactly that many rows (1: the rule in
  // TileShape). -1: the measured default. Phases that steal rows use the row-run layout either
  // way.
  int mma_fold = -1;
  // The row-run fold with each 16-byte chunk's 8 products summed as fp16 pairs (HFMA2) before
  // the fp32 row sum: a quarter of the fold's arithmetic instructions, one fp16 rounding on each
  // 4-product partial (for k = 24576 and weights ~0.02 about one fp16 rounding of the output).
  // fp16 only (bf16 keeps the fp32 fold); not with the tiled layout. 1: on, 0: off (the fp32
  // fold), -1: the measured default (kernels/decode_chain.cu: on).
  int half_fold = -1;
  // The fused MLP (DecodeChainPhase::weight_t): a CTA computes its own rows of the up
  // projection (+ GELU) into shared memory and streams the same rows of the down projection's
  // transposed weight, adding each row times its activation into per-thread fp32 sums of the
  // whole output, which it adds into an fp32 vector in the workspace (red.add); the next phase
  // reads that vector (plus the residual and the bias, added into it by the up phase) after its
  // grid barrier, rounds it and writes the residual stream. One grid barrier and the
  // intermediate's round trip through L2 fewer a layer. Needs a phase before the pair (its barrier
  // orders the vector's zeroing) and one after it, a down projection of at most 8192 outputs whose
  // rows divide the ring stage, and no LL boundary, work stealing or tiled layout on the three
  // phases. 1: on where it applies, 0: off, -1: the measured default (kernels/decode_chain.cu).
  int fused_mlp = -1;
  // With the fused MLP: each CTA's last N ring stages of the pair's rows (its c_fc outputs, kept
  // in the workspace too, and the matching transposed mlp.c_proj rows) are dealt at run time (an
  // atomic ticket) to whichever CTA has finished its own first, so that the SMs the memory serves
  // more slowly do not hold up the barrier after the pair. 0: none; -1: the measured default
  // (kernels/decode_chain.cu: none). Needs at least N + 1 stages of rows a CTA.
  int fused_pool = -1;
  // Per-SM shares of every phase's static rows (kernels/decode_chain.h: DecodeChainSmShares,
  // from DecodeChainShareCalibrator), copied into the launch's parameters; null: equal shares.
  // Needs a grid of exactly sm_shares->sms CTAs (no spare SMs), and neither the fused MLP nor the
  // tiled layout (InvalidArgument otherwise). Phases that steal rows keep their chunks.
  const DecodeChainSmShares* sm_shares = nullptr;
};

// wt = w^T for a 2-byte dtype: w [n, k] row-major into wt [k, n] (DecodeChainPhase::weight_t),
// on `stream`. InvalidArgument for a null pointer or a non-positive size.
absl::Status DecodeChainTransposeCuda(const void* w, void* wt, int64_t n, int64_t k,
                                      cudaStream_t stream);

// CTAs of a chain launched with `tuning` on the calling thread's device.
absl::StatusOr<int> DecodeChainGrid(const DecodeChainTuning& tuning = {});

// Runs the chain on `stream`. `workspace`: DecodeChainWorkspaceBytes(slots) bytes, zeroed once;
// `slot` < slots picks the counter (chains that may run concurrently, or back to back without a
// full dependency between them, need different slots; a chain of one phase uses none).
// Unimplemented where the device cannot hold the grid (then nothing was launched); InvalidArgument
// as DecodeChainSupported. Allocates nothing: may be captured into a CUDA graph.
absl::Status DecodeChainCuda(const DecodeChainParams& p, cudaStream_t stream, bool pdl,
                             void* workspace, int slot, const DecodeChainTuning& tuning = {});

}  // namespace mqa
