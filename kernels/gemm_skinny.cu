// The skinny decode GEMMs (m <= CudaGemm::kSkinnyMaxM): the row-streaming kernel (SkinnyGemmCuda)
// and its split-K form (SkinnySplitKGemmCuda), with their fused epilogues (bias, GELU-tanh,
// residual, the layer norm of A's rows, the KV-cache write). CudaGemm (gemm_cuda.cu) routes decode
// shapes here; see gemm_cuda.h for what each option does.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/device_info.h"
#include "kernels/forward_cuda_common.cuh"
#include "kernels/gemm_cuda.h"
#include "kernels/tma.cuh"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

// --- Skinny kernel ---------------------------------------------------------------------------

constexpr int kSkinnyWarps = 4;
constexpr int kSkinnyUnroll = 4;  // 16-byte weight loads in flight per row and lane
// CudaGemm::Options::skinny_deep_unroll: m = 1 GEMMs whose warps are few (SkinnyOptions::
// deep_max_warps) stream with twice the loads in flight per lane, and load twice as much before
// PdlWait.
constexpr int kSkinnyDeepUnroll = 8;
// CudaGemm::Options::skinny_half_fold: calls of at most this k (or narrow, deep-unrolled ones).
constexpr int64_t kSkinnyHalfMaxK = 4096;
// CudaGemm::Options::skinny_occupancy: the CTAs an SM the registers of its instantiations allow,
// with the default unroll (64 registers; ptxas spills 16-32 bytes) and with the deep one (128
// registers, no spills; 168 with the fused layer norm otherwise).
constexpr int kSkinnyOccupancyCtas = 8;
constexpr int kSkinnyDeepOccupancyCtas = 4;

// GemmTailAttention as the kernel takes it (FillSkinnyTail fills it): q, the new k / v and the
// caches as element pointers, the CTA split, the workspace cut into counters, LL words and
// partials.
template <typename T>
struct SkinnyTailArgs {
  const T* q = nullptr;      // C's row: query head h at q + h D
  const T* k_new = nullptr;  // the step's K row (KV head g at k_new + g D); v_new likewise
  const T* v_new = nullptr;
  const T* key_cache = nullptr;
  const T* value_cache = nullptr;
  T* out = nullptr;
  const int32_t* block_table = nullptr;
  const int32_t* context_len = nullptr;
  int heads = 0, group = 1, kv_width = 0, block_shift = 0, splits = 0;
  int max_context = 0;  // GemmTailAttention::max_context: the table entries it may read
  int tail_ctas = 0;    // CTAs [0, tail_ctas) run the attention (heads x splits), ...
  int gemm_ctas = 0;    // ... and the next gemm_ctas the GEMM
  int cluster = 0;  // > 0: the launch's cluster size (= splits; GemmTailAttention::cluster_merge)
  float scale_log2 = 0.0f;  // softmax scale x log2(e)
  // counters[kTailEpoch]: the launch's epoch (never reset; one more after each launch);
  // [kTailCountOut]: the attention warps that have read their LL words (zero again when the
  // launch ends); [kTailHeadCounts + h]: head h's splits done with the L2 merge (likewise).
  int* counters = nullptr;
  // The LL handover: C's columns [0, ll_cols) also as 32-bit words, the element in the low half
  // and the launch's flag (the epoch plus one) in the high half.
  uint32_t* ll = nullptr;
  int ll_cols = 0;
  float* partials = nullptr;  // [heads x splits][kGemmTailHeadDim + 2]: O (unnormalised), max, sum
  unsigned long long* stamps = nullptr;  // GemmTailAttention::stamps
  // The output projection (GemmTailAttention::proj_weight; kProj instantiations only): proj_n rows
  // of proj_k = heads D weights; counters[TailDoneWord(heads) + h]: head h's output stored, as the
  // launch's epoch plus one.
  const T* proj_w = nullptr;
  const T* proj_b = nullptr;
  T* hidden = nullptr;
  int proj_n = 0, proj_k = 0;
};
inline constexpr int kTailEpoch = 0, kTailCountOut = 1, kTailHeadCounts = 2;
// The heads' words of the projection (SkinnyTailArgs::proj_w) start on the 128-byte line after the
// counts, so that the GEMM CTAs' polling of them does not share a line with the attention's
// atomics (FillSkinnyTail checks that they fit GemmTailCounterBytes).
__host__ __device__ constexpr int TailDoneWord(int heads) {
  return (kTailHeadCounts + heads + 31) / 32 * 32;
}

__device__ __forceinline__ uint32_t LoadRelaxedGpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint4 LoadRelaxedGpu4(const uint32_t* p) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ void StoreRelaxedGpu(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Release and acquire at GPU scope for the tail projection's words: MEMBAR.ALL.GPU where
// __threadfence() is MEMBAR.SC.GPU (and an L1 invalidation the readers, which load through L2,
// do not need).
__device__ __forceinline__ void StoreReleaseGpu(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void FenceAcqRelGpu() {
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
}
// The launch's epoch plus one, read after the PDL wait: the previous launch on the workspace,
// which bumped the epoch, is complete by then. The LL words' flag is it in a word's high half
// (TailLlFlag); the projection's head words hold it whole.
__device__ __forceinline__ uint32_t TailEpoch1(const int* counters) {
  return LoadRelaxedGpu(reinterpret_cast<const uint32_t*>(counters + kTailEpoch)) + 1u;
}
__device__ __forceinline__ uint32_t TailLlFlag(uint32_t epoch1) { return epoch1 << 16; }
__device__ __forceinline__ bool TailLlFlagged(uint4 w, uint32_t flag) {
  return ((w.x & 0xffff0000u) == flag) & ((w.y & 0xffff0000u) == flag) &
         ((w.z & 0xffff0000u) == flag) & ((w.w & 0xffff0000u) == flag);
}
// The elements of four LL words, as four of C's elements in a uint2.
__device__ __forceinline__ uint2 TailLlData(uint4 w) {
  return make_uint2((w.x & 0xffffu) | (w.y << 16), (w.z & 0xffffu) | (w.w << 16));
}

// Thread 0's %globaltimer as this CTA's GemmTailStamp `e` (GemmTailAttention::stamps), if any.
__device__ __forceinline__ void TailStamp(unsigned long long* stamps, int e) {
  if (stamps == nullptr || threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  stamps[static_cast<int64_t>(blockIdx.x) * kGemmTailStampWords + e] = t;
}

// TailStamp once `dep` is in thread 0's registers: the volatile shared store waits for it, and the
// clock is read after the store (diagnostics only: callers pass a value of the loads they time).
__device__ __forceinline__ void TailStampAfter(unsigned long long* stamps, int e, uint32_t dep) {
  if (stamps == nullptr || threadIdx.x != 0) return;
  __shared__ uint32_t tail_sink;
  asm volatile("st.volatile.shared.u32 [%0], %1;\n" ::"r"(fwd::SmemAddr(&tail_sink)), "r"(dep)
               : "memory");
  TailStamp(stamps, e);
}

// This CTA's kind (kTailStampKind: 1 a GEMM CTA, 2 an attention CTA), if stamps are kept.
__device__ __forceinline__ void TailStampKind(unsigned long long* stamps, unsigned kind) {
  if (stamps == nullptr || threadIdx.x != 0) return;
  stamps[static_cast<int64_t>(blockIdx.x) * kGemmTailStampWords + kTailStampKind] = kind;
}

template <typename T>
struct SkinnyArgs {
  const T* a = nullptr;
  int64_t lda = 0;
  const T* b = nullptr;
  int64_t ldb = 0;
  T* c = nullptr;
  int64_t ldc = 0;
  const T* bias = nullptr;
  int m = 0, n = 0, k = 0;
  bool accumulate = false;
  // Fused layer norm of A's rows (kLn): weight and bias [k]; the skinny kernel also takes the
  // per-column sums of GemmEpilogue::ln_wsum / ln_bsum (the split-K kernel does not use them).
  const T* ln_w = nullptr;
  const T* ln_b = nullptr;
  float ln_eps = 1e-5f;
  const float* ln_wsum = nullptr;
  const float* ln_bsum = nullptr;
  // Fused KV-cache write (key_cache non-null): columns [kv_col0, kv_col0 + 2 kv_width).
  T* key_cache = nullptr;
  T* value_cache = nullptr;
  const int32_t* slots = nullptr;
  int kv_col0 = 0, kv_width = 0;
  // m = 1 (CudaGemm::Options::skinny_stage_bytes): elements of each weight row after the first
  // unrolled group that each lane copies into shared memory (its own 16-byte chunks) before the
  // PDL wait; at launch a multiple of 32 chunks (LaunchSkinnyUnrolled rounds and caps it).
  int stage_elems = 0;
  // Skinny kernel (CudaGemm::Options::skinny_early_epilogue): each storing lane loads its bias
  // (and layer-norm sums) before the PDL wait and its residual right after it, instead of after
  // the fold.
  bool early_epilogue = false;
  bool release_early = false;  // GemmEpilogue::release_dependents_early
  bool evict_first = true;     // SkinnyOptions::evict_first
  SkinnyTailArgs<T> tail;      // kTail instantiations only
};

// The weights' L2 eviction priority (SkinnyOptions::evict_first): an opaque policy for the
// .L2::cache_hint loads below.
__device__ __forceinline__ uint64_t WeightPolicy(bool evict_first) {
  return evict_first ? tma::EvictFirstPolicy() : tma::EvictNormalPolicy();
}

// 16 bytes of a weight row with the L2 priority `policy` (not volatile: the compiler schedules
// it as it would a plain load).
template <typename V>
__device__ __forceinline__ V LoadWeight16(const void* ptr, uint64_t policy) {
  uint4 u;
  asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
      : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
      : "l"(ptr), "l"(policy));
  V v;
  static_assert(sizeof(v) == sizeof(u));
  memcpy(&v, &u, sizeof(u));
  return v;
}

// cp.async of 16 weight bytes into shared memory with the L2 priority `policy`.
__device__ __forceinline__ void CpAsyncWeight16(uint32_t dst, const void* src, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, 16, %2;\n" ::"r"(dst),
               "l"(src), "l"(policy)
               : "memory");
}

__device__ __forceinline__ void PrefetchL2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// What the epilogue of output element (i, col) reads besides the dot product: the bias and, with
// accumulate, C's old value (the residual). The skinny kernel loads them early (SkinnyArgs::
// early_epilogue); the split-K kernel at the end.
struct SkinnyOut {
  float bias = 0.0f, resid = 0.0f;
};

template <typename T>
__device__ __forceinline__ float SkinnyLoadBias(const SkinnyArgs<T>& p, int col) {
  return p.bias != nullptr ? fwd::ToFloat(p.bias[col]) : 0.0f;
}

template <typename T>
__device__ __forceinline__ float SkinnyLoadResid(const SkinnyArgs<T>& p, int i, int col) {
  return p.accumulate ? fwd::ToFloat(p.c[static_cast<int64_t>(i) * p.ldc + col]) : 0.0f;
}

// The fused epilogue of one output element (i, col) whose dot product is `v`: bias, activation,
// residual (from `o`), the store, and the fused KV-cache write.
template <typename T, int kAct>
__device__ __forceinline__ T SkinnyStore(const SkinnyArgs<T>& p, int i, int col, float v,
                                         const SkinnyOut& o) {
  v = fwd::Activate<kAct>(v + o.bias) + o.resid;
  const T out = fwd::FromFloat<T>(v);
  p.c[static_cast<int64_t>(i) * p.ldc + col] = out;
  const int j = col - p.kv_col0;
  if (p.key_cache != nullptr && j >= 0 && j < 2 * p.kv_width) {
    const int64_t slot = p.slots[i];
    if (slot >= 0) {
      if (j < p.kv_width) {
        p.key_cache[slot * p.kv_width + j] = out;
      } else {
        p.value_cache[slot * p.kv_width + (j - p.kv_width)] = out;
      }
    }
  }
  return out;
}

// One pass of the fused layer norm's row statistics over A's M rows: this thread's sum over the
// elements j0, j0 + stride, ... < k of each row, of x (kSquares false) or of the centred square
// (x - mean)^2 (kSquares true; `mean` is read only then), the rows' loads of a step in flight
// together; then for each row i in turn, the sum reduced over the warp's lanes and
// per_row(i, warp_sum) (every lane gets the warp's sum).
template <typename T, int M, bool kSquares, typename F>
__device__ __forceinline__ void WarpRowSums(const T* const (&arow)[M], int j0, int stride, int k,
                                            const float (&mean)[M], F&& per_row) {
  using V = fwd::Vec16<T>;
  constexpr int kV = V::kN;
  float sum[M];
#pragma unroll
  for (int i = 0; i < M; ++i) sum[i] = 0.0f;
  for (int j = j0; j < k; j += stride) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const V av = *reinterpret_cast<const V*>(arow[i] + j);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        if constexpr (kSquares) {
          const float d = fwd::ToFloat(av.v[e]) - mean[i];
          sum[i] += d * d;
        } else {
          sum[i] += fwd::ToFloat(av.v[e]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], o);
    per_row(i, sum[i]);
  }
}

// Each of a warp's partial dot products summed over its lanes (every lane gets the sums): the
// end of both skinny kernels' folds.
template <int M, int R>
__device__ __forceinline__ void WarpSumAcc(float (&acc)[M][R]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[i][r] += __shfl_xor_sync(0xffffffffu, acc[i][r], o);
}

// Row statistics of the skinny kernel's fused layer norm (kLn): thread t of the CTA sums x and x^2
// over the 16-byte chunks t, t + CTA threads, ... of each of A's M rows (SkinnyLnAccumulate: one
// pass, the loads of a step in flight together); at the end each warp's sums are reduced over its
// lanes into `part` (SkinnyLnPublish), and after a __syncthreads LnRowStats combines the warps'
// sums into row i's mean and 1 / std.
template <typename T, int M>
__device__ __forceinline__ void SkinnyLnAccumulate(const T* const (&arow)[M], int k,
                                                   float (&sum)[M], float (&sq)[M]) {
  using V = fwd::Vec16<T>;
  constexpr int kV = V::kN;
  for (int j = threadIdx.x * kV; j < k; j += kSkinnyWarps * 32 * kV) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const V av = *reinterpret_cast<const V*>(arow[i] + j);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const float x = fwd::ToFloat(av.v[e]);
        sum[i] += x;
        sq[i] = fmaf(x, x, sq[i]);
      }
    }
  }
}

template <int M>
__device__ __forceinline__ void SkinnyLnPublish(float (&sum)[M], float (&sq)[M],
                                                float (&part)[kSkinnyWarps][M][2]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], o);
      sq[i] += __shfl_xor_sync(0xffffffffu, sq[i], o);
    }
  }
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      part[threadIdx.x >> 5][i][0] = sum[i];
      part[threadIdx.x >> 5][i][1] = sq[i];
    }
  }
}

template <int M>
__device__ __forceinline__ float2 LnRowStats(const float (&part)[kSkinnyWarps][M][2], int i, int k,
                                             float eps) {
  float sum = 0.0f, sq = 0.0f;
#pragma unroll
  for (int w = 0; w < kSkinnyWarps; ++w) {
    sum += part[w][i][0];
    sq += part[w][i][1];
  }
  const float mean = sum / k;
  return make_float2(mean, rsqrtf(fmaxf(sq / k - mean * mean, 0.0f) + eps));
}

// The tail attention (GemmTailAttention): CTA h splits + s (the attention's CTAs come first in
// the grid, so that they are dispatched, and their loads issued, before the GEMM CTAs' weight
// loads fill the memory system) attends query head h over cached positions [64 s, 64 s + 64) of
// the sequence. Warp w takes 16 of them, lane l dims [4 l, 4 l + 4) of each: before the GEMM is
// done it loads its positions' K / V rows from the cache into registers (every row but the newest
// was written by an earlier step; the table's entries are loaded beside the context length, not
// after it). Then each warp polls the LL words of q and, where it holds the newest position, of
// that position's k / v, until every one carries the launch's flag: the GEMM thread that stores a
// column of C stores it again as an LL word, so no count of the GEMM CTAs and no second load
// stands between the last word written and the scores. Each warp scores its 16 positions (a
// shuffle reduction each), and the four warps' (max, sum, O) meet in shared memory. One split:
// O / sum is the output. Several: the splits merge, in a cluster or through the workspace.
//
// The flag is the epoch plus one. Every word of the launch is read by some warp, and the warps
// count themselves out once they have read theirs, so when the last one bumps the epoch every
// GEMM thread that stores a word has read it: the next launch on the workspace (after its PDL
// wait) writes and expects the next flag, and a word of this launch never matches it. The flag
// is 16 bits: only the previous launch's flag must differ.
template <typename T>
__device__ __forceinline__ float4 TailUnpack4(uint2 u) {
  T e[4];
  static_assert(sizeof(e) == sizeof(u));
  memcpy(e, &u, sizeof(u));
  return make_float4(fwd::ToFloat(e[0]), fwd::ToFloat(e[1]), fwd::ToFloat(e[2]),
                     fwd::ToFloat(e[3]));
}

// The CTA counts in at `counter` (fwd::ArrivedLast, every thread taking part); true in every
// thread of the last of `of` CTAs, whose reads then see the others' writes.
__device__ __forceinline__ bool TailCountIn(int* counter, int of, int* last) {
  return fwd::ArrivedLast(counter, 0, of - 1, threadIdx.x == 0, last, [] { __syncthreads(); });
}

// Dim d of a head's attention from its splits' partials (O unnormalised at [0, D), max at D, sum
// at D + 1; `at(j, i)` loads split j's value i), kBatch splits' loads at a time in one round trip,
// folded online; a split past the context has max -inf and adds nothing.
template <typename At>
__device__ __forceinline__ float TailMergeSplits(const At& at, int splits, int d) {
  constexpr int D = kGemmTailHeadDim, kBatch = 8;
  float mx = -INFINITY, sum = 0.0f, acc = 0.0f;
  for (int i0 = 0; i0 < splits; i0 += kBatch) {
    float mi[kBatch], li[kBatch], oi[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const bool in = i0 + j < splits;
      const int split = in ? i0 + j : 0;
      mi[j] = in ? at(split, D) : -INFINITY;
      li[j] = at(split, D + 1);
      oi[j] = at(split, d);
    }
    float bx = mx;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) bx = fmaxf(bx, mi[j]);
    const float r = mx == -INFINITY ? 0.0f : exp2f(mx - bx);  // rescale what is folded
    sum *= r;
    acc *= r;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (mi[j] == -INFINITY) continue;
      const float f = exp2f(mi[j] - bx);
      sum = fmaf(f, li[j], sum);
      acc = fmaf(f, oi[j], acc);
    }
    mx = bx;
  }
  return acc / sum;
}

// kProj (GemmTailAttention::proj_weight): the CTA that stores head h's output then sets the
// head's word (the `signal` below) for the GEMM CTAs' projection (SkinnyTailProj).
template <typename T, bool kProj = false>
__device__ __forceinline__ void SkinnyTailAttention(const SkinnyTailArgs<T>& t, int cta) {
  constexpr int D = kGemmTailHeadDim, kWarpTokens = kGemmTailTokens / kSkinnyWarps;
  static_assert(D == 4 * 32 && kWarpTokens == 16);
  const int h = cta / t.splits, s = cta - h * t.splits;
  const int kv = (h / t.group) * D;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  fwd::PdlTrigger();  // the next kernel waits for this whole grid anyway
  TailStampKind(t.stamps, 2);
  const int ctx = *t.context_len, newest = ctx - 1;
  const int tok0 = s * kGemmTailTokens + warp * kWarpTokens;
  // The cluster merge: rank 0's barrier for its peers' partials (pushed into tail_in by st.async,
  // each completing its bytes on it), initialised before the cluster barrier's arrival, which the
  // peers wait for before they push (long before: their q comes from the GEMM first).
  __shared__ float tail_in[kGemmTailMaxClusterSplits][D + 2];
  __shared__ __align__(8) uint64_t tail_bar;
  const uint32_t bar = fwd::SmemAddr(&tail_bar);
  if (t.cluster > 0) {
    if (s == 0 && threadIdx.x == 0) {
      tma::MbarInit(bar, 1);
      tma::FenceMbarInit();
      tma::MbarArriveExpectTx(bar, static_cast<uint32_t>((t.splits - 1) * (D + 2) * 4));
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  }
  // The table's entries are loaded beside the context length (up to max_context, which the
  // table covers), not after it: the K / V loads wait for one round trip, not two.
  int32_t blk[kWarpTokens];
#pragma unroll
  for (int j = 0; j < kWarpTokens; ++j) {
    const int tok = tok0 + j;
    blk[j] = tok < t.max_context ? t.block_table[tok >> t.block_shift] : 0;
  }
  uint2 kr[kWarpTokens], vr[kWarpTokens];
#pragma unroll
  for (int j = 0; j < kWarpTokens; ++j) {
    const int tok = tok0 + j;
    kr[j] = vr[j] = make_uint2(0, 0);
    if (tok < newest) {
      const int mask = (1 << t.block_shift) - 1;
      const int64_t slot = (static_cast<int64_t>(blk[j]) << t.block_shift) + (tok & mask);
      const int64_t off = slot * t.kv_width + kv + 4 * lane;
      kr[j] = *reinterpret_cast<const uint2*>(t.key_cache + off);
      vr[j] = *reinterpret_cast<const uint2*>(t.value_cache + off);
    }
  }
  fwd::PdlWait();
  TailStamp(t.stamps, kTailStampPdlDone);
  if (t.stamps != nullptr) {
    uint32_t in = 0;
#pragma unroll
    for (int j = 0; j < kWarpTokens; ++j) in ^= kr[j].x ^ vr[j].y;
    TailStampAfter(t.stamps, kTailStampKvIn, in);
  }
  // The warp's LL words: q's four dims a lane, and where the warp holds the newest position, that
  // position's k / v; polled (all loads of a round in flight together) until every one carries
  // the launch's flag. Then the warp counts itself out; the result is needed only at the end.
  const uint32_t epoch1 = TailEpoch1(t.counters), flag = TailLlFlag(epoch1);
  const bool has_new = newest >= tok0 && newest < tok0 + kWarpTokens;
  const uint32_t* qw = t.ll + h * D + 4 * lane;
  const uint32_t* kw = t.ll + (t.k_new - t.q) + kv + 4 * lane;
  const uint32_t* vw = t.ll + (t.v_new - t.q) + kv + 4 * lane;
  uint4 wq, wk = make_uint4(0, 0, 0, 0), wv = wk;
  for (bool in = false; !in;) {
    wq = LoadRelaxedGpu4(qw);
    if (has_new) {
      wk = LoadRelaxedGpu4(kw);
      wv = LoadRelaxedGpu4(vw);
    }
    in = __all_sync(0xffffffffu,
                    TailLlFlagged(wq, flag) &&
                        (!has_new || (TailLlFlagged(wk, flag) && TailLlFlagged(wv, flag))));
  }
  TailStamp(t.stamps, kTailStampWordsIn);
  int counted_out = -1;
  if (lane == 0) counted_out = atomicAdd(t.counters + kTailCountOut, 1);
  const float4 q = TailUnpack4<T>(TailLlData(wq));
#pragma unroll
  for (int j = 0; j < kWarpTokens; ++j) {
    if (tok0 + j == newest) {
      kr[j] = TailLlData(wk);
      vr[j] = TailLlData(wv);
    }
  }
  float sc[kWarpTokens];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kWarpTokens; ++j) {
    const float4 k = TailUnpack4<T>(kr[j]);
    float d = q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    sc[j] = tok0 + j < ctx ? d * t.scale_log2 : -INFINITY;
    m = fmaxf(m, sc[j]);
  }
  TailStamp(t.stamps, kTailStampScores);
  float l = 0.0f;
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (m != -INFINITY) {
#pragma unroll
    for (int j = 0; j < kWarpTokens; ++j) {
      const float pj = exp2f(sc[j] - m);
      const float4 v = TailUnpack4<T>(vr[j]);
      l += pj;
      o.x = fmaf(pj, v.x, o.x);
      o.y = fmaf(pj, v.y, o.y);
      o.z = fmaf(pj, v.z, o.z);
      o.w = fmaf(pj, v.w, o.w);
    }
  }
  __shared__ float tail_ml[kSkinnyWarps][2];
  __shared__ float4 tail_o[kSkinnyWarps][32];
  __shared__ int tail_last;
  if (lane == 0) {
    tail_ml[warp][0] = m;
    tail_ml[warp][1] = l;
  }
  tail_o[warp][lane] = o;
  __syncthreads();
  TailStamp(t.stamps, kTailStampPartial);
  // Thread d: dim d of the split's (unnormalised) output, and the split's max and sum.
  const int d = threadIdx.x;
  float ms = -INFINITY;
#pragma unroll
  for (int w = 0; w < kSkinnyWarps; ++w) ms = fmaxf(ms, tail_ml[w][0]);
  float ls = 0.0f, os = 0.0f;
  if (ms != -INFINITY) {
#pragma unroll
    for (int w = 0; w < kSkinnyWarps; ++w) {
      const float f = exp2f(tail_ml[w][0] - ms);  // 0 for a warp with no position
      ls = fmaf(f, tail_ml[w][1], ls);
      os = fmaf(f, reinterpret_cast<const float*>(tail_o[w])[d], os);
    }
  }
  T* out = t.out + h * D + d;
  // kProj: head h's output is stored (by every thread of this CTA): its word says so.
  const auto signal = [&] {
    if constexpr (kProj) {
      __syncthreads();  // every thread's output element before thread 0's release
      if (threadIdx.x == 0) {
        StoreReleaseGpu(reinterpret_cast<uint32_t*>(t.counters + TailDoneWord(t.heads) + h),
                        epoch1);
      }
    }
  };
  if (t.splits == 1) {
    *out = fwd::FromFloat<T>(os / ls);
    signal();
  } else if (t.cluster > 0) {
    // The head's splits are one cluster (the attention's CTAs come first, so split s is the
    // cluster's rank s): ranks 1.. push their partials into rank 0's tail_in (st.async,
    // completing their bytes on rank 0's tail_bar) and leave; rank 0 waits for the bytes and
    // merges. Measured on an H100 (2026-12-07 ~09:24 UTC, SantaCoder b1 128 / 128 decode step,
    // separate processes in rotation, four rounds): 0.968-0.969 ms against 0.974-0.989, faster
    // in every round (-1%), where the partials had stayed in each rank's shared memory behind a
    // cluster barrier, rank 0 read them through DSMEM and a second barrier kept the ranks until
    // it had; layer 10's timeline: the warps' partials to the CTAs' end 0.4 us instead of 2.1
    // (benchmarks/mqabench/NOTES.md version 57).
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");  // tail_bar is set up
    if (s != 0) {
      uint32_t dst, rbar;
      asm volatile("mapa.shared::cluster.u32 %0, %1, 0;\n"
                   : "=r"(dst)
                   : "r"(fwd::SmemAddr(&tail_in[s][0])));
      asm volatile("mapa.shared::cluster.u32 %0, %1, 0;\n" : "=r"(rbar) : "r"(bar));
      auto push = [&](int i, float v) {
        asm volatile(
            "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(
                dst + 4 * i),
            "r"(__float_as_uint(v)), "r"(rbar)
            : "memory");
      };
      push(d, os);
      if (d == 0) {
        push(D, ms);
        push(D + 1, ls);
      }
      TailStamp(t.stamps, kTailStampMerged);
    } else {
      tma::MbarWaitCluster(bar, 0);
      TailStamp(t.stamps, kTailStampMerged);
      const auto at = [&](int j, int i) {
        return j > 0 ? tail_in[j][i] : i == D ? ms : i == D + 1 ? ls : os;
      };
      *out = fwd::FromFloat<T>(TailMergeSplits(at, t.splits, d));
      signal();
    }
  } else {
    constexpr int kSlot = D + 2;
    const float* head = t.partials + static_cast<int64_t>(h * t.splits) * kSlot;
    float* part = t.partials + static_cast<int64_t>(h * t.splits + s) * kSlot;
    part[d] = os;
    if (d == 0) {
      part[D] = ms;
      part[D + 1] = ls;
    }
    if (TailCountIn(t.counters + kTailHeadCounts + h, t.splits, &tail_last)) {
      TailStamp(t.stamps, kTailStampMerged);
      const auto at = [&](int j, int i) { return __ldcg(head + j * kSlot + i); };
      *out = fwd::FromFloat<T>(TailMergeSplits(at, t.splits, d));
      if (threadIdx.x == 0) t.counters[kTailHeadCounts + h] = 0;  // every split has counted in
      signal();
    }
  }
  // The last warp to count out resets the count and bumps the epoch.
  if (lane == 0 && counted_out == t.tail_ctas * kSkinnyWarps - 1) {
    t.counters[kTailCountOut] = 0;
    atomicAdd(t.counters + kTailEpoch, 1);
  }
  TailStamp(t.stamps, kTailStampEnd);
}

// The output projection in the tail's launch (GemmTailAttention::proj_weight), by GEMM CTA g
// after its QKV columns: warp w takes rows c0 = (4 g + w) R .. c0 + R of proj_w (R = 2: the 2048
// rows of SantaCoder's attn.c_proj over 256 CTAs, eight a CTA) and loads them whole (proj_k <=
// U x 32 x 8: one unrolled group, in the registers the QKV rows left), with the storing lanes'
// bias and residual, before anything waits. Then warp 0 polls the heads' words (lane h head h's,
// one 4-byte load a lane a round) until each holds the launch's epoch plus one (`epoch1`, lane
// 0's); an acquire fence and the CTA barrier hand the sighting on, and every warp loads the
// output row from L2 (it was written in this launch, so never from L1) and folds it, in the order
// attn.c_proj's deep-unrolled skinny GEMM folds it (the same sums, the same rounding). The
// residual is updated in place: every GEMM CTA that stores QKV columns has read it (the layer norm's pass
// and the fold) before its columns' LL words were read, which every head's output needs.
template <typename T, int U, int R, bool kHalf>
__device__ __forceinline__ void SkinnyTailProj(const SkinnyTailArgs<T>& t, int g, uint32_t epoch1,
                                               uint64_t wpolicy) {
  using V = fwd::Vec16<T>;
  constexpr int kV = V::kN;
  if (g * kSkinnyWarps * R >= t.proj_n) return;  // no rows for this CTA
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int c0 = (g * kSkinnyWarps + warp) * R;
  const bool live = c0 < t.proj_n;
  const int kk = lane * kV;
  V w[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = min(c0 + r, t.proj_n - 1);
      if (live && kk + u * 32 * kV < t.proj_k) {
        w[u][r] = LoadWeight16<V>(t.proj_w + row * t.proj_k + kk + u * 32 * kV, wpolicy);
      } else {
        w[u][r] = V{};
      }
    }
  const int col = c0 + lane;
  const bool stores = live && lane < R && col < t.proj_n;
  float bias = 0.0f, resid = 0.0f;
  if (stores) {
    if (t.proj_b != nullptr) bias = fwd::ToFloat(t.proj_b[col]);
    resid = fwd::ToFloat(t.hidden[col]);
  }
  if (warp == 0) {
    const uint32_t want = __shfl_sync(0xffffffffu, epoch1, 0);
    const uint32_t* done = reinterpret_cast<const uint32_t*>(t.counters + TailDoneWord(t.heads));
    for (bool in = false; !in;) {
      in = __all_sync(0xffffffffu, lane >= t.heads || LoadRelaxedGpu(done + lane) == want);
    }
    FenceAcqRelGpu();  // the words seen, then the barrier: the other warps' loads after both
  }
  __syncthreads();
  if (!live) return;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (kk + u * 32 * kV >= t.proj_k) break;
    const uint4 xu = __ldcg(reinterpret_cast<const uint4*>(t.out + kk + u * 32 * kV));
    V xv;
    static_assert(sizeof(xv) == sizeof(xu));
    memcpy(&xv, &xu, sizeof(xu));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if constexpr (kHalf) {
        acc[r] += fwd::HalfPairDot8(&w[u][r], &xv);
      } else {
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          acc[r] = fmaf(fwd::ToFloat(xv.v[e]), fwd::ToFloat(w[u][r].v[e]), acc[r]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  if (stores) {
    float v = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (lane == r) v = acc[r];
    t.hidden[col] = fwd::FromFloat<T>((v + bias) + resid);
  }
}

// R: weight rows (output columns) per warp. kLn: A's rows go through a layer norm first, folded
// into the epilogue: with g the LN weight and b its bias, a row x of mean mu and 1 / std s gives
//   LN(x) . w = s (sum_j w_j g_j x_j - mu sum_j w_j g_j) + sum_j w_j b_j,
// so the fold takes x_j g_j, and the row's statistics (SkinnyLnAccumulate, the CTA's threads
// sharing the pass) and the two per-column sums (ln_wsum, ln_bsum: LayerNormFoldSumsCuda, once per
// weight) enter only at the end. Nothing waits on the statistics before the fold; the products
// are not rounded through T as a separate LayerNormCuda's output would be.
//
// PDL (forward_cuda_common.cuh): the first unrolled group of weight loads and an L2 prefetch of
// the next 4 KiB of each weight row are issued before PdlWait; weights never depend on the
// previous kernel. U: 16-byte weight loads in flight per row and lane (kSkinnyUnroll, or
// kSkinnyDeepUnroll for narrow m = 1 GEMMs).
// kHalf (M = 1, fp16; CudaGemm::Options::skinny_half_fold): each 16-byte chunk's eight products
// summed as HFMA2 pairs before the fp32 sum (a quarter of the arithmetic instructions, one fp16
// rounding on each 4-product partial; with kLn, x_j g_j rounded to fp16 first).
// kMinCtas: the CTAs an SM the registers must allow (CudaGemm::Options::skinny_occupancy).
// kTail: CTAs [0, p.tail.tail_ctas) run the tail attention (GemmEpilogue::tail), the GEMM's
// CTAs follow. kProj (with kTail): the GEMM CTAs then run the output projection (SkinnyTailProj).
template <typename T, int M, int kAct, int R, bool kLn, int U = kSkinnyUnroll, bool kHalf = false,
          int kMinCtas = 1, bool kTail = false, bool kProj = false>
__global__ void __launch_bounds__(kSkinnyWarps * 32, kMinCtas)
    SkinnyGemmKernel(const SkinnyArgs<T> p) {
  static_assert(!kHalf || (M == 1 && std::is_same_v<T, __half>));
  static_assert(!kTail || M == 1);
  static_assert(!kProj || kTail);
  // kTail: the attention's CTAs first in the grid, the GEMM's after them.
  int gemm_block = static_cast<int>(blockIdx.x);
  if constexpr (kTail) {
    TailStamp(p.tail.stamps, kTailStampStart);
    if (gemm_block < p.tail.tail_ctas) {
      SkinnyTailAttention<T, kProj>(p.tail, gemm_block);
      return;
    }
    TailStampKind(p.tail.stamps, 1);
    gemm_block -= p.tail.tail_ctas;
  }
  using V = fwd::Vec16<T>;
  constexpr int kV = V::kN, kStep = U * 32 * kV;
  const int lane = threadIdx.x & 31;
  const int n0 = (gemm_block * kSkinnyWarps + (threadIdx.x >> 5)) * R;
  const int m = p.m, n = p.n, k = p.k;
  const T* brow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) brow[r] = p.b + static_cast<int64_t>(min(n0 + r, n - 1)) * p.ldb;
  int kk = lane * kV;
  const bool live = n0 < n;
  const bool have_first = live && kk + (U - 1) * 32 * kV < k;
  const uint64_t wpolicy = WeightPolicy(p.evict_first);
  V first[U][R];
  if (have_first) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        first[u][r] = LoadWeight16<V>(brow[r] + kk + u * 32 * kV, wpolicy);
  }
  // The next stage_elems of each row into shared memory (cp.async), each lane its own chunks, so
  // that no barrier is needed: with the first group, a row's first (U * 32 + stage) chunks are on
  // chip, or in flight, when the input arrives.
  extern __shared__ __align__(16) unsigned char skinny_stage[];
  const int stage_end = have_first ? min(k, kStep + p.stage_elems) : 0;
  T* stage_rows = reinterpret_cast<T*>(skinny_stage) +
                  static_cast<int64_t>(threadIdx.x >> 5) * R * p.stage_elems;
  if (have_first && stage_end > kStep) {
    for (int j = kStep + lane * kV; j < stage_end; j += 32 * kV) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        CpAsyncWeight16(fwd::SmemAddr(stage_rows + r * p.stage_elems + (j - kStep)), brow[r] + j,
                        wpolicy);
      }
    }
    fwd::CpAsyncCommit();
  }
  if (live) {
    constexpr int kLine = 128 / sizeof(T);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int off = max(kStep, stage_end) + lane * kLine;
      if (off < k) PrefetchL2(brow[r] + off);
    }
  }
  // Lane i R + r stores output (i, n0 + r): what its epilogue reads besides the dot product.
  const int out_i = lane / R, out_col = n0 + lane % R;
  const bool stores = live && lane < M * R && out_i < m && out_col < n;
  SkinnyOut out;
  float ln_ws = 0.0f, ln_bs = 0.0f;
  auto load_consts = [&] {
    out.bias = SkinnyLoadBias(p, out_col);
    if constexpr (kLn) {
      ln_ws = p.ln_wsum[out_col];
      ln_bs = p.ln_bsum[out_col];
    }
  };
  if (stores && p.early_epilogue) load_consts();
  if (p.release_early) fwd::PdlTrigger();
  fwd::PdlWait();
  if (!p.release_early) fwd::PdlTrigger();
  if constexpr (kTail) TailStamp(p.tail.stamps, kTailStampPdlDone);
  // kTail: the launch's epoch plus one and the LL words' flag (storing lanes; after the wait:
  // the previous launch's bump).
  uint32_t epoch1 = 0, ll_flag = 0;
  if constexpr (kTail) {
    if (stores) {
      epoch1 = TailEpoch1(p.tail.counters);
      ll_flag = TailLlFlag(epoch1);
    }
  }
  // With kLn every warp takes its part of the statistics.
  if (!kLn && !live) return;
  if (stores && p.early_epilogue) out.resid = SkinnyLoadResid(p, out_i, out_col);

  const T* arow[M];
#pragma unroll
  for (int i = 0; i < M; ++i) arow[i] = p.a + static_cast<int64_t>(min(i, m - 1)) * p.lda;
  __shared__ float ln_part[kLn ? kSkinnyWarps : 1][M][2];
  float ln_sum[M], ln_sq[M];
#pragma unroll
  for (int i = 0; i < M; ++i) ln_sum[i] = ln_sq[i] = 0.0f;
  float acc[M][R];
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;

  auto fma_group = [&](const V(&bv)[R], int kk) {
    V gv;  // the layer norm's weights of these k
    if constexpr (kLn) gv = *reinterpret_cast<const V*>(p.ln_w + kk);
    if constexpr (kHalf) {
      V xv = *reinterpret_cast<const V*>(arow[0] + kk);
      if constexpr (kLn) {
#pragma unroll
        for (int e = 0; e < kV; ++e) xv.v[e] = __hmul(xv.v[e], gv.v[e]);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) acc[0][r] += fwd::HalfPairDot8(&bv[r], &xv);
    } else {
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const V av = *reinterpret_cast<const V*>(arow[i] + kk);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          float x = fwd::ToFloat(av.v[e]);
          if constexpr (kLn) x *= fwd::ToFloat(gv.v[e]);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[i][r] = fmaf(x, fwd::ToFloat(bv[r].v[e]), acc[i][r]);
        }
      }
    }
  };
  if (have_first) {
#pragma unroll
    for (int u = 0; u < U; ++u) fma_group(first[u], kk + u * 32 * kV);
    kk += kStep;
  }
  // The statistics' pass after the first group (whose registers are free again, and whose input
  // loads put A's rows in L1), by every warp of the CTA.
  if constexpr (kLn) SkinnyLnAccumulate<T, M>(arow, k, ln_sum, ln_sq);
  if (live) {
    if (have_first && stage_end > kStep) {
      fwd::CpAsyncWait<0>();  // each lane reads back only the chunks it copied
      for (; kk < stage_end; kk += 32 * kV) {
        V bv[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          bv[r] = *reinterpret_cast<const V*>(stage_rows + r * p.stage_elems + (kk - kStep));
        }
        fma_group(bv, kk);
      }
    }
    for (; kk + (U - 1) * 32 * kV < k; kk += kStep) {
      V bv[U][R];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) bv[u][r] = LoadWeight16<V>(brow[r] + kk + u * 32 * kV, wpolicy);
#pragma unroll
      for (int u = 0; u < U; ++u) fma_group(bv[u], kk + u * 32 * kV);
    }
    for (; kk < k; kk += 32 * kV) {
      V bv[R];
#pragma unroll
      for (int r = 0; r < R; ++r) bv[r] = LoadWeight16<V>(brow[r] + kk, wpolicy);
      fma_group(bv, kk);
    }
    WarpSumAcc(acc);
    if constexpr (kTail) TailStampAfter(p.tail.stamps, kTailStampDot, __float_as_uint(acc[0][0]));
  }
  if constexpr (kLn) {
    SkinnyLnPublish<M>(ln_sum, ln_sq, ln_part);
    __syncthreads();
  }
  if (stores) {
    if (!p.early_epilogue) {
      load_consts();
      out.resid = SkinnyLoadResid(p, out_i, out_col);
    }
    float v = 0.0f;  // this lane's output: acc[out_i][lane % R]
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (lane == i * R + r) v = acc[i][r];
    if constexpr (kLn) {
      const float2 st = LnRowStats<M>(ln_part, out_i, k, p.ln_eps);
      v = st.y * (v - st.x * ln_ws) + ln_bs;
    }
    const T stored = SkinnyStore<T, kAct>(p, out_i, out_col, v, out);
    if constexpr (kTail) {
      if (out_col < p.tail.ll_cols) {  // the column again as the tail's LL word
        uint16_t bits;
        memcpy(&bits, &stored, sizeof(bits));
        StoreRelaxedGpu(p.tail.ll + out_col, ll_flag | bits);
      }
    }
  }
  if constexpr (kProj) SkinnyTailProj<T, U, R, kHalf>(p.tail, gemm_block, epoch1, wpolicy);
  if constexpr (kTail) TailStamp(p.tail.stamps, kTailStampEnd);
}

template <typename T>
SkinnyArgs<T> MakeSkinnyArgs(const GemmParams& p, const GemmEpilogue& e) {
  SkinnyArgs<T> a;
  a.a = static_cast<const T*>(p.a);
  a.lda = p.lda;
  a.b = static_cast<const T*>(p.b);
  a.ldb = p.ldb;
  a.c = static_cast<T*>(p.c);
  a.ldc = p.ldc;
  a.bias = static_cast<const T*>(e.bias);
  a.m = static_cast<int>(p.m);
  a.n = static_cast<int>(p.n);
  a.k = static_cast<int>(p.k);
  a.accumulate = e.accumulate;
  a.ln_w = static_cast<const T*>(e.ln_weight);
  a.ln_b = static_cast<const T*>(e.ln_bias);
  a.ln_eps = e.ln_epsilon;
  a.ln_wsum = e.ln_wsum;
  a.ln_bsum = e.ln_bsum;
  a.key_cache = static_cast<T*>(e.key_cache);
  a.value_cache = static_cast<T*>(e.value_cache);
  a.slots = e.slot_mapping;
  a.kv_col0 = static_cast<int>(e.kv_col0);
  a.kv_width = static_cast<int>(e.kv_width);
  a.release_early = e.release_dependents_early;
  return a;
}

// The CTAs of the tail projection's instantiation kKernel (with `smem` bytes of dynamic shared
// memory: its launches' only value) the device holds at once, in clusters of `cluster` where that
// is > 1. Asked of the occupancy API once per instantiation and cluster size (the same on every
// device of a process in practice, as the split-K kernel's count), not at every launch.
template <auto kKernel>
absl::StatusOr<int64_t> TailProjResidentCtas(int cluster, dim3 grid, dim3 block, size_t smem) {
  static std::atomic<int64_t> asked[kGemmTailMaxClusterSplits + 1];  // 0: not yet
  const int slot = std::max(cluster, 1);
  int64_t resident = asked[slot].load(std::memory_order_relaxed);
  if (resident > 0) return resident;
  if (cluster > 1) {
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg = fwd::PdlClusterConfig(false, static_cast<unsigned>(cluster),
                                                         grid, block, smem, nullptr, attr);
    int clusters = 0;
    CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveClusters(&clusters, kKernel, &cfg));
    resident = int64_t{clusters} * cluster;
  } else {
    int per_sm = 0;
    CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, kKernel, static_cast<int>(block.x), smem));
    ASSIGN_OR_RETURN(const int sms, CurrentDeviceSms());
    resident = int64_t{per_sm} * sms;
  }
  asked[slot].store(resident, std::memory_order_relaxed);
  return resident;
}

// kTail: a.tail is filled (LaunchSkinny), the layer norm fused, the identity activation; the grid
// is the GEMM's, and a.tail's CTAs are added to it.
template <typename T, int M, int R, int U, bool kHalf = false, int kMinCtas = 1, bool kTail = false>
absl::Status LaunchSkinnyUnrolled(const SkinnyArgs<T>& a, bool ln, Activation act, dim3 grid,
                                  cudaStream_t stream, bool pdl) {
  const dim3 block(kSkinnyWarps * 32);
  // How much of each row to stage (a.stage_elems asks): no more than follows the first unrolled
  // group of a row, and no more than the CTA's part of the SM's shared memory when the grid's CTAs
  // are resident together (at most 2048 threads' worth an SM; 1 KiB of it reserved a CTA), so that
  // staging never costs residency. SantaCoder's measured calls (c_fc: 8 CTAs an SM, 2 KiB a row;
  // mlp.c_proj: 2 an SM, 12 KiB) stay within it; wide calls (a StarCoder-sized layer outside the
  // decode chain, an lm_head) stage less instead of running in more waves.
  constexpr int kChunks32 = 32 * 16 / static_cast<int>(sizeof(T)), kStep = U * kChunks32;
  SkinnyArgs<T> b = a;
  if (a.stage_elems > 0) {
    int device = 0, smem_per_sm = 0;
    CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    ASSIGN_OR_RETURN(const int sms, CurrentDeviceSms());
    const int64_t per_sm = std::min<int64_t>((grid.x + sms - 1) / sms, 2048 / (kSkinnyWarps * 32));
    const int64_t per_cta = std::max<int64_t>(0, smem_per_sm / per_sm - 1024);
    const int64_t rest = (a.k - kStep + kChunks32 - 1) / kChunks32 * kChunks32;
    const int64_t elems = std::min<int64_t>(
        {a.stage_elems, per_cta / (kSkinnyWarps * R) / static_cast<int64_t>(sizeof(T)), rest});
    b.stage_elems = static_cast<int>(std::max<int64_t>(0, elems / kChunks32 * kChunks32));
  }
  const size_t smem = size_t{kSkinnyWarps} * R * b.stage_elems * sizeof(T);
  auto launch = [&](auto kernel) -> absl::Status {
    if (smem > 48 * 1024) {
      CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(smem)));
    }
    // kTail with the cluster merge: the head's splits as one cluster (0 elsewhere: none).
    CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdlCluster(pdl, static_cast<unsigned>(b.tail.cluster),
                                                    kernel, grid, block, smem, stream, b));
    return absl::OkStatus();
  };
  if constexpr (kTail) {
    // The tail's CTAs, then the GEMM's (padded to a multiple of the cluster size with the cluster
    // merge).
    grid.x = static_cast<unsigned>(a.tail.tail_ctas + a.tail.gemm_ctas);
    if (a.tail.proj_n > 0) {
      // The projection: the GEMM CTAs wait for the attention, which waits for every GEMM CTA's
      // columns, so every CTA of the grid must be resident at once (3 an SM at 128 threads: the
      // registers are bounded for it), or the launch could hang: refused where it may not be.
      constexpr auto kernel = SkinnyGemmKernel<T, M, 0, R, true, U, kHalf, 3, true, true>;
      ASSIGN_OR_RETURN(const int64_t resident,
                       TailProjResidentCtas<kernel>(b.tail.cluster, grid, block, smem));
      if (resident < grid.x) {
        return absl::UnimplementedError(
            absl::StrCat("SkinnyGemmCuda: the tail's projection needs its ", grid.x,
                         " CTAs resident at once; the device holds ", resident));
      }
      return launch(kernel);
    }
    return launch(SkinnyGemmKernel<T, M, 0, R, true, U, kHalf, 1, true>);
  }
  switch (act) {
    case Activation::kIdentity:
      return ln ? launch(SkinnyGemmKernel<T, M, 0, R, true, U, kHalf, kMinCtas>)
                : launch(SkinnyGemmKernel<T, M, 0, R, false, U, kHalf, kMinCtas>);
    case Activation::kGeluTanh:
      return ln ? launch(SkinnyGemmKernel<T, M, 1, R, true, U, kHalf, kMinCtas>)
                : launch(SkinnyGemmKernel<T, M, 1, R, false, U, kHalf, kMinCtas>);
    case Activation::kGeluErf:
      return absl::UnimplementedError("SkinnyGemmCuda: GELU (erf) is not fused");
  }
  return absl::OkStatus();
}

// GemmEpilogue::tail checked and cut into the kernel's SkinnyTailArgs (Unimplemented where the
// kernel does not take it; InvalidArgument for a tail that cannot be meant).
template <typename T>
absl::Status FillSkinnyTail(const GemmParams& p, const GemmEpilogue& e, int gemm_ctas,
                            SkinnyTailArgs<T>* t) {
  const GemmTailAttention& g = e.tail;
  if (e.ln_weight == nullptr || e.key_cache == nullptr || e.activation != Activation::kIdentity ||
      e.accumulate || p.m != 1) {
    return absl::UnimplementedError(
        "SkinnyGemmCuda: the tail attention needs m = 1, the fused layer norm and KV write");
  }
  if (g.head_dim != kGemmTailHeadDim) {
    return absl::UnimplementedError("SkinnyGemmCuda: the tail attention takes head_dim 128");
  }
  if (g.heads <= 0 || g.kv_heads <= 0 || g.heads % g.kv_heads != 0 ||
      e.kv_width != int64_t{g.kv_heads} * g.head_dim || int64_t{g.heads} * g.head_dim > e.kv_col0 ||
      g.block_size <= 0 || (g.block_size & (g.block_size - 1)) != 0 || g.max_context <= 0 ||
      g.block_table == nullptr || g.context_len == nullptr || g.workspace == nullptr) {
    return absl::InvalidArgumentError("SkinnyGemmCuda: bad tail attention");
  }
  const int splits = (g.max_context + kGemmTailTokens - 1) / kGemmTailTokens;
  if (int64_t{g.heads} * splits > kGemmTailMaxCtas ||
      g.workspace_bytes < GemmTailAttentionWorkspaceBytes(g.heads)) {
    return absl::UnimplementedError("SkinnyGemmCuda: tail attention too long for its CTAs");
  }
  const int64_t ll_cols = e.kv_col0 + 2 * e.kv_width;  // q, k and v: the LL words
  if (ll_cols > int64_t{kGemmTailLlColsPerHead} * g.heads) {
    return absl::UnimplementedError("SkinnyGemmCuda: the tail attention's k / v must follow q");
  }
  const T* c = static_cast<const T*>(p.c);
  t->q = c;
  t->k_new = c + e.kv_col0;
  t->v_new = c + e.kv_col0 + e.kv_width;
  t->key_cache = static_cast<const T*>(e.key_cache);
  t->value_cache = static_cast<const T*>(e.value_cache);
  t->out = static_cast<T*>(g.output);
  t->block_table = g.block_table;
  t->context_len = g.context_len;
  t->heads = g.heads;
  t->group = g.heads / g.kv_heads;
  t->kv_width = static_cast<int>(e.kv_width);
  t->block_shift = __builtin_ctz(static_cast<unsigned>(g.block_size));
  t->splits = splits;
  t->max_context = g.max_context;
  t->cluster = g.cluster_merge && splits > 1 && splits <= kGemmTailMaxClusterSplits ? splits : 0;
  t->tail_ctas = g.heads * splits;
  // With the cluster merge the clusters tile the grid: GEMM CTAs past n (no columns) are added to
  // make the grid whole clusters.
  t->gemm_ctas = t->cluster > 0 ? (gemm_ctas + splits - 1) / splits * splits : gemm_ctas;
  t->scale_log2 = g.scale * 1.4426950408889634f;
  char* w = static_cast<char*>(g.workspace);
  t->counters = reinterpret_cast<int*>(w);
  t->ll = reinterpret_cast<uint32_t*>(w + GemmTailCounterBytes(g.heads));
  t->ll_cols = static_cast<int>(ll_cols);
  t->partials =
      reinterpret_cast<float*>(w + GemmTailCounterBytes(g.heads) + GemmTailLlBytes(g.heads));
  t->stamps = g.stamps;
  if (g.proj_weight != nullptr) {
    // The projection by the GEMM CTAs (SkinnyTailProj): rows of one unrolled group, eight a CTA
    // over the CTAs that store QKV columns, and those columns exactly q / k / v (every CTA that
    // reads the residual row is then one the attention waits for). head_dim is 128 here, so the
    // bound on proj_k keeps the heads within the one warp that polls their words.
    constexpr int kProjMaxK = kSkinnyDeepUnroll * 32 * (16 / static_cast<int>(sizeof(T)));
    const int64_t proj_k = int64_t{g.heads} * g.head_dim;
    if (g.hidden == nullptr || g.proj_n <= 0 || g.proj_n > p.n || proj_k > kProjMaxK ||
        p.n != ll_cols || e.kv_col0 != proj_k ||
        (TailDoneWord(g.heads) + g.heads) * sizeof(int) > GemmTailCounterBytes(g.heads) ||
        reinterpret_cast<uintptr_t>(g.proj_weight) % 16 != 0) {
      return absl::UnimplementedError(
          "SkinnyGemmCuda: the tail's projection needs heads x head_dim <= 2048, at most n rows, "
          "C's columns exactly q / k / v and 16-byte aligned weights");
    }
    t->proj_w = static_cast<const T*>(g.proj_weight);
    t->proj_b = static_cast<const T*>(g.proj_bias);
    t->hidden = static_cast<T*>(g.hidden);
    t->proj_n = g.proj_n;
    t->proj_k = static_cast<int>(proj_k);
  }
  return absl::OkStatus();
}

// o.deep_max_warps > 0: an m = 1 call of at most that many warps runs with kSkinnyDeepUnroll
// (instantiated for 2 rows per warp only).
template <typename T, int M, int R>
absl::Status LaunchSkinny(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream,
                          const SkinnyOptions& o) {
  const bool pdl = o.pdl;
  const int per_block = kSkinnyWarps * R;
  const int64_t blocks = (p.n + per_block - 1) / per_block;
  SkinnyArgs<T> a = MakeSkinnyArgs<T>(p, e);
  // m = 1: stage up to stage_bytes of each row (LaunchSkinnyUnrolled caps it).
  if constexpr (M == 1) a.stage_elems = std::max(0, o.stage_bytes) / static_cast<int>(sizeof(T));
  a.early_epilogue = o.early_epilogue;
  a.evict_first = o.evict_first;
  const bool ln = e.ln_weight != nullptr;
  const dim3 grid(static_cast<unsigned>(blocks));
  // m = 1, 2 rows a warp: narrow enough for kSkinnyDeepUnroll (o.deep_max_warps).
  [[maybe_unused]] const bool deep =
      o.deep_max_warps > 0 && blocks * kSkinnyWarps <= o.deep_max_warps;
  if (e.tail.output != nullptr) {
    if constexpr (M == 1 && R == 2) {
      if (!deep) return absl::UnimplementedError("SkinnyGemmCuda: the tail needs the deep unroll");
      RETURN_IF_ERROR(FillSkinnyTail(p, e, static_cast<int>(blocks), &a.tail));
      if constexpr (std::is_same_v<T, __half>) {
        if (o.half_fold) {
          return LaunchSkinnyUnrolled<T, M, R, kSkinnyDeepUnroll, true, 1, true>(
              a, ln, e.activation, grid, stream, pdl);
        }
      }
      return LaunchSkinnyUnrolled<T, M, R, kSkinnyDeepUnroll, false, 1, true>(a, ln, e.activation,
                                                                              grid, stream, pdl);
    } else {
      return absl::UnimplementedError("SkinnyGemmCuda: the tail attention needs m = 1, 2 rows");
    }
  }
  if constexpr (M == 1 && R == 2) {
    if constexpr (std::is_same_v<T, __half>) {
      // Only where it was measured faster (H200, 2026-12-04 ~14:48 UTC, gemm_bench --chain only):
      // SantaCoder's four layer GEMMs 30.8 -> 28.9 us, StarCoder's 200.6 -> 205.4 us (k 6144 and
      // 24576, no deep unroll): narrow calls (the deep unroll) and k <= kSkinnyHalfMaxK.
      if (o.half_fold && (deep || p.k <= kSkinnyHalfMaxK)) {
        if (deep) {
          return o.occupancy ? LaunchSkinnyUnrolled<T, M, R, kSkinnyDeepUnroll, true,
                                                    kSkinnyDeepOccupancyCtas>(a, ln, e.activation,
                                                                              grid, stream, pdl)
                             : LaunchSkinnyUnrolled<T, M, R, kSkinnyDeepUnroll, true>(
                                   a, ln, e.activation, grid, stream, pdl);
        }
        return o.occupancy
                   ? LaunchSkinnyUnrolled<T, M, R, kSkinnyUnroll, true, kSkinnyOccupancyCtas>(
                         a, ln, e.activation, grid, stream, pdl)
                   : LaunchSkinnyUnrolled<T, M, R, kSkinnyUnroll, true>(a, ln, e.activation, grid,
                                                                        stream, pdl);
      }
    }
    if (deep) {
      return LaunchSkinnyUnrolled<T, M, R, kSkinnyDeepUnroll>(a, ln, e.activation, grid, stream,
                                                              pdl);
    }
  }
  return LaunchSkinnyUnrolled<T, M, R, kSkinnyUnroll>(a, ln, e.activation, grid, stream, pdl);
}

// --- Split-K skinny kernel (CudaGemm::Options::skinny_split_k) -------------------------------
//
// The weight stream is cut into steps of kSplitRows rows x 32 * 16 bytes (one 16-byte load per
// lane and row). Row group g (rows g R .. g R + R - 1) has I = ceil(k / (32 kV)) steps; the G I
// steps of the whole GEMM, row group after row group, are dealt out to W warps in W contiguous,
// equal ranges: warp w streams steps [w G I / W, (w + 1) G I / W). W is what fits on the device at
// once (one wave: every SM gets the same share and all finish together) or, for a small GEMM,
// fewer: no more warps than batches of SplitUnroll(M) steps. A warp streams its range a batch at a
// time (SplitUnroll(M) x kSplitRows 16-byte loads in flight per lane) with the next batch
// prefetched into L2. A row group covered by one warp is finished by that warp. A row group
// shared by several warps gets one partial sum (M x R floats) from each into the workspace; the
// last to arrive (an atomic counter, which it resets to zero) adds them in warp order
// (deterministic) and applies the epilogue: no second launch, nothing to clear between launches.
//
// Every warp's range is non-empty (W <= G I), so a shared row group's contributors are the warps
// first..last that hold its first and last step, and all of them but `first` start inside it.
// The counter of a shared group is indexed by `last` (a warp starts inside at most one group);
// each warp has two partial slots: its first row group (head) and its last one (tail).
//
// Workspace: counters [max warps] (zero on entry and exit), then partials [2 x max warps][32];
// max warps = SMs x kSplitMaxCtasPerSm x kSplitWarps.

constexpr int kSplitWarps = 4;
constexpr int kSplitRows = 2;  // weight rows per step
// Steps per batch (16-byte loads in flight per row and lane): 8, or 4 for M >= 4, whose A rows
// take the registers.
constexpr int SplitUnroll(int m) { return m >= 4 ? 4 : 8; }
constexpr int kSplitMaxCtasPerSm = 8;
// Registers capped at 128 (4 CTAs of 128 threads per SM): 16 warps x 4-8 KiB of weights in flight
// per SM, and without the cap ptxas hoists a whole batch of A loads (up to 250 registers).
constexpr int kSplitMinCtasPerSm = 4;
constexpr int kSplitSlot = 32;  // floats per partial: M x R <= 32, one per lane
static_assert(CudaGemm::kSkinnyMaxM * kSplitRows <= kSplitSlot);

int64_t SplitMaxWarps(int num_sms) { return int64_t{num_sms} * kSplitMaxCtasPerSm * kSplitWarps; }

template <typename T>
struct SplitArgs {
  SkinnyArgs<T> g;              // operands and epilogue
  int64_t steps_per_group = 0;  // I (at least 1)
  int64_t total_steps = 0;      // G I
  int num_warps = 0;            // W, 1..G I
  int* counters = nullptr;      // [max warps]
  float* partials = nullptr;    // [2 max warps][kSplitSlot]
};

// 16 bytes at ptr if `ok`, else zeros (ptr is not read), without a branch; kept as four 32-bit
// words (a Vec16 of 16-bit elements would take a register per element). Weights (kStream) are
// read once: not kept in L1, the L2 fetch widened to 256 bytes. A and the layer-norm parameters
// are read by every warp: plain (coherent, L1-cached) loads, as A is the previous kernel's output.
template <bool kStream>
__device__ __forceinline__ uint4 LoadOrZero(const void* ptr, bool ok) {
  uint4 u;
  if constexpr (kStream) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
        " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
        " @p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
        : "l"(ptr), "r"(static_cast<int>(ok)));
  } else {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
        " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
        " @p ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
        : "l"(ptr), "r"(static_cast<int>(ok)));
  }
  return u;
}

// The two 16-bit elements of a word as floats (element 0 is the low half).
template <typename T>
__device__ __forceinline__ float2 Unpack2(uint32_t w) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h;
    static_assert(sizeof(h) == sizeof(w));
    memcpy(&h, &w, sizeof(w));
    return __half22float2(h);
  } else {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  }
}

// Element e (0..7) of a 16-byte word group as a float.
template <typename T>
__device__ __forceinline__ void Unpack8(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 t = Unpack2<T>(w[q]);
    f[2 * q] = t.x;
    f[2 * q + 1] = t.y;
  }
}

// The warp whose range holds step `step` (the largest w with w total / W <= step).
__device__ __forceinline__ int64_t SplitWarpOf(int64_t step, int64_t total, int64_t warps) {
  return ((step + 1) * warps - 1) / total;
}

// WarpRowSums over the CTA (each thread takes every kSplitWarps * 32-th 16-byte group), the warps'
// sums added through `red` in shared memory; then per_row(i, cta_sum) for each row i (every
// thread gets the CTA's sum).
template <typename T, int M, bool kSquares, typename F>
__device__ __forceinline__ void CtaRowSums(const T* const (&arow)[M], int k, const float (&mean)[M],
                                           float (&red)[kSplitWarps][M], F&& per_row) {
  constexpr int kV = fwd::Vec16<T>::kN;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  WarpRowSums<T, M, kSquares>(arow, threadIdx.x * kV, kSplitWarps * 32 * kV, k, mean,
                              [&](int i, float sum) {
                                if (lane == 0) red[warp][i] = sum;
                              });
  __syncthreads();
#pragma unroll
  for (int i = 0; i < M; ++i) {
    float t = 0.0f;
#pragma unroll
    for (int q = 0; q < kSplitWarps; ++q) t += red[q][i];
    per_row(i, t);
  }
}

// PDL as SkinnyGemmKernel: the first batch of weight loads and the L2 prefetch of the second are
// issued before PdlWait; A, the workspace and the outputs are touched only after it (the
// workspace is also used by the previous split-K GEMM, which has completed by then).
template <typename T, int M, int kAct, bool kLn>
__global__ void __launch_bounds__(kSplitWarps * 32, kSplitMinCtasPerSm)
    SplitKSkinnyGemmKernel(const SplitArgs<T> s) {
  using V = fwd::Vec16<T>;
  constexpr int R = kSplitRows, U = SplitUnroll(M), kV = V::kN, kStep = 32 * kV;
  static_assert(kV == 8, "16-bit elements");
  constexpr int kLine = 128 / sizeof(T);  // elements per 128-byte line
  constexpr int kLinesPerStep = kStep / kLine;
  static_assert(U * kLinesPerStep <= 32, "one L2 prefetch per lane and row covers a batch");
  const SkinnyArgs<T>& p = s.g;
  const int lane = threadIdx.x & 31;
  const int64_t w = int64_t{blockIdx.x} * kSplitWarps + (threadIdx.x >> 5);
  const int64_t I = s.steps_per_group, total = s.total_steps, W = s.num_warps;
  const int m = p.m, n = p.n, k = p.k;
  const bool live = w < W;
  const int64_t begin = live ? w * total / W : 0;
  const int64_t end = live ? (w + 1) * total / W : 0;

  // The current row group g and the steps [sl, se) of it that this warp streams.
  int64_t g = begin / I;
  int64_t sl = begin - g * I, se = min(end - g * I, I);
  auto set_rows = [&](int64_t group, const T*(&rows)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      rows[r] = p.b + min(group * R + r, static_cast<int64_t>(n - 1)) * p.ldb;
    }
  };
  const T* brow[R];
  set_rows(g, brow);
  uint4 bv[U][R];
  auto load_batch = [&]() {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kk = (sl + u) * kStep + lane * kV;
      const bool ok = sl + u < se && kk < k;
#pragma unroll
      for (int r = 0; r < R; ++r) bv[u][r] = LoadOrZero<true>(brow[r] + kk, ok);
    }
  };
  // The batch after the one at sl (in this group, else the next group's first one, if this warp
  // has it) into L2: lane l takes line l % kLinesPerStep of step l / kLinesPerStep of each row.
  auto prefetch_next = [&]() {
    int64_t ps = sl + U, pe = se;
    const T* prow[R];
    if (ps < se) {
#pragma unroll
      for (int r = 0; r < R; ++r) prow[r] = brow[r];
    } else {
      if ((g + 1) * I >= end) return;
      ps = 0;
      pe = min(end - (g + 1) * I, I);
      set_rows(g + 1, prow);
    }
    const int64_t step = ps + lane / kLinesPerStep;
    const int64_t off = step * kStep + (lane % kLinesPerStep) * kLine;
    if (lane < U * kLinesPerStep && step < pe && off < k) {
#pragma unroll
      for (int r = 0; r < R; ++r) PrefetchL2(prow[r] + off);
    }
  };
  if (live) {
    load_batch();
    prefetch_next();
  }
  fwd::PdlWait();
  fwd::PdlTrigger();

  const T* arow[M];
#pragma unroll
  for (int i = 0; i < M; ++i) arow[i] = p.a + static_cast<int64_t>(min(i, m - 1)) * p.lda;
  float mean[M], rstd[M];
  if constexpr (kLn) {
    // Row statistics once per CTA (two passes, as SkinnyGemmKernel), before idle warps leave.
    __shared__ float red[2][kSplitWarps][M];
    CtaRowSums<T, M, false>(arow, k, mean, red[0], [&](int i, float sum) { mean[i] = sum / k; });
    CtaRowSums<T, M, true>(arow, k, mean, red[1],
                           [&](int i, float sq) { rstd[i] = rsqrtf(sq / k + p.ln_eps); });
  }
  if (!live) return;

  float acc[M][R];
  // The batch in bv (steps sl .. sl + U - 1; those past se or k are zeros, and so is their A).
  auto fma_batch = [&]() {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kk64 = (sl + u) * kStep + lane * kV;
      const bool ok = sl + u < se && kk64 < k;
      const int kk = ok ? static_cast<int>(kk64) : 0;
      float b[R][kV];
#pragma unroll
      for (int r = 0; r < R; ++r) Unpack8<T>(bv[u][r], b[r]);
      float lw[kV], lb[kV];
      if constexpr (kLn) {
        Unpack8<T>(LoadOrZero<false>(p.ln_w + kk, ok), lw);
        Unpack8<T>(LoadOrZero<false>(p.ln_b + kk, ok), lb);
      }
#pragma unroll
      for (int i = 0; i < M; ++i) {
        float x[kV];
        Unpack8<T>(LoadOrZero<false>(arow[i] + kk, ok), x);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          if constexpr (kLn) {
            x[e] = ok ? fwd::ToFloat(fwd::FromFloat<T>((x[e] - mean[i]) * rstd[i] * lw[e] + lb[e]))
                      : 0.0f;
          }
#pragma unroll
          for (int r = 0; r < R; ++r) acc[i][r] = fmaf(x[e], b[r][e], acc[i][r]);
        }
      }
    }
  };

  bool loaded = true;  // bv holds the first batch (loaded before PdlWait)
  bool head = true;    // g is this warp's first row group
  for (;;) {
    const bool whole = sl == 0 && se == I;
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;
    for (; sl < se; sl += U) {
      if (!loaded) {
        load_batch();
        prefetch_next();
      }
      loaded = false;
      fma_batch();
    }
    WarpSumAcc(acc);
    // Lane i * R + r owns output (i, g R + r).
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (lane == i * R + r) v = acc[i][r];
    bool finish = true;
    if (!whole) {
      float* slot = s.partials + (2 * w + (head ? 0 : 1)) * kSplitSlot;
      if (lane < M * R) __stcg(slot + lane, v);
      __threadfence();
      __syncwarp();
      const int64_t first = SplitWarpOf(g * I, total, W);
      const int64_t last = SplitWarpOf((g + 1) * I - 1, total, W);
      int arrived = 0;
      if (lane == 0) arrived = atomicAdd(s.counters + last, 1);
      arrived = __shfl_sync(0xffffffffu, arrived, 0);
      finish = arrived == last - first;
      if (finish) {
        __threadfence();
        v = 0.0f;
#pragma unroll 4
        for (int64_t c = first; c <= last; ++c) {
          const bool c_head = c * total / W >= g * I;
          const float* ps = s.partials + (2 * c + (c_head ? 0 : 1)) * kSplitSlot;
          if (lane < M * R) v += __ldcg(ps + lane);
        }
        if (lane == 0) s.counters[last] = 0;
      }
    }
    if (finish) {
      const int i = lane / R;
      const int64_t col = g * R + lane % R;
      if (lane < M * R && i < m && col < n) {
        const int c = static_cast<int>(col);
        SkinnyStore<T, kAct>(p, i, c, v, {SkinnyLoadBias(p, c), SkinnyLoadResid(p, i, c)});
      }
    }
    if ((g + 1) * I >= end) break;
    ++g;
    head = false;
    sl = 0;
    se = min(end - g * I, I);
    set_rows(g, brow);
  }
}

template <typename T, int M>
absl::Status LaunchSplitK(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream,
                          void* workspace, size_t workspace_bytes, const SkinnySplitKOptions& o) {
  using Kernel = void (*)(SplitArgs<T>);
  const bool ln = e.ln_weight != nullptr;
  Kernel kernel = nullptr;
  int act = 0;
  switch (e.activation) {
    case Activation::kIdentity:
      kernel = ln ? SplitKSkinnyGemmKernel<T, M, 0, true> : SplitKSkinnyGemmKernel<T, M, 0, false>;
      break;
    case Activation::kGeluTanh:
      kernel = ln ? SplitKSkinnyGemmKernel<T, M, 1, true> : SplitKSkinnyGemmKernel<T, M, 1, false>;
      act = 1;
      break;
    case Activation::kGeluErf:
      return absl::UnimplementedError("SkinnySplitKGemmCuda: GELU (erf) is not fused");
  }
  ASSIGN_OR_RETURN(const int sms, CurrentDeviceSms());
  if (workspace == nullptr || workspace_bytes < SkinnySplitKWorkspaceBytes(sms)) {
    return absl::InvalidArgumentError(absl::StrCat("SkinnySplitKGemmCuda: workspace of ",
                                                   workspace_bytes, " bytes, needs ",
                                                   SkinnySplitKWorkspaceBytes(sms)));
  }
  int per_sm = o.ctas_per_sm;
  if (per_sm <= 0) {
    // CTAs of this kernel that fit on one SM (registers); the same on every device of a process
    // in practice, so asked once per kernel.
    static std::atomic<int> fits[2][2];
    per_sm = fits[act][ln].load(std::memory_order_relaxed);
    if (per_sm <= 0) {
      CUDA_RETURN_IF_ERROR(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kSplitWarps * 32, 0));
      fits[act][ln].store(per_sm, std::memory_order_relaxed);
    }
  }
  per_sm = std::clamp(per_sm, 1, kSplitMaxCtasPerSm);

  constexpr int64_t kStep = 32 * fwd::Vec16<T>::kN;
  SplitArgs<T> s;
  s.g = MakeSkinnyArgs<T>(p, e);
  const int64_t groups = (p.n + kSplitRows - 1) / kSplitRows;
  s.steps_per_group = std::max<int64_t>(1, (p.k + kStep - 1) / kStep);
  s.total_steps = groups * s.steps_per_group;
  const int64_t batches = (s.total_steps + SplitUnroll(M) - 1) / SplitUnroll(M);
  s.num_warps = static_cast<int>(std::min<int64_t>(int64_t{sms} * per_sm * kSplitWarps, batches));
  if (s.total_steps > (int64_t{1} << 62) / (s.num_warps + 1)) {
    return absl::UnimplementedError("SkinnySplitKGemmCuda: shape too large");
  }
  s.counters = static_cast<int*>(workspace);
  s.partials =
      reinterpret_cast<float*>(static_cast<char*>(workspace) + SkinnySplitKCounterBytes(sms));
  const int64_t blocks = (s.num_warps + kSplitWarps - 1) / kSplitWarps;
  CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdl(o.pdl, kernel, dim3(static_cast<unsigned>(blocks)),
                                           dim3(kSplitWarps * 32), stream, s));
  return absl::OkStatus();
}

// What both skinny kernels accept. OK with m or n zero (nothing to do: *empty set).
absl::Status CheckSkinny(const GemmParams& p, const GemmEpilogue& e, const char* who, bool* empty) {
  RETURN_IF_ERROR(CheckGemmCuda(p, who));
  if (e.accumulate && e.activation != Activation::kIdentity) {
    return absl::InvalidArgumentError("GEMM: accumulate needs the identity activation");
  }
  *empty = p.m == 0 || p.n == 0;
  if (*empty) return absl::OkStatus();
  if (p.m > CudaGemm::kSkinnyMaxM || p.k % 8 != 0 || p.lda % 8 != 0 || p.ldb % 8 != 0 ||
      !fwd::Aligned16(p.a) || !fwd::Aligned16(p.b) || e.activation == Activation::kGeluErf) {
    return absl::UnimplementedError(absl::StrCat(who, ": shape or alignment not supported"));
  }
  if ((e.ln_weight != nullptr) != (e.ln_bias != nullptr) ||
      (e.ln_weight && (!fwd::Aligned16(e.ln_weight) || !fwd::Aligned16(e.ln_bias)))) {
    return absl::UnimplementedError(
        absl::StrCat(who, ": layer norm needs aligned weight and bias"));
  }
  if (e.key_cache != nullptr) {
    if (!e.value_cache || !e.slot_mapping || e.kv_col0 < 0 || e.kv_width <= 0 ||
        e.kv_col0 + 2 * e.kv_width > p.n || e.accumulate) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": bad fused KV-cache write"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SkinnyGemmCuda(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream,
                            const SkinnyOptions& o) {
  bool empty = false;
  RETURN_IF_ERROR(CheckSkinny(p, e, "SkinnyGemmCuda", &empty));
  if (empty) return absl::OkStatus();
  if (e.ln_weight != nullptr && (e.ln_wsum == nullptr || e.ln_bsum == nullptr)) {
    return absl::UnimplementedError("SkinnyGemmCuda: a fused layer norm needs ln_wsum and ln_bsum");
  }
  auto with_rows = [&]<typename T, int R>() -> absl::Status {
    if (p.m == 1) return LaunchSkinny<T, 1, R>(p, e, stream, o);
    SkinnyOptions wide;  // the m = 1 options do not apply
    wide.pdl = o.pdl;
    if (p.m == 2) return LaunchSkinny<T, 2, R>(p, e, stream, wide);
    if (p.m <= 4) return LaunchSkinny<T, 4, R>(p, e, stream, wide);
    return LaunchSkinny<T, 8, R>(p, e, stream, wide);
  };
  auto with_type = [&]<typename T>() -> absl::Status {
    switch (o.rows_per_warp) {
      case 1:
        return with_rows.template operator()<T, 1>();
      case 4:
        return with_rows.template operator()<T, 4>();
      default:
        return with_rows.template operator()<T, 2>();
    }
  };
  return p.dtype == DType::kF16 ? with_type.template operator()<__half>()
                                : with_type.template operator()<__nv_bfloat16>();
}

namespace {

// One warp a column: its two dot products over k, fp32, lanes strided by 16-byte chunks.
template <typename T>
__global__ void LayerNormFoldSumsKernel(const T* b, int64_t ldb, int64_t n, int64_t k,
                                        const T* ln_w, const T* ln_b, float* wsum, float* bsum) {
  using V = fwd::Vec16<T>;
  constexpr int kV = V::kN;
  const int64_t col = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (col >= n) return;
  const T* row = b + col * ldb;
  float ws = 0.0f, bs = 0.0f;
  for (int64_t j = int64_t{lane} * kV; j < k; j += 32 * kV) {
    const V bv = *reinterpret_cast<const V*>(row + j);
    const V wv = *reinterpret_cast<const V*>(ln_w + j);
    const V lv = *reinterpret_cast<const V*>(ln_b + j);
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      const float x = fwd::ToFloat(bv.v[e]);
      ws = fmaf(x, fwd::ToFloat(wv.v[e]), ws);
      bs = fmaf(x, fwd::ToFloat(lv.v[e]), bs);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ws += __shfl_xor_sync(0xffffffffu, ws, o);
    bs += __shfl_xor_sync(0xffffffffu, bs, o);
  }
  if (lane == 0) {
    wsum[col] = ws;
    bsum[col] = bs;
  }
}

}  // namespace

absl::Status LayerNormFoldSumsCuda(const void* b, int64_t ldb, int64_t n, int64_t k, DType dtype,
                                   const void* ln_weight, const void* ln_bias, float* wsum,
                                   float* bsum, cudaStream_t stream) {
  if (dtype != DType::kF16 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError("LayerNormFoldSumsCuda: fp16 or bf16 weights");
  }
  if (n < 0 || k % 8 != 0 || ldb % 8 != 0 || !fwd::Aligned16(b) || !fwd::Aligned16(ln_weight) ||
      !fwd::Aligned16(ln_bias) || wsum == nullptr || bsum == nullptr) {
    return absl::InvalidArgumentError("LayerNormFoldSumsCuda: shape or alignment not supported");
  }
  if (n == 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>((n * 32 + kThreads - 1) / kThreads));
  if (dtype == DType::kF16) {
    LayerNormFoldSumsKernel<<<grid, kThreads, 0, stream>>>(
        static_cast<const __half*>(b), ldb, n, k, static_cast<const __half*>(ln_weight),
        static_cast<const __half*>(ln_bias), wsum, bsum);
  } else {
    LayerNormFoldSumsKernel<<<grid, kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(b), ldb, n, k,
        static_cast<const __nv_bfloat16*>(ln_weight), static_cast<const __nv_bfloat16*>(ln_bias),
        wsum, bsum);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

size_t SkinnySplitKCounterBytes(int num_sms) {
  return static_cast<size_t>((SplitMaxWarps(num_sms) * sizeof(int) + 255) / 256 * 256);
}

size_t SkinnySplitKWorkspaceBytes(int num_sms) {
  return SkinnySplitKCounterBytes(num_sms) +
         static_cast<size_t>(SplitMaxWarps(num_sms)) * 2 * kSplitSlot * sizeof(float);
}

absl::Status SkinnySplitKGemmCuda(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream,
                                  void* workspace, size_t workspace_bytes,
                                  const SkinnySplitKOptions& options) {
  if (e.tail.output != nullptr) {
    return absl::UnimplementedError("SkinnySplitKGemmCuda: no tail attention");
  }
  bool empty = false;
  RETURN_IF_ERROR(CheckSkinny(p, e, "SkinnySplitKGemmCuda", &empty));
  if (empty) return absl::OkStatus();
  auto with_type = [&]<typename T>() -> absl::Status {
    if (p.m == 1) return LaunchSplitK<T, 1>(p, e, stream, workspace, workspace_bytes, options);
    if (p.m == 2) return LaunchSplitK<T, 2>(p, e, stream, workspace, workspace_bytes, options);
    if (p.m <= 4) return LaunchSplitK<T, 4>(p, e, stream, workspace, workspace_bytes, options);
    return LaunchSplitK<T, 8>(p, e, stream, workspace, workspace_bytes, options);
  };
  return p.dtype == DType::kF16 ? with_type.template operator()<__half>()
                                : with_type.template operator()<__nv_bfloat16>();
}

}  // namespace mqa
