// The GPT-BigCode forward pass of one tensor-parallel rank over a paged KV cache, for a batch that
// mixes prefill chunks and decode steps (StepInput, runtime/model_runner.h).
//
// Per step: h = wte[token] + wpe[position]; per layer: qkv = LN1(h) c_attn^T + b, this step's K/V
// written to the cache at slot_mapping, paged causal attention over the cache (scale
// 1/sqrt(head_dim) when scale_attn_weights), h += attn c_proj^T + b, h += act(LN2(h) c_fc^T + b)
// mlp.c_proj^T + b; then only StepInput::logits_rows are gathered, normalised by ln_f and
// multiplied by the tied lm_head. Tensor parallel (weights.h): each rank computes its heads and
// its slice of the MLP; the row-parallel partial sums are all-reduced (biases live on rank 0
// only); the vocab-parallel embedding is all-reduced; lm_head logits shards are gathered on rank 0.
//
// The forward is device-agnostic: it calls the op layer (kernels/ops.h) with params structs, which
// dispatches on the weights' device. Activations live in a workspace preallocated for
// max_batched_tokens / max_logits_rows (grown once, at the start of a step, if a step needs more);
// nothing is allocated per layer.
//
// CUDA backend: the model owns a stream, a CudaGemm (cuBLASLt + the skinny decode GEMM) and the
// device buffers for the step's index arrays (one pinned host-to-device copy per step), the
// attention workspace and fp32 logits. Decode-only steps of one rank (every query length 1, at most
// max_graph_batch sequences) run as CUDA graphs, one per (batch bucket, context bucket): the batch
// is padded to the bucket with sequences that write nothing, and the attention is sized for the
// context bucket (the next power of two of the longest context, at least 256).
//
// Thread ownership: one thread (the runner's) calls Forward; not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/activation.h"
#include "kernels/ops.h"
#include "kernels/sampling.h"
#include "model/weights.h"
#include "parallel/collectives.h"
#include "runtime/model_runner.h"
#include "runtime/tensor.h"

namespace mqa {

// The decode shapes GptBigCodeOptions::gemm_autotune is meant for: the decode graphs' batch
// buckets go up to 256 rows; prefill chunks are larger or vary with every request.
inline constexpr int kDecodeGemmAutotuneMaxM = 256;

// One rank's paged KV cache: per layer a key and a value tensor
// [num_blocks, block_size, kv_heads, head_dim]. Owned by the runner; same thread rules.
class PagedKvCache {
 public:
  // Block sizes the kernels support (the CUDA kernels specialise on them).
  static bool IsSupportedBlockSize(int block_size) {
    return block_size == 8 || block_size == 16 || block_size == 32;
  }
  struct Shape {
    int64_t num_layers = 0;
    int64_t kv_heads = 1;
    int64_t head_dim = 0;
    int num_blocks = 0;
    int block_size = 16;
  };
  // InvalidArgument for an unsupported block size or non-positive sizes; ResourceExhausted when
  // the memory is not there.
  static absl::StatusOr<PagedKvCache> Allocate(const Shape& shape, DType dtype, Device device);
  // Bytes of one block over all layers, K and V (for sizing the pool from a memory budget).
  static int64_t BytesPerBlock(const Shape& shape, DType dtype);

  PagedKvCache() = default;
  const Shape& shape() const { return shape_; }
  int num_blocks() const { return shape_.num_blocks; }
  int block_size() const { return shape_.block_size; }
  Tensor& key(int64_t layer) { return key_[layer]; }
  Tensor& value(int64_t layer) { return value_[layer]; }
  // Copies physical block src to dst in every layer's K and V (copy-on-write of a shared block).
  // On the GPU: synchronous (the default stream); prefer CopyBlocks.
  absl::Status CopyBlock(int src, int dst);
  // All copies in order (CPU), or in one kernel launch on `cuda_stream` (GPU; the pairs must not
  // chain, which copy-on-write of fresh blocks guarantees).
  absl::Status CopyBlocks(absl::Span<const BlockCopy> copies, void* cuda_stream);

 private:
  Shape shape_;
  std::vector<Tensor> key_, value_;
  Tensor tensor_table_;  // CUDA: device array of the 2 * num_layers cache pointers
  Tensor copy_pairs_;    // CUDA: device staging of CopyBlocks' pairs
};

// What a step may contain, checked before anything runs: sizes agree, query_start is a partition
// of the tokens, context_len >= query length and fits the block table, token ids < vocab_size,
// positions < n_positions, slots (< 0: skipped) and the used block-table entries and block copies
// inside the pool, logits rows inside the batch. InvalidArgument names the first violation.
absl::Status ValidateStepInput(const StepInput& input, const ModelConfig& config, int num_blocks,
                               int block_size);

// The bits of GptBigCodeOptions::tail_release_early: the GEMMs of a tail layer that release the
// next kernel as their CTAs start.
enum TailReleaseBit : int {
  kTailReleaseAttnProj = 1,  // attn.c_proj (c_fc's CTAs stage their rows during the tail)
  kTailReleaseMlpProj = 2,   // mlp.c_proj (the next layer's QKV launch)
  kTailReleaseFc = 4,        // c_fc (mlp.c_proj)
  kTailReleaseQkv = 8,       // the QKV launch's GEMM CTAs (attn.c_proj)
  kTailReleaseAll = 15,
};

struct GptBigCodeOptions {
  int64_t max_batched_tokens = 2048;  // workspace rows preallocated for token activations
  int64_t max_logits_rows = 256;      // workspace rows preallocated for logits
  // CUDA backend only.
  bool cuda_graphs = true;     // decode steps as CUDA graphs (one rank only)
  int max_graph_batch = 256;   // larger decode batches run eagerly
  // Steps in which every sequence brings the same number q of tokens, 1 < q <= max_graph_query,
  // each with a logits row (speculative decoding's check step) also run as CUDA graphs, one per
  // (batch bucket, context bucket, q); 1: decode steps only.
  int max_graph_query = 1;
  bool skinny_gemm = true;     // the m <= 8 decode GEMM kernel (else cuBLASLt throughout)
  // Launch-latency knobs of the decode path (mqabench --fast; measured side by side on the H200,
  // 2026-12-02: pdl took SantaCoder batch 1 from 1.325 to 1.230 ms a step and left StarCoder
  // within noise (8.91 / 8.96 ms); fuse gained 2% on SantaCoder and lost 2% on StarCoder, so it
  // stays off. Again on 2026-12-03 ~20:22 UTC with attention variant 14, register layer norms and
  // the deep unroll: pdl 0.1516 -> 0.1316 s SantaCoder b1 and 1.1011 -> 1.0812 s StarCoder b1;
  // pdl+fuse 0.1468 and 1.1534 s, so fuse now loses on both):
  // pdl: layer norm, bias/activation and the skinny GEMM launched as programmatic dependents
  //   (the GEMM loads its first weights before waiting on the previous kernel);
  // fuse_small_kernels: where the skinny GEMM runs (m <= 8), ln_1 / ln_2 / ln_f are computed
  //   inside the following GEMM and the KV-cache write inside the QKV GEMM (3 launches a layer);
  // fuse_layer_norms: only the layer norms (the KV write stays with the attention kernel).
  // Either keeps each GEMM's per-column sums against its layer norm (LayerNormFoldSumsCuda:
  // 2 (qkv_cols + inner) floats a layer and 2 vocab_shard for lm_head), from which the skinny
  // kernel folds the norm into its epilogue (2026-12-05; the figures above are of the earlier
  // form, whose every warp computed the row statistics before its fold). The folded form, first
  // run on an H100 (2026-12-05 14:44 UTC, mqabench --fast pdl,pdl+ln,pdl,pdl+ln, interleaved):
  // SantaCoder b1 decode step 1.118 / 1.120 -> 1.097 / 1.095 ms (0.1441 / 0.1446 -> 0.1414 /
  // 0.1412 s), StarCoder b1 11.172 -> 11.167 ms (its layers run the decode chain; only ln_f
  // folds); the fused-LN GEMM tests and HF parity's _defaults_ln / _defaults_fuse instances
  // passed there. On by default since then.
  bool pdl = true;
  bool fuse_small_kernels = false;
  bool fuse_layer_norms = true;
  // cuBLASLt shapes (m > 8, or skinny_gemm off): time up to 8 heuristic algorithms per GEMM shape
  // on its first eager run and keep the fastest (CudaGemm::Options::autotune; mqabench --autotune).
  // Off here; the server (and mqabench, as the server does) turns it on for the decode shapes
  // (kDecodeGemmAutotuneMaxM) while it warms up the decode graphs, then freezes it
  // (FreezeGemmAutotune): -2.0% a StarCoder b32 step on an H100 (BENCHMARKS.md, 2026-12-05 late
  // evening).
  bool gemm_autotune = false;
  int gemm_autotune_max_m = 0;  // CudaGemm::Options::autotune_max_m (0: every shape)
  // Small decode kernels (mqabench --small): layer norm with the row in registers
  // (LayerNormCudaKernel::kRegisters) and greedy argmax split over a cluster of 8 CTAs
  // (SampleTokensCudaKernel::kGreedyCluster). On since the H200 run of 2026-12-02 ~23:00 UTC:
  // StarCoder batch 1 8.777 -> 8.497 ms a step, SantaCoder 1.177 -> 1.141 ms (BENCHMARKS.md).
  bool ln_registers = true;
  bool greedy_cluster = true;
  // Decode GEMM kernels (mqabench --gemm splitk,tc): CudaGemm::Options::skinny_split_k (m <= 8)
  // and stream_tc (8 < m <= 64, in place of cuBLASLt).
  bool gemm_split_k = false;
  bool gemm_stream_tc = false;
  bool gemm_stream_tc_tma = false;  // CudaGemm::Options::stream_tc_tma (mqabench --gemm tma)
  // PagedAttentionTuning::variant for the model's attention (mqabench --attn): 3 = split partials
  // in fp16/bf16 merged by a second kernel; 5 = the last split CTA of a row tile to finish merges
  // it in the attention kernel (no merge launch, up to 32 splits); 6 = 5 for few short splits,
  // else 3. Default 6 since the H200 run of 2026-12-03 ~07:10 UTC: variant 5 ran StarCoder b1
  // 1.0885 -> 1.0767 s, SantaCoder b1 0.1480 -> 0.1458 s, StarCoder b32 1.9461 -> 1.9366 s, but
  // lost in attention_bench at 8 x 4096 and 32 x 2048 (BENCHMARKS.md). 9 = 6 with the step's
  // older KV rows copied before the PDL wait, the next kernel released at once, and the split
  // merge inside a thread-block cluster where the grid fits in one CTA per SM: the default since
  // the H200 run of 2026-12-03 ~09:20 UTC (kernels/paged_attention_cuda.h). 11 = the wgmma
  // kernel (kernels/paged_attention_hopper.cuh; shapes it does not take run as 9): the default
  // since the H200 run of 2026-12-03 ~12:28 UTC, side by side with 9: StarCoder b1 1.1180 ->
  // 1.0846 s, SantaCoder b1 0.1539 -> 0.1350 s, StarCoder b32 2.0035 -> 1.9596 s. 13 = 11 with
  // TMA copies by a producer warp on decode splits of at most 512 tokens: the default since the
  // H200 runs of 2026-12-03 ~17:30-17:50 UTC (3-6% faster than 11 at 64 x 2048, 1 x 8192 and
  // 32 x 576 in isolation; end to end equal within 0.3%). 14 = 13 with the decode step's KV-cache
  // write fused into the TMA kernel (the model hands it its write): the default since the H200 run
  // of 2026-12-03 ~19:25 UTC, side by side with 13: StarCoder b32 1.9410 -> 1.9387 s (and 1.9535
  // -> 1.9362), b1 1.0844 -> 1.0781 s, SantaCoder b1 0.1363 -> 0.1318 s. 17 = 14 with the split
  // merge as one warp a (token, head) up to 8 splits: the default since the H200 run of
  // 2026-12-04 ~16:49 UTC (64 x 2048 in isolation 28.50 -> 25.99 us; end to end equal or a
  // little faster: SantaCoder b1 decode step -0.4%, StarCoder b32 -0.1%). 18 = 17 with the pair
  // (one CTA an SM, two consumer warpgroups, no split) where one split a sequence fills the SMs
  // (decode batches of 93-132 sequences, contexts up to 2048): the default since 2026-12-04
  // ~18:30 UTC (in isolation 128 x 512 17.45 -> 14.74 us, 120 x 1024 26.35 -> 23.49; every other
  // batch keeps 17's path).
  int attention_variant = 18;
  // CudaGemm::Options::skinny_deep_unroll (mqabench --gemm skinnyd): narrow m = 1 GEMMs keep twice
  // the weight loads in flight. On since the same run: SantaCoder b1 0.1480 -> 0.1410 s
  // (StarCoder's GEMMs are too wide to take it).
  bool gemm_deep_unroll = true;
  // CudaGemm::Options::skinny_half_fold (mqabench --gemm skinnydh / skinnydf): m = 1 fp16 GEMMs
  // of k <= 4096 or narrow sum each 16-byte chunk's products as fp16 pairs before the fp32 sum.
  // On: H200, 2026-12-04 ~14:48 UTC, SantaCoder b1 decode step 1.044 / 1.048 -> 1.016 / 1.000 ms
  // (applied to every m = 1 GEMM then; StarCoder's, k 6144 and 24576, got slower and are left out);
  // ~14:57 with this rule, on / off / on / off: 1.012 / 1.057 / 1.058 / 1.059 ms (a noisy call).
  bool gemm_half_fold = true;
  // CudaGemm::Options::skinny_stage_bytes (mqabench --gemm skinnydsN): m = 1 GEMMs copy this many
  // bytes of each weight row into shared memory before their PDL wait. SantaCoder b1 -7% a decode
  // step (NOTES version 17).
  int gemm_stage_bytes = 16384;
  // CudaGemm::Options::skinny_occupancy (mqabench --gemm skinnydo): m = 1 fp16 GEMMs on
  // instantiations built for more resident CTAs an SM (SantaCoder's c_fc in one wave, its QKV
  // beside mlp.c_proj). Off until measured.
  bool gemm_occupancy = false;
  // Batch-1 decode steps (one token, one rank) run each layer's c_proj, ln_2 + c_fc, MLP c_proj
  // and the next layer's ln_1 + QKV as one persistent kernel that streams their weights through
  // shared memory across the phase boundaries (kernels/decode_chain.h; mqabench --chain): two
  // launches a layer (attention, chain) instead of seven. On where a layer's four projections
  // hold at least decode_chain_min_layer_bytes of weights: on the H200 (2026-12-04, BENCHMARKS.md)
  // a StarCoder layer (758 MB) streams at 98% of the copy rate in a chain against 91% as four
  // GEMMs, and StarCoder b1 128/128 went 1.07 -> 1.018 s; a SantaCoder layer (85 MB) loses
  // (1.025 -> 1.125 ms a step: its phases are too short for the four grid barriers and input
  // reloads a layer).
  bool decode_chain = true;
  int64_t decode_chain_min_layer_bytes = int64_t{256} << 20;
  // SMs the chain leaves to the attention between two chains (DecodeChainTuning::spare_sms): 0,
  // 4 and 8 measured, 4 and 8 no better.
  int decode_chain_spare_sms = 0;
  // With decode_chain: the attention runs as the chain's first phase (one CTA a head, the KV write
  // with it) when the step's context is at most decode_chain_attention_max_context long (0: the
  // short form's bound, DecodeChainShortAttentionMaxContext: 256 tokens at D = 128), so that a
  // layer is one launch (no attention or merge kernel between two chains). History: slower on the
  // H200 of 2026-12-03 (StarCoder b1 8.44 ms a step with the attention separate, 8.58 inside),
  // before the chain's later changes; on the H100s of 2026-12-06 the short form is 0.25-0.75%
  // faster in eight calls (StarCoder b1 128 / 128, `mqabench --chain na,auto`), while the loop form
  // that longer contexts would take loses 4.5% (512 / 128): hence on, with the short form's bound
  // (benchmarks/mqabench/NOTES.md version 38).
  bool decode_chain_attention = true;
  int decode_chain_attention_max_context = 0;
  // With decode_chain: ring stages a chain CTA keeps requested ahead of its consumers
  // (DecodeChainTuning::max_inflight; 0: the whole ring).
  int decode_chain_max_inflight = 0;
  // With decode_chain: bytes a ring stage (DecodeChainTuning::stage_bytes, a multiple of 8192; 0:
  // the kernel's automatic choice).
  int decode_chain_stage_bytes = 0;
  // With decode_chain: DecodeChainTuning::ll_inputs (-1: the kernel's measured default).
  int decode_chain_ll_inputs = -1;
  // With decode_chain and the attention inside it: DecodeChainTuning::head_hold (-1: the kernel's
  // measured default, held until the K rows are read; 0 runs as 1; 2: until the head is written).
  int decode_chain_head_hold = -1;
  // With decode_chain: DecodeChainTuning::mma_fold (-1: the kernel's measured default).
  int decode_chain_mma_fold = -1;
  // With decode_chain: DecodeChainTuning::half_fold (fp16 pair sums in the fold; -1: the kernel's
  // measured default).
  int decode_chain_half_fold = -1;
  // With decode_chain: DecodeChainTuning::steal_chunks (-1: the kernel's measured default, off;
  // 0: each CTA's rows of a phase fixed in advance).
  int decode_chain_steal_chunks = -1;
  // With decode_chain: the fused MLP (DecodeChainTuning::fused_mlp): each layer's mlp.c_proj
  // weight is also kept transposed on the GPU (n_inner x E more elements a layer: 12 GB for
  // StarCoder in fp16), so that a chain streams it right after c_fc without a grid barrier.
  bool decode_chain_fused_mlp = false;
  // With it: DecodeChainTuning::fused_pool (-1: the kernel's default).
  int decode_chain_fused_pool = -1;
  // With decode_chain: the attention before a chain releases it before the attention is done
  // (PagedAttentionParams::release_dependents_early), so that its weights stream meanwhile.
  bool decode_chain_early_release = true;
  // Batch-1 decode steps of layers outside the decode chain (SantaCoder-sized), with the layer
  // norms fused: the attention (and the KV-cache write) done by the QKV GEMM's own launch
  // (GemmTailAttention, kernels/gemm.h): extra CTAs a (head, 64-token split) load their cached
  // rows while the GEMM runs and attend once it is done, the last split of a head merging; no
  // attention or merge launch. Head_dim 128, contexts of at most 128 / heads x 64 tokens (512 for
  // SantaCoder), elsewhere the attention kernels; one rank only (not measured with tensor
  // parallelism, where the heads are shards). On the H200 (2026-12-06 02:17 UTC, mqabench
  // --chain notail,tail,notail,tail; BENCHMARKS.md) a SantaCoder b1 step 0.940 / 0.931 ms without,
  // 0.902 / 0.895 with (-4%).
  bool tail_attention = true;
  // With tail_attention: GemmTailAttention::cluster_merge (a head's splits merged through
  // distributed shared memory in one thread-block cluster, not through L2 after an atomic
  // count-in). On an H100 (2026-12-06 03:21 UTC, mqabench --chain auto,tailc x3, BENCHMARKS.md) a
  // SantaCoder b1 step 1.085 / 1.086 / 1.086 ms with the L2 merge, 1.069 / 1.068 / 1.067 with
  // the cluster's (-1.6%).
  bool tail_cluster_merge = true;
  // With tail_attention, in a layer whose QKV launch ran the tail: the GEMMs that release the
  // next kernel as their CTAs start (GemmEpilogue::release_dependents_early) rather than after
  // their PDL wait, a mask of TailReleaseBit (kTailReleaseAttnProj: c_fc's CTAs then stage their
  // weight rows during the tail's attention instead of after the QKV launch's end).
  // kTailReleaseAttnProj since an H100 run (2026-12-06 05:05 UTC, mqabench --chain
  // auto,tailr,tailr2 x2; benchmarks/mqabench/NOTES.md version 33): SantaCoder b1 decode step
  // 1.057 / 1.056 ms without, 1.025 / 1.025 with (-3.0%); 3: 1.026 / 1.025; three more H100
  // calls -1.3 to -3.6%; the other bits nothing.
  int tail_release_early = kTailReleaseAttnProj;
  // With tail_attention, on one rank: attn.c_proj and its residual add in the QKV launch too, by
  // its GEMM CTAs once every head's output is stored (GemmTailAttention::proj_weight): three
  // launches a layer, no grid boundary between the attention and the projection. Where the launch
  // refuses it (the occupancy check, the shapes), the tail runs without it and attn.c_proj after.
  // Off until measured (mqabench --chain tailp).
  bool tail_attention_proj = false;
};

class GptBigCode {
 public:
  // Checks every weight's shape, dtype and device against weights.config / weights.shard
  // (InvalidArgument naming the tensor) and allocates the workspace. `weights` must outlive the
  // model.
  static absl::StatusOr<std::unique_ptr<GptBigCode>> Create(const GptBigCodeWeights& weights,
                                                            const GptBigCodeOptions& options);

  // Runs one step (validated with ValidateStepInput against `cache`): writes this step's K/V into
  // `cache` and returns fp32 host logits [logits_rows.size(), vocab_size] on rank 0 and
  // [0, vocab_size] elsewhere. Collective: every rank calls it with the same input.
  absl::StatusOr<Tensor> Forward(const StepInput& input, PagedKvCache& cache,
                                 Collectives& collectives);

  // Forward, then one token per logits row drawn with `params` (one per row, kernels/sampling.h):
  // on the GPU only the token ids come back to the host. Rank 0 gets the tokens, the others an
  // empty vector.
  // logits (optional): also the fp32 logits of the rows, on the host (rank 0), as Forward returns
  // them.
  absl::StatusOr<std::vector<int32_t>> ForwardSample(const StepInput& input, PagedKvCache& cache,
                                                     Collectives& collectives,
                                                     absl::Span<const RowSamplingParams> params,
                                                     Tensor* logits = nullptr);

  // Asynchronous decoding: the host prepares step t + 1 while the GPU runs step t (one rank:
  // FailedPrecondition otherwise; on the CPU each launch computes at once, which gives the same
  // tokens, so that what builds on it is tested without a GPU).
  // LaunchSample enqueues a step and its sampling and returns at once; CollectSample waits for the
  // oldest launched step and returns its tokens (rank 0). At most two launches are outstanding;
  // ForwardSample and Forward need none. feed_rows: token rows [0, feed_rows) of `input` take
  // the tokens that the previous launch sampled for its rows [0, feed_rows), on the device (what
  // input.token_ids holds there is ignored), so step t + 1 can be launched before step t's tokens
  // reach the host.
  absl::Status LaunchSample(const StepInput& input, PagedKvCache& cache, Collectives& collectives,
                            absl::Span<const RowSamplingParams> params, int feed_rows = 0);
  absl::StatusOr<std::vector<int32_t>> CollectSample();

  Device device() const { return ctx_.device; }
  // The cudaStream_t every CUDA launch of this model goes to (null on the CPU).
  void* cuda_stream() const { return ctx_.stream; }
  // Benchmarks switch the skinny decode GEMM (and its weight rows per warp: 1, 2 or 4); no-op on
  // the CPU. Drops captured graphs.
  void set_skinny_gemm(bool on, int rows_per_warp = 2);
  // Benchmarks and tests switch GptBigCodeOptions::pdl / fuse_small_kernels / fuse_layer_norms
  // (the first fused call computes the layer-norm sums); no-op on the CPU. Drops captured graphs.
  absl::Status set_fast_paths(bool pdl, bool fuse_small_kernels, bool fuse_layer_norms = false);
  // Benchmarks switch GptBigCodeOptions::gemm_autotune (tuned shapes are kept while off); no-op on
  // the CPU. Drops captured graphs (and their eager first runs, where new shapes get tuned).
  void set_gemm_autotune(bool on, int max_m = 0);
  // Shapes tuned so far keep their algorithms; no new shape is tuned (CudaGemm::freeze_autotune)
  // until set_gemm_autotune turns tuning on again. No-op on the CPU.
  void FreezeGemmAutotune();
  // Benchmarks switch GptBigCodeOptions::ln_registers / greedy_cluster; no-op on the CPU. Drops
  // captured graphs.
  void set_small_kernels(bool ln_registers, bool greedy_cluster);
  // Benchmarks switch the model's attention: GptBigCodeOptions::attention_variant and
  // PagedAttentionTuning::warps_m / num_splits / hopper_tile_tokens (0: automatic, as the runner
  // uses). No-op on the CPU. Drops captured graphs.
  void set_attention(int variant, int warps_m, int splits, int tile_tokens = 0);
  // Benchmarks only: OpContext::skip (kernels/ops.h; the step's outputs become garbage). Works on
  // both devices; drops captured graphs.
  void set_skip_ops(uint32_t skip);
  // Benchmarks switch GptBigCodeOptions::gemm_split_k / gemm_stream_tc (0 off, 1 on, 2 on in its
  // TMA form: gemm_stream_tc_tma) / gemm_deep_unroll / gemm_half_fold (half_fold < 0: unchanged);
  // no-op on the CPU. Drops captured graphs.
  void set_gemm_kernels(bool split_k, int stream_tc, bool deep_unroll, int half_fold = -1);
  // Benchmarks: the TMA form's knobs (CudaGemm::Options::stream_tc_tma_boxes / _hints; 0 / -1:
  // the kernel's defaults). Drops captured graphs.
  void set_gemm_stream_tma_knobs(int boxes, int hints);
  // Benchmarks: GptBigCodeOptions::gemm_stage_bytes. Drops captured graphs.
  void set_gemm_stage_bytes(int bytes);
  // Benchmarks: GptBigCodeOptions::gemm_occupancy. Drops captured graphs.
  void set_gemm_occupancy(bool on);
  // Benchmarks: CudaGemm::Options::skinny_early_epilogue. Drops captured graphs.
  void set_gemm_early_epilogue(bool on);
  // Benchmarks: CudaGemm::Options::skinny_evict_first. Drops captured graphs.
  void set_gemm_evict_first(bool on);
  // One line on what autotuning did so far (shapes tuned, how many changed algorithm, the summed
  // single-run time of the heuristic's choices against the tuned ones, seconds spent); "" on the
  // CPU.
  std::string gemm_autotune_summary() const;
  // Benchmarks and tests switch GptBigCodeOptions::decode_chain; no-op on the CPU. Drops captured
  // graphs.
  // spare_sms < 0: unchanged; attention: GptBigCodeOptions::decode_chain_attention (< 0:
  // unchanged).
  // max_inflight: GptBigCodeOptions::decode_chain_max_inflight, min_layer_bytes:
  // decode_chain_min_layer_bytes (each < 0: unchanged).
  void set_decode_chain(bool on, int spare_sms = -1, int attention = -1, int max_inflight = -1,
                        int64_t min_layer_bytes = -1);
  // Benchmarks: GptBigCodeOptions::decode_chain_stage_bytes. Drops captured graphs.
  void set_decode_chain_stage_bytes(int bytes);
  // Benchmarks: GptBigCodeOptions::decode_chain_ll_inputs. Drops captured graphs.
  void set_decode_chain_ll_inputs(int ll);
  // Benchmarks: GptBigCodeOptions::decode_chain_head_hold. Drops captured graphs.
  void set_decode_chain_head_hold(int hold);
  // Benchmarks: GptBigCodeOptions::decode_chain_mma_fold. Drops captured graphs.
  void set_decode_chain_mma_fold(int mma);
  // Benchmarks: GptBigCodeOptions::decode_chain_half_fold. Drops captured graphs.
  void set_decode_chain_half_fold(int half);
  // Benchmarks: GptBigCodeOptions::decode_chain_fused_mlp; on, the transposed weights are made
  // (once; off frees them). Drops captured graphs. An allocation failure is returned as is.
  absl::Status set_decode_chain_fused_mlp(bool on, int pool = -1);
  // Benchmarks (mqabench --chain-timeline): every decode chain records its timeline
  // (DecodeChainTuning::timeline) into a device buffer, layer l's chain at l x
  // DecodeChainTimelineWords(SM count) words; each step overwrites the last. Drops captured graphs.
  // FailedPrecondition on the CPU.
  absl::Status set_decode_chain_timeline(bool on);
  // The buffer as the last step left it (n_layer x the SM count x kDecodeChainTimelineWords words,
  // zero where no chain ran); empty when off.
  absl::StatusOr<std::vector<unsigned long long>> decode_chain_timeline() const;
  // Benchmarks (mqabench --tail-timeline): layer `layer`'s QKV launch with the tail attention
  // records GemmTailAttention::stamps (each step overwrites the last); -1: off. Drops captured
  // graphs. FailedPrecondition on the CPU.
  absl::Status set_tail_timeline(int layer);
  // The stamps as the last step left them (kGemmTailStampWords words a CTA of the launch, zero
  // past its grid); empty when off.
  absl::StatusOr<std::vector<unsigned long long>> tail_timeline() const;
  // Benchmarks (mqabench --chain shares): the decode chains take per-SM shares of their rows
  // (DecodeChainTuning::sm_shares, a copy kept here; calibrated from decode_chain_timeline's
  // words by DecodeChainShareCalibrator); null: equal shares. Drops captured graphs.
  void set_decode_chain_sm_shares(const DecodeChainSmShares* shares);
  // Benchmarks: GptBigCodeOptions::decode_chain_early_release. Drops captured graphs.
  void set_decode_chain_early_release(bool on);
  // Benchmarks: every decode attention's merge releases the next kernel before the attention is
  // done (PagedAttentionParams::release_dependents_early), not only before a decode chain: the
  // skinny GEMM after it then stages its weights during the attention. Measured slower for
  // StarCoder b1 without the chain (2026-12-04); not yet for SantaCoder. Drops captured graphs.
  void set_attention_release_early(bool on);
  // Benchmarks: GptBigCodeOptions::decode_chain_steal_chunks. Drops captured graphs.
  void set_decode_chain_steal_chunks(int chunks);
  // Tests and benchmarks: GptBigCodeOptions::tail_attention. Drops captured graphs.
  void set_tail_attention(bool on);
  // GptBigCodeOptions::tail_cluster_merge. Drops captured graphs.
  void set_tail_cluster_merge(bool on);
  // GptBigCodeOptions::tail_release_early. Drops captured graphs.
  void set_tail_release_early(int mask);
  // GptBigCodeOptions::tail_attention_proj. Drops captured graphs.
  void set_tail_attention_proj(bool on);
  // Decode chains launched (or captured) so far: benchmarks print it to show the chain ran.
  int64_t decode_chain_runs() const { return chain_runs_; }
  // Of those, the chains with the attention as their first phase (decode_chain_attention), and
  // whether the last one launched (or captured) had it.
  int64_t decode_chain_attention_runs() const { return chain_attention_runs_; }
  bool last_decode_chain_had_attention() const { return last_chain_attention_; }
  // QKV GEMMs launched (or captured) with the tail attention so far (tests, benchmarks).
  int64_t tail_attention_runs() const { return tail_runs_; }
  // Of those, the launches with attn.c_proj in them too (tail_attention_proj).
  int64_t tail_attention_proj_runs() const { return tail_proj_runs_; }
  // Graphs captured so far (tests, benchmarks).
  int num_cuda_graphs() const;
  // One decode step shape, {sequences, longest context}, for each (batch bucket, context bucket)
  // graph key that a decode step of at most max_batch sequences and max_context tokens can land
  // in (GptBigCodeRunner::WarmUpDecodeGraphs runs them). Empty on the CPU or with graphs off.
  std::vector<std::pair<int, int>> DecodeGraphShapes(int max_batch, int max_context) const;
  // Benchmarks: time each decode graph launch with CUDA events (the GPU's time from the graph's
  // first node to its last, without the host's step preparation and the sampling that follow).
  // last_graph_ms() is that time for the most recent graph launch once the stream has passed it
  // (any ForwardSample / Forward call returns after that), or a negative value when the last step
  // ran no graph or timing is off. No-op on the CPU.
  void set_time_graphs(bool on);
  double last_graph_ms() const;

  ~GptBigCode();

 private:
  // The per-step index arrays where the kernels can read them (host vectors on the CPU, a device
  // buffer on CUDA), and the step's shape as the kernels see it (padded to the graph bucket).
  struct StepIndices {
    const int32_t* token_ids = nullptr;
    const int32_t* positions = nullptr;
    const int32_t* query_start = nullptr;
    const int32_t* context_lens = nullptr;
    const int32_t* slot_mapping = nullptr;
    const int32_t* block_tables = nullptr;
    const int32_t* logits_rows = nullptr;
    int max_context_len = 0;
    int64_t num_tokens = 0;
    int num_seqs = 0;
    int max_blocks_per_seq = 0;
    int max_query_len = 0;  // 0: unknown (the CPU path)
    int64_t num_logits_rows = 0;
  };
  struct CudaState;  // stream, GEMM, device buffers, graphs (gpt_bigcode.cc)
  struct CudaStateDeleter {
    void operator()(CudaState* s) const;
  };

  GptBigCode(const GptBigCodeWeights& weights, Activation activation);
  absl::Status EnsureWorkspace(int64_t tokens, int64_t logits_rows);
  absl::StatusOr<StepIndices> StageIndices(const StepInput& input) const;
  absl::Status Layer(int64_t layer, const StepIndices& idx, PagedKvCache& cache,
                     Collectives& collectives);
  // h[0:n) += (A B^T)[0:n) + bias, with the product all-reduced over the ranks first when T > 1
  // (gemm.c = proj_ is the scratch). release_early: LinearParams::release_dependents_early.
  absl::Status RowParallelResidual(const GemmParams& gemm, const Tensor& bias,
                                   Collectives& collectives, bool release_early = false);
  // Embedding and every layer: the residual stream in hidden_.
  absl::Status Trunk(const StepIndices& idx, PagedKvCache& cache, Collectives& collectives);
  // ln_f and lm_head over the gathered logits rows into local_logits_.
  absl::Status LogitsRows(const StepIndices& idx);
  absl::StatusOr<Tensor> Logits(int64_t num_rows, const StepIndices& idx, Collectives& collectives);

  // CUDA backend (gpt_bigcode_cuda.cc).
  absl::Status InitCuda(const GptBigCodeOptions& options);
  // Copies the index arrays to the device; bucket_batch > 0 pads a step of `query` tokens a
  // sequence to that many sequences and sizes its attention for bucket_context tokens (a graph's
  // fixed shape).
  absl::StatusOr<StepIndices> StageIndicesCuda(const StepInput& input, int64_t bucket_batch,
                                               int bucket_context, int64_t query);
  // The step up to fp32 logits [logits rows, vocab] in logits_f32_ on rank 0 (asynchronous).
  // feed_rows > 0: token rows [0, feed_rows) take the previous LaunchSample's tokens on the device.
  absl::Status ForwardCuda(const StepInput& input, PagedKvCache& cache, Collectives& collectives,
                           int64_t* logits_rows, int feed_rows = 0);
  absl::Status TrunkAndLogitsCuda(const StepIndices& idx, PagedKvCache& cache,
                                  Collectives& collectives);
  // Sampling after ForwardCuda: the kernel and the token copy to pinned memory, then an event
  // (LaunchSampleCuda); CollectSampleCuda waits for the oldest launch's event.
  absl::Status LaunchSampleCuda(absl::Span<const RowSamplingParams> params);
  absl::Status FeedTokens(const StepIndices& idx, int feed_rows);
  // The first `rows` rows of logits_f32_ into a new host tensor, enqueued on the model's stream
  // (complete once the stream has passed it).
  absl::StatusOr<Tensor> LogitsToHostCuda(int64_t rows);
  int pending_launches() const;  // LaunchSample steps not collected
  // LaunchSample's CUDA part after the checks common to both devices (ForwardCuda with the token
  // feed, then LaunchSampleCuda), and the CUDA launches not collected.
  absl::Status LaunchStepCuda(const StepInput& input, PagedKvCache& cache, Collectives& collectives,
                              absl::Span<const RowSamplingParams> params, int feed_rows);
  int pending_cuda_launches() const;
  absl::StatusOr<std::vector<int32_t>> CollectSampleCuda();
  // Drops captured graphs (their baked pointers die with a reallocated buffer).
  void ClearCudaGraphs();

  const GptBigCodeWeights& w_;
  const Activation activation_;
  OpContext ctx_;
  std::unique_ptr<CudaState, CudaStateDeleter> cuda_;
  // LaunchSample on the CPU: the tokens of launches not collected, oldest first, and the rows the
  // newest launch sampled (what the next launch's feed_rows may take).
  std::deque<std::vector<int32_t>> cpu_pending_;
  std::vector<int32_t> cpu_last_sampled_;
  DType dtype_;
  // Geometry of this rank.
  int64_t embd_ = 0, head_dim_ = 0, heads_ = 0, kv_heads_ = 0, qkv_cols_ = 0, inner_ = 0;
  int64_t vocab_shard_ = 0;
  int cache_block_size_ = 16;  // of the cache of the step being staged (CUDA)
  bool fuse_ = false;          // the layer norms into the skinny GEMMs (CUDA only; either option)
  bool fuse_kv_ = false;  // ... and the KV write into QKV (GptBigCodeOptions::fuse_small_kernels)
  bool chain_ = false;         // GptBigCodeOptions::decode_chain (CUDA only)
  int64_t chain_min_layer_bytes_ = 0;  // ... _min_layer_bytes
  bool chain_attention_ = false;            // GptBigCodeOptions::decode_chain_attention
  int chain_attention_max_context_ = 1024;  // ... _attention_max_context
  bool chain_early_release_ = true;         // ... _early_release
  bool attention_release_early_ = false;    // set_attention_release_early
  bool tail_attention_ = false;             // GptBigCodeOptions::tail_attention
  bool tail_cluster_merge_ = false;         // GptBigCodeOptions::tail_cluster_merge
  bool tail_attention_proj_ = false;        // GptBigCodeOptions::tail_attention_proj
  int tail_release_early_ = 0;              // GptBigCodeOptions::tail_release_early
  // Within a step: the previous layer's decode chain already computed this layer's ln_1 + QKV.
  bool qkv_ready_ = false;
  int64_t chain_runs_ = 0;
  int64_t chain_attention_runs_ = 0;
  bool last_chain_attention_ = false;
  int64_t tail_runs_ = 0;
  int64_t tail_proj_runs_ = 0;
  bool chain_refusal_logged_ = false;  // a refused chain is reported once (stderr)
  // Workspace (capacities in rows).
  int64_t token_capacity_ = 0, logits_capacity_ = 0;
  Tensor hidden_;  // [tokens, E]: the residual stream
  Tensor normed_;  // [tokens, E]: LN output
  Tensor qkv_;     // [tokens, qkv_cols]: this rank's Q heads, then K and V heads
  Tensor attn_;    // [tokens, heads * D]
  Tensor proj_;    // [tokens, E]: row-parallel partial sums
  Tensor mlp_;     // [tokens, inner_shard]
  // CUDA, decode_chain_fused_mlp: each layer's mlp_proj_w transposed ([inner_shard, E]).
  std::vector<Tensor> mlp_proj_wt_;
  // CUDA, fuse_: [2, n] fp32 sums (GemmEpilogue::ln_wsum, then ln_bsum) of layer l's QKV (2 l)
  // and c_fc (2 l + 1) against ln_1 / ln_2, then lm_head's against ln_f (2 n_layer).
  std::vector<Tensor> ln_sums_;
  absl::Status EnsureLnSums();
  // The fusion of `ln` (weight, bias, epsilon) into the following GEMM, with its sums from
  // ln_sums_[i] (n columns); those left null where there are none (the skinny GEMM then refuses
  // the fusion and the separate layer norm runs).
  LinearFusion FusedLayerNorm(const LayerNormParams& ln, size_t i, int64_t n) const;
  Tensor rows_;    // [logits rows, E]
  Tensor rows_normed_;
  Tensor local_logits_;     // [logits rows, vocab_shard]
  Tensor gathered_logits_;  // [T * logits rows, vocab_shard]
  Tensor logits_f32_;       // CUDA: [logits rows, vocab] fp32 (rank 0)
};

}  // namespace mqa
