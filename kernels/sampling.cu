// GPU sampling (see sampling.h for the function computed) and the logits conversion.
#include <cfloat>

#include <cooperative_groups.h>

#include "absl/strings/str_cat.h"
#include "kernels/forward_cuda_common.cuh"
#include "kernels/sampling_cuda.h"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

namespace cg = cooperative_groups;

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

// One row's token with the whole CTA (kThreads threads), the function of sampling.h; every
// thread of the CTA calls it; thread 0 writes *token.
__device__ __forceinline__ void SampleRowBlock(const float* __restrict__ row, int vocab,
                                               const RowSamplingParams rp, int32_t* token) {
  __shared__ float fscratch[33];
  __shared__ int iscratch[33];
  __shared__ float chunk_sum[kThreads];
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
    if (tid == 0) *token = idx == INT_MAX ? 0 : idx;
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
  if (tid == 0) *token = found;
}

// SampleTokensCudaKernel::kOneCtaPerRow: one CTA per row.
__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* __restrict__ logits, int vocab, int64_t ld,
                 const RowSamplingParams* __restrict__ params, int32_t* tokens) {
  SampleRowBlock(logits + blockIdx.x * ld, vocab, params[blockIdx.x], tokens + blockIdx.x);
}

// SampleTokensCudaKernel::kGreedyCluster: one cluster of kGreedyCluster CTAs per row. A greedy
// row is split into kGreedyCluster contiguous slices, each CTA reduces its slice to (largest
// value, smallest index holding it) and stores that pair into CTA 0's shared memory
// (distributed shared memory); after a cluster barrier CTA 0 reduces the kGreedyCluster pairs.
// No global workspace, so it runs inside CUDA graphs and on concurrent streams as it is. A
// sampled row (temperature > 0) runs SampleRowBlock in CTA 0 while the other CTAs exit: every
// CTA of a cluster reads the same row's parameters, so the branch is uniform over the cluster.
constexpr int kGreedyCluster = 8;
constexpr int kGreedyLoads = 4;  // loads in flight per thread and round (vocab 49152: one round)

// (v, i) replaces (best, best_i) when larger, or equal with a smaller index: the first index of
// the largest value, as std::max_element. NaN never wins (as fmaxf in SampleRowBlock).
__device__ __forceinline__ void KeepBetter(float& best, int& best_i, float v, int i) {
  if (v > best || (v == best && i < best_i)) {
    best = v;
    best_i = i;
  }
}

__device__ __forceinline__ void WarpArgMax(float& best, int& best_i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int i = __shfl_xor_sync(0xffffffffu, best_i, o);
    KeepBetter(best, best_i, v, i);
  }
}

// Split cluster barrier (PTX barrier.cluster): every thread of every CTA of the cluster executes
// each of these, in the same order. arrive.relaxed orders no memory; arrive (release) and wait
// (acquire) make the shared-memory stores before the arrive visible after the wait.
__device__ __forceinline__ void ClusterArriveRelaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void ClusterArrive() {
  asm volatile("barrier.cluster.arrive.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void ClusterWait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

// kVec4: logits 16-byte aligned and ld % 4 == 0 (float4 loads; the vocab % 4 last values scalar).
template <bool kVec4>
__global__ void __cluster_dims__(kGreedyCluster, 1, 1) __launch_bounds__(kThreads)
    SampleGreedyClusterKernel(const float* __restrict__ logits, int vocab, int64_t ld,
                              const RowSamplingParams* __restrict__ params, int32_t* tokens) {
  __shared__ float slice_best[kGreedyCluster];  // CTA 0's: one pair per CTA of the cluster
  __shared__ int slice_index[kGreedyCluster];
  __shared__ float warp_best[kThreads / 32];
  __shared__ int warp_index[kThreads / 32];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t r = blockIdx.x / kGreedyCluster;
  const float* row = logits + r * ld;
  if (!(params[r].temperature <= 0.0f)) {  // sampled: SampleRowBlock's test, NaN included
    if (rank == 0) SampleRowBlock(row, vocab, params[r], tokens + r);
    return;
  }
  // Arrive now, wait before the store into CTA 0's shared memory: by then every CTA of the
  // cluster has started (a CTA's shared memory may be written only while it runs).
  ClusterArriveRelaxed();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int units = kVec4 ? vocab / 4 : vocab;
  const int per_cta = (units + kGreedyCluster - 1) / kGreedyCluster;
  const int begin = min(units, rank * per_cta), end = min(units, begin + per_cta);
  float best = -INFINITY;
  int best_i = INT_MAX;
  for (int base = begin + tid; base < end; base += kGreedyLoads * kThreads) {
    if constexpr (kVec4) {
      float4 v[kGreedyLoads];
#pragma unroll
      for (int k = 0; k < kGreedyLoads; ++k) {
        const int g = base + k * kThreads;
        if (g < end) v[k] = reinterpret_cast<const float4*>(row)[g];
      }
#pragma unroll
      for (int k = 0; k < kGreedyLoads; ++k) {
        const int g = base + k * kThreads;
        if (g < end) {
          KeepBetter(best, best_i, v[k].x, 4 * g);
          KeepBetter(best, best_i, v[k].y, 4 * g + 1);
          KeepBetter(best, best_i, v[k].z, 4 * g + 2);
          KeepBetter(best, best_i, v[k].w, 4 * g + 3);
        }
      }
    } else {
      float v[kGreedyLoads];
#pragma unroll
      for (int k = 0; k < kGreedyLoads; ++k) {
        const int g = base + k * kThreads;
        if (g < end) v[k] = row[g];
      }
#pragma unroll
      for (int k = 0; k < kGreedyLoads; ++k) {
        const int g = base + k * kThreads;
        if (g < end) KeepBetter(best, best_i, v[k], g);
      }
    }
  }
  if (kVec4 && rank == kGreedyCluster - 1 && 4 * units + tid < vocab) {
    KeepBetter(best, best_i, row[4 * units + tid], 4 * units + tid);
  }
  WarpArgMax(best, best_i);
  if (lane == 0) {
    warp_best[warp] = best;
    warp_index[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < kThreads / 32 ? warp_best[lane] : -INFINITY;
    best_i = lane < kThreads / 32 ? warp_index[lane] : INT_MAX;
    WarpArgMax(best, best_i);
  }
  ClusterWait();
  if (tid == 0) {
    *cluster.map_shared_rank(&slice_best[rank], 0) = best;
    *cluster.map_shared_rank(&slice_index[rank], 0) = best_i;
  }
  ClusterArrive();
  ClusterWait();
  if (rank == 0 && warp == 0) {
    best = lane < kGreedyCluster ? slice_best[lane] : -INFINITY;
    best_i = lane < kGreedyCluster ? slice_index[lane] : INT_MAX;
    WarpArgMax(best, best_i);
    if (lane == 0) tokens[r] = best_i == INT_MAX ? 0 : best_i;
  }
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

absl::Status SampleTokensCuda(const SampleTokensParams& p, cudaStream_t stream,
                              SampleTokensCudaKernel kernel) {
  if (p.vocab <= 0 || p.ld < p.vocab || p.rows < 0 || p.vocab > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleTokensCuda: vocab ", p.vocab, ", ld ", p.ld, ", rows ", p.rows));
  }
  if (p.rows == 0) return absl::OkStatus();
  if (!p.logits || !p.params || !p.tokens) {
    return absl::InvalidArgumentError("SampleTokensCuda: null pointer");
  }
  const int vocab = static_cast<int>(p.vocab);
  switch (kernel) {
    case SampleTokensCudaKernel::kOneCtaPerRow:
      SampleKernel<<<p.rows, kThreads, 0, stream>>>(p.logits, vocab, p.ld, p.params, p.tokens);
      break;
    case SampleTokensCudaKernel::kGreedyCluster: {
      if (p.rows > INT32_MAX / kGreedyCluster) {
        return absl::InvalidArgumentError(
            absl::StrCat("SampleTokensCuda: ", p.rows, " rows (greedy cluster kernel)"));
      }
      const bool vec4 = fwd::Aligned16(p.logits) && p.ld % 4 == 0;
      const dim3 grid(static_cast<unsigned>(p.rows * kGreedyCluster));
      auto* greedy_kernel =
          vec4 ? SampleGreedyClusterKernel<true> : SampleGreedyClusterKernel<false>;
      greedy_kernel<<<grid, kThreads, 0, stream>>>(p.logits, vocab, p.ld, p.params, p.tokens);
      break;
    }
  }
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
