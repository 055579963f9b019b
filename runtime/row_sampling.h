// The per-row sampling parameters of a device-side sampler (kernels/sampling.h: the CPU
// reference and the CUDA kernel) and its counter-based uniform draw. Here, below the kernels, so
// that the engine can fill them for a ModelRunner (runtime/model_runner.h) without depending on
// the kernels library.
#pragma once

#include <cstdint>

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

}  // namespace mqa
