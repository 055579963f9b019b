// GPU sampling (see sampling.h for the function computed) and the logits conversion.
#include <cfloat>

#include "absl/strings/str_cat.h"
#include "kernels/forward_cuda_common.cuh"
#include "kernels/sampling_cuda.h"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

constexpr int kThreads = 512;

// Order-preserving map of floats to unsigned integers (no NaNs expected).
__device__ __forceinline__ uint32_t Key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) scratch[32] = s;
  }
  __syncthreads();
  return scratch[32];
}

// Smallest index whose value equals the block-wide max (ties: first index), as in std::max_element.
__device__ __forceinline__ int BlockMinIndex(int v, int* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int s = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : INT_MAX;
    for (int o = 16; o > 0; o >>= 1) s = min(s, __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) scratch[32] = s;
  }
  __syncthreads();
  return scratch[32];
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* __restrict__ logits, int vocab, int64_t ld,
                 const RowSamplingParams* __restrict__ params, int32_t* tokens) {
  __shared__ float fscratch[33];
  __shared__ int iscratch[33];
  __shared__ float chunk_sum[kThreads];
  const float* row = logits + blockIdx.x * ld;
  const RowSamplingParams rp = params[blockIdx.x];
  const int tid = threadIdx.x;

  if (rp.temperature <= 0.0f) {
    float best = -INFINITY;
    for (int i = tid; i < vocab; i += kThreads) best = fmaxf(best, row[i]);
    const float m = BlockMax(best, fscratch);
    int idx = INT_MAX;
    for (int i = tid; i < vocab; i += kThreads) {
      if (row[i] == m) {
        idx = i;
        break;
      }
    }
    idx = BlockMinIndex(idx, iscratch);
    if (tid == 0) tokens[blockIdx.x] = idx == INT_MAX ? 0 : idx;
    return;
  }
  const float t = rp.temperature;
  float mx = -INFINITY, mn = INFINITY;
  for (int i = tid; i < vocab; i += kThreads) {
    const float x = row[i] / t;
    mx = fmaxf(mx, x);
    mn = fminf(mn, x);
  }
  mx = BlockMax(mx, fscratch);
  mn = -BlockMax(-mn, fscratch);

  // Top-k: the largest key with at least k values at or above it (the k-th largest value).
  uint32_t threshold = Key(mn);
  if (rp.top_k > 0 && rp.top_k < vocab) {
    uint32_t lo = Key(mn), hi = Key(mx);
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo + 1) / 2;
      float count = 0;
      for (int i = tid; i < vocab; i += kThreads) count += Key(row[i] / t) >= mid ? 1.0f : 0.0f;
      if (fwd::BlockSum(count, fscratch) >= static_cast<float>(rp.top_k)) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    threshold = lo;
  }
  // Top-p over the kept values.
  if (rp.top_p < 1.0f) {
    float mass = 0;
    for (int i = tid; i < vocab; i += kThreads) {
      const float x = row[i] / t;
      if (Key(x) >= threshold) mass += expf(x - mx);
    }
    const float target = rp.top_p * fwd::BlockSum(mass, fscratch);
    uint32_t lo = threshold, hi = Key(mx);
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo + 1) / 2;
      float s = 0;
      for (int i = tid; i < vocab; i += kThreads) {
        const float x = row[i] / t;
        if (Key(x) >= mid) s += expf(x - mx);
      }
      if (fwd::BlockSum(s, fscratch) >= target) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    threshold = lo;
  }
  // The draw: contiguous chunks per thread, an exclusive scan of the chunk masses, then the one
  // thread whose chunk holds the crossing walks it.
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int begin = min(vocab, tid * chunk), end = min(vocab, begin + chunk);
  float local = 0;
  int last_kept = -1;
  for (int i = begin; i < end; ++i) {
    const float x = row[i] / t;
    if (Key(x) >= threshold) {
      local += expf(x - mx);
      last_kept = i;
    }
  }
  chunk_sum[tid] = local;
  __syncthreads();
  if (tid == 0) {
    float run = 0;
    for (int j = 0; j < kThreads; ++j) {
      const float v = chunk_sum[j];
      chunk_sum[j] = run;
      run += v;
    }
    fscratch[32] = run;
  }
  __syncthreads();
  const float total = fscratch[32];
  const float target = SampleUniform(rp.seed, rp.offset) * total;
  int found = INT_MAX;
  float cum = chunk_sum[tid];
  if (cum <= target && cum + local > target) {
    for (int i = begin; i < end; ++i) {
      const float x = row[i] / t;
      if (Key(x) >= threshold) {
        cum += expf(x - mx);
        if (cum > target) {
          found = i;
          break;
        }
      }
    }
  }
  found = BlockMinIndex(found, iscratch);
  if (found == INT_MAX) {  // rounding left the target at the very end: the last kept index
    found = -BlockMinIndex(last_kept < 0 ? INT_MAX : -last_kept, iscratch);
  }
  if (tid == 0) tokens[blockIdx.x] = found;
}

template <typename T>
__global__ void LogitsToFloatKernel(const T* __restrict__ in, int shards, int64_t rows,
                                    int64_t vocab_shard, int64_t vocab, float* __restrict__ out) {
  const int64_t total = rows * vocab;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / vocab, col = i % vocab;
    const int64_t shard = col / vocab_shard, c = col % vocab_shard;
    out[i] = fwd::ToFloat(in[(shard * rows + r) * vocab_shard + c]);
  }
}

}  // namespace

absl::Status SampleTokensCuda(const SampleTokensParams& p, cudaStream_t stream) {
  if (p.vocab <= 0 || p.ld < p.vocab || p.rows < 0 || p.vocab > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleTokensCuda: vocab ", p.vocab, ", ld ", p.ld, ", rows ", p.rows));
  }
  if (p.rows == 0) return absl::OkStatus();
  if (!p.logits || !p.params || !p.tokens) {
    return absl::InvalidArgumentError("SampleTokensCuda: null pointer");
  }
  SampleKernel<<<p.rows, kThreads, 0, stream>>>(p.logits, static_cast<int>(p.vocab), p.ld,
                                                p.params, p.tokens);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status LogitsToFloatCuda(const LogitsToFloatParams& p, cudaStream_t stream) {
  if (p.shards <= 0 || p.rows < 0 || p.vocab_shard <= 0 || p.vocab <= 0 ||
      p.vocab > p.shards * p.vocab_shard) {
    return absl::InvalidArgumentError(absl::StrCat("LogitsToFloatCuda: ", p.shards, " shards of ",
                                                   p.vocab_shard, ", vocab ", p.vocab));
  }
  if (p.rows == 0) return absl::OkStatus();
  if (!p.input || !p.output) return absl::InvalidArgumentError("LogitsToFloatCuda: null pointer");
  return fwd::DispatchFloat(p.dtype, "LogitsToFloatCuda", [&]<typename T>() -> absl::Status {
    const int64_t total = p.rows * p.vocab;
    const int64_t blocks = std::min<int64_t>((total + 255) / 256, 132 * 8);
    LogitsToFloatKernel<T><<<blocks, 256, 0, stream>>>(static_cast<const T*>(p.input), p.shards,
                                                       p.rows, p.vocab_shard, p.vocab, p.output);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  });
}

}  // namespace mqa
