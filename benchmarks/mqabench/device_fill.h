// GPU-side helpers of mqabench: random ("dummy") weights made directly on the device (a host
// fill of StarCoder's 31 GB would take minutes), and the two ceilings measured in the same run.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/weights.h"

namespace mqa::bench {

// Weights of rank 0 of 1 on the current device: matrices and embeddings uniform with standard
// deviation config.initializer_range, layer-norm weights 1, biases 0; lm_head tied to wte.
absl::StatusOr<GptBigCodeWeights> MakeDeviceDummyWeights(const ModelConfig& config, DType dtype,
                                                         uint64_t seed);

// Device-to-device copy bandwidth in bytes/s (bytes read + written), `bytes` per copy.
absl::StatusOr<double> MeasureCopyBandwidth(size_t bytes);

// Dense GEMM rate in FLOP/s (m = n = k = size, the dtype, fp32 accumulation, random inputs).
absl::StatusOr<double> MeasureGemmRate(int64_t size, DType dtype);

}  // namespace mqa::bench
