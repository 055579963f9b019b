// Token sampling from fp32 logits rows, with one parameter set per row: greedy, temperature,
// top-k, top-p and a per-request seed. The CPU reference (sampling_cpu.cc) and the CUDA kernel
// (sampling.cu, sampling_cuda.h) compute the same function:
//   greedy (temperature <= 0): the first index of the largest logit;
//   otherwise x = logit / temperature; keep x >= the k-th largest x (top_k in (0, vocab));
//   e = exp(x - max x); of the kept, keep x >= the largest threshold whose kept mass reaches
//   top_p * (kept mass) (top_p < 1); draw u = SampleUniform(seed, offset) and return the first
//   kept index, in vocabulary order, whose running kept mass exceeds u * (kept mass).
// Ties at a threshold are all kept. `offset` counts the draws a request made so far, so that a
// request's tokens depend on its seed and its own history only.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/row_sampling.h"

namespace mqa {

struct SampleTokensParams {
  const float* logits = nullptr;  // [rows, ld], the first `vocab` columns used
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t ld = 0;
  const RowSamplingParams* params = nullptr;  // [rows]
  int32_t* tokens = nullptr;                  // [rows] out
};

// Host pointers. InvalidArgument for non-positive vocab, ld < vocab, null pointers.
absl::Status SampleTokensCpu(const SampleTokensParams& p);

}  // namespace mqa
