// The CUDA paged attention (see kernels/paged_attention.h for the layout and semantics) and the
// per-head baseline it is measured against. Include only from CUDA-enabled code.
//
// Supported: fp16 and bf16; head_dim 64 and 128; block_size a power of two from 8 to 256; any
// num_heads / num_kv_heads group (query heads of one KV head share one CTA's MMA tiles up to 64,
// larger groups tile further). Device pointers throughout, including block_tables, query_start
// and context_lens. Every context_len must be <= max_context_len, every query length <=
// max_query_len (when given). Launches are asynchronous on `stream`; thread-compatible (no
// global state but a per-device cache of the SM count).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/kv_cache.h"
#include "kernels/paged_attention.h"

namespace mqa {

// Tuning knobs for tests and benchmarks; the defaults are what production uses.
struct PagedAttentionTuning {
  int num_splits = 0;  // KV splits per sequence (split-KV); 0 chooses from the SM count
  // Warps along the query rows of a CTA (1, 2, 3, 4 or 8 picks that decode layout); 0: automatic.
  int warps_m = 0;
  // Decode-path variant (kernels/ATTENTION_NOTES.md, version 3), to be measured side by side:
  //  0: version 2 as measured (block ids fetched per stage, merge as a second plain launch);
  //  1: the split's block-table entries loaded into shared memory at CTA start in one coalesced
  //     round trip that does not wait for the metadata loads, all prologue stages issued at once,
  //     and the merge launched with programmatic dependent launch (overlaps the tail);
  //  2: as 1, with the merge fused into the attention kernel: a cooperative launch (every CTA
  //     resident), the splits of one (sequence, KV head) meet at a counter in the workspace and
  //     each merges a slice of the rows. Needs the workspace's first bytes zeroed once before
  //     first use (cudaMemset of the whole workspace is fine); the kernel leaves them zeroed.
  //     Falls back to 1 where the grid is not co-resident or the workspace has no room.
  //  3: as 1, with the split partial outputs stored in the element type (fp16/bf16) instead of
  //     fp32: half the partial-write and merge-read bytes (the merge kernel reads T).
  //  4: as 3, but with no merge launch when there are at most 8 splits: each split CTA counts
  //     itself in at a counter in the workspace and the last one to arrive merges the row tile
  //     (no waiting, no cooperative launch; works in graphs). More than 8 splits: runs as 3.
  //     Workspace: as 2 (first bytes zeroed once; the kernel leaves them zeroed); without room
  //     for the counters it runs as 3.
  //  5: as 4 with the in-kernel merge up to 32 splits.
  //  6: as 5 where a split is short and few (at most kAutoMergeSplits splits of at most
  //     kAutoMergeTokens tokens each: decode batches at short contexts, where the merge launch is
  //     a large share), else as 3. From the 2026-12-03 H200 run: 5 ran StarCoder batch 1 and 32
  //     and SantaCoder batch 1 faster end to end (2-4 splits of one tile; 8 splits of two), but
  //     32 x 2048 (8 splits of 4 tiles) 28.3 us vs 21.1 and 8 x 4096 (32 splits) 47.3 vs 16.9.
  //  7: as 6, and the KV rows of positions before the step's first query are copied before the
  //     PDL wait (they were written by earlier steps, not by the kernel this one overlaps):
  //     only Q and the step's own rows are loaded after it; and the next kernel's programmatic
  //     launch is released at the start (its weight loads overlap this kernel), not after the
  //     main loop.
  //  8: as 3 with 7's early copies, and with 2..8 splits no partials in global memory: the
  //     splits of a row tile run as one thread-block cluster and merge through distributed
  //     shared memory after a cluster barrier (no counters, no merge launch, no last arriver).
  //  9: as 7, but as 8 (cluster merge) where the whole grid fits in one CTA per SM: from the
  //     H200 run of 2026-12-03 ~09:20 UTC, 8 ran StarCoder batch 1 1.1432 -> 1.1130 s and
  //     SantaCoder batch 1 0.1651 -> 0.1519 s against 7, but StarCoder batch 32 (32 clusters of
  //     5 splits, 160 CTAs) 2.0383 -> 2.0673 s, and large grids far slower (64 x 2048 54.5 us
  //     vs 33.6): cluster scheduling costs where the grid is more than a wave.
  // 10: as 9, but past one CTA per SM as 3 with the early copies (the merge kernel, not the last
  //     arriving split).
  // 11: Hopper warpgroup MMA (wgmma; kernels/paged_attention_hopper.cuh): one 128-thread
  //     warpgroup per (sequence, KV head, split) holds all of its <= 64 query rows, S = Q K^T and
  //     O += P V as asynchronous wgmma with P from registers; splits and merge as 3. Past 64
  //     query rows (prefill) one CTA per 64-row tile. Shapes it does not take (head_dim other
  //     than 64 / 128, a split whose block ids overflow the shared table) run as 9 (3 for the
  //     last).
  // 12: as 11 where it takes at most 64 query rows per (sequence, KV head), else as 9 (11 before
  //     its multi-tile prefill; kept for side-by-side runs).
  // 13: as 11 for decode (at most 64 query rows per sequence and KV head, block_size >= 16), with
  //     a producer warp copying the K / V tiles by TMA (the paged cache as a 2-D tensor map) and
  //     mbarrier stages instead of the consumers' cp.async and a CTA barrier every tile
  //     (ATTENTION_NOTES.md version 18), where a split is at most 512 tokens (measured faster
  //     there; with hopper_tma_ctas set, at any length); other shapes run as 11.
  // 14: 13 with fuse_kv_write (PagedAttentionCuda's kv_write done by the TMA kernel; without a
  //     kv_write, 13).
  // 15: 14, and where the fused TMA kernel runs 2..8 splits and the grid is at most one CTA an
  //     SM, the splits of a row tile run as one cluster and merge through distributed shared
  //     memory (variant 8's ClusterMerge; every thread of every CTA of the cluster, the producer
  //     warp and CTAs with no work included, takes part): no partials, no merge launch. (A first
  //     form, the last arriving split merging from global partials as variant 5, lost on the
  //     H200 on 2026-12-03 ~20:00 UTC: StarCoder b32 1.9543 -> 1.9932 s, b1 1.0793 -> 1.1408,
  //     SantaCoder 0.1314 -> 0.1354; one CTA merging 48 rows serially.) Measured against 14
  //     (~20:10 UTC): b32 equal, StarCoder b1 1.0768 -> 1.0888 s, SantaCoder b1 0.1320 -> 0.1309.
  // 16: 14 with kv_before_wait (the first stages' K / V requested before the PDL wait). Correct,
  //     and slower (H200, 2026-12-04 ~14:02 UTC, mqabench --attn 14,16,14,16: StarCoder b1 decode
  //     step 7.969 / 7.967 ms against 8.021 / 8.021, b32 8.720 / 8.749 against 8.786 / 8.809): the
  //     early loads queue behind the previous kernel's tail; kept for side-by-side runs. On
  //     SantaCoder b1 too (after the skinny QKV GEMM, no chain; H100, 2026-12-05 14:45 UTC,
  //     --attn 18,16,18,16): 1.146 / 1.142 ms a decode step against 1.124 / 1.117.
  // 17: 14 with warp_merge (the split merge as one warp a (token, head) up to 8 splits:
  //     MergeSplitsWarpKernel). H200 2026-12-04 ~16:49 UTC against 14 (attention_bench, graph
  //     us): 64 x 2048 28.50 -> 25.99, 64 x 8192 78.30 -> 75.61, 128 x 2048 50.57 -> 46.39;
  //     mqabench: SantaCoder b1 decode step 0.989 / 0.988 -> 0.985 / 0.984 ms, StarCoder b32
  //     9.028 -> 9.018 ms.
  // 18: 17 with the pair (kernels/paged_attention_hopper.cuh, TmaShape): one CTA an SM, two
  //     consumer warpgroups taking a split's tiles alternately, one producer warp each, where one
  //     split a sequence keeps at least 70% of the SMs busy (decode batches of 93-132 sequences x
  //     KV heads at 132 SMs) with contexts of at most 2048 tokens: no merge (17: two splits and
  //     a merge kernel). Elsewhere 17. H200 2026-12-04 ~18:07 UTC (attention_bench --one, graph
  //     us, 17 / 18): 128 x 512 17.45 / 14.74, 120 x 1024 26.35 / 23.49, 128 x 2048 43.15 /
  //     41.29. (ATTENTION_NOTES.md, version 24.)
  // Default 18, the model's (GptBigCodeOptions::attention_variant), since 2026-12-04 ~18:20 UTC;
  // 17 from ~16:49 UTC, 14 before (H200 2026-12-03 ~19:25 UTC,
  // against 13 end to end: StarCoder b32 -0.1..-0.9%, b1 -0.6%, SantaCoder b1 -3.3%). 13 is the
  // fastest at the decode shapes of attention_bench's variant table with splits of at most 512
  // tokens, and 11 elsewhere (prefill: 11's kernel) on the H200 (2026-12-03 ~17:50 UTC, graph us,
  // 11 / 13: 64 x 2048 29.16 / 28.31, 1 x 8192 10.12 / 9.49, 32 x 576 11.50 / 11.04;
  // BENCHMARKS.md). 11 was the default from ~12:28 UTC (against 3: 64 x 2048 29.4 vs 32.8, causal
  // 4096 prefill 618 vs 989), 3 before.
  int variant = 18;
  // Launch the attention kernel as a programmatic dependent of the previous kernel in the stream
  // (not with variant 2's cooperative launch): its block-table and metadata loads overlap that
  // kernel's tail. The previous kernel must not write the step metadata (query_start,
  // context_lens, block_tables), which the kernel reads before its wait.
  bool pdl = false;
  // Variant 11's KV tokens per pipeline stage: 32 or 64; 0: 32 for decode (at most 64 query rows
  // per sequence and KV head), 64 past that (prefill).
  int hopper_tile_tokens = 0;
  // Variant 11's warpgroups a CTA: 1 (64 query rows) or 2 (128 rows sharing each K / V stage,
  // always with 64-token stages); 0: 2 for long prefills (UseTwoWarpgroupPrefill), else 1.
  int hopper_warpgroups = 0;
  // Variant 13's CTAs an SM: 2 (5 KV stages at head_dim 128) or 3 (3 stages, a third consumer
  // warpgroup an SM; the split plan fills three slots an SM), the TMA kernel then taking splits of
  // any length; 0: 2 (the faster on the H200 at most decode shapes;
  // kernels/paged_attention_hopper.cuh), on splits of at most 512 tokens.
  int hopper_tma_ctas = 0;
  // PagedAttentionCuda's kv_write fused into variant 13's TMA kernel (decode batches); off: the
  // write is launched first (KvCacheWriteCuda). Variants 14 and 15 set it. (The first H200 run,
  // 2026-12-03 ~18:25 UTC, failed: the new row was taken from each sequence's last split, not the
  // split holding its last position; fixed and verified at ~19:25 UTC.)
  bool fuse_kv_write = false;
  // With the fused write: the TMA kernel's producer issues its first stages' K / V boxes before
  // the programmatic-dependent wait (every cached row they hold was written by an earlier step;
  // the new row's stale copy is replaced in shared memory). Variant 16 sets it.
  bool kv_before_wait = false;
  // The split merge (variants 1 and 3 onwards, where a merge kernel follows) as one warp a
  // (query token, head), four heads a CTA, instead of a 128-thread CTA a (token, head)
  // (head_dim 64 / 128, at most 8 splits; one warp a CTA with release_dependents_early). Variant
  // 17 sets it.
  bool warp_merge = false;
  // Variant 18's pair on every decode shape the TMA kernel takes (splits: num_splits, else the
  // SMs over the sequences x KV heads, at most 8; up to 8 merged in a cluster, more by the merge
  // kernel), whether or not it fills the SMs: for tests and measurements.
  bool tma_pair = false;
};

inline constexpr int kNumPagedAttentionVariants = 19;
inline constexpr int kAutoMergeSplits = 8;
inline constexpr int kAutoMergeTokens = 128;
inline const char* PagedAttentionVariantName(int v) {
  return v == 0    ? "v2"
         : v == 1  ? "smemtab+pdl"
         : v == 2  ? "fused"
         : v == 3  ? "halfpart"
         : v == 4  ? "lastmerge8"
         : v == 5  ? "lastmerge32"
         : v == 6  ? "auto(3|5)"
         : v == 7  ? "auto+earlykv"
         : v == 8  ? "cluster+earlykv"
         : v == 9  ? "auto(7|8)"
         : v == 10 ? "auto(3e|8)"
         : v == 11 ? "hopper"
         : v == 12 ? "hopper-decode"
         : v == 13 ? "hopper-tma"
         : v == 14 ? "hopper-tma+kvw"
         : v == 15 ? "hopper-tma+kvw+cluster"
         : v == 16 ? "hopper-tma+kvw+early"
         : v == 17 ? "hopper-tma+kvw+warpmerge"
         : v == 18 ? "hopper-tma+kvw+warpmerge+pair"
                   : "?";
}

// Variant 11's automatic form for `p` on a device of `sms` SMs: two warpgroups (128-row CTAs) for
// a long prefill — more than 64 query rows per (sequence, KV head), a context of at least
// kTwoWarpgroupMinContext tokens and at least kTwoWarpgroupMinWaves waves of 128-row CTAs — else
// one (kernels/paged_attention_hopper.cuh has the measurements behind the thresholds).
inline constexpr int kTwoWarpgroupMinContext = 2048;
inline constexpr int kTwoWarpgroupMinWaves = 4;
bool UseTwoWarpgroupPrefill(const PagedAttentionParams& p, int sms);

// Variant 18's automatic rule for `p` on a device of `sms` SMs: the pair (one CTA an SM, two
// consumer warpgroups, one split a sequence, no merge) for a decode batch (at most 64 query rows
// per sequence and KV head) whose sequences x KV heads fill 70-100% of the SMs, at contexts of
// at most 2048 tokens (kernels/paged_attention_hopper.cuh and paged_attention.cu have the
// measurements behind the thresholds).
bool UsePairDecode(const PagedAttentionParams& p, int sms);

// Bytes of scratch PagedAttentionCuda needs for `p` (split-KV partial results); 0 when it will
// not split. A smaller workspace is allowed: the launch then uses fewer splits.
size_t PagedAttentionCudaWorkspaceBytes(const PagedAttentionParams& p,
                                        const PagedAttentionTuning& tuning = {});

// Decode (max_query_len 1) and prefill / mixed batches. `workspace` is device memory owned by the
// caller, at least PagedAttentionCudaWorkspaceBytes(p) for the full split-KV speed; may be null.
//
// kv_write (optional): the step's new K / V rows, written into the cache before they are attended
// to, as KvCacheWriteCuda(*kv_write, stream, tuning.pdl) would; its caches, dtype, head counts
// and block size must be p's and its tokens p's (InvalidArgument otherwise). With
// tuning.fuse_kv_write, variant 13's TMA kernel does the write itself for a decode batch
// (p.max_query_len == 1): the split holding each sequence's last position takes the new row from
// kv_write's key / value and writes the cache (no launch); every other path launches
// KvCacheWriteCuda first.
absl::Status PagedAttentionCuda(const PagedAttentionParams& p, cudaStream_t stream, void* workspace,
                                size_t workspace_bytes, const PagedAttentionTuning& tuning = {},
                                const KvCacheWriteParams* kv_write = nullptr);

// The 2023 design, kept as the benchmark's baseline: decode only (every q_len 1), one CTA per
// (sequence, query head) that re-reads its KV head through `head_mapping` (device, [num_heads]:
// query head -> KV head), CUDA cores only. max_context_len <= 32768.
absl::Status PagedAttentionPerHeadBaselineCuda(const PagedAttentionParams& p,
                                               const int32_t* head_mapping, cudaStream_t stream);

}  // namespace mqa
