// The 2023 paged-attention design, kept only as the benchmark's baseline (and tested, so that
// the comparison is honest): one CTA per (sequence, query head), each re-reading its KV head
// (found through a head_mapping tensor) from memory, dot products on CUDA cores, the context's
// logits in shared memory. With 48 query heads on one KV head it reads the KV cache 48 times.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/attention_dispatch.h"
#include "kernels/paged_attention_cuda.h"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxContext = 32768;

struct BaselineArgs {
  const void* query = nullptr;
  int64_t query_stride = 0;
  void* output = nullptr;
  const void* key_cache = nullptr;
  const void* value_cache = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* query_start = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* head_mapping = nullptr;
  int num_heads = 0;
  int num_kv_heads = 0;
  int max_blocks_per_seq = 0;
  int block_size = 0;
  int logits_stride = 0;
  float scale = 0.0f;
};

template <typename T>
__device__ __forceinline__ void Unpack8(const uint4& raw, float (&f)[8]) {
  const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if constexpr (std::is_same_v<T, __half>) {
      f[j] = __half2float(h[j]);
    } else {
      f[j] = __bfloat162float(h[j]);
    }
  }
}

template <typename T>
__device__ __forceinline__ T FromFloat(float x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

__device__ float BlockReduce(float v, float* red, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x >> 5;
  __syncthreads();  // red may still be read from the previous reduction
  if ((threadIdx.x & 31) == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < kThreads / 32; ++w) v = is_max ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) PerHeadKernel(const BaselineArgs a) {
  constexpr int kChunks = D / 8;
  constexpr int kGroups = kThreads / kChunks;
  extern __shared__ float smem[];
  float* q_s = smem;                        // [D]
  float* logits = q_s + D;                  // [logits_stride]
  float* acc_s = logits + a.logits_stride;  // [kGroups][D]
  float* red = acc_s + kGroups * D;         // [warps]
  const int head = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
  const int kvh = a.head_mapping[head];
  const int token = a.query_start[seq];
  const int ctx = a.context_lens[seq];
  const T* q = static_cast<const T*>(a.query) + token * a.query_stride + head * D;
  for (int d = tid; d < D; d += kThreads) {
    if constexpr (std::is_same_v<T, __half>) {
      q_s[d] = __half2float(q[d]);
    } else {
      q_s[d] = __bfloat162float(q[d]);
    }
  }
  __syncthreads();
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  auto row_offset = [&](int t) {
    const int64_t slot =
        static_cast<int64_t>(table[t / a.block_size]) * a.block_size + t % a.block_size;
    return (slot * a.num_kv_heads + kvh) * D;
  };
  const T* key_cache = static_cast<const T*>(a.key_cache);
  const T* value_cache = static_cast<const T*>(a.value_cache);

  float mx = -INFINITY;
  for (int t = tid; t < ctx; t += kThreads) {
    const uint4* k = reinterpret_cast<const uint4*>(key_cache + row_offset(t));
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float f[8];
      Unpack8<T>(k[c], f);
#pragma unroll
      for (int j = 0; j < 8; ++j) dot += q_s[c * 8 + j] * f[j];
    }
    logits[t] = dot * a.scale;
    mx = fmaxf(mx, logits[t]);
  }
  mx = BlockReduce(mx, red, true);
  float sum = 0.0f;
  for (int t = tid; t < ctx; t += kThreads) {
    const float e = __expf(logits[t] - mx);
    logits[t] = e;
    sum += e;
  }
  sum = BlockReduce(sum, red, false);  // its barriers also publish the logits

  const int group = tid / kChunks, c = tid % kChunks;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int t = group; t < ctx; t += kGroups) {
    float f[8];
    Unpack8<T>(*reinterpret_cast<const uint4*>(value_cache + row_offset(t) + c * 8), f);
    const float w = logits[t];
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += w * f[j];
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) acc_s[group * D + c * 8 + j] = acc[j];
  __syncthreads();
  T* out = static_cast<T*>(a.output) + (static_cast<int64_t>(token) * a.num_heads + head) * D;
  for (int d = tid; d < D; d += kThreads) {
    float v = 0.0f;
    for (int gi = 0; gi < kGroups; ++gi) v += acc_s[gi * D + d];
    out[d] = FromFloat<T>(v / sum);
  }
}

}  // namespace

absl::Status PagedAttentionPerHeadBaselineCuda(const PagedAttentionParams& p,
                                               const int32_t* head_mapping, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidatePagedAttentionShape(p));
  if (p.num_tokens != p.num_seqs) {
    return absl::InvalidArgumentError("per-head baseline: decode only (one query per sequence)");
  }
  if (p.max_context_len > kMaxContext || head_mapping == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("per-head baseline: needs head_mapping and max_context_len <= ", kMaxContext));
  }
  if (p.num_seqs == 0) return absl::OkStatus();
  return attention::DispatchTypeAndDim(
      p.dtype, p.head_dim, [&]<typename T, int D>() -> absl::Status {
        BaselineArgs a;
        a.query = p.query;
        a.query_stride = p.query_stride;
        a.output = p.output;
        a.key_cache = p.key_cache;
        a.value_cache = p.value_cache;
        a.block_tables = p.block_tables;
        a.query_start = p.query_start;
        a.context_lens = p.context_lens;
        a.head_mapping = head_mapping;
        a.num_heads = p.num_heads;
        a.num_kv_heads = p.num_kv_heads;
        a.max_blocks_per_seq = p.max_blocks_per_seq;
        a.block_size = p.block_size;
        a.logits_stride = (p.max_context_len + 3) / 4 * 4;
        a.scale = p.scale;
        constexpr int kGroups = kThreads / (D / 8);
        const size_t smem = (D + a.logits_stride + kGroups * D + kThreads / 32) * sizeof(float);
        static const cudaError_t attr = cudaFuncSetAttribute(
            PerHeadKernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
            (D + kMaxContext + kGroups * D + kThreads / 32) * static_cast<int>(sizeof(float)));
        CUDA_RETURN_IF_ERROR(attr);
        PerHeadKernel<T, D><<<dim3(p.num_heads, p.num_seqs), kThreads, smem, stream>>>(a);
        CUDA_RETURN_IF_LAUNCH_ERROR();
        return absl::OkStatus();
      });
}

}  // namespace mqa
