// Paged multi-query attention on tensor cores (the design of kernels/paged_attention_cuda.h).
//
// One CTA per (row tile, KV split, KV head, sequence). A "row" is one (query token, query head)
// pair of the query heads that share the CTA's KV head, ordered token-major: a decode step's
// rows are the group's heads (48 for StarCoder), a prefill chunk's rows are q_len x group. Rows
// form the M dimension of mma.sync m16n8k16 tiles, so every KV byte the CTA streams through
// shared memory (cp.async, 16-byte, multi-stage) is used by all of its rows: 48 heads make 48
// FLOP per KV byte, which is why this runs on tensor cores. Each warp owns 16 rows and a slice
// of every KV tile's tokens; softmax is online in fp32 (log2 domain); warps that shared rows
// merge at the end through shared memory. When the batch is too small to fill the SMs, the KV
// range is split across CTAs (split-KV) and a second kernel merges the partial results by
// log-sum-exp.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/attention_dispatch.h"
#include "kernels/device_info.h"
#include "kernels/forward_cuda_common.cuh"
#include "kernels/kv_cache_cuda.h"
#include "kernels/paged_attention_cuda.h"
#include "kernels/tma.cuh"
#include "kernels/tma_map.h"
#include "kernels/wgmma.cuh"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

using attention::WarpLayout;

constexpr int kTileN = 64;  // KV tokens per pipeline stage
constexpr int kMinSplitTokens = 64;
// More splits than this cost more in partial writes and merge work than they gain (H200 split
// sweep, 2026-12-02 after the copy-path fix: 1 x 8192 12.5 us at 64 splits, 14.7 at 128;
// 1 x 1024 8.6 us at 16 splits of 64 tokens vs 10.2 at 8; 1 x 256 8.3 us at 4 vs 10.0 at 2).
constexpr int kMaxAutoSplits = 64;
// Block-table entries a CTA can hold in shared memory (variants 1 and 2); a split that spans
// more blocks uses the per-stage fetch of variant 0.
constexpr int kTableCap = 512;

struct KernelArgs {
  const void* query = nullptr;
  int64_t query_stride = 0;
  void* output = nullptr;
  const void* key_cache = nullptr;
  const void* value_cache = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* query_start = nullptr;
  const int32_t* context_lens = nullptr;
  float* partial_o = nullptr;    // [num_splits, num_tokens, num_heads, head_dim]
  float* partial_lse = nullptr;  // [num_splits, num_tokens, num_heads], log2 domain
  int num_seqs = 0;
  int num_tokens = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int group = 0;
  int max_blocks_per_seq = 0;
  int block_shift = 0;
  int num_splits = 1;
  int chunk = 0;  // KV tokens per split, a multiple of kTileN
  float scale_log2 = 0.0f;
  int variant = 0;       // PagedAttentionTuning::variant as launched (2 only when co-resident)
  int table_blocks = 0;  // > 0: block-table entries per split loaded into shared memory
  unsigned* counters = nullptr;  // variants 2, 4, 5: [num_seqs][num_kv_heads][row_tiles][2], zeroed
  // Variants 3-5: partial outputs stored in T (half the bytes of fp32; the lse stays fp32).
  bool narrow_partials = false;
  // Variants 1, 3-5 (when a merge kernel follows): trigger the programmatic dependent launch.
  bool pdl = false;
  // Variants 4-5: the last split CTA of a (sequence, KV head, row tile) to finish merges, in this
  // kernel (no merge launch); set only when num_splits <= the variant's cap.
  bool inline_merge = false;
  // Variants 7-10: the KV rows of positions before the step's first query (written by earlier
  // steps, not by the kernel this one may overlap under PDL) are copied before griddepcontrol.wait,
  // and the next kernel's launch is released at the start.
  bool early_kv = false;
  // PagedAttentionParams::release_dependents_early (the merge kernel's release).
  bool early_release = false;
  // Variants 8-10 with 2..kClusterMergeCap splits: the splits of a row tile run as one thread-block
  // cluster and merge through distributed shared memory (no partials in global memory, no merge
  // launch, no counters).
  bool cluster_merge = false;
  // Variant 13's TMA kernel with a fused KV-cache write (decode: one query token a sequence):
  // the split holding the sequence's last position takes its new K / V row from here (token t,
  // KV head g at new_key + t * new_key_stride + g * head_dim), uses it for the last tile and
  // writes it to the caches at slot_mapping[t] (< 0: not written). Null: the rows are in the
  // cache already.
  const void* new_key = nullptr;
  const void* new_value = nullptr;
  int64_t new_key_stride = 0;
  int64_t new_value_stride = 0;
  const int32_t* slot_mapping = nullptr;
  // With new_key (the fused write): the TMA kernel's producer issues the first stages' K / V
  // boxes before griddepcontrol.wait (PagedAttentionTuning::kv_before_wait).
  bool kv_before_wait = false;
  // Every sequence has exactly one query token (max_query_len 1 and as many tokens as sequences):
  // token t is sequence t's (the merge kernels skip their binary search).
  bool one_query_each = false;
};

// Variants 4 and 5: the most splits whose merge the last CTA does itself (beyond, they run as 3).
constexpr int kInlineMergeCap4 = 8;
constexpr int kInlineMergeCap5 = 32;
// Variants 8-10: the most splits merged inside a cluster (the portable cluster size).
constexpr int kClusterMergeCap = 8;
// Variants 9 and 10, automatic splits: when the fill-every-slot rule gives CTAs of more than one
// KV tile and splitting each sequence into one wave of cluster-merged CTAs (grid <= SMs) leaves no
// CTA more than this many tiles, the cluster plan is taken. H200, 2026-12-03, variant 9, graph us:
// 32 x 576: 3 splits of 3 tiles, 96 CTAs, cluster merge 14.6 against the fill rule's 5 splits of
// 2 tiles, 160 CTAs, last-arriver merge 20.7; 32 x 1024: 4 splits of 4 tiles 20.7 against 8 of 2
// tiles 25.0; but 16 x 1024: the fill rule's 16 one-tile splits (256 CTAs, merge kernel) 13.7
// against 8 splits of 2 tiles in clusters 16.9; and 64 x 2048 with 2 splits of 16 tiles lost to
// 4 splits, 39.7 vs 32.1.
constexpr int kClusterWaveMaxTiles = 4;


// --- PTX wrappers ------------------------------------------------------------------------------

using fwd::SmemAddr;

// 16 bytes global -> shared, asynchronous; zero-fills when !valid (src is then not read).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

// c += a * b for one m16n8k16 tile, fp32 accumulation.
template <typename T>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

using fwd::Exp2;

template <typename T>
__device__ __forceinline__ float2 Unpack2(uint32_t u) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
  } else {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
  }
}

using fwd::Pack2;

// 16 bytes of output: v[0..7] * inv rounded to T (one uint4 store), or kept in fp32 (two float4).
template <typename T>
__device__ __forceinline__ void StoreScaled8(T* dst, const float (&v)[8], float inv) {
  uint4 packed;
  packed.x = Pack2<T>(v[0] * inv, v[1] * inv);
  packed.y = Pack2<T>(v[2] * inv, v[3] * inv);
  packed.z = Pack2<T>(v[4] * inv, v[5] * inv);
  packed.w = Pack2<T>(v[6] * inv, v[7] * inv);
  *reinterpret_cast<uint4*>(dst) = packed;
}
__device__ __forceinline__ void StoreScaled8(float* dst, const float (&v)[8], float inv) {
  *reinterpret_cast<float4*>(dst) = make_float4(v[0] * inv, v[1] * inv, v[2] * inv, v[3] * inv);
  *reinterpret_cast<float4*>(dst + 4) =
      make_float4(v[4] * inv, v[5] * inv, v[6] * inv, v[7] * inv);
}

// Element offset of (row, 16-byte chunk) in a [rows][D] shared tile. The XOR swizzle puts the 8
// rows that one ldmatrix reads at the same logical chunk into 8 different bank groups.
template <int D>
__device__ __forceinline__ int Swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

template <int D, int WM, int WN>
struct Shape {
  static constexpr int kWarps = WM * WN;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16 * WM;  // query rows per CTA
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kStages = WN > 1 ? 3 : 2;
  static constexpr int kWarpTokens = kTileN / WN;  // tokens of a KV tile per warp
  static constexpr int kEpStride = D + 4;          // padded fp32 row of the epilogue
  static constexpr size_t kQBytes = size_t{kRows} * D * 2;
  static constexpr size_t kStageBytes = size_t{kStages} * 2 * kTileN * D * 2;
  static constexpr size_t kEpBytes = size_t{WN} * kRows * kEpStride * 4;
  static constexpr size_t kKvBytes = kStageBytes > kEpBytes ? kStageBytes : kEpBytes;
  static constexpr size_t kStatBytes = (size_t{WN} * kRows * 2 + 2 * kRows) * 4;
  static constexpr size_t kSmemBytes = kQBytes + kKvBytes + kStatBytes;
  // Decode layouts need two resident CTAs per SM to keep enough bytes in flight.
  static constexpr int kMinCtas = kThreads <= 192 ? 2 : 1;
  static_assert(kWarpTokens % 16 == 0, "each warp needs whole k16 steps of tokens");
};

// Variant 2's in-kernel merge. Every split CTA of one (row tile, KV head, sequence) that has work
// arrives at a counter after writing its partials and waits for the others (the launch is
// cooperative, so they are all resident); then each merges a slice of the tile's (row, 4-dim)
// items: `sub` lanes share an item, each folding every sub-th split with an online max, and
// combine by shuffles. The last CTA to leave resets the counters for the next launch.
template <typename T, int D, int kThreads>
__device__ __forceinline__ void FusedMerge(const KernelArgs& a, int seq, int kvh, int row_tile,
                                        int split, int row_begin, int row_last, int q_begin,
                                        int pos0, int kv_end) {
  const int tid = threadIdx.x;
  const int nvalid = min(a.num_splits, (kv_end + a.chunk - 1) / a.chunk);
  const int row_tiles = gridDim.x / a.num_splits;
  unsigned* cnt =
      a.counters + ((static_cast<int64_t>(seq) * a.num_kv_heads + kvh) * row_tiles + row_tile) * 2;
  __threadfence();  // this thread's partials are visible device-wide before the arrival
  __syncthreads();
  if (tid == 0) {
    atomicAdd(cnt, 1u);
    while (fwd::LoadAcquireGpu(cnt) < static_cast<unsigned>(nvalid)) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();

  constexpr int kC4 = D / 4;
  const int G = a.group;
  const int items = (row_last - row_begin + 1) * kC4;
  const int per_cta = (items + nvalid - 1) / nvalid;
  int sub = 32;
  while (sub > 1 && sub * per_cta > kThreads) sub >>= 1;
  const int groups = kThreads / sub;
  const int iters = (per_cta + groups - 1) / groups;
  const int j = tid & (sub - 1);
  const int64_t split_stride = static_cast<int64_t>(a.num_tokens) * a.num_heads;
  for (int k = 0; k < iters; ++k) {  // uniform trip count: every lane reaches the shuffles
    const int local = k * groups + tid / sub;
    const int gi = split * per_cta + local;
    const bool ok = local < per_cta && gi < items;
    float m = -INFINITY, wsum = 0.0f;
    float4 acc = make_float4(0, 0, 0, 0);
    int64_t row0 = 0;
    int c = 0;
    if (ok) {
      const int row = row_begin + gi / kC4;
      c = gi % kC4;
      const int token = q_begin + row / G;
      const int head = kvh * G + row % G;
      const int ns = min(a.num_splits, (pos0 + row / G) / a.chunk + 1);  // splits that saw it
      row0 = static_cast<int64_t>(token) * a.num_heads + head;
      for (int s = j; s < ns; s += sub) {
        const float l = __ldcg(a.partial_lse + s * split_stride + row0);
        const float4 x =
            __ldcg(reinterpret_cast<const float4*>(a.partial_o + (s * split_stride + row0) * D) + c);
        if (l == -INFINITY) continue;
        if (l > m) {
          const float f = Exp2(m - l);  // 0 while m is -inf
          acc.x *= f, acc.y *= f, acc.z *= f, acc.w *= f;
          wsum *= f;
          m = l;
        }
        const float w = Exp2(l - m);
        acc.x += w * x.x, acc.y += w * x.y, acc.z += w * x.z, acc.w += w * x.w;
        wsum += w;
      }
    }
    float m_all = m;
    for (int o = 1; o < sub; o <<= 1) m_all = fmaxf(m_all, __shfl_xor_sync(0xffffffffu, m_all, o));
    const float f = m == -INFINITY ? 0.0f : Exp2(m - m_all);
    acc.x *= f, acc.y *= f, acc.z *= f, acc.w *= f;
    wsum *= f;
    for (int o = 1; o < sub; o <<= 1) {
      acc.x += __shfl_xor_sync(0xffffffffu, acc.x, o);
      acc.y += __shfl_xor_sync(0xffffffffu, acc.y, o);
      acc.z += __shfl_xor_sync(0xffffffffu, acc.z, o);
      acc.w += __shfl_xor_sync(0xffffffffu, acc.w, o);
      wsum += __shfl_xor_sync(0xffffffffu, wsum, o);
    }
    if (ok && j == 0) {
      const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
      uint2 packed;
      packed.x = Pack2<T>(acc.x * inv, acc.y * inv);
      packed.y = Pack2<T>(acc.z * inv, acc.w * inv);
      *reinterpret_cast<uint2*>(static_cast<T*>(a.output) + row0 * D + c * 4) = packed;
    }
  }
  __syncthreads();
  if (tid == 0 && atomicAdd(cnt + 1, 1u) == static_cast<unsigned>(nvalid) - 1) {
    atomicExch(cnt, 0u);  // every CTA of the group has passed its wait
    atomicExch(cnt + 1, 0u);
  }
}

// Variants 4-5's in-kernel merge, with no waiting (so no cooperative launch): every split CTA of
// one (row tile, KV head, sequence) that has work writes its partials (T outputs, fp32 lse),
// fences and counts itself in; the one that arrives last merges all of the tile's rows and resets
// the counter for the next launch. Pass 1 loads every (split, row) lse into shared memory in one
// coalesced round trip and turns them into weights; pass 2 gives each thread 16-byte chunks of
// output whose split loads are independent (their addresses do not wait on each other).
// `scratch` holds kMaxSplits x kRows + kRows floats (the free KV stages).
template <typename T, int D, int kThreads, int kRows>
__device__ __forceinline__ void LastArriverMerge(const KernelArgs& a, int seq, int kvh,
                                                 int row_tile, int row_begin, int row_last,
                                                 int q_begin, int kv_end, float* scratch) {
  __shared__ int is_last_s;
  const int tid = threadIdx.x;
  const int nvalid = min(a.num_splits, (kv_end + a.chunk - 1) / a.chunk);
  const int row_tiles = gridDim.x / a.num_splits;
  unsigned* cnt =
      a.counters + ((static_cast<int64_t>(seq) * a.num_kv_heads + kvh) * row_tiles + row_tile) * 2;
  __threadfence();  // this thread's partials are visible device-wide before the arrival
  __syncthreads();
  if (tid == 0) {
    const bool last = atomicAdd(cnt, 1u) == static_cast<unsigned>(nvalid) - 1;
    if (last) atomicExch(cnt, 0u);  // every CTA of the group has arrived: ready for next launch
    is_last_s = last;
  }
  __syncthreads();
  if (!is_last_s) return;
  __threadfence();  // acquire side: the other CTAs' partials are read after their arrivals

  const int G = a.group;
  const int nr = row_last - row_begin + 1;
  const int64_t split_stride = static_cast<int64_t>(a.num_tokens) * a.num_heads;
  float* w_s = scratch;                     // [nvalid][kRows]: lse, then weights
  float* inv_s = scratch + nvalid * kRows;  // [kRows]: 1 / sum of weights
  auto row0_of = [&](int r) -> int64_t {
    const int row = row_begin + r;
    return static_cast<int64_t>(q_begin + row / G) * a.num_heads + kvh * G + row % G;
  };
  for (int idx = tid; idx < nvalid * nr; idx += kThreads) {
    const int s = idx / nr, r = idx % nr;
    w_s[s * kRows + r] = __ldcg(a.partial_lse + s * split_stride + row0_of(r));
  }
  __syncthreads();
  for (int r = tid; r < nr; r += kThreads) {
    float m = -INFINITY;
    for (int s = 0; s < nvalid; ++s) m = fmaxf(m, w_s[s * kRows + r]);
    // Split 0 saw every row's first token, so m is finite.
    float sum = 0.0f;
    for (int s = 0; s < nvalid; ++s) {
      const float l = w_s[s * kRows + r];
      const float w = l == -INFINITY ? 0.0f : Exp2(l - m);
      w_s[s * kRows + r] = w;
      sum += w;
    }
    inv_s[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  __syncthreads();
  constexpr int kC8 = D / 8;
  const T* part = reinterpret_cast<const T*>(a.partial_o);
  for (int it = tid; it < nr * kC8; it += kThreads) {
    const int r = it / kC8, c = it % kC8;
    const int64_t row0 = row0_of(r);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll 4
    for (int s = 0; s < nvalid; ++s) {
      const float w = w_s[s * kRows + r];
      if (w == 0.0f) continue;  // a split that saw none of this row's tokens
      const uint4 x = __ldcg(reinterpret_cast<const uint4*>(part + (s * split_stride + row0) * D) + c);
      const float2 f0 = Unpack2<T>(x.x), f1 = Unpack2<T>(x.y), f2 = Unpack2<T>(x.z),
                   f3 = Unpack2<T>(x.w);
      acc[0] += w * f0.x, acc[1] += w * f0.y, acc[2] += w * f1.x, acc[3] += w * f1.y;
      acc[4] += w * f2.x, acc[5] += w * f2.y, acc[6] += w * f3.x, acc[7] += w * f3.y;
    }
    const float inv = inv_s[r];
    uint4 packed;
    packed.x = Pack2<T>(acc[0] * inv, acc[1] * inv);
    packed.y = Pack2<T>(acc[2] * inv, acc[3] * inv);
    packed.z = Pack2<T>(acc[4] * inv, acc[5] * inv);
    packed.w = Pack2<T>(acc[6] * inv, acc[7] * inv);
    *reinterpret_cast<uint4*>(static_cast<T*>(a.output) + row0 * D + c * 8) = packed;
  }
}

// The cluster merge (variants 8-10). Each CTA of the cluster (one per split of a row tile) holds
// its normalised partial output rows in ep_s ([kRows][kEpStride] fp32) and their log2-sum-exp in lse_s
// ([kRows]; -inf: the split saw none of the row's keys, its ep_s row is not read). After a cluster
// barrier, CTA `rank` merges every n-th 16-byte output chunk of the tile from all n CTAs' shared
// memory; a second barrier keeps every CTA's shared memory alive until its peers are done.
template <typename T, int D, int kThreads, int kRows, int kEpStride>
__device__ __forceinline__ void ClusterMerge(const KernelArgs& a, int kvh, int row_begin,
                                             int total_rows, int q_begin, float* ep_s,
                                             float* lse_s) {
  namespace cg = cooperative_groups;
  constexpr int kChunks = D / 8;
  cg::cluster_group cluster = cg::this_cluster();
  const int n = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  asm volatile("barrier.cluster.arrive.aligned;\n" ::: "memory");  // release: ep_s, lse_s
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");    // acquire: the peers'
  const int G = a.group;
  for (int idx = rank * kThreads + threadIdx.x; idx < kRows * kChunks; idx += n * kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const int row = row_begin + r;
    if (row >= total_rows) continue;
    float lse[kClusterMergeCap];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kClusterMergeCap; ++j) {
      lse[j] = j < n ? *cluster.map_shared_rank(lse_s + r, j) : -INFINITY;
      mx = fmaxf(mx, lse[j]);
    }
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float wsum = 0.0f;
#pragma unroll
    for (int j = 0; j < kClusterMergeCap; ++j) {
      if (lse[j] == -INFINITY) continue;  // also j >= n
      const float w = exp2f(lse[j] - mx);
      wsum += w;
      const float* src = cluster.map_shared_rank(ep_s + r * kEpStride + c * 8, j);
      const float4 x = *reinterpret_cast<const float4*>(src);
      const float4 y = *reinterpret_cast<const float4*>(src + 4);
      v[0] += w * x.x, v[1] += w * x.y, v[2] += w * x.z, v[3] += w * x.w;
      v[4] += w * y.x, v[5] += w * y.y, v[6] += w * y.z, v[7] += w * y.w;
    }
    const int64_t token = q_begin + row / G;
    const int head = kvh * G + row % G;
    StoreScaled8(static_cast<T*>(a.output) + (token * a.num_heads + head) * D + c * 8, v,
                 wsum > 0.0f ? 1.0f / wsum : 0.0f);
  }
  asm volatile("barrier.cluster.arrive.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

// kNarrow: variants 3-10 (T partials, the inline and cluster merges, the early copies), a
// separate instantiation so that variants 0-2 keep their measured register allocation (3x2 D128
// is capped at 168).
template <typename T, int D, int WM, int WN, bool kNarrow>
__global__ void __launch_bounds__(Shape<D, WM, WN>::kThreads, Shape<D, WM, WN>::kMinCtas)
    PagedAttentionKernel(const KernelArgs a) {
  using S = Shape<D, WM, WN>;
  static_assert(S::kKvBytes >= (kInlineMergeCap5 + 1) * S::kRows * sizeof(float),
                "the inline merge's scratch lives in the KV stages");
  constexpr int kNT = S::kWarpTokens / 8;   // score n-tiles per warp
  constexpr int kKT = S::kWarpTokens / 16;  // PV k-steps per warp
  constexpr int kStageElems = kTileN * D;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* kv_s = reinterpret_cast<T*>(smem + S::kQBytes);
  float* ep_s = reinterpret_cast<float*>(smem + S::kQBytes);  // aliases kv_s after the loop
  float* ml_s = reinterpret_cast<float*>(smem + S::kQBytes + S::kKvBytes);  // [WN][kRows][2]
  float* fin_s = ml_s + WN * S::kRows * 2;                                  // [kRows][2]

  // Variants 7-10: the next kernel (the attention projection's GEMM, or a merge kernel) may launch
  // at once and run its own prologue (weight loads) beside this one; its griddepcontrol.wait
  // still waits for this grid to complete. Safe for ordering: this kernel's pre-wait reads touch
  // nothing that kernel writes before its wait.
  if (a.early_kv) asm volatile("griddepcontrol.launch_dependents;\n" ::);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % WM, wn = warp / WM;
  const int seq = blockIdx.z, kvh = blockIdx.y;
  const int split = blockIdx.x % a.num_splits;
  // Reversed so that the causal prefill's heaviest (last) row tiles start first.
  const int row_tile = gridDim.x / a.num_splits - 1 - blockIdx.x / a.num_splits;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  const int kv_begin = split * a.chunk;

  // Variants 1-2: the split's block ids in one coalesced round trip that needs no metadata (the
  // split's range is known from the grid; entries past the context are loaded but never used), so
  // it overlaps the query_start / context_lens loads below instead of following them.
  __shared__ int32_t table_s[kTableCap];
  const bool use_table = a.table_blocks > 0;
  if (use_table) {
    const int first = kv_begin >> a.block_shift;
    for (int i = tid; i < a.table_blocks; i += S::kThreads) {
      table_s[i] = table[min(first + i, a.max_blocks_per_seq - 1)];
    }
  }

  const int q_begin = a.query_start[seq];
  const int q_len = a.query_start[seq + 1] - q_begin;
  const int ctx = a.context_lens[seq];
  const int G = a.group;
  const int total_rows = q_len * G;
  const int row_begin = row_tile * S::kRows;
  if (row_begin >= total_rows) return;
  const int row_last = min(row_begin + S::kRows, total_rows) - 1;
  const int pos0 = ctx - q_len;  // position of the sequence's first query
  const int min_pos = pos0 + row_begin / G;
  const int kv_end = pos0 + row_last / G + 1;
  if (kv_begin >= kv_end) {
    if constexpr (kNarrow) {
      if (a.cluster_merge) {
        // A split past this sequence's context still takes part in its cluster's merge (the
        // barriers count every CTA), contributing nothing; it writes outputs, hence the wait.
        asm volatile("griddepcontrol.wait;\n" ::: "memory");
        for (int r = tid; r < S::kRows; r += S::kThreads) ml_s[r] = -INFINITY;
        ClusterMerge<T, D, S::kThreads, S::kRows, S::kEpStride>(a, kvh, row_begin, total_rows,
                                                                q_begin, ep_s, ml_s);
      }
    }
    return;
  }
  const int kv_stop = split == a.num_splits - 1 ? kv_end : min(kv_begin + a.chunk, kv_end);
  const int num_tiles = (kv_stop - kv_begin + kTileN - 1) / kTileN;

  const T* query = static_cast<const T*>(a.query);
  const T* key_cache = static_cast<const T*>(a.key_cache);
  const T* value_cache = static_cast<const T*>(a.value_cache);
  const int block_mask = (1 << a.block_shift) - 1;

  // The physical block of each of a tile's token rows, double-buffered in shared memory. Threads
  // below kTileN load them from the block table two tiles ahead of the copies (the load's latency
  // hides under a tile's compute) and store them one tile ahead, so no cp.async waits on a
  // dependent global load.
  __shared__ int32_t block_of_row[2][kTileN];
  auto fetch_block = [&](int tile) -> int32_t {
    const int tok = kv_begin + tile * kTileN + tid;
    return !use_table && tid < kTileN && tile < num_tiles && tok < kv_stop
               ? table[tok >> a.block_shift]
               : -1;
  };
  auto store_block = [&](int tile, int32_t block) {
    if (tid < kTileN) block_of_row[tile & 1][tid] = block;
  };
  // Variants 1-5 (block ids in table_s): thread tid always copies the 16-byte column `cc` of
  // token rows rr0, rr0 + kRowStep, ... of a tile, so its shared-memory columns are fixed and a
  // copy costs a table read and one address computation. (The first version recomputed row,
  // chunk and block from a flat index per 16 bytes: ~50 integer instructions a copy, which made
  // the decode kernel issue-bound, ncu 2026-12-02.)
  static_assert(S::kThreads % S::kChunks == 0, "whole rows per pass");
  constexpr int kRowStep = S::kThreads / S::kChunks;
  constexpr int kCopyIters = (kTileN + kRowStep - 1) / kRowStep;
  const int cc = tid % S::kChunks, rr0 = tid / S::kChunks;
  const int first_block = kv_begin >> a.block_shift;
  const int64_t slot_elems = static_cast<int64_t>(a.num_kv_heads) * D;
  const int64_t col_off = static_cast<int64_t>(kvh) * D + cc * 8;
  // Row pass k of a tile's copies (block-table path): rows rr0 + k * kRowStep. part 0: every
  // row; 1: the rows the kernel this one overlaps under PDL cannot be writing (positions before
  // the step's first query, and rows past the split, which are zero-filled); 2: the others.
  auto issue_pass = [&](int tile, int stage, int k, int part = 0) {
    const int r = rr0 + k * kRowStep;
    if (kTileN % kRowStep != 0 && r >= kTileN) return;
    T* ks = kv_s + stage * 2 * kStageElems;
    T* vs = ks + kStageElems;
    const int tok = kv_begin + tile * kTileN + r;
    const bool valid = tok < kv_stop;
    if (part != 0 && (part == 2) != (valid && tok >= pos0)) return;
    int64_t off = 0;
    if (valid) {
      const int32_t block = table_s[(tok >> a.block_shift) - first_block];
      off = ((static_cast<int64_t>(block) << a.block_shift) + (tok & block_mask)) * slot_elems +
            col_off;
    }
    const int so = Swz<D>(r, cc);
    CpAsync16(ks + so, key_cache + off, valid);
    CpAsync16(vs + so, value_cache + off, valid);
  };
  auto issue_tile = [&](int tile, int stage, int part = 0) {
    T* ks = kv_s + stage * 2 * kStageElems;
    T* vs = ks + kStageElems;
    const int base = kv_begin + tile * kTileN;
    if (use_table) {
#pragma unroll
      for (int k = 0; k < kCopyIters; ++k) issue_pass(tile, stage, k, part);
      return;
    }
    for (int idx = tid; idx < kTileN * S::kChunks; idx += S::kThreads) {
      const int r = idx / S::kChunks, c = idx % S::kChunks;
      const int32_t block = block_of_row[tile & 1][r];
      const bool valid = block >= 0;
      int64_t off = 0;
      if (valid) {
        const int64_t slot =
            (static_cast<int64_t>(block) << a.block_shift) + ((base + r) & block_mask);
        off = (slot * a.num_kv_heads + kvh) * D + c * 8;
      }
      CpAsync16(ks + Swz<D>(r, c), key_cache + off, valid);
      CpAsync16(vs + Swz<D>(r, c), value_cache + off, valid);
    }
  };
  // Variants 7-10: the prologue's rows that no kernel of this step writes are copied before the
  // wait below, overlapping the previous kernel's tail; they join the first prologue group.
  const bool early = a.early_kv && use_table;
  if (early) {
    __syncthreads();  // table_s is visible
#pragma unroll
    for (int s = 0; s < S::kStages - 1; ++s) {
      if (s < num_tiles) issue_tile(s, s, 1);
    }
  }

  // Launched as a programmatic dependent (PagedAttentionTuning::pdl), this CTA may be running
  // before the kernel that wrote Q and the new KV rows has finished: everything above read only
  // step metadata (written before the step's first kernel) and KV rows of earlier steps; Q, the
  // step's own KV rows and every write come after this wait. A no-op for a plain launch.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");

  // Q rows of this tile (zero rows past the end), one cp.async group of its own; with the early
  // copies, plain L2 loads instead (cp.async groups complete in order, and Q must not wait behind
  // the KV rows issued before the wait; the barrier before its use publishes the stores).
  if (early) {
    constexpr int kQIters = (S::kRows * S::kChunks + S::kThreads - 1) / S::kThreads;
    uint4 qv[kQIters];
#pragma unroll
    for (int i = 0; i < kQIters; ++i) {
      const int idx = tid + i * S::kThreads;
      const int r = idx / S::kChunks, c = idx % S::kChunks;
      const int row = row_begin + r;
      qv[i] = make_uint4(0, 0, 0, 0);
      if (idx < S::kRows * S::kChunks && row < total_rows) {
        qv[i] = __ldcg(reinterpret_cast<const uint4*>(query + (q_begin + row / G) * a.query_stride +
                                                      (kvh * G + row % G) * D + c * 8));
      }
    }
#pragma unroll
    for (int i = 0; i < kQIters; ++i) {
      const int idx = tid + i * S::kThreads;
      if (idx < S::kRows * S::kChunks) {
        *reinterpret_cast<uint4*>(q_s + Swz<D>(idx / S::kChunks, idx % S::kChunks)) = qv[i];
      }
    }
  } else {
    for (int idx = tid; idx < S::kRows * S::kChunks; idx += S::kThreads) {
      const int r = idx / S::kChunks, c = idx % S::kChunks;
      const int row = row_begin + r;
      const bool valid = row < total_rows;
      const int token = q_begin + (valid ? row / G : 0);
      const int head = kvh * G + (valid ? row % G : 0);
      CpAsync16(q_s + Swz<D>(r, c), query + token * a.query_stride + head * D + c * 8, valid);
    }
    CpAsyncCommit();
  }

  if (use_table) {
    if (!early) __syncthreads();  // table_s is visible; every prologue stage is issued at once
#pragma unroll
    for (int s = 0; s < S::kStages - 1; ++s) {
      if (s < num_tiles) issue_tile(s, s, early ? 2 : 0);
      CpAsyncCommit();
    }
  } else {
#pragma unroll
    for (int s = 0; s < S::kStages - 1; ++s) {
      store_block(s, fetch_block(s));
      __syncthreads();
      if (s < num_tiles) issue_tile(s, s);
      CpAsyncCommit();
    }
    __syncthreads();  // the prologue's reads of block_of_row are done before it is refilled
    store_block(S::kStages - 1, fetch_block(S::kStages - 1));
  }
  int32_t pending_block = fetch_block(S::kStages);

  // This thread's two rows (g and g + 8 of the warp's 16) and their positions; rows past the end
  // take the last valid row's position (never written, so any finite result is fine).
  const int g = lane >> 2, quad = lane & 3;
  int my_pos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = min(row_begin + wm * 16 + g + 8 * i, row_last);
    my_pos[i] = pos0 + row / G;
  }

  // Q's group (without the early copies; with them Q was stored directly and this returns at
  // once: only the kStages - 1 prologue groups are pending).
  CpAsyncWait<S::kStages - 1>();
  __syncthreads();
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int mi = lane >> 3;
    const int r = wm * 16 + (mi & 1) * 8 + (lane & 7);
    LdMatrixX4(qf[kk], q_s + Swz<D>(r, kk * 2 + (mi >> 1)));
  }

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};

  for (int t = 0; t < num_tiles; ++t) {
    CpAsyncWait<S::kStages - 2>();
    __syncthreads();  // tile t is visible to all; everyone is done with tile t - 1's stage
    // The copies of tile t + kStages - 1 go into the stage tile t - 1 used. On the block-table
    // path their row passes are interleaved with the score MMAs below (the address arithmetic
    // fills the tensor-core latency); the per-stage fetch path issues them here.
    const int next = t + S::kStages - 1;
    const bool issue_next = next < num_tiles;
    const int next_stage = next % S::kStages;
    if (!use_table && issue_next) issue_tile(next, next_stage);
    store_block(t + S::kStages, pending_block);  // read after the next iteration's barrier
    pending_block = fetch_block(t + S::kStages + 1);

    const T* ks = kv_s + (t % S::kStages) * 2 * kStageElems;
    const T* vs = ks + kStageElems;
    const int tok0 = wn * S::kWarpTokens;  // this warp's first token within the tile

    float s[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        const int mi = lane >> 3;
        uint32_t b[4];
        LdMatrixX4(b, ks + Swz<D>(tok0 + np * 16 + (mi >> 1) * 8 + (lane & 7), kk * 2 + (mi & 1)));
        Mma<T>(s[2 * np], qf[kk], b[0], b[1]);
        Mma<T>(s[2 * np + 1], qf[kk], b[2], b[3]);
      }
      if (kk < kCopyIters && use_table && issue_next) issue_pass(next, next_stage, kk);
    }
#pragma unroll
    for (int k = D / 16; k < kCopyIters; ++k) {
      if (use_table && issue_next) issue_pass(next, next_stage, k);
    }
    CpAsyncCommit();

    const int tile_base = kv_begin + t * kTileN;
    const bool need_mask = tile_base + kTileN > min(min_pos + 1, kv_stop);
    // Raw scores here; the scale (> 0, so the max commutes with it) is folded into the exponent.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (need_mask) {
          const int tok = tile_base + tok0 + n * 8 + quad * 2 + (e & 1);
          if (tok >= kv_stop || tok > my_pos[e >> 1]) s[n][e] = -INFINITY;
        }
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i] * a.scale_log2);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a fully masked row so far
      alpha[i] = Exp2(m[i] - m_use);
      m[i] = m_new;
      mx[i] = m_use;
    }
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = Exp2(fmaf(s[n][e], a.scale_log2, -mx[e >> 1]));
        rs[e >> 1] += s[n][e];
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + rs[i];
    // Once the running maxima settle (most decode tiles), alpha is exactly 1 for the warp's rows:
    // skip the 64-element rescale (warp-uniform test).
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
    }

#pragma unroll
    for (int kk = 0; kk < kKT; ++kk) {
      const uint32_t pa[4] = {Pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                              Pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              Pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              Pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nd = 0; nd < D / 16; ++nd) {
        const int mi = lane >> 3;
        uint32_t b[4];
        LdMatrixX4Trans(
            b, vs + Swz<D>(tok0 + kk * 16 + (mi & 1) * 8 + (lane & 7), nd * 2 + (mi >> 1)));
        Mma<T>(o[2 * nd], pa, b[0], b[1]);
        Mma<T>(o[2 * nd + 1], pa, b[2], b[3]);
      }
    }
  }

  // A kernel launched as a programmatic dependent (the merge, or the next layer's kernel) may
  // start now: it waits for this grid's completion before reading its output, so only its
  // launch and prologue overlap. A no-op when nothing dependent was launched.
  asm volatile("griddepcontrol.launch_dependents;\n" ::);

  // --- Epilogue: merge the WN warps that share rows, normalise, write. ---
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  CpAsyncWait<0>();
  __syncthreads();  // the KV stages are free: the epilogue buffer aliases them
  if (quad == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = wm * 16 + g + 8 * i;
      ml_s[(wn * S::kRows + r) * 2] = m[i];
      ml_s[(wn * S::kRows + r) * 2 + 1] = l[i];
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = wm * 16 + g + 8 * i;
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < WN; ++w) m_all = fmaxf(m_all, ml_s[(w * S::kRows + r) * 2]);
    const float m_use = m_all == -INFINITY ? 0.0f : m_all;
    const float factor = Exp2(m[i] - m_use);
    if (wn == 0 && quad == 0) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < WN; ++w) {
        sum += ml_s[(w * S::kRows + r) * 2 + 1] * Exp2(ml_s[(w * S::kRows + r) * 2] - m_use);
      }
      fin_s[r * 2] = m_all;
      fin_s[r * 2 + 1] = sum;
    }
    float* dst = ep_s + (wn * S::kRows + r) * S::kEpStride + quad * 2;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<float2*>(dst + n * 8) =
          make_float2(o[n][2 * i] * factor, o[n][2 * i + 1] * factor);
    }
  }
  __syncthreads();
  for (int idx = tid; idx < S::kRows * S::kChunks; idx += S::kThreads) {
    const int r = idx / S::kChunks, c = idx % S::kChunks;
    const int row = row_begin + r;
    if (row >= total_rows) continue;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int w = 0; w < WN; ++w) {
      const float* src = ep_s + (w * S::kRows + r) * S::kEpStride + c * 8;
      const float4 x = *reinterpret_cast<const float4*>(src);
      const float4 y = *reinterpret_cast<const float4*>(src + 4);
      v[0] += x.x, v[1] += x.y, v[2] += x.z, v[3] += x.w;
      v[4] += y.x, v[5] += y.y, v[6] += y.z, v[7] += y.w;
    }
    const float sum = fin_s[r * 2 + 1];
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    if (kNarrow && a.cluster_merge) {
      // This thread alone reads and writes chunk c of row r: the sum goes to the first slot.
      StoreScaled8(ep_s + r * S::kEpStride + c * 8, v, inv);
      if (c == 0) ml_s[r] = sum > 0.0f ? fin_s[r * 2] + __log2f(sum) : -INFINITY;
      continue;
    }
    const int64_t token = q_begin + row / G;
    const int head = kvh * G + row % G;
    if (a.num_splits == 1) {
      StoreScaled8(static_cast<T*>(a.output) + (token * a.num_heads + head) * D + c * 8, v, inv);
    } else {
      const int64_t prow =
          (static_cast<int64_t>(split) * a.num_tokens + token) * a.num_heads + head;
      if constexpr (kNarrow) {
        StoreScaled8(reinterpret_cast<T*>(a.partial_o) + prow * D + c * 8, v, inv);
      } else {
        StoreScaled8(a.partial_o + prow * D + c * 8, v, inv);
      }
      if (c == 0) a.partial_lse[prow] = sum > 0.0f ? fin_s[r * 2] + __log2f(sum) : -INFINITY;
    }
  }
  if (!kNarrow && a.variant == 2 && a.num_splits > 1) {
    FusedMerge<T, D, S::kThreads>(a, seq, kvh, row_tile, split, row_begin, row_last, q_begin, pos0,
                                  kv_end);
  }
  if constexpr (kNarrow) {
    if (a.cluster_merge) {
      ClusterMerge<T, D, S::kThreads, S::kRows, S::kEpStride>(a, kvh, row_begin, total_rows,
                                                              q_begin, ep_s, ml_s);
    }
  }
  if (kNarrow && a.inline_merge) {
    // The KV stages (ep_s) are free scratch once every thread is past the epilogue; the merge
    // starts with a barrier.
    LastArriverMerge<T, D, S::kThreads, S::kRows>(a, seq, kvh, row_tile, row_begin, row_last,
                                                  q_begin, kv_end, ep_s);
  }
}

// The position of query token `token` in its sequence, for the merge kernels: with one query a
// sequence (KernelArgs::one_query_each) token t is sequence t's last position, one load; else the
// sequence is found by a binary search over query_start (a chain of dependent loads, which the
// merge's prologue runs after the attention grid's main loops: it is on the critical path). On
// the H200 (~17:15 UTC) the one load took the CTA form at 64 x 2048 from 28.5-28.6 to 27.6 us
// and 64 x 8192 from 77.1-77.7 to 76.7; the warp form, with four heads a CTA, about equal.
// (Triggering the merge's launch at the attention's start instead, so that its prologue overlaps
// the main loop, lost in the same call: 64 x 2048 26.62 against 26.44 us, StarCoder b32 decode
// step 8.961 against 8.920 ms.)
__device__ __forceinline__ int QueryPosition(const KernelArgs& a, int token) {
  if (a.one_query_each) return a.context_lens[token] - 1;
  int lo = 0, hi = a.num_seqs - 1;  // the last sequence whose first query is <= token
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.query_start[mid] <= token) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int q_len = a.query_start[lo + 1] - a.query_start[lo];
  return a.context_lens[lo] - q_len + (token - a.query_start[lo]);
}

// The merge kernels' programmatic-dependent protocol: everything before this overlapped the
// attention kernel, whose partials are complete after the wait. A PDL successor may launch before
// it with early_release (it waits for this grid itself), else after. No-ops for a plain launch.
__device__ __forceinline__ void MergeAwaitPartials(const KernelArgs& a) {
  if (a.early_release) asm volatile("griddepcontrol.launch_dependents;\n" ::);
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  if (!a.early_release) asm volatile("griddepcontrol.launch_dependents;\n" ::);
}

// N = 2 or 4 consecutive partial-output elements from element `elem` on (P: float or T), as
// floats: one 8- or 16-byte load (4- or 8-byte for T).
template <typename T, typename P, int N>
__device__ __forceinline__ void LoadPartials(const KernelArgs& a, int64_t elem, float (&x)[N]) {
  static_assert(N == 2 || N == 4, "2 or 4 elements");
  if constexpr (std::is_same_v<P, float>) {
    if constexpr (N == 4) {
      const float4 v = *reinterpret_cast<const float4*>(a.partial_o + elem);
      x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else {
      const float2 v = *reinterpret_cast<const float2*>(a.partial_o + elem);
      x[0] = v.x, x[1] = v.y;
    }
  } else {
    const T* src = reinterpret_cast<const T*>(a.partial_o) + elem;
    if constexpr (N == 4) {
      const uint2 u = *reinterpret_cast<const uint2*>(src);
      const float2 lo = Unpack2<T>(u.x), hi = Unpack2<T>(u.y);
      x[0] = lo.x, x[1] = lo.y, x[2] = hi.x, x[3] = hi.y;
    } else {
      const float2 v = Unpack2<T>(*reinterpret_cast<const uint32_t*>(src));
      x[0] = v.x, x[1] = v.y;
    }
  }
}

// N = 2 or 4 values times inv, rounded to T, at dst (one 4- or 8-byte store).
template <typename T, int N>
__device__ __forceinline__ void StoreScaledN(T* dst, const float (&v)[N], float inv) {
  static_assert(N == 2 || N == 4, "2 or 4 elements");
  if constexpr (N == 4) {
    uint2 packed;
    packed.x = Pack2<T>(v[0] * inv, v[1] * inv);
    packed.y = Pack2<T>(v[2] * inv, v[3] * inv);
    *reinterpret_cast<uint2*>(dst) = packed;
  } else {
    *reinterpret_cast<uint32_t*>(dst) = Pack2<T>(v[0] * inv, v[1] * inv);
  }
}

// Merges the split-KV partials of one (query token, head) by log-sum-exp. Thread (group, c)
// sums 4 dims of every kGroups-th split; the groups meet in shared memory. P is the partial
// outputs' type: float (variants 0-2) or T (3-5).
template <typename T, int D, typename P>
__global__ void __launch_bounds__(128) MergeSplitsKernel(const KernelArgs a) {
  constexpr int kChunks = D / 4;
  constexpr int kGroups = 128 / kChunks;
  __shared__ float lse_max_s;
  __shared__ float4 acc_s[kGroups][kChunks];
  extern __shared__ float w_s[];  // [num_splits]: weights exp2(lse - max)
  const int token = blockIdx.x, head = blockIdx.y, tid = threadIdx.x;
  const int pos = QueryPosition(a, token);
  const int valid = min(a.num_splits, pos / a.chunk + 1);  // the splits that saw this query
  const int64_t row0 = static_cast<int64_t>(token) * a.num_heads + head;
  MergeAwaitPartials(a);  // variants 1 and 3 on launch this as a programmatic dependent
  const int64_t split_stride = static_cast<int64_t>(a.num_tokens) * a.num_heads;
  for (int s = tid; s < valid; s += 128) w_s[s] = a.partial_lse[s * split_stride + row0];
  __syncthreads();
  if (tid < 32) {
    float m = -INFINITY;
    for (int s = tid; s < valid; s += 32) m = fmaxf(m, w_s[s]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (tid == 0) lse_max_s = m;
  }
  __syncthreads();
  for (int s = tid; s < valid; s += 128) w_s[s] = Exp2(w_s[s] - lse_max_s);
  __syncthreads();
  const int group = tid / kChunks, c = tid % kChunks;
  float4 acc = make_float4(0, 0, 0, 0);
  for (int s = group; s < valid; s += kGroups) {
    const float w = w_s[s];
    float x[4];
    LoadPartials<T, P, 4>(a, (s * split_stride + row0) * D + c * 4, x);
    acc.x += w * x[0], acc.y += w * x[1], acc.z += w * x[2], acc.w += w * x[3];
  }
  acc_s[group][c] = acc;
  __syncthreads();
  if (tid < kChunks) {
    float wsum = 0.0f;
    for (int s = 0; s < valid; ++s) wsum += w_s[s];
    float4 sum = make_float4(0, 0, 0, 0);
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      sum.x += acc_s[gi][tid].x, sum.y += acc_s[gi][tid].y;
      sum.z += acc_s[gi][tid].z, sum.w += acc_s[gi][tid].w;
    }
    const float v[4] = {sum.x, sum.y, sum.z, sum.w};
    StoreScaledN<T, 4>(static_cast<T*>(a.output) + row0 * D + tid * 4, v, 1.0f / wsum);
  }
}

// The merge's second form (variant 17), for at most kWarpMergeMaxSplits splits: one warp per
// (query token, head), blockDim.x / 32 heads a CTA (kWarpMergeHeads; one before an
// early-released decode chain), lane c holding dims [c D / 32, (c + 1) D / 32). After the wait a
// warp reads its splits' lse (a lane a split) and all their partial rows in one round trip and
// merges by shuffles: no shared memory, no CTA barrier. MergeSplitsKernel gives every (token,
// head) a 128-thread CTA: 3072 CTAs at 64 x 2048, more than a wave beside the attention's, each a
// chain of three barriers and two round trips.
//
// Taken up to kWarpMergeMaxSplits splits (one round trip), where it was faster on the H200
// (2026-12-04 ~16:49 UTC, attention_bench, graph us, variant 14 / 17): 64 x 2048 (4 splits) 28.50
// / 25.99, 64 x 8192 (4) 78.30 / 75.61, 128 x 2048 (2) 50.57 / 46.39, 32 x 576 (5) 10.80 / 10.28,
// 32 x 2048 (8) 17.09 / 17.40; past it (a form that looped over batches of 8 splits, one more
// round trip each) the CTA form won: 16 x 2048 (16) 12.72 / 14.42, 1 x 8192 (64) 9.63 / 21.84. (A
// wide CTA form for more splits — each thread loading 8 splits' 16-byte chunks with the lse in
// one round trip, the split lanes meeting in 4 KiB of shared memory — measured ~17:10 UTC: 1 x
// 8192 9.28 against 9.52, 8 x 2048 10.27 / 10.45, but 16 x 2048 14.12 / 12.74, and StarCoder b1 at
// 4096 tokens equal (decode step 8.231 / 8.224 against 8.240 / 8.232 ms): not kept.) Where the
// merge releases a decode chain early (release_dependents_early: StarCoder b1) four heads a CTA
// made the step slower (mqabench --attn 14,17,14,17, ~16:58 UTC: decode step 8.085 / 8.100 ms
// against 8.135 / 8.145), for a reason not found; one warp a CTA there is equal to the CTA form.
constexpr int kWarpMergeHeads = 4;
constexpr int kWarpMergeMaxSplits = 8;

template <typename T, int D, typename P>
__global__ void __launch_bounds__(32 * kWarpMergeHeads) MergeSplitsWarpKernel(const KernelArgs a) {
  constexpr int kV = D / 32;
  static_assert(kV == 2 || kV == 4, "head_dim 64 or 128");
  const int token = blockIdx.x, lane = threadIdx.x & 31;
  const int head = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);  // a warp a head
  const int pos = QueryPosition(a, token);
  // The splits that saw this query: at most kWarpMergeMaxSplits (the host's condition).
  const int valid = min(a.num_splits, pos / a.chunk + 1);
  MergeAwaitPartials(a);
  if (head >= a.num_heads) return;
  const int64_t split_stride = static_cast<int64_t>(a.num_tokens) * a.num_heads;
  const int64_t row0 = static_cast<int64_t>(token) * a.num_heads + head;
  // The lse (lane s: split s) and every split's partial slice, together.
  const float my_lse = lane < valid ? a.partial_lse[lane * split_stride + row0] : -INFINITY;
  float x[kWarpMergeMaxSplits][kV];
#pragma unroll
  for (int s = 0; s < kWarpMergeMaxSplits; ++s) {
    if (s < valid) {
      LoadPartials<T, P, kV>(a, (s * split_stride + row0) * D + lane * kV, x[s]);
    } else {
#pragma unroll
      for (int v = 0; v < kV; ++v) x[s][v] = 0.0f;
    }
  }
  float m = my_lse;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const float my_w = lane < valid ? Exp2(my_lse - m) : 0.0f;  // m finite: split 0 saw a key
  float acc[kV];
#pragma unroll
  for (int v = 0; v < kV; ++v) acc[v] = 0.0f;
#pragma unroll
  for (int s = 0; s < kWarpMergeMaxSplits; ++s) {
    const float w = __shfl_sync(0xffffffffu, my_w, s);  // 0 past valid
#pragma unroll
    for (int v = 0; v < kV; ++v) acc[v] = fmaf(w, x[s][v], acc[v]);
  }
  float l = my_w;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  StoreScaledN<T, kV>(static_cast<T*>(a.output) + row0 * D + lane * kV, acc, 1.0f / l);
}

// CTAs per SM of `kernel` at this block size and dynamic shared memory, after raising its
// shared-memory limit to that size; 0 when it cannot be resident. Callers cache it per kernel.
template <typename Kernel>
int MaxResidentCtas(Kernel kernel, int threads, int smem_bytes) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) !=
      cudaSuccess) {
    return 0;
  }
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem_bytes) !=
      cudaSuccess) {
    return 0;
  }
  return n;
}

#include "kernels/paged_attention_hopper.cuh"

// --- Host side ---------------------------------------------------------------------------------

int SmCount() {
  const absl::StatusOr<int> sms = CurrentDeviceSms();
  return sms.ok() ? *sms : 132;  // the H200's, where the query fails
}

struct Plan {
  WarpLayout layout = WarpLayout::k8x1;
  int row_tiles = 0;
  int num_splits = 1;
  int chunk = 0;
};

int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Block-table entries a split of `chunk` tokens can touch (its first block may be partial).
int TableSpan(int chunk, int block_size) { return CeilDiv(chunk, block_size) + 1; }

int MaxQueryLen(const PagedAttentionParams& p) {
  if (p.max_query_len > 0) return p.max_query_len;
  return std::max(1, p.num_tokens - p.num_seqs + 1);
}

// Query rows ((token, head) pairs) of the longest query per (sequence, KV head).
int64_t MaxRows(const PagedAttentionParams& p) {
  return static_cast<int64_t>(MaxQueryLen(p)) * (p.num_heads / p.num_kv_heads);
}

WarpLayout ChooseLayout(const PagedAttentionParams& p, const PagedAttentionTuning& tuning) {
  switch (tuning.warps_m) {
    case 1:
      return WarpLayout::k1x4;
    case 2:
      return WarpLayout::k2x2;
    case 3:
      return WarpLayout::k3x2;
    case 4:
      return WarpLayout::k4x2;
    case 8:
      return WarpLayout::k8x1;
  }
  const int group = p.num_heads / p.num_kv_heads;
  if (MaxQueryLen(p) > 1) return WarpLayout::k8x1;
  if (group <= 16) return WarpLayout::k1x4;
  if (group <= 32) return WarpLayout::k2x2;
  if (group <= 48) return WarpLayout::k3x2;
  if (group <= 64) return WarpLayout::k4x2;
  return WarpLayout::k8x1;
}

// Resident CTAs per SM of one instantiation (sets its shared-memory limit on first use).
template <typename T, int D, int WM, int WN, bool kNarrow>
int ResidentCtas() {
  using S = Shape<D, WM, WN>;
  static const int ctas = MaxResidentCtas(PagedAttentionKernel<T, D, WM, WN, kNarrow>, S::kThreads,
                                          static_cast<int>(S::kSmemBytes));
  return ctas;
}

// Variant 13's tensor map over one layer's K or V cache: a 2-D tensor of row_elems (kv_heads x
// head_dim) columns and as many slot rows as an int32 coordinate reaches (the kernel addresses only
// rows of the sequences' own blocks, so the map needs no bound on the pool), boxes of 16 rows x 64
// columns, 128-byte swizzle. False when the driver rejects the map (the caller runs 11).
bool EncodeKvCacheMap(CUtensorMap* map, const void* cache, DType dtype, int64_t row_elems) {
  return EncodeTmaMap2d(map, cache, dtype, static_cast<uint64_t>(row_elems), uint64_t{INT32_MAX},
                        static_cast<uint64_t>(row_elems) * 2, hopper::kTmaBoxCols,
                        hopper::kTmaBoxRows);
}

size_t BytesPerSplit(const PagedAttentionParams& p) {
  return static_cast<size_t>(p.num_tokens) * p.num_heads * (p.head_dim + 1) * sizeof(float);
}

// Variant 2's arrival counters at the start of the workspace, rounded to 256 bytes; 0 otherwise.
size_t CounterBytes(const PagedAttentionParams& p, const PagedAttentionTuning& tuning,
                    int row_tiles) {
  if (tuning.variant != 2 && tuning.variant != 4 && tuning.variant != 5 && tuning.variant != 6 &&
      tuning.variant != 7 && tuning.variant != 9) {
    return 0;
  }
  const size_t n = static_cast<size_t>(p.num_seqs) * p.num_kv_heads * row_tiles * 2;
  return (n * sizeof(unsigned) + 255) / 256 * 256;
}

int RowTiles(const PagedAttentionParams& p, const PagedAttentionTuning& tuning) {
  return CeilDiv(MaxRows(p), 16 * attention::WarpsM(ChooseLayout(p, tuning)));
}

// The whole launch geometry; `resident` is CTAs per SM of the chosen instantiation.
// one_wave_cluster: variants 9 and 10 (see kClusterWaveMaxTiles).
// tile_rows: query rows a CTA holds (0: the mma layout's 16 x warps_m; the wgmma kernel's 64).
Plan MakePlan(const PagedAttentionParams& p, const PagedAttentionTuning& tuning, int resident,
              size_t workspace_bytes, bool one_wave_cluster = false, int tile_rows = 0) {
  Plan plan;
  plan.layout = ChooseLayout(p, tuning);
  if (tile_rows <= 0) tile_rows = 16 * attention::WarpsM(plan.layout);
  plan.row_tiles = CeilDiv(MaxRows(p), tile_rows);
  const int64_t base = static_cast<int64_t>(p.num_seqs) * p.num_kv_heads * plan.row_tiles;
  const int max_ctx = std::max(1, p.max_context_len);
  const int max_tiles = CeilDiv(max_ctx, kTileN);
  int splits = tuning.num_splits;
  if (splits <= 0) {
    // Fill the resident slots with one wave; at least two splits when the batch alone leaves
    // SMs idle.
    const int64_t slots = static_cast<int64_t>(SmCount()) * std::max(1, resident);
    splits = static_cast<int>(std::max<int64_t>(1, slots / std::max<int64_t>(1, base)));
    if (base < SmCount()) splits = std::max(splits, 2);
    // Splits shorter than kMinSplitTokens (one KV tile) cannot help; past kMaxAutoSplits the
    // merge costs more than the parallelism gains.
    splits = std::min({splits, CeilDiv(max_ctx, kMinSplitTokens), kMaxAutoSplits});
    if (one_wave_cluster && 2 * base <= SmCount() && CeilDiv(max_tiles, splits) > 1) {
      const int one_wave = static_cast<int>(std::min<int64_t>(kClusterMergeCap, SmCount() / base));
      if (CeilDiv(max_tiles, one_wave) <= kClusterWaveMaxTiles) splits = one_wave;
    }
  }
  splits = std::clamp(splits, 1, max_tiles);
  if (splits > 1 && workspace_bytes != SIZE_MAX) {
    splits = std::min<int64_t>(splits, workspace_bytes / std::max<size_t>(1, BytesPerSplit(p)));
    splits = std::max(splits, 1);
  }
  plan.chunk = CeilDiv(CeilDiv(max_ctx, splits), kTileN) * kTileN;
  plan.num_splits = CeilDiv(max_ctx, plan.chunk);
  return plan;
}

absl::Status ValidateForCuda(const PagedAttentionParams& p) {
  RETURN_IF_ERROR(ValidatePagedAttentionShape(p));
  const int bs = p.block_size;
  if (bs < 8 || bs > 256 || (bs & (bs - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA attention: block_size ", bs,
                                                   " unsupported (a power of two from 8 to 256)"));
  }
  if (p.query_stride % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA attention: query_stride ", p.query_stride,
                                                   " must be a multiple of 8 elements"));
  }
  for (const void* ptr :
       {p.query, static_cast<const void*>(p.output), p.key_cache, p.value_cache}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
      return absl::InvalidArgumentError("CUDA attention: tensors must be 16-byte aligned");
    }
  }
  if (p.num_seqs > 65535 || p.num_heads > 65535) {
    return absl::InvalidArgumentError("CUDA attention: more than 65535 sequences or heads");
  }
  if (p.num_tokens > 0 && p.max_context_len <= 0) {
    return absl::InvalidArgumentError("CUDA attention: max_context_len must be set");
  }
  return absl::OkStatus();
}

}  // namespace

bool UseTwoWarpgroupPrefill(const PagedAttentionParams& p, int sms) {
  const int64_t max_rows = MaxRows(p);
  return max_rows > hopper::kRows && p.max_context_len >= kTwoWarpgroupMinContext &&
         static_cast<int64_t>(p.num_seqs) * p.num_kv_heads * CeilDiv(max_rows, 2 * hopper::kRows) >=
             static_cast<int64_t>(kTwoWarpgroupMinWaves) * sms;
}

bool UsePairDecode(const PagedAttentionParams& p, int sms) {
  const int64_t base = static_cast<int64_t>(p.num_seqs) * p.num_kv_heads;
  return MaxRows(p) <= hopper::kRows && p.max_context_len <= hopper::kPairMaxSplitTokens &&
         base <= sms && base * 10 >= static_cast<int64_t>(sms) * 7;
}

size_t PagedAttentionCudaWorkspaceBytes(const PagedAttentionParams& p,
                                        const PagedAttentionTuning& tuning) {
  if (!ValidateForCuda(p).ok() || p.num_tokens == 0) return 0;
  size_t bytes = 0;
  const absl::Status s = attention::DispatchAttention(
      p.dtype, p.head_dim, ChooseLayout(p, tuning), [&]<typename T, int D, int WM, int WN>() {
        // Variant 13 plans for its own CTAs an SM (three: more splits than the others).
        const int tma_ctas =
            tuning.hopper_tma_ctas > 0 ? tuning.hopper_tma_ctas : hopper::kTmaDefaultCtas;
        const int resident = std::max(ResidentCtas<T, D, WM, WN, false>(),
                                      tuning.variant >= 13 ? tma_ctas : 0);
        const Plan plan = MakePlan(p, tuning, resident, SIZE_MAX);
        bytes = plan.num_splits > 1 ? plan.num_splits * BytesPerSplit(p) + 256 +
                                          CounterBytes(p, tuning, plan.row_tiles)
                                    : 0;
        return absl::OkStatus();
      });
  return s.ok() ? bytes : 0;
}

absl::Status PagedAttentionCuda(const PagedAttentionParams& p, cudaStream_t stream, void* workspace,
                                size_t workspace_bytes, const PagedAttentionTuning& tuning,
                                const KvCacheWriteParams* kv_write) {
  RETURN_IF_ERROR(ValidateForCuda(p));
  if (kv_write != nullptr) {
    RETURN_IF_ERROR(ValidateKvCacheWriteShape(*kv_write));
    if (kv_write->key_cache != p.key_cache || kv_write->value_cache != p.value_cache ||
        kv_write->dtype != p.dtype || kv_write->num_kv_heads != p.num_kv_heads ||
        kv_write->head_dim != p.head_dim || kv_write->block_size != p.block_size ||
        kv_write->num_tokens != p.num_tokens) {
      return absl::InvalidArgumentError(
          "CUDA attention: kv_write must name the attention's caches, shapes and tokens");
    }
  }
  if (p.num_tokens == 0 || p.num_seqs == 0) return absl::OkStatus();
  return attention::DispatchAttention(
      p.dtype, p.head_dim, ChooseLayout(p, tuning),
      [&]<typename T, int D, int WM, int WN>() -> absl::Status {
        using S = Shape<D, WM, WN>;
        // The instantiation that will launch (variants 3-5 never fall back below 3): this also
        // raises its shared-memory limit before the launch.
        const int resident = tuning.variant >= 3 ? ResidentCtas<T, D, WM, WN, true>()
                                                 : ResidentCtas<T, D, WM, WN, false>();
        if (resident == 0) {
          return absl::InternalError("CUDA attention: kernel cannot be resident (shared memory)");
        }
        const size_t usable = workspace == nullptr ? 0 : workspace_bytes;
        // Variants 2, 4, 5 keep their counters first; without room for them 2 runs as variant 1,
        // 4 and 5 as 3.
        const size_t counter_bytes = CounterBytes(p, tuning, RowTiles(p, tuning));
        int variant = std::clamp(tuning.variant, 0, kNumPagedAttentionVariants - 1);
        // 11 (wgmma) plans and merges as 3; shapes it does not take run as 9.
        const int64_t max_rows = MaxRows(p);
        bool hopper = false;
        hopper::Config hcfg;
        // 14 is 13 with the fused KV write; 15 is 14 with the split merge in a cluster.
        const bool fuse_requested = tuning.fuse_kv_write || (variant >= 14 && variant <= 18);
        const bool tma_cluster = variant == 15;
        const bool kv_before_wait = tuning.kv_before_wait || variant == 16;
        const bool warp_merge = tuning.warp_merge || variant == 17 || variant == 18;
        const bool pair_auto = variant == 18;
        if (variant >= 14 && variant <= 18) variant = 13;
        bool tma_chosen = false;  // variant 13's TMA kernel, before the plan's split length
        if (variant == 13) {  // TMA decode: <= 64 rows, 16-slot boxes within a block; else 11
          if constexpr (D == 64 || D == 128) {
            if (max_rows <= hopper::kRows && p.block_size >= hopper::kTmaBoxRows) {
              hcfg = hopper::ChooseTmaConfig<T, D>(tuning.hopper_tma_ctas);
              hopper = hcfg.resident > 0;
              tma_chosen = hopper;
            }
          }
          variant = hopper ? 3 : 11;
        }
        if (variant == 11 || variant == 12) {
          if constexpr (D == 64 || D == 128) {
            hcfg = hopper::ChooseConfig<T, D>(tuning.hopper_tile_tokens, tuning.hopper_warpgroups,
                                              max_rows > hopper::kRows,
                                              UseTwoWarpgroupPrefill(p, SmCount()));
          }
          // 12: decode only (more than 64 rows run as 9), as 11 was until 2026-12-03.
          hopper = hcfg.resident > 0 && (variant == 11 || max_rows <= hopper::kRows);
          variant = hopper ? 3 : 9;
        }
        // 7 and 8 are 6 and 3 with the early KV copies (8: and the cluster merge, below); 9 is 7
        // and 10 is 8 with the cluster merge only where the grid fits in one CTA per SM.
        const bool early_kv = variant >= 7;
        const bool cluster = variant >= 8;
        const bool cluster_if_small = variant >= 9;
        if (variant == 7 || variant == 9) variant = 6;
        if (variant == 8 || variant == 10) variant = 3;
        // 6 launches as 5; whether it merges in the kernel depends on the plan (below).
        const bool auto_merge = variant == 6;
        if (auto_merge) variant = 5;
        size_t head_bytes = 256 + counter_bytes;
        if (counter_bytes > 0 && usable < head_bytes + 2 * BytesPerSplit(p)) {
          variant = variant == 2 ? 1 : 3;
          head_bytes = 256;
        }
        const size_t plan_bytes = usable >= head_bytes ? usable - head_bytes : 0;
        Plan plan = MakePlan(p, tuning, resident, plan_bytes, cluster_if_small);
        if (hopper) {
          // Decode (<= 64 rows, one row tile) keeps the plan measured with it; past that (prefill,
          // long multi-token queries) 11 plans its own 64-row tiles.
          // 13 fills its own CTA slots (hopper_tma_ctas).
          const Plan own = max_rows > hopper::kRows || hcfg.tma_kernel != nullptr
                               ? MakePlan(p, tuning, hcfg.resident, plan_bytes, false,
                                          hcfg.tile_rows)
                               : plan;
          // 11 keeps a split's block ids in its shared table: a longer split runs as 3, on the
          // mma kernel's plan.
          hopper = TableSpan(own.chunk, p.block_size) <= kTableCap;
          if (hopper) {
            plan = own;
            plan.row_tiles = CeilDiv(max_rows, hcfg.tile_rows);
          }
          if constexpr (D == 64 || D == 128) {
            // Automatic 13 streams splits of at most kTmaMaxSplitTokens; longer ones run 11's
            // kernel on the same plan.
            if (hcfg.tma_kernel != nullptr && tuning.hopper_tma_ctas == 0 &&
                plan.chunk > hopper::kTmaMaxSplitTokens) {
              hcfg = hopper::MakeConfig<T, D, hopper::kDecodeTN, 1>();
            }
          }
        }
        // Variant 18 (or tuning.tma_pair): the pair — one CTA an SM, two consumer warpgroups —
        // where one split a sequence keeps at least 70% of the SMs busy in one wave (batches of
        // 93-132 sequences x KV heads at 132 SMs) with splits of at most kPairMaxSplitTokens: no
        // merge at all, where 17 runs two splits and a merge (H200 2026-12-04 ~18:29 UTC,
        // attention_bench --one, graph us, 17 / the pair with one split: 96 x 2048 38.95 / 35.9,
        // 100 x 512 15.4 / 12.8; at lower fills no gain: 80 x 1024 20.6 / 20.4, 66 x 512 12.27 /
        // 12.05, and 72 x 2048 29.0 / 35.5, where 17 runs three splits). Forced (tests): any decode
        // shape, its splits (num_splits, else the SMs over the sequences x KV heads, at most
        // kClusterMergeCap) merged in a cluster.
        bool pair = false;
        if constexpr (D == 64 || D == 128) {
          if (tma_chosen && tuning.hopper_tma_ctas == 0 && (pair_auto || tuning.tma_pair)) {
            const int64_t base = static_cast<int64_t>(p.num_seqs) * p.num_kv_heads;  // 1 row tile
            const int sms = SmCount();
            PagedAttentionTuning pt = tuning;
            if (pt.num_splits <= 0) {
              pt.num_splits = tuning.tma_pair
                                  ? static_cast<int>(std::clamp<int64_t>(
                                        sms / std::max<int64_t>(1, base), 1, kClusterMergeCap))
                                  : 1;
            }
            const hopper::Config pcfg = hopper::MakeTmaConfig<T, D, 1>();
            const Plan pp = MakePlan(p, pt, 1, plan_bytes, false, pcfg.tile_rows);
            const bool fills = pp.num_splits == 1 && UsePairDecode(p, sms);
            if (pcfg.resident > 0 && TableSpan(pp.chunk, p.block_size) <= kTableCap &&
                (tuning.tma_pair || fills)) {
              pair = true;
              hopper = true;
              hcfg = pcfg;
              plan = pp;
              plan.row_tiles = 1;
            }
          }
        }
        // Variant 13's tensor maps over the K and V caches; without them (no driver entry point,
        // a map rejected) it runs 11's kernel on the same plan.
        CUtensorMap maps[2];
        bool fuse_kv = false;
        if constexpr (D == 64 || D == 128) {
          if (hopper && hcfg.tma_kernel != nullptr &&
              !(EncodeKvCacheMap(&maps[0], p.key_cache, p.dtype, p.num_kv_heads * D) &&
                EncodeKvCacheMap(&maps[1], p.value_cache, p.dtype, p.num_kv_heads * D))) {
            hcfg = hopper::MakeConfig<T, D, hopper::kDecodeTN, 1>();
            pair = false;
          }
          // The KV write: fused into the TMA kernel for a decode batch (tuning.fuse_kv_write,
          // 16-byte rows; the fused instantiation exists for the automatic two CTAs an SM and for
          // the pair, same plan), else launched first.
          fuse_kv = fuse_requested && tuning.hopper_tma_ctas == 0 && kv_write != nullptr &&
                    hopper && hcfg.tma_kernel != nullptr &&
                    p.max_query_len == 1 && kv_write->key_stride % 8 == 0 &&
                    kv_write->value_stride % 8 == 0 &&
                    reinterpret_cast<uintptr_t>(kv_write->key) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(kv_write->value) % 16 == 0;
          if (fuse_kv) {
            static_assert(hopper::kTmaDefaultCtas == 2, "the fused form is instantiated for two");
            hcfg = pair ? hopper::MakeTmaConfig<T, D, 1, true>()
                        : hopper::MakeTmaConfig<T, D, 2, true>();
          }
        }
        if (kv_write != nullptr && !fuse_kv) {
          RETURN_IF_ERROR(KvCacheWriteCuda(*kv_write, stream, tuning.pdl));
        }
        const int64_t grid_x = static_cast<int64_t>(plan.row_tiles) * plan.num_splits;
        if (grid_x > INT32_MAX) return absl::InvalidArgumentError("CUDA attention: grid too large");
        const dim3 grid(static_cast<unsigned>(grid_x), p.num_kv_heads, p.num_seqs);
        // The fused merge waits for its sibling CTAs: only when the whole grid is resident.
        if (variant == 2 && (plan.num_splits == 1 ||
                             grid_x * p.num_kv_heads * p.num_seqs >
                                 static_cast<int64_t>(SmCount()) * resident)) {
          variant = 1;
        }
        KernelArgs a;
        a.query = p.query;
        a.query_stride = p.query_stride;
        a.output = p.output;
        a.key_cache = p.key_cache;
        a.value_cache = p.value_cache;
        a.block_tables = p.block_tables;
        a.query_start = p.query_start;
        a.context_lens = p.context_lens;
        a.num_seqs = p.num_seqs;
        a.num_tokens = p.num_tokens;
        a.num_heads = p.num_heads;
        a.num_kv_heads = p.num_kv_heads;
        a.group = p.num_heads / p.num_kv_heads;
        a.max_blocks_per_seq = p.max_blocks_per_seq;
        a.block_shift = __builtin_ctz(static_cast<unsigned>(p.block_size));
        a.num_splits = plan.num_splits;
        a.chunk = plan.chunk;
        a.scale_log2 = p.scale * static_cast<float>(M_LOG2E);
        a.variant = variant;
        a.narrow_partials = variant >= 3;
        a.early_kv = early_kv;
        a.early_release = p.release_dependents_early;
        a.one_query_each = p.max_query_len == 1 && p.num_tokens == p.num_seqs;
        a.cluster_merge = cluster && plan.num_splits > 1 &&
                          plan.num_splits <= kClusterMergeCap &&
                          (!cluster_if_small || grid_x * p.num_kv_heads * p.num_seqs <= SmCount());
        a.inline_merge =
            !a.cluster_merge && plan.num_splits > 1 &&
            ((variant == 4 && plan.num_splits <= kInlineMergeCap4) ||
             (variant == 5 && plan.num_splits <= kInlineMergeCap5 &&
              (!auto_merge ||
               (plan.num_splits <= kAutoMergeSplits && plan.chunk <= kAutoMergeTokens))));
        // 15: the fused TMA kernel's splits of a row tile run as a cluster and merge through
        // distributed shared memory, where the grid is one CTA an SM at most (as variant 9).
        if (tma_cluster && fuse_kv && plan.num_splits > 1 && plan.num_splits <= kClusterMergeCap &&
            grid_x * p.num_kv_heads * p.num_seqs <= SmCount()) {
          a.cluster_merge = true;
        }
        if (pair && plan.num_splits > 1 && plan.num_splits <= kClusterMergeCap) {
          a.cluster_merge = true;
        }
        // A merge kernel follows (variants 1 and 3, 4-5 past their cap, 8 past the cluster cap):
        // launched early.
        const bool merge_launch =
            plan.num_splits > 1 && variant != 2 && !a.inline_merge && !a.cluster_merge;
        a.pdl = merge_launch && variant != 0;
        if (variant >= 1) {
          const int first_span = TableSpan(plan.chunk, p.block_size);
          a.table_blocks = first_span <= kTableCap ? first_span : 0;
        }
        if (plan.num_splits > 1) {
          // 256-byte aligned counters (variant 2) and partials inside the caller's workspace.
          const uintptr_t base = (reinterpret_cast<uintptr_t>(workspace) + 255) & ~uintptr_t{255};
          const bool counters = variant == 2 || variant == 4 || variant == 5;
          a.counters = counters ? reinterpret_cast<unsigned*>(base) : nullptr;
          a.partial_o = reinterpret_cast<float*>(base + (counters ? counter_bytes : 0));
          a.partial_lse = a.partial_o + static_cast<size_t>(plan.num_splits) * p.num_tokens *
                                            p.num_heads * p.head_dim;
        }
        if (variant == 2) {
          cudaLaunchConfig_t config = {};
          config.gridDim = grid;
          config.blockDim = dim3(S::kThreads);
          config.dynamicSmemBytes = S::kSmemBytes;
          config.stream = stream;
          cudaLaunchAttribute attr[1];
          attr[0].id = cudaLaunchAttributeCooperative;
          attr[0].val.cooperative = 1;
          config.attrs = attr;
          config.numAttrs = 1;
          CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, PagedAttentionKernel<T, D, WM, WN, false>, a));
          CUDA_RETURN_IF_LAUNCH_ERROR();
          return absl::OkStatus();
        }
        auto kernel = a.narrow_partials ? PagedAttentionKernel<T, D, WM, WN, true>
                                        : PagedAttentionKernel<T, D, WM, WN, false>;
        unsigned threads = S::kThreads;
        size_t smem_bytes = S::kSmemBytes;
        if constexpr (D == 64 || D == 128) {
          if (fuse_kv) {
            a.new_key = kv_write->key;
            a.new_value = kv_write->value;
            a.new_key_stride = kv_write->key_stride;
            a.new_value_stride = kv_write->value_stride;
            a.slot_mapping = kv_write->slot_mapping;
            a.kv_before_wait = kv_before_wait;
          }
          if (hopper) {  // same arguments (and grid geometry): only the kernel differs
            kernel = hcfg.kernel;
            threads = hcfg.threads;
            smem_bytes = hcfg.smem_bytes;
          }
        }
        {
          // With the cluster merge the splits of a row tile (consecutive in x) are one cluster.
          const unsigned cluster = a.cluster_merge ? static_cast<unsigned>(plan.num_splits) : 1;
          if (hopper && hcfg.tma_kernel != nullptr) {
            CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdlCluster(tuning.pdl, cluster, hcfg.tma_kernel,
                                                            grid, dim3(threads), smem_bytes, stream,
                                                            a, maps[0], maps[1]));
          } else {
            CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdlCluster(tuning.pdl, cluster, kernel, grid,
                                                            dim3(threads), smem_bytes, stream, a));
          }
          CUDA_RETURN_IF_LAUNCH_ERROR();
        }
        if (!merge_launch) return absl::OkStatus();
        auto merge = a.narrow_partials ? MergeSplitsKernel<T, D, T> : MergeSplitsKernel<T, D, float>;
        dim3 merge_grid(p.num_tokens, p.num_heads);
        size_t merge_smem = plan.num_splits * sizeof(float);
        unsigned merge_threads = 128;
        if constexpr (D == 64 || D == 128) {
          if (warp_merge && plan.num_splits <= kWarpMergeMaxSplits) {
            merge = a.narrow_partials ? MergeSplitsWarpKernel<T, D, T>
                                      : MergeSplitsWarpKernel<T, D, float>;
            // Before an early-released decode chain one warp a CTA, as many CTAs as the CTA form
            // (H200 ~17:29 UTC, StarCoder b1 decode step 8.137 / 8.144 ms with the CTA form,
            // 8.153 / 8.149 with this: equal; four heads a CTA there was 0.5% slower, ~16:58).
            const int heads_per_cta = a.early_release ? 1 : kWarpMergeHeads;
            merge_grid.y = CeilDiv(p.num_heads, heads_per_cta);
            merge_threads = 32 * heads_per_cta;
            merge_smem = 0;
          }
        }
        // With PDL the merge launches while the attention kernel runs.
        CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdlSmem(a.pdl, merge, merge_grid, dim3(merge_threads),
                                                     merge_smem, stream, a));
        CUDA_RETURN_IF_LAUNCH_ERROR();
        return absl::OkStatus();
      });
}

}  // namespace mqa
