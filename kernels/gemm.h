// The GEMM of every Linear layer, in PyTorch's weight layout (row-major, B is [out, in]):
//   C[m, n] = alpha * sum_k A[m, k] * B[n, k] + beta * C[m, n]
//   GemmCpu (gemm_cpu.cc): OpenBLAS cblas_sgemm where CMake found it (MQA_WITH_CBLAS), plain
//     loops otherwise;
//   CudaGemm (gemm_cuda.h, with the CUDA backend): cuBLASLt and the skinny decode kernels
//     behind the same params, plus a stream.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/dtype.h"

namespace mqa {

struct GemmParams {
  const void* a = nullptr;  // [m, k], row stride lda (elements)
  const void* b = nullptr;  // [n, k], row stride ldb
  void* c = nullptr;        // [m, n], row stride ldc; must not overlap a or b
  int64_t lda = 0;
  int64_t ldb = 0;
  int64_t ldc = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: C is write-only (its old contents, even NaN, are ignored)
  DType dtype = DType::kF32;
};

// A batch-1 decode step's attention done by the QKV projection's own launch (GemmEpilogue::tail,
// LinearFusion::tail; the CUDA skinny kernel only): after the GEMM's CTAs have written the
// step's q / k / v row (and, with the fused KV-cache write, the cache), heads x splits extra CTAs
// each attend one query head over one split of kGemmTailTokens cached positions (their rows
// loaded before the GEMM finishes; q and the newest k / v handed over as flagged LL words, which
// the GEMM writes beside C) and a head's splits merge their partials into `output`. Query head h is
// C's columns [h D, (h + 1) D); its KV head h / (heads / kv_heads) is the fused write's columns
// (GemmEpilogue::kv_col0 / kv_width) and cache rows. Exact softmax attention as PagedAttention
// computes it, in fp32, rounded once.
inline constexpr int kGemmTailTokens = 64;    // cached positions a split
inline constexpr int kGemmTailHeadDim = 128;  // the one head_dim it takes
inline constexpr int kGemmTailMaxCtas = 128;  // heads x splits at most (< any H100/H200's SMs)
struct GemmTailAttention {
  void* output = nullptr;  // [heads D] of C's dtype: the attention's output row; null: no tail
  // Device: the sequence's block ids, ceil(max_context / block_size) entries at least (all read;
  // those past the context are not used).
  const int32_t* block_table = nullptr;
  const int32_t* context_len = nullptr;  // device, one value: positions attended (the new one too)
  int heads = 0, kv_heads = 0, head_dim = 0, block_size = 0;
  int max_context = 0;  // bound on *context_len (a graph's bucket): ceil(/ kGemmTailTokens) splits
  float scale = 1.0f;
  // Counters, LL words and partials (GemmTailAttentionWorkspaceBytes): zeroed once before the
  // first use; each launch leaves its counts zeroed and the epoch of the LL words' flag advanced,
  // so launches on one workspace must be stream-ordered (as a model's layers are).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // The splits of a head (2 to kGemmTailMaxClusterSplits of them) as one thread-block cluster:
  // the others push their partials into the first's shared memory (st.async, completing bytes on
  // its mbarrier) and the first merges them, instead of the partials going through L2 and the
  // last split to count in (an atomic round trip) merging. The launch's GEMM CTAs are padded to a
  // multiple of the splits (the clusters tile the grid, the attention's CTAs first). Elsewhere (one
  // split, more than 8) the L2 merge.
  bool cluster_merge = false;
  // Diagnostics (mqabench --tail-timeline): thread 0 of every CTA of the launch writes %globaltimer
  // at the GemmTailStamp events into its kGemmTailStampWords words at stamps + CTA x
  // kGemmTailStampWords (the attention's CTAs 0 .. and the GEMM's after them; the last word is
  // the CTA's kind); null: none.
  unsigned long long* stamps = nullptr;
  // The attention's output projection too (proj_weight non-null; one rank): hidden += proj_weight
  // x output + proj_bias, rounded once, as attn.c_proj's skinny GEMM with its residual epilogue
  // computes it, and `output` is written as well. The launch's GEMM CTAs do it: after their QKV
  // columns, GEMM CTA g loads rows [8 g, 8 g + 8) of proj_weight into the registers the QKV rows
  // left, with their bias and residual, then one warp polls a word a head, which the CTA that
  // stores the head's output sets, and once every head's is set the CTA folds the output row
  // (from L2) into its rows. No grid boundary and no second launch between the attention and the
  // projection. Needs heads x head_dim <= 2048, proj_n <= n (C's columns), the QKV columns
  // exactly q / k / v, and every CTA of the launch resident at once (the GEMM CTAs wait for the
  // attention, which waits for every GEMM CTA's columns): checked with the occupancy API at
  // launch, Unimplemented where not (nothing has run then).
  const void* proj_weight = nullptr;  // [proj_n, heads head_dim], rows contiguous
  const void* proj_bias = nullptr;    // [proj_n]; null: none
  void* hidden = nullptr;             // [proj_n]: the residual, updated in place
  int proj_n = 0;
};
inline constexpr int kGemmTailMaxClusterSplits = 8;  // the portable cluster size
inline constexpr int kGemmTailStampWords = 16;
// GemmTailAttention::stamps' words. A GEMM CTA writes Start, PdlDone, Dot (its warp 0's dot
// products summed) and End; an attention CTA every other one: PdlDone, KvIn (its warp 0's cached K
// / V rows in registers, waited for only when stamping), WordsIn (its warp 0's LL words of q and
// the newest k / v all flagged), Scores (the scores' maximum known), Partial (its warps' partials
// merged), Merged (the cluster merge: the first split's peers' partials arrived, or a peer's
// pushed; the L2 merge: the count-in of the last split), End (its output stored).
enum GemmTailStamp : int {
  kTailStampStart = 0,
  kTailStampPdlDone = 1,
  kTailStampDot = 2,
  kTailStampKvIn = 3,
  kTailStampWordsIn = 4,
  kTailStampScores = 5,
  kTailStampPartial = 6,
  kTailStampMerged = 7,
  kTailStampEnd = 8,
  kTailStampKind = 15,  // 1: a GEMM CTA, 2: an attention CTA
};

// The workspace a tail of `heads` query heads needs at most (kGemmTailMaxCtas splits in all):
// 2 + heads int counters (the epoch, the attention warps counted out, each head's splits merged)
// and, with the projection, a word a head (its output stored: the launch's epoch plus one; from the
// next 128-byte line on, which the kernel checks fits), padded to 256 bytes;
// an LL word for each of C's q / k / v columns (at most kGemmTailLlColsPerHead a query head: k and
// v follow q); then the splits' fp32 partials.
inline constexpr int kGemmTailLlColsPerHead = 3 * kGemmTailHeadDim;
inline size_t GemmTailCounterBytes(int heads) {
  return (static_cast<size_t>(2 + 2 * heads) * 4 + 255) / 256 * 256;
}
inline size_t GemmTailLlBytes(int heads) {
  return static_cast<size_t>(heads) * kGemmTailLlColsPerHead * 4;
}
inline size_t GemmTailAttentionWorkspaceBytes(int heads) {
  return GemmTailCounterBytes(heads) + GemmTailLlBytes(heads) +
         static_cast<size_t>(kGemmTailMaxCtas) * (kGemmTailHeadDim + 2) * 4;
}

// fp32 only. InvalidArgument for other dtypes, negative sizes, strides shorter than a row.
absl::Status GemmCpu(const GemmParams& p);

// The threads GemmCpu's OpenBLAS uses (process-wide); returns the count in effect, 1 without
// OpenBLAS. Ranks sharing a node each take their share of its cores: OpenBLAS's default, every
// core for every rank, has their spinning threads fight over the same cores.
int SetCpuGemmThreads(int threads);

}  // namespace mqa
