// The CUDA side of kernels/decode_chain.h: the persistent batch-1 decode chain kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/decode_chain.h"

namespace mqa {

// Device bytes of the workspace of `slots` independent chains (one counter each, 128 bytes
// apart). Zero it once (cudaMemset); every launch leaves its counter at zero.
size_t DecodeChainWorkspaceBytes(int slots);

// OK when DecodeChainCuda takes `p`; InvalidArgument naming the first thing it does not.
absl::Status DecodeChainSupported(const DecodeChainParams& p);

// Benchmark knobs; the defaults are the measured choice.
struct DecodeChainTuning {
  int stage_bytes = 0;  // bytes a ring stage (a multiple of 8192); 0: 32 KiB
  int max_stages = 0;   // at most this many stages (0: as many as fit, up to 16)
  // Diagnostic: the consumers release each stage without reading it (outputs are garbage): the
  // rate at which the producer alone streams the weights.
  bool stream_only = false;
  // SMs left without a chain CTA (the grid is SMs - spare_sms CTAs): room for the attention
  // kernel that runs between two chains, so that the next chain's CTAs can all be resident (and
  // stream their first weights) while it runs.
  int spare_sms = 0;
  // Bytes each CTA's producer keeps requested into L2 (cp.async.bulk.prefetch.L2) ahead of its
  // ring loads, across the phase boundaries and into DecodeChainParams::next_weight: HBM keeps
  // streaming while the consumers wait at a grid barrier with the ring full. 0: none.
  int l2_lookahead_bytes = 0;
  // Diagnostic: DecodeChainTimelineWords(grid) words of device memory (grid: DecodeChainGrid);
  // every CTA records its events there (DecodeChainEvent) from a separate instantiation of the
  // kernel. Null: none.
  unsigned long long* timeline = nullptr;
};

// CTAs of a chain launched with `tuning` on the calling thread's device.
absl::StatusOr<int> DecodeChainGrid(const DecodeChainTuning& tuning = {});

// The timeline: kDecodeChainTimelineWords words a CTA (CTA c's at c * kDecodeChainTimelineWords).
// Words kGlobalStart / kGlobalEnd are %globaltimer (ns), every other one clock64 of the CTA's SM:
// kClockStart beside kGlobalStart (after the set-up barrier), kClockEnd beside kGlobalEnd (the
// consumers' last instruction). Phase g (counting an attention phase as 0) has consumer events
// at kPhaseEvents + g * kPhaseEventCount + DecodeChainPhaseEvent and the producer's first and
// last ring load at kProducerEvents + 2 g (+ 1); kProducerDone once it has issued everything.
inline constexpr int kDecodeChainTimelineWords = 64;
enum DecodeChainEvent : int {
  kChainGlobalStart = 0,
  kChainClockStart = 1,
  kChainGlobalEnd = 2,
  kChainClockEnd = 3,
  kChainPhaseEvents = 4,
  kChainProducerEvents = 4 + 6 * (kMaxDecodeChainPhases + 1),
  kChainProducerDone = kChainProducerEvents + 2 * (kMaxDecodeChainPhases + 1),
};
enum DecodeChainPhaseEvent : int {
  kChainBarrierEnter = 0,  // the grid barrier before the phase (none before the first)
  kChainBarrierExit,
  kChainInputReady,   // the phase's input vector (normalised) in shared memory
  kChainFirstFull,    // the phase's first ring stage has arrived
  kChainLastRelease,  // its last stage folded and released
  kChainEpilogueDone,  // its outputs written
  kChainPhaseEventCount,
};
static_assert(kChainProducerDone < kDecodeChainTimelineWords);
inline size_t DecodeChainTimelineWords(int grid) {
  return static_cast<size_t>(grid) * kDecodeChainTimelineWords;
}

// Runs the chain on `stream`. `workspace`: DecodeChainWorkspaceBytes(slots) bytes, zeroed once;
// `slot` < slots picks the counter (chains that may run concurrently, or back to back without a
// full dependency between them, need different slots; a chain of one phase uses none).
// Unimplemented where the device cannot hold the grid (then nothing was launched); InvalidArgument
// as DecodeChainSupported. Allocates nothing: may be captured into a CUDA graph.
absl::Status DecodeChainCuda(const DecodeChainParams& p, cudaStream_t stream, bool pdl,
                             void* workspace, int slot, const DecodeChainTuning& tuning = {});

}  // namespace mqa
