#include "model/gpt_bigcode_runner.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace mqa {

absl::StatusOr<std::unique_ptr<GptBigCodeRunner>> GptBigCodeRunner::Create(
    GptBigCodeWeights weights, Collectives* collectives, const GptBigCodeRunnerOptions& options) {
  if (collectives == nullptr) return absl::InvalidArgumentError("GptBigCodeRunner: no collectives");
  if (collectives->rank() != weights.shard.rank ||
      collectives->world_size() != weights.shard.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptBigCodeRunner: collectives are rank ", collectives->rank(), " of ",
                     collectives->world_size(), ", weights are rank ", weights.shard.rank, " of ",
                     weights.shard.world_size));
  }
  if (!weights.wte.defined()) return absl::InvalidArgumentError("GptBigCodeRunner: no weights");
  auto runner =
      std::unique_ptr<GptBigCodeRunner>(new GptBigCodeRunner(std::move(weights), collectives));
  const GptBigCodeWeights& w = runner->weights_;

  PagedKvCache::Shape shape;
  shape.num_layers = w.config.n_layer;
  shape.kv_heads = w.shard.kv_heads_per_rank;
  shape.head_dim = w.config.head_dim();
  shape.block_size = options.block_size;
  shape.num_blocks = options.num_kv_blocks;
  if (shape.num_blocks <= 0) {
    const int64_t per_block = PagedKvCache::BytesPerBlock(shape, w.wte.dtype());
    const int64_t blocks = per_block > 0 ? options.kv_cache_bytes / per_block : 0;
    if (blocks <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GptBigCodeRunner: set num_kv_blocks or a kv_cache_bytes of at least one block (",
          per_block, " bytes)"));
    }
    shape.num_blocks = static_cast<int>(std::min<int64_t>(blocks, INT32_MAX / 64));
  }
  ASSIGN_OR_RETURN(runner->cache_, PagedKvCache::Allocate(shape, w.wte.dtype(), w.wte.device()));

  GptBigCodeOptions model_options;
  model_options.max_batched_tokens = options.max_batched_tokens;
  model_options.max_logits_rows = options.max_logits_rows;
  ASSIGN_OR_RETURN(runner->model_, GptBigCode::Create(w, model_options));
  return runner;
}

absl::StatusOr<Tensor> GptBigCodeRunner::Execute(const StepInput& input) {
  RETURN_IF_ERROR(
      ValidateStepInput(input, weights_.config, cache_.num_blocks(), cache_.block_size()));
  for (const BlockCopy& copy : input.block_copies) {
    RETURN_IF_ERROR(cache_.CopyBlock(copy.src, copy.dst));
  }
  return model_->Forward(input, cache_, *collectives_);
}

absl::StatusOr<std::unique_ptr<GptBigCodeRunner>> CreateGptBigCodeRunnerFromDir(
    LoadOptions load, Collectives* collectives, const GptBigCodeRunnerOptions& options) {
  if (collectives == nullptr) return absl::InvalidArgumentError("GptBigCodeRunner: no collectives");
  load.rank = collectives->rank();
  load.world_size = collectives->world_size();
  ASSIGN_OR_RETURN(GptBigCodeWeights weights, LoadWeights(load));
  return GptBigCodeRunner::Create(std::move(weights), collectives, options);
}

}  // namespace mqa
