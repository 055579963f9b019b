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

#if defined(__CUDACC__)
#define MQA_HOST_DEVICE __host__ __device__
#else
#define MQA_HOST_DEVICE
#endif

namespace mqa {

struct RowSamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = -1;        // <= 0 or >= vocab: all
  float top_p = 1.0f;        // >= 1: all
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// A counter-based uniform draw in [0, 1) with 24 random bits (the same on host and device).
MQA_HOST_DEVICE inline float SampleUniform(uint64_t seed, uint64_t offset) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const uint64_t r = mix(seed ^ mix(offset + 0x632be59bd9b4e019ull));
  return static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
}

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
