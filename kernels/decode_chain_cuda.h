// The CUDA side of kernels/decode_chain.h: the persistent batch-1 decode chain kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"
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
};

// Runs the chain on `stream`. `workspace`: DecodeChainWorkspaceBytes(slots) bytes, zeroed once;
// `slot` < slots picks the counter (chains that may run concurrently, or back to back without a
// full dependency between them, need different slots; a chain of one phase uses none).
// Unimplemented where the device cannot hold the grid (then nothing was launched); InvalidArgument
// as DecodeChainSupported. Allocates nothing: may be captured into a CUDA graph.
absl::Status DecodeChainCuda(const DecodeChainParams& p, cudaStream_t stream, bool pdl,
                             void* workspace, int slot, const DecodeChainTuning& tuning = {});

}  // namespace mqa
