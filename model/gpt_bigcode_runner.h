// GptBigCodeRunner: the ModelRunner of one rank (runtime/model_runner.h) for GPT-BigCode. It owns
// this rank's weights, its paged KV cache (one K and one V tensor per layer, [num_blocks,
// block_size, kv_heads, head_dim]) and the forward's workspace; it borrows the Collectives that
// connect it to the other tensor-parallel ranks (MakeLocalCollectives() for one rank).
//
// Execute(step): validates the step (InvalidArgument, before any collective or cache write),
// applies its block copies, runs the forward and returns fp32 logits [logits_rows, vocab_size]
// on rank 0 ([0, vocab_size] on the other ranks). Every rank calls Execute with the same step.
//
// Thread ownership: one thread (the engine's, or a worker's) calls a runner; not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gpt_bigcode.h"
#include "model/weights.h"
#include "model/weights_loader.h"
#include "parallel/collectives.h"
#include "runtime/decode_lookahead.h"
#include "runtime/model_runner.h"

namespace mqa {

struct GptBigCodeRunnerOptions {
  int block_size = 16;  // 8, 16 or 32
  // Size of the KV pool: num_kv_blocks when > 0, else as many blocks as fit in kv_cache_bytes
  // (per rank, K and V of all layers), else (CUDA) from free memory after a profiling forward:
  // gpu_memory_utilization * total device memory - what the weights, workspace and the profile
  // step use. One of the three must be set.
  int num_kv_blocks = 0;
  int64_t kv_cache_bytes = 0;
  double gpu_memory_utilization = 0.0;  // CUDA only; e.g. 0.9 (vLLM's default)
  int64_t max_batched_tokens = 2048;    // workspace preallocation (grown if a step needs more)
  int64_t max_logits_rows = 256;
  // Where the forward runs. kCuda needs float16 / bfloat16 weights; host weights are uploaded
  // (the current CUDA device), weights already on the device are used as they are.
  Device device = Device::kCpu;
  bool cuda_graphs = true;  // decode steps as CUDA graphs (one rank)
  int max_graph_batch = 256;
  int max_graph_query = 1;              // GptBigCodeOptions::max_graph_query
  bool skinny_gemm = true;              // the m <= 8 GEMM kernel for small decode batches
  bool pdl = true;                      // GptBigCodeOptions::pdl
  bool fuse_small_kernels = false;      // GptBigCodeOptions::fuse_small_kernels
  bool fuse_layer_norms = true;         // GptBigCodeOptions::fuse_layer_norms
  bool gemm_autotune = false;           // GptBigCodeOptions::gemm_autotune
  int gemm_autotune_max_m = 0;          // GptBigCodeOptions::gemm_autotune_max_m
  bool ln_registers = true;             // GptBigCodeOptions::ln_registers
  bool greedy_cluster = true;           // GptBigCodeOptions::greedy_cluster
  bool gemm_split_k = false;            // GptBigCodeOptions::gemm_split_k
  bool gemm_stream_tc = false;          // GptBigCodeOptions::gemm_stream_tc
  int attention_variant = 18;           // GptBigCodeOptions::attention_variant
  bool gemm_deep_unroll = true;         // GptBigCodeOptions::gemm_deep_unroll
  bool decode_chain = true;             // GptBigCodeOptions::decode_chain
  int64_t decode_chain_min_layer_bytes = GptBigCodeOptions().decode_chain_min_layer_bytes;
  // GptBigCodeOptions::decode_chain_attention, decode_chain_attention_max_context
  bool decode_chain_attention = GptBigCodeOptions().decode_chain_attention;
  int decode_chain_attention_max_context = GptBigCodeOptions().decode_chain_attention_max_context;
  int decode_chain_half_fold = -1;      // GptBigCodeOptions::decode_chain_half_fold
  bool decode_chain_fused_mlp = false;  // GptBigCodeOptions::decode_chain_fused_mlp
  bool tail_attention = GptBigCodeOptions().tail_attention;  // GptBigCodeOptions::tail_attention
  // GptBigCodeOptions::tail_cluster_merge
  bool tail_cluster_merge = GptBigCodeOptions().tail_cluster_merge;
  int tail_release_early = GptBigCodeOptions().tail_release_early;  // ... ::tail_release_early
  bool tail_attention_proj = GptBigCodeOptions().tail_attention_proj;  // ... ::tail_attention_proj
};

class GptBigCodeRunner final : public ModelRunner {
 public:
  // `collectives` must outlive the runner; its rank and world size must match weights.shard.
  static absl::StatusOr<std::unique_ptr<GptBigCodeRunner>> Create(
      GptBigCodeWeights weights, Collectives* collectives, const GptBigCodeRunnerOptions& options);

  // Waits for a predicted step still running (decode lookahead) before the buffers it uses go.
  ~GptBigCodeRunner() override;

  absl::StatusOr<Tensor> Execute(const StepInput& input) override;
  // Execute, then one token per logits row drawn on the device (kernels/sampling.h; on the CPU
  // with the same function): only token ids leave the GPU. params: one per logits row.
  absl::StatusOr<std::vector<int32_t>> ExecuteAndSample(const StepInput& input,
                                                        absl::Span<const RowSamplingParams> params);
  // GptBigCode::LaunchSample / CollectSample after this runner's checks and block copies: the
  // next step is launched before the previous one's tokens are on the host (CUDA, one rank).
  absl::Status LaunchSample(const StepInput& input, absl::Span<const RowSamplingParams> params,
                            int feed_rows = 0);
  absl::StatusOr<std::vector<int32_t>> CollectSample() { return model_->CollectSample(); }
  // True on the GPU: the engine's sampling goes through ExecuteSampled (on the CPU the engine
  // keeps its own sampler).
  bool samples_on_device() const override { return model_->device() == Device::kCuda; }
  absl::StatusOr<SampledStep> ExecuteSampled(const StepInput& input,
                                             absl::Span<const RowSamplingParams> params,
                                             bool with_logits) override;
  // CUDA, one rank, graphs on: runs a decode step of every shape GptBigCode::DecodeGraphShapes
  // gives, twice (the first runs eagerly and creates the GEMM plans, the second captures), so that
  // serving never captures on a live request's step. The steps read and write only block 0 (its
  // contents are garbage afterwards: call it before any sequence holds blocks). With
  // GptBigCodeOptions::gemm_autotune the eager runs time the decode GEMM shapes, and tuning is
  // frozen afterwards (GptBigCode::FreezeGemmAutotune): nothing later pays a timing pass. Returns
  // the graphs captured; 0 where there are none to take.
  absl::StatusOr<int> WarmUpDecodeGraphs(int max_batch, int max_context);
  // CUDA: calibrates the decode chains' per-SM shares (DecodeChainTuning::sm_shares): `steps`
  // batch-1 decode steps at `context` tokens (block 0 only, as WarmUpDecodeGraphs: call it before
  // any sequence holds blocks) record every chain's timeline, DecodeChainShareCalibrator turns
  // them into shares, and the model takes them (GptBigCode::set_decode_chain_sm_shares; captured
  // graphs are dropped). FailedPrecondition where no chain ran (the chain is off, or no layer is
  // large enough) or the calibration had too little to go on; the shares are then equal. The
  // timelines are read as the default chain's four phases (c_proj, c_fc, mlp.c_proj, c_attn):
  // with decode_chain_attention on, the phases are offset by one and the rates mismatched.
  absl::StatusOr<DecodeChainShareCalibration> CalibrateDecodeChainShares(int steps, int context);
  // Drops a predicted step still pending (decode lookahead), so that the GPU is idle afterwards.
  absl::Status KeepAlive() override;
  // Decode lookahead's counts so far (StepInput::may_look_ahead, runtime/decode_lookahead.h).
  const LookaheadStats& lookahead_stats() const { return lookahead_stats_; }
  int64_t vocab_size() const override { return weights_.config.vocab_size; }
  int num_kv_blocks() const override { return cache_.num_blocks(); }
  int block_size() const override { return cache_.block_size(); }

  const GptBigCodeWeights& weights() const { return weights_; }
  const ModelConfig& config() const { return weights_.config; }
  PagedKvCache& kv_cache() { return cache_; }
  GptBigCode& model() { return *model_; }
  // KV cache bytes per token on this rank (K and V of every layer): 20 KiB for StarCoder in fp16.
  int64_t kv_bytes_per_token() const;

 private:
  GptBigCodeRunner(GptBigCodeWeights weights, Collectives* collectives)
      : weights_(std::move(weights)), collectives_(collectives) {}

  // Every step's start: validates it (InvalidArgument before any collective or cache write) and
  // applies its block copies (in order on the CPU, one launch on the model's stream on the GPU).
  absl::Status PrepareStep(const StepInput& input);
  // Decode lookahead: the step after `input` if every sequence continues (PredictNextDecodeStep
  // with this cache's block size and the model's positions), and its launch right after `input`'s
  // (fed on the device with the tokens `input` samples; nothing without a prediction). A failure
  // to launch it is counted (LookaheadStats::failed, the first logged), never `input`'s.
  std::optional<LookaheadStep> PredictNext(const StepInput& input,
                                           absl::Span<const RowSamplingParams> params) const;
  void LaunchLookahead(std::optional<LookaheadStep> next);
  // Waits for a pending predicted step and forgets it (every path but the matching one).
  absl::Status DropLookahead();
  absl::Status SizeKvPoolFromFreeMemory(const GptBigCodeRunnerOptions& options,
                                        PagedKvCache::Shape& shape);

  GptBigCodeWeights weights_;
  Collectives* collectives_;
  PagedKvCache cache_;
  std::unique_ptr<GptBigCode> model_;  // refers to weights_: declared after it
  // The predicted step launched and not collected (its token ids: what it was fed).
  std::optional<LookaheadStep> lookahead_;
  LookaheadStats lookahead_stats_;
};

// LoadWeights(load) for this rank (load.rank / load.world_size are taken from `collectives`),
// then Create. The entry point for the launcher and for the HF-fixture parity test:
//   LoadOptions load; load.model_dir = dir;
//   GptBigCodeRunnerOptions opts; opts.num_kv_blocks = 64;
//   auto runner = CreateGptBigCodeRunnerFromDir(load, collectives.get(), opts);
absl::StatusOr<std::unique_ptr<GptBigCodeRunner>> CreateGptBigCodeRunnerFromDir(
    LoadOptions load, Collectives* collectives, const GptBigCodeRunnerOptions& options);

// Copies every host tensor of `weights` to the current CUDA device (tied lm_head stays shared);
// tensors already there are kept. FailedPrecondition without CUDA.
absl::Status UploadWeightsToCuda(GptBigCodeWeights& weights);

}  // namespace mqa
