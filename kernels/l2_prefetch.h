// Weights into L2 on a side stream while the main stream runs kernels that leave HBM idle (the
// decode attention between the QKV and attention-projection GEMMs): the side stream forks from
// the main stream at an event, runs one short kernel whose threads issue `prefetch.global.L2` for
// every 128-byte line of the ranges and exit, and is joined back before the step ends. Works
// inside a CUDA graph capture (the fork and join become graph edges).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace mqa {

struct L2PrefetchRange {
  const void* ptr = nullptr;
  size_t bytes = 0;
};

// Records `fork` on `main`, makes `side` wait for it and launches the prefetch of r0 and r1 on
// `side` (empty ranges are skipped), then records `done` on `side`. ctas: the prefetch grid.
absl::Status L2PrefetchForkCuda(L2PrefetchRange r0, L2PrefetchRange r1, int ctas,
                                cudaStream_t main, cudaStream_t side, cudaEvent_t fork,
                                cudaEvent_t done);

// Makes `main` wait for the last prefetch forked with `done`.
absl::Status L2PrefetchJoinCuda(cudaStream_t main, cudaEvent_t done);

}  // namespace mqa
