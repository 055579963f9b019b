// The CUDA sampler (kernels/sampling.h) and the logits conversion that feeds it. Include only from
// CUDA-enabled code. Asynchronous on `stream`; device pointers.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/sampling.h"
#include "runtime/dtype.h"

namespace mqa {

// Which kernel SampleTokensCuda runs. Both give the same tokens.
enum class SampleTokensCudaKernel {
  // One CTA per row: argmax for greedy rows; for sampled rows bisections over the
  // order-preserving integer keys of the floats find the top-k and top-p thresholds exactly,
  // then a block scan finds the drawn index.
  kOneCtaPerRow,
  // A cluster of 8 CTAs per row: a greedy row's argmax split 8 ways (its CTAs combine their
  // results through distributed shared memory, no global workspace); a sampled row runs the
  // kOneCtaPerRow code in the cluster's first CTA. Mixed batches need nothing special.
  kGreedyCluster,
};

// p.params and p.tokens are device arrays. Works inside CUDA graph capture.
absl::Status SampleTokensCuda(
    const SampleTokensParams& p, cudaStream_t stream,
    SampleTokensCudaKernel kernel = SampleTokensCudaKernel::kOneCtaPerRow);

struct LogitsToFloatParams {
  const void* input = nullptr;  // [shards * rows, vocab_shard] of `dtype` (gathered shards)
  int shards = 1;
  int64_t rows = 0;
  int64_t vocab_shard = 0;
  int64_t vocab = 0;      // <= shards * vocab_shard; columns past it (padding) are dropped
  float* output = nullptr;  // [rows, vocab]: row i = shard 0's row i, then shard 1's, ...
  DType dtype = DType::kF16;
};

absl::Status LogitsToFloatCuda(const LogitsToFloatParams& p, cudaStream_t stream);

}  // namespace mqa
