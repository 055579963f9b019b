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

#include "absl/status/statusor.h"
#include "model/gpt_bigcode.h"
#include "model/weights.h"
#include "model/weights_loader.h"
#include "parallel/collectives.h"
#include "runtime/model_runner.h"

namespace mqa {

struct GptBigCodeRunnerOptions {
  int block_size = 16;  // 8, 16 or 32
  // Size of the KV pool: num_kv_blocks when > 0, else as many blocks as fit in kv_cache_bytes
  // (per rank, K and V of all layers). One of the two must be set.
  int num_kv_blocks = 0;
  int64_t kv_cache_bytes = 0;
  int64_t max_batched_tokens = 2048;  // workspace preallocation (grown if a step needs more)
  int64_t max_logits_rows = 256;
};

class GptBigCodeRunner final : public ModelRunner {
 public:
  // `collectives` must outlive the runner; its rank and world size must match weights.shard.
  static absl::StatusOr<std::unique_ptr<GptBigCodeRunner>> Create(
      GptBigCodeWeights weights, Collectives* collectives, const GptBigCodeRunnerOptions& options);

  absl::StatusOr<Tensor> Execute(const StepInput& input) override;
  int64_t vocab_size() const override { return weights_.config.vocab_size; }
  int num_kv_blocks() const override { return cache_.num_blocks(); }
  int block_size() const override { return cache_.block_size(); }

  const GptBigCodeWeights& weights() const { return weights_; }
  const ModelConfig& config() const { return weights_.config; }
  PagedKvCache& kv_cache() { return cache_; }

 private:
  GptBigCodeRunner(GptBigCodeWeights weights, Collectives* collectives)
      : weights_(std::move(weights)), collectives_(collectives) {}

  GptBigCodeWeights weights_;
  Collectives* collectives_;
  PagedKvCache cache_;
  std::unique_ptr<GptBigCode> model_;  // refers to weights_: declared after it
};

// LoadWeights(load) for this rank (load.rank / load.world_size are taken from `collectives`),
// then Create. The entry point for the launcher and for the HF-fixture parity test:
//   LoadOptions load; load.model_dir = dir;
//   GptBigCodeRunnerOptions opts; opts.num_kv_blocks = 64;
//   auto runner = CreateGptBigCodeRunnerFromDir(load, collectives.get(), opts);
absl::StatusOr<std::unique_ptr<GptBigCodeRunner>> CreateGptBigCodeRunnerFromDir(
    LoadOptions load, Collectives* collectives, const GptBigCodeRunnerOptions& options);

}  // namespace mqa
