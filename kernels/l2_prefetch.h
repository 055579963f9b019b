// A hint that a latency-bound kernel hands to the GPU's idle memory system: the rows of the next
// GEMM's weights whose first bytes L2 should fetch while the kernel runs.
//
// Why: at decode sizes the attention and layer-norm kernels leave most of the DRAM bandwidth
// unused for several microseconds (the attention at StarCoder batch 32 reads ~10 MB in ~11 us),
// and the GEMM that follows is bound by streaming its weights. Fetching the first bytes of each
// of its weight rows into L2 during that window lets every CTA of the GEMM (whatever its tiling,
// as long as each walks k upward from 0) start on L2 hits, so the GEMM streams fewer bytes from
// DRAM after it starts. Only a hint: it changes no result, and a kernel that ignores it is
// correct.
#pragma once

#include <cstdint>

namespace mqa {

struct L2PrefetchHint {
  const void* base = nullptr;  // row r starts at base + r * stride (16-byte aligned)
  int64_t rows = 0;
  int64_t stride = 0;  // bytes between rows (a multiple of 16)
  int bytes = 0;       // fetched from the start of each row (a multiple of 16, <= stride); 0: none
};

// The hint for a [rows, cols] weight of `elem_bytes` elements with `budget_bytes` spread as an
// equal prefix of every row (rounded down to 16 bytes, at most the row); none when that prefix is
// under 256 bytes and not the whole row, or the rows are not 16-byte aligned.
inline L2PrefetchHint WeightPrefixHint(const void* base, int64_t rows, int64_t cols,
                                       int64_t elem_bytes, int64_t budget_bytes) {
  L2PrefetchHint h;
  const int64_t row_bytes = cols * elem_bytes;
  if (base == nullptr || rows <= 0 || budget_bytes <= 0 || row_bytes % 16 != 0 ||
      reinterpret_cast<uintptr_t>(base) % 16 != 0) {
    return h;
  }
  int64_t per_row = budget_bytes / rows / 16 * 16;
  if (per_row > row_bytes) per_row = row_bytes;
  if (per_row < 256 && per_row < row_bytes) return h;
  h.base = base;
  h.rows = rows;
  h.stride = row_bytes;
  h.bytes = static_cast<int>(per_row);
  return h;
}

#ifdef __CUDACC__
// Issues this CTA's share of `h`: the rows dealt out in equal contiguous ranges over the grid's
// CTAs, `lanes` threads of the CTA (this one is `lane`) one row each in turn. One bulk prefetch
// instruction a row; the kernel does not wait for it. Nothing before sm_90.
__device__ __forceinline__ void IssueL2Prefetch(const L2PrefetchHint& h, int lane, int lanes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (h.bytes == 0) return;
  const int64_t ctas = static_cast<int64_t>(gridDim.x) * gridDim.y * gridDim.z;
  const int64_t cta =
      blockIdx.x + static_cast<int64_t>(gridDim.x) * (blockIdx.y + static_cast<int64_t>(gridDim.y) * blockIdx.z);
  const int64_t per = (h.rows + ctas - 1) / ctas;
  const int64_t end = per * (cta + 1) < h.rows ? per * (cta + 1) : h.rows;
  const char* base = static_cast<const char*>(h.base);
  for (int64_t r = per * cta + lane; r < end; r += lanes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(base + r * h.stride),
                 "r"(h.bytes)
                 : "memory");
  }
#endif
}
#endif

}  // namespace mqa
