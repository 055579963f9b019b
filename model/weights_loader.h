// Loading one tensor-parallel rank's GptBigCodeWeights (model/weights.h) from a Hugging Face
// GPT-BigCode folder: config.json plus safetensors (one file or sharded), or random ("dummy")
// weights of the right shapes from config.json alone.
//
// Only this rank's slice of each tensor is read (the file is mmapped; other ranks' rows and
// columns are never touched). Every checkpoint tensor's shape is checked against config.json;
// errors name the file, the tensor and the expected and found shapes.
//
// Thread safety: LoadWeights is reentrant; the progress callback runs on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/dtype.h"

namespace mqa {

struct LoadOptions {
  std::string model_dir;  // holds config.json (+ model.safetensors[.index.json] unless dummy)
  int rank = 0;
  int world_size = 1;
  DType dtype = DType::kF32;  // of the loaded weights: F32 for the CPU backend, F16/BF16 for CUDA
  // "auto": the folder's safetensors checkpoint (an error if there is none);
  // "safetensors": the same, named explicitly;
  // "dummy": random weights from config.json alone (normal(0, initializer_range) matrices and
  //   embeddings, layer-norm weights 1, biases 0). Values are a pure function of
  //   (seed, tensor name, element index in the full tensor), so every world size yields shards
  //   of the same model.
  std::string load_format = "auto";
  uint64_t seed = 0;
  // Called after each checkpoint tensor is placed, with the running totals of bytes written
  // into this rank's weights and tensors done. May be empty.
  std::function<void(uint64_t bytes, int64_t tensors)> progress;
};

// The shard geometry of `rank` of `world_size`; an error when n_head or n_inner is not a
// multiple of world_size or rank is out of range.
absl::StatusOr<ShardInfo> MakeShardInfo(const ModelConfig& config, int rank, int world_size);

absl::StatusOr<GptBigCodeWeights> LoadWeights(const LoadOptions& options);

}  // namespace mqa
